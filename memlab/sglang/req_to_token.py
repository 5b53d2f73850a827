"""The request table, request -> row: ``ReqToTokenPool`` of sglang/srt/mem_cache/memory_pool.py.

Each running request owns one row; ``req_to_token[row, i]`` is the physical KV slot of the
request's i-th token. Row 0 is padding: padded batch entries point at it and may write it freely.
The request itself is the slice of SGLang's ``Req`` and ``ReqKvInfo`` (managers/schedule_batch.py)
that these books read.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from memlab.common import _checks
from memlab.common.env import resolve_device


class ReqKvInfo:
    """A request's KV books (SGLang's ``ReqKvInfo``, managers/schedule_batch.py), kept on the
    request as ``req.kv``. The request owns the KV slots at positions ``[cache_protected_len,
    kv_allocated_len)`` of its row; the prefix cache owns ``[0, cache_protected_len)`` (matched or
    inserted), so that part is never the request's to free.

    SGLang's record also carries a cursor per sliding-window component, a retraction backup and
    the Mamba tracking cursors; memlab keeps the one SWA cursor (``swa_evicted_seqlen``), the Mamba
    state slot, its tracking slots and the deferred clear/copy (chapter 07), and keeps the
    tracking cursors per row on ``HybridReqToTokenPool``.
    """

    __slots__ = (
        "req_pool_idx",
        "cache_protected_len",
        "cache_inserted_len",
        "kv_committed_len",
        "kv_allocated_len",
        "swa_evicted_seqlen",
        "swa_evict_floor",
        "mamba_pool_idx",
        "mamba_ping_pong_track_buffer",
        "mamba_cow_src_index",
        "mamba_needs_clear",
    )

    def __init__(self):
        self.req_pool_idx: int | None = None  # its row in the request table
        self.cache_protected_len = 0  # the tree owns [0, here)
        # The request already inserted [0, here) into the tree: a later insert counts a hit only on
        # the nodes past it, so the request counts each node once.
        self.cache_inserted_len = 0
        self.kv_committed_len = 0  # KV written up to here (<= kv_allocated_len)
        self.kv_allocated_len = 0  # slots held up to here
        # Positions before here gave their SWA slots back as the window moved on (the full side
        # still holds them): SGLang's ``get_evicted_seqlen(ComponentType.SWA)``.
        self.swa_evicted_seqlen = 0
        # Prefill-aware SWA (SGLang's scheduler sets it to the prefill's end): [0, here) is never
        # window-evicted, and the prefix cache keys nothing past it.
        self.swa_evict_floor = 0
        self.mamba_pool_idx: torch.Tensor | None = (
            None  # its state slot (hybrid models), shape ()
        )
        self.mamba_ping_pong_track_buffer: torch.Tensor | None = (
            None  # its tracking slots, -1 = not taken yet
        )
        self.mamba_cow_src_index: torch.Tensor | None = (
            None  # a cached state to copy in before the first extend
        )
        self.mamba_needs_clear = (
            False  # a new state slot: zero it before the first extend
        )

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None

    @property
    def holds_mamba(self) -> bool:
        return self.mamba_pool_idx is not None

    @property
    def is_kv_released(self) -> bool:
        return self.kv_allocated_len == 0

    def mark_kv_released(self) -> None:
        self.kv_allocated_len = 0
        self.swa_evicted_seqlen = 0  # the window's cursor goes with the slots

    def __repr__(self):
        return (
            f"ReqKvInfo(row={self.req_pool_idx}, protected={self.cache_protected_len}, "
            f"inserted={self.cache_inserted_len}, committed={self.kv_committed_len}, "
            f"allocated={self.kv_allocated_len})"
        )


class Req:
    """The slice of SGLang's ``Req`` (managers/schedule_batch.py) the memory books read: its token
    ids, its KV books (``kv``) and where it meets the prefix cache.

    ``prefix_len``: tokens whose KV the request already has (a match, or the chunks done);
    ``extend_end``: where the chunk being computed ends; ``last_node`` / ``lock``: the tree node
    its prefix ends at and the lock it holds there (``RadixCache.lock``). SGLang keeps
    ``full_untruncated_fill_ids`` as an array it refreshes; memlab computes it.
    """

    __slots__ = (
        "rid",
        "origin_input_ids",
        "output_ids",
        "kv",
        "generation",
        "priority",
        "prefix_len",
        "extend_end",
        "last_node",
        "lock",
    )

    def __init__(self, rid, origin_input_ids=(), priority: int | None = None):
        self.rid = rid
        self.origin_input_ids = list(origin_input_ids)
        self.output_ids: list[int] = []
        self.kv = ReqKvInfo()
        # row generation seen when the row was taken (memlab's, for chapter 01)
        self.generation = -1
        self.priority = priority
        self.prefix_len = 0
        self.extend_end: int | None = None
        self.last_node = None
        self.lock = None

    @property
    def full_untruncated_fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def extend_len(self) -> int:
        return self.extend_end - self.prefix_len

    def reset_for_retract(self) -> None:
        """After its KV went back (``release_kv_cache(..., checkpoint=False)``): it starts over,
        with its output so far, as a new request would (SGLang's ``Req.reset_for_retract``)."""
        self.prefix_len = 0
        self.last_node = self.lock = self.extend_end = None
        self.kv.cache_protected_len = self.kv.cache_inserted_len = (
            self.kv.kv_committed_len
        ) = 0
        kv = self.kv
        kv.mamba_pool_idx = kv.mamba_ping_pong_track_buffer = kv.mamba_cow_src_index = (
            None
        )
        kv.mamba_needs_clear = False

    def __repr__(self):
        return f"Req({self.rid!r}, row={self.kv.req_pool_idx}, kv={self.kv.kv_allocated_len})"


class ReqToTokenPool:
    """``size`` usable rows (1..size) plus padding row 0, each ``max_context_len`` slots wide."""

    def __init__(self, size: int, max_context_len: int, device="cpu"):
        self.size = _checks.integer("size", size, 1, _checks.INT32_MAX)
        self.max_context_len = _checks.integer(
            "max_context_len", max_context_len, 1, _checks.INT32_MAX
        )
        self.device = resolve_device(device)
        self.req_to_token = torch.zeros(
            (self.size + 1, self.max_context_len), dtype=torch.int32, device=self.device
        )
        # Bumped on every allocation and never reset (not even by clear): an asynchronous reader
        # that stored (row, generation) detects reuse of the row by a changed generation.
        self.req_generation = torch.zeros(self.size + 1, dtype=torch.int64)
        self.clear()

    def clear(self) -> None:
        # Allocation takes from the tail (O(k)); which row a request gets does not matter.
        self.free_slots = list(range(1, self.size + 1))
        # O(1) double-free check
        self._row_free = bytearray([0]) + bytearray([1]) * self.size
        # the Req given each row by alloc (memlab's check)
        self._row_owner: list = [None] * (self.size + 1)

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc_rows(self, n: int) -> list[int] | None:
        """Take ``n`` rows, all or nothing (``None`` when short); bump their generations."""
        n = _checks.integer("n (rows to allocate)", n, 0)
        if n > len(self.free_slots):
            return None
        if n == 0:
            return []  # free_slots[-0:] would be the whole list
        rows = self.free_slots[-n:]
        # O(n) from the tail; popping the head would shift the whole list
        del self.free_slots[-n:]
        for r in rows:
            self._row_free[r] = 0
        self.req_generation[rows] += 1
        return rows

    def alloc(self, reqs: Iterable[Req]) -> list[int] | None:
        """Give each new request a row; a request continuing a chunked prefill keeps its row."""
        reqs = self._check_alloc(reqs)
        new = [r for r in reqs if not r.kv.holds_kv]
        rows = self.alloc_rows(len(new))
        if rows is None:
            return None
        gens = self.req_generation[rows].tolist()
        for r, row, gen in zip(new, rows, gens):
            r.kv.req_pool_idx, r.generation = row, gen
            self._row_owner[row] = r
        return [r.kv.req_pool_idx for r in reqs]

    def free(self, row_or_req) -> None:
        """Return a row (an int or a Req, whose ``req_pool_idx`` is then cleared)."""
        req = row_or_req if isinstance(row_or_req, Req) else None
        row = req.kv.req_pool_idx if req is not None else row_or_req
        self._check_free(row)
        row = int(row)
        self._row_free[row], self._row_owner[row] = 1, None
        self.free_slots.append(row)
        if req is not None:
            req.kv.req_pool_idx = None

    def write(self, indices, values) -> None:
        """``req_to_token[indices] = values``; indices as for tensor indexing, e.g. (row, slice).
        Rows and positions in range are the caller's contract, as in SGLang: memlab checks an int
        row or position, not a tensor of them (a scan on every write)."""
        self._check_write(indices, values)
        try:
            self.req_to_token[indices] = values
        # torch compares the shapes before it writes anything
        except RuntimeError as exc:
            raise ValueError(
                f"values of shape {tuple(values.shape)} do not fit req_to_token[indices]: {exc}"
            ) from None

    # -- argument checks (memlab's; SGLang asserts only that a kept row already holds KV) ----------
    def _check_alloc(self, reqs) -> list:
        """Each request once; a request that keeps its row (a chunked prefill) must already own KV
        and hold the row this pool gave it (not a free row, nor another request's)."""
        for r in _checks.each_once("reqs", reqs, Req, "alloc"):
            row = r.kv.req_pool_idx
            ours = (
                type(row) is int and 0 < row <= self.size and self._row_owner[row] is r
            )
            if r.kv.holds_kv and not (ours and r.kv.kv_allocated_len > 0):
                raise ValueError(
                    f"{r!r} claims row {row!r}, which this pool did not give it, or owns no KV "
                    "yet: only a chunked prefill that already wrote KV keeps its row"
                )
        return list(reqs)

    def _check_free(self, row) -> None:
        _checks.integer("row to free (row 0 is padding)", row, 1, self.size)
        if self._row_free[row]:
            raise ValueError(f"double free: row {row} is already free")

    def _check_write(self, indices, values) -> None:
        if type(values) is not int:  # one slot id, or a tensor of them
            _checks.index_tensor(
                "values (slot ids)", values, self.device, owner="table"
            )
        parts = indices if isinstance(indices, tuple) else (indices,)
        if len(parts) > 2 or not all(_is_index(ix) for ix in parts):
            raise TypeError(
                "indices must be a row, or (rows, positions): ints, slices or int tensors, "
                f"got {indices!r} (None would write every row)"
            )
        # an int row or position is read; a tensor of them is the caller's contract, as in SGLang
        for name, ix, hi in zip(
            ("row", "position"), parts, (self.size, self.max_context_len - 1)
        ):
            if type(ix) is int:
                _checks.integer(f"indices ({name})", ix, 0, hi)


def _is_index(ix) -> bool:
    """A row or position index: an int (not a bool), a slice, or an int32/int64 tensor."""
    if isinstance(ix, torch.Tensor):
        return ix.dtype in _checks.INDEX_DTYPES
    return isinstance(ix, slice) or (type(ix) is int)
