"""Chapter 07 exercise: a Mamba layer's per-request state slots and its ping-pong tracking slots.

Write ``get_mamba_tracking_slots`` and ``MambaRows.alloc_row``, ``free_row``,
``next_track_slot``. Grade with ``./course grade 07``.
"""

import torch


def get_mamba_tracking_slots(
    extra_buffer: bool, overlap: bool, lazy: bool = False
) -> int:
    """How many tracking slots a request takes besides its state slot.

    0 without the extra buffer; 1 in lazy mode (the second comes when first needed); otherwise 2
    under the overlap scheduler (while step t-1 still reads one snapshot, step t writes the
    other: ping-pong) and 1 without it. See chapter 07 (ping-pong).
    """
    raise NotImplementedError


class MambaRows:
    """Mamba state slots for the rows of a request table.

    Given: the state. Slots 1..num_slots (0 is padding) hold a state row each in ``state``;
    ``free_slots`` (int64) is handed out from its head and freed slots go to its tail. Per
    request row r: ``state_slot[r]`` (0 = none), ``track_slots[r]`` (``tracking`` columns, 0 =
    none), ``next_track_idx[r]`` (which column the next snapshot goes to, 0 when fresh) and
    ``last_track_seqlen[r]`` (-1 = no snapshot yet).
    """

    def __init__(self, rows: int, num_slots: int, state_dim: int, tracking: int):
        self.tracking = tracking
        self.state = torch.zeros(num_slots + 1, state_dim)
        self.free_slots = torch.arange(1, num_slots + 1, dtype=torch.int64)
        self.state_slot = torch.zeros(rows + 1, dtype=torch.int64)
        self.track_slots = torch.zeros(rows + 1, tracking, dtype=torch.int64)
        self.next_track_idx = torch.zeros(rows + 1, dtype=torch.int64)
        self.last_track_seqlen = torch.full((rows + 1,), -1, dtype=torch.int64)

    def alloc_row(self, row: int) -> bool:
        """Give request row ``row`` a state slot and ``tracking`` tracking slots; False when short.

        All or nothing: with fewer than ``1 + tracking`` free slots return False and change
        nothing. Otherwise take them from the head of ``free_slots`` (the first is the state
        slot, the rest the tracking slots in column order), ZERO their rows of ``state`` and only
        theirs (the previous owner's recurrent state must not leak into a new request; the slots
        need not be consecutive, and other rows of ``state`` belong to other requests), set
        ``state_slot[row]`` and ``track_slots[row]``, and return True. Leave every other field
        alone: ``next_track_idx[row]`` and ``last_track_seqlen[row]`` keep the fresh values
        ``free_row`` left (0 and -1). See chapter 07 (state per request).
        """
        raise NotImplementedError

    def free_row(self, row: int) -> None:
        """Give back every slot the row owns (non-zero ones, appended to the tail of
        ``free_slots``) and reset ALL four per-row fields to their fresh values (0, zeros, 0,
        -1): a reused row must not see a stale slot or ping-pong index. See chapter 07 (freeing).
        """
        raise NotImplementedError

    def next_track_slot(self, row: int) -> int:
        """The tracking slot the row's next snapshot goes to:
        ``track_slots[row, next_track_idx[row]]``; then advance ``next_track_idx[row]`` by one,
        modulo ``tracking`` (with 2 slots: ping-pong). Raise ValueError when there are no tracking
        slots (``tracking == 0``) or the row has none.
        """
        raise NotImplementedError
