"""Linear-attention state per request (MambaPool of sglang/srt/mem_cache/memory_pool.py).

A linear layer keeps no KV per token; it keeps one fixed-size state per request (a conv state:
the last ``kernel - 1`` inputs per channel, and a temporal state: the recurrence's matrix). So
its ledger counts request slots (``MambaSlotAllocator``, allocator/mamba.py) over the state's
storage (``MambaPool``), and the request table learns, per row, which slot holds the request's
state and which extra "tracking" slots it may write snapshots to (``HybridReqToTokenPool``).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import torch

from memlab.common import _checks
from memlab.common.env import resolve_device
from memlab.sglang.req_to_token import Req, ReqToTokenPool


def mamba_tracking_slots(extra_buffer: bool, overlap: bool, lazy: bool = False) -> int:
    """Tracking slots a request takes at admission besides its state slot.

    None without the extra buffer; one in lazy mode (the second comes when first needed);
    otherwise two under the overlap scheduler (while step t-1 still reads one snapshot, step t
    writes the other: ping-pong) and one without it.
    """
    if not extra_buffer:
        return 0
    if lazy:
        return 1
    return 2 if overlap else 1


def _slot_tensor(name: str, slots, device, hi: int) -> torch.Tensor:
    """Slots (or rows) ``0..hi`` as an int64 tensor: a 0-d or 1-D integer tensor on ``device``,
    or a list of ints. Their values are read where that costs no sync (the CPU)."""
    if isinstance(slots, torch.Tensor):
        _checks.index_tensor(name, slots, device)
    else:
        slots = torch.tensor(
            _checks.int_list(name, slots), dtype=torch.int64, device=device
        )
    t = slots.reshape(-1).to(torch.int64)
    if slots.dim() > 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(slots.shape)}")
    if t.device.type == "cpu":
        _checks.values_in(name, t, 0, hi)
    return t


class MambaSlotAllocator:
    """Free slots 1..size; allocation from the head, frees appended at the tail (FIFO reuse)."""

    __slots__ = ("size", "device", "debug_mode", "free_slots")

    def __init__(self, size: int, device="cpu", debug_mode: bool = False):
        self.size, self.device = (
            _checks.integer("size", size, 1, _checks.INT32_MAX),
            resolve_device(device),
        )
        self.debug_mode = debug_mode
        self.clear()

    def clear(self) -> None:
        # Slot 0 is padding: padded batch entries read and write it harmlessly.
        self.free_slots = torch.arange(
            1, self.size + 1, dtype=torch.int64, device=self.device
        )

    def available_size(self) -> int:
        return self.free_slots.numel()

    def alloc(self, need_size: int) -> torch.Tensor | None:
        need_size = _checks.integer("need_size", need_size, 0)
        if need_size > self.free_slots.numel():
            return None
        out = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        return out

    def free(self, slots: torch.Tensor) -> None:
        """Give slots back (to the tail). A slot freed twice is refused in debug mode only."""
        # a tensor, as SGLang's MambaPool.free takes
        _checks.index_tensor("slots", slots, self.device, ndim=1)
        slots = slots.to(torch.int64)
        if slots.numel() == 0:
            return
        # on a GPU the range check would sync
        if self.debug_mode or slots.device.type == "cpu":
            lo, hi = int(slots.min()), int(slots.max())
            if lo < 1 or hi > self.size:
                raise ValueError(
                    f"cannot free mamba slot {lo if lo < 1 else hi}: slots are 1..{self.size} "
                    "(slot 0 is padding)"
                )
        if self.debug_mode:
            uniq, counts = torch.unique(
                torch.cat((self.free_slots, slots)), return_counts=True
            )
            if (counts > 1).any():
                raise ValueError(
                    f"mamba slot {int(uniq[counts > 1][0])} freed twice "
                    "(already free or repeated in this call)"
                )
        self.free_slots = torch.cat((self.free_slots, slots))


class MambaPool:
    """State slots 1..size (slot 0 padding): conv state and temporal state of every mamba layer.

    As SGLang's: ``conv`` is a list over the conv-state components (``conv_state_shape``, one
    shape per component: most models have one, ``(channels, kernel - 1)``), each stacked over the
    layers, ``(num_mamba_layers, size + 1, *shape)``; ``temporal`` is one tensor
    ``(num_mamba_layers, size + 1, *temporal_state_shape)``. All mamba layers share the shapes, so
    one tensor per component serves them all. Storage only, as SGLang's: the free slots are the
    request table's (``HybridReqToTokenPool.mamba_allocator``).
    """

    def __init__(
        self,
        size: int,
        num_mamba_layers: int,
        conv_state_shape: Sequence[Sequence[int]],
        temporal_state_shape: Sequence[int],
        conv_dtype: torch.dtype = torch.bfloat16,
        ssm_dtype: torch.dtype = torch.float32,
        device="cpu",
    ):
        _check_mamba_pool(
            size,
            num_mamba_layers,
            conv_state_shape,
            temporal_state_shape,
            conv_dtype,
            ssm_dtype,
        )
        self.size, self.device = size, resolve_device(device)
        self.num_mamba_layers = num_mamba_layers
        self.conv = [
            torch.zeros(
                (num_mamba_layers, size + 1, *shape),
                dtype=conv_dtype,
                device=self.device,
            )
            for shape in conv_state_shape
        ]
        self.temporal = torch.zeros(
            (num_mamba_layers, size + 1, *temporal_state_shape),
            dtype=ssm_dtype,
            device=self.device,
        )
        self._slot_siblings: list = []

    # -- states that share the slot's lifetime ---------------------------------------------
    def register_slot_state(self, state) -> None:
        """Attach a state indexed by slot that must be cleared, copied and moved with the slot.

        ``state``: a tensor whose first dim is ``size + 1``, or an object with
        ``clear_slots(slots)`` and ``copy_slots(src, dst)``.
        """
        if isinstance(state, torch.Tensor):
            _checks.tensor("state", state, device=self.device)
            if state.dim() == 0 or state.shape[0] != self.size + 1:
                raise ValueError(
                    f"a slot state needs {self.size + 1} rows (slot 0 padding), got "
                    f"{tuple(state.shape)}"
                )
            state = _TensorSlotState(state)
        elif not all(
            callable(getattr(state, m, None)) for m in ("clear_slots", "copy_slots")
        ):
            raise TypeError(
                f"{state!r} is neither a tensor nor has clear_slots/copy_slots"
            )
        self._slot_siblings = [*self._slot_siblings, state]

    # -- slot contents ------------------------------------------------------------------------
    def clear_slots(self, slots) -> None:
        """Zero the state of ``slots`` (SGLang does it on the forward stream, before the extend)."""
        slots = _slot_tensor("slots", slots, self.device, self.size)
        for c in self.conv:
            c[:, slots] = 0
        self.temporal[:, slots] = 0
        for s in self._slot_siblings:
            s.clear_slots(slots)

    def copy_slots(self, src, dst) -> None:
        """State of slots ``src`` -> slots ``dst`` (e.g. a snapshot into a tracking slot)."""
        src = _slot_tensor("src", src, self.device, self.size)
        dst = _slot_tensor("dst", dst, self.device, self.size)
        if src.numel() != dst.numel():
            raise ValueError(f"copy of {src.numel()} slots into {dst.numel()}")
        for c in self.conv:
            c[:, dst] = c[:, src]
        self.temporal[:, dst] = self.temporal[:, src]
        for s in self._slot_siblings:
            s.copy_slots(src, dst)

    def move_slots(self, src, dst) -> None:
        """State of slots ``src`` -> slots ``dst``, then ``src`` cleared (a slot in both keeps what
        it received). Every registered state moves too."""
        src = _slot_tensor("src", src, self.device, self.size)
        dst = _slot_tensor("dst", dst, self.device, self.size)
        if src.numel() != dst.numel():
            raise ValueError(f"move of {src.numel()} slots into {dst.numel()}")
        self.copy_slots(src, dst)
        self.clear_slots(src[~torch.isin(src, dst)])

    def get_state(self, mamba_layer_idx: int):
        """(conv, temporal) of one mamba layer, indexed by slot: conv is a list over its components
        (SGLang's ``State.at_layer_idx``)."""
        i = _checks.integer(
            "mamba_layer_idx", mamba_layer_idx, 0, self.num_mamba_layers - 1
        )
        return [c[i] for c in self.conv], self.temporal[i]

    def bytes_per_slot(self) -> int:
        return sum(c[:, 0].nbytes for c in self.conv) + self.temporal[:, 0].nbytes

    def mem_usage_bytes(self) -> int:
        return sum(c.nbytes for c in self.conv) + self.temporal.nbytes


class _TensorSlotState:
    __slots__ = ("t",)

    def __init__(self, t: torch.Tensor):
        self.t = t

    def clear_slots(self, slots):
        self.t[slots] = 0

    def copy_slots(self, src, dst):
        self.t[dst] = self.t[src]


class HybridReqToTokenPool(ReqToTokenPool):
    """The request table of a hybrid model: each request also holds a mamba state slot.

    As SGLang 0.5.23's: the slots come from ``mamba_allocator``; ``alloc(reqs)`` gives each
    request a row and, unless it still holds one (a continuing chunk, a state it kept), a state
    slot, marked ``req.kv.mamba_needs_clear``: it is zeroed before the request's first extend,
    unless a cached state is copied in (``req.kv.mamba_cow_src_index``). SGLang zeroes it on the
    forward stream (``ModelRunner``, before the mamba layers run); memlab has no forward stream and
    zeroes it in ``execute_deferred_mamba_cow_and_clear(reqs)``, which whoever prepares the extend
    calls after ``alloc``. ``free(req)`` gives back the row only; the state and the tracking slots
    go with ``free_mamba_cache(req)`` (a tree that adopts a state keeps it).

    Per row, on the device: ``req_index_to_mamba_index_mapping`` (the state slot; 0 = none), the
    ping-pong tracking slots ``req_index_to_mamba_ping_pong_track_buffer_mapping`` (-1 = not taken
    yet, in lazy mode, as SGLang's; 0 on a free row), which of them the next snapshot goes to
    (``mamba_next_track_idx``) and the length the last snapshot was taken at
    (``mamba_last_track_seqlen``, -1 = none). SGLang keeps the two cursors on the request; memlab
    keeps them per row and resets them with a fresh row. A freed row gets all of them back to
    those values, so a reused row never sees a stale slot (SGLang leaves them until reuse).
    """

    def __init__(
        self,
        size: int,
        max_context_len: int,
        mamba_size: int,
        conv_state_shape: Sequence[Sequence[int]],
        temporal_state_shape: Sequence[int],
        mamba_layer_ids: Sequence[int],
        *,
        conv_dtype: torch.dtype = torch.bfloat16,
        ssm_dtype: torch.dtype = torch.float32,
        enable_mamba_extra_buffer: bool = False,
        enable_overlap_schedule: bool = True,
        mamba_extra_buffer_lazy: bool = False,
        device="cpu",
        debug_mode: bool = False,
    ):
        if len(set(mamba_layer_ids)) != len(mamba_layer_ids):
            raise ValueError(f"repeated mamba layer ids: {list(mamba_layer_ids)}")
        self.mamba_pool = MambaPool(
            mamba_size,
            len(mamba_layer_ids),
            conv_state_shape,
            temporal_state_shape,
            conv_dtype,
            ssm_dtype,
            device,
        )
        self.mamba_allocator = MambaSlotAllocator(mamba_size, device, debug_mode)
        # Mamba layers sit sparsely among the model's layers; the pool stores only them.
        self.mamba_map = {layer_id: i for i, layer_id in enumerate(mamba_layer_ids)}
        self.enable_mamba_extra_buffer = enable_mamba_extra_buffer
        self.mamba_extra_buffer_lazy = mamba_extra_buffer_lazy
        self.mamba_ping_pong_track_buffer_size = (
            mamba_tracking_slots(True, enable_overlap_schedule)
            if enable_mamba_extra_buffer
            else 0
        )
        self.mamba_initial_tracking_slots = mamba_tracking_slots(
            enable_mamba_extra_buffer, enable_overlap_schedule, mamba_extra_buffer_lazy
        )
        dev = resolve_device(device)
        self.debug_mode = debug_mode
        self.req_index_to_mamba_index_mapping = torch.zeros(
            size + 1, dtype=torch.int64, device=dev
        )
        self.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.zeros(
            (size + 1, self.mamba_ping_pong_track_buffer_size),
            dtype=torch.int64,
            device=dev,
        )
        self.mamba_next_track_idx = torch.zeros(size + 1, dtype=torch.int64, device=dev)
        self.mamba_last_track_seqlen = torch.full(
            (size + 1,), -1, dtype=torch.int64, device=dev
        )
        super().__init__(size, max_context_len, device)

    # -- layers -----------------------------------------------------------------------------
    def mamba_layer_index(self, layer_id: int) -> int:
        try:
            return self.mamba_map[_checks.integer("layer_id", layer_id)]
        except KeyError:
            raise ValueError(
                f"layer {layer_id} is not a mamba layer (mamba layers: {sorted(self.mamba_map)})"
            ) from None

    def mamba2_layer_cache(self, layer_id: int):
        return self.mamba_pool.get_state(self.mamba_layer_index(layer_id))

    # -- rows and state slots ---------------------------------------------------------------
    def clear(self) -> None:
        super().clear()
        self.mamba_allocator.clear()
        self._reset_rows(slice(None))

    def _reset_rows(self, rows) -> None:
        self.req_index_to_mamba_index_mapping[rows] = 0
        self.req_index_to_mamba_ping_pong_track_buffer_mapping[rows] = 0
        self.mamba_next_track_idx[rows] = 0
        self.mamba_last_track_seqlen[rows] = -1

    def alloc(self, reqs) -> list[int] | None:
        """A row for each new request, then a state slot for each request that holds none (marked
        to be zeroed) and its initial tracking slots (extra buffer); a request that still holds
        its state keeps it. None when rows or slots are short, and then nothing was taken
        (memlab's choice: SGLang takes the rows, then asserts when state slots are short; its
        scheduler checks them first, ``ensure_mamba_capacity``)."""
        reqs = self._check_alloc(reqs)
        need = sum(1 for r in reqs if not r.kv.holds_mamba)
        if self.enable_mamba_extra_buffer:
            need += self.mamba_initial_tracking_slots * sum(
                1 for r in reqs if r.kv.mamba_ping_pong_track_buffer is None
            )
        if need > self.mamba_allocator.available_size():
            return None
        fresh = [r for r in reqs if not r.kv.holds_kv]
        select_index = super().alloc(reqs)
        if not select_index:  # None (rows short) or no request at all
            return select_index
        for r in reqs:
            # a state kept across rows (a chunk going on, a tree's) is reused
            if not r.kv.holds_mamba:
                r.kv.mamba_pool_idx = self.mamba_allocator.alloc(1)[0]
                r.kv.mamba_needs_clear = True
            if (
                self.enable_mamba_extra_buffer
                and r.kv.mamba_ping_pong_track_buffer is None
            ):
                self._alloc_ping_pong_buffer(r)
        rows = torch.tensor(
            select_index,
            dtype=torch.int64,
            device=self.req_index_to_mamba_index_mapping.device,
        )
        if fresh:
            self._reset_rows(
                torch.tensor(
                    [r.kv.req_pool_idx for r in fresh],
                    dtype=torch.int64,
                    device=rows.device,
                )
            )
        self.req_index_to_mamba_index_mapping[rows] = torch.stack(
            [r.kv.mamba_pool_idx for r in reqs]
        ).to(rows.device)
        if self.enable_mamba_extra_buffer:
            self.req_index_to_mamba_ping_pong_track_buffer_mapping[rows] = torch.stack(
                [r.kv.mamba_ping_pong_track_buffer for r in reqs]
            ).to(rows.device)
        return select_index

    def _alloc_ping_pong_buffer(self, req) -> None:
        """The tracking slots: all of them, or one in lazy mode (the other -1 until needed)."""
        n = self.mamba_initial_tracking_slots
        buf = torch.full(
            (self.mamba_ping_pong_track_buffer_size,),
            -1,
            dtype=torch.int64,
            device=self.mamba_allocator.device,
        )
        buf[:n] = self.mamba_allocator.alloc(n)
        req.kv.mamba_ping_pong_track_buffer = buf

    def ensure_tracking_slots(self, reqs) -> bool:
        """Lazy mode: give each request its missing tracking slots now (in its buffer and in its
        row); False (nothing taken) when short."""
        reqs = _checks.each_once("reqs", reqs, Req, "call", merge=True)  # each row once
        if not self.enable_mamba_extra_buffer or any(
            not r.kv.holds_mamba for r in reqs
        ):
            raise ValueError(
                "tracking slots need the extra buffer and requests that hold their state"
            )
        missing = [
            (r, int(i))
            for r in reqs
            for i in (r.kv.mamba_ping_pong_track_buffer < 0).nonzero()[:, 0]
        ]
        if not missing:
            return True
        slots = self.mamba_allocator.alloc(len(missing))
        if slots is None:
            return False
        pp = self.req_index_to_mamba_ping_pong_track_buffer_mapping
        for (r, i), slot in zip(missing, slots):
            r.kv.mamba_ping_pong_track_buffer[i] = slot
            pp[r.kv.req_pool_idx, i] = slot
        return True

    def free(self, row_or_req) -> None:
        """Give back the row only (SGLang's ``ReqToTokenPool.free``): the request keeps its state
        slot and tracking slots until ``free_mamba_cache``. The row's entries are reset."""
        row = row_or_req.kv.req_pool_idx if isinstance(row_or_req, Req) else row_or_req
        # a bad or free row is refused here, before anything changed
        super().free(row_or_req)
        self._reset_rows(int(row))

    def free_mamba_cache(
        self, req: Req, mamba_ping_pong_track_buffer_to_keep: int | None = None
    ) -> None:
        """Give back the request's state slot and its tracking slots (but the one at position
        ``mamba_ping_pong_track_buffer_to_keep``, which a tree adopted), state first."""
        _checks.instance("req", req, Req)
        _validate_free_mamba_cache(
            req,
            mamba_ping_pong_track_buffer_to_keep,
            self.mamba_ping_pong_track_buffer_size,
        )
        kv = req.kv
        self.mamba_allocator.free(kv.mamba_pool_idx.reshape(1))
        kv.mamba_pool_idx = None
        if self.enable_mamba_extra_buffer:
            buf = kv.mamba_ping_pong_track_buffer
            keep = [p != mamba_ping_pong_track_buffer_to_keep for p in range(len(buf))]
            self.mamba_allocator.free(
                buf[torch.tensor(keep, device=buf.device, dtype=torch.bool) & (buf > 0)]
            )
            kv.mamba_ping_pong_track_buffer = kv.mamba_cow_src_index = None
            kv.mamba_needs_clear = False
        if kv.holds_kv:  # the row stays the request's, its state entries go
            self.req_index_to_mamba_index_mapping[kv.req_pool_idx] = 0
            self.req_index_to_mamba_ping_pong_track_buffer_mapping[kv.req_pool_idx] = 0

    def execute_deferred_mamba_cow_and_clear(self, reqs) -> None:
        """Before the requests' first extend: a cached state copied into a new slot wins over the
        clear; any other new slot is zeroed (SGLang's ``_collect_deferred_mamba_cow_and_clear``
        in ``prepare_for_extend`` and ``ModelRunner._maybe_execute_deferred_mamba_cow_and_clear``
        on the forward stream, in one step here)."""
        clear, src, dst = [], [], []
        for r in _checks.each_once("reqs", reqs, Req, "batch"):
            kv = r.kv
            if kv.mamba_cow_src_index is not None:
                src.append(kv.mamba_cow_src_index.reshape(1))
                dst.append(kv.mamba_pool_idx.reshape(1))
            elif kv.mamba_needs_clear:
                clear.append(kv.mamba_pool_idx.reshape(1))
            kv.mamba_cow_src_index, kv.mamba_needs_clear = None, False
        if clear:
            self.mamba_pool.clear_slots(torch.cat(clear))
        if src:
            self.mamba_pool.copy_slots(torch.cat(src), torch.cat(dst))

    # -- state slots of running requests ----------------------------------------------------
    def get_mamba_indices(self, rows) -> torch.Tensor:
        table = self.req_index_to_mamba_index_mapping
        return table[_slot_tensor("rows", rows, table.device, self.size)]

    def next_track_slots(self, rows) -> torch.Tensor:
        """The tracking slot each row writes its next snapshot to; flips the ping-pong index."""
        pp = self.req_index_to_mamba_ping_pong_track_buffer_mapping
        if pp.shape[1] == 0:
            raise ValueError(
                "no tracking slots: the pool was built without enable_mamba_extra_buffer"
            )
        r = _slot_tensor("rows", rows, pp.device, self.size)
        idx = self.mamba_next_track_idx[r]
        slots = pp[r, idx]
        if (self.debug_mode or slots.device.type == "cpu") and bool((slots < 1).any()):
            raise ValueError(
                f"rows {r[slots < 1].tolist()} have no tracking slot yet "
                "(lazy mode: call ensure_tracking_slots first)"
            )
        self.mamba_next_track_idx[r] = (idx + 1) % pp.shape[1]
        return slots

    def track_state(self, rows, seq_lens) -> torch.Tensor:
        """Snapshot each row's state into its next tracking slot (what a prefix cache keeps)."""
        device = self.req_index_to_mamba_index_mapping.device
        r = _slot_tensor("rows", rows, device, self.size)
        lens = _slot_tensor("seq_lens", seq_lens, device, _checks.INT32_MAX)
        if lens.shape != r.shape:
            raise ValueError(f"{len(lens)} seq_lens for {len(r)} rows")
        dst = self.next_track_slots(r)
        self.mamba_pool.copy_slots(self.req_index_to_mamba_index_mapping[r], dst)
        self.mamba_last_track_seqlen[r] = lens
        return dst

    def held_mamba_slots(self) -> torch.Tensor:
        """Every slot some row maps (for ledgers and tests; a request that kept its state without
        a row is not in the table)."""
        both = torch.cat(
            (
                self.req_index_to_mamba_index_mapping[1:],
                self.req_index_to_mamba_ping_pong_track_buffer_mapping[1:].reshape(-1),
            )
        )
        return both[both > 0]


# -- argument checks at the boundary ----------------------------------------------------------


def _check_mamba_pool(size, layers, conv_shapes, temporal_shape, conv_dtype, ssm_dtype):
    """Positive sizes, one shape per conv-state component, floating-point state dtypes, and
    buffers small enough to exist (2**48 elements each at most)."""
    _checks.integer("size", size, 1, _checks.INT32_MAX)
    _checks.integer("num_mamba_layers (at least one mamba layer)", layers, 1)
    _checks.instance("conv_state_shape", conv_shapes, (list, tuple), "a list of shapes")
    if len(conv_shapes) == 0:
        raise ValueError(
            "conv_state_shape lists the conv-state components: one shape at least"
        )
    for name, shape in [("conv_state_shape", s) for s in conv_shapes] + [
        ("temporal_state_shape", temporal_shape)
    ]:
        dims = _checks.int_list(name, shape, 1, _checks.INT32_MAX)
        if layers * (size + 1) * prod(dims) > 2**48:
            raise ValueError(
                f"{name} {tuple(dims)}: a buffer of more than 2**48 values"
            )
    for name, dtype in (("conv_dtype", conv_dtype), ("ssm_dtype", ssm_dtype)):
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(
                f"{name} must be a floating-point torch.dtype, got {dtype!r}"
            )


def _validate_free_mamba_cache(req, keep, size) -> None:
    if not req.kv.holds_mamba:
        raise ValueError(f"{req!r} holds no mamba state: freed twice?")
    if keep not in (None, 0, 1) or (keep == 1 and size != 2):
        raise ValueError(f"cannot keep ping-pong entry {keep!r} of {size}")
