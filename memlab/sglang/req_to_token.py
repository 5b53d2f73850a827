"""The request table, request -> row: ``ReqToTokenPool`` of sglang/srt/mem_cache/memory_pool.py.

Each running request owns one row; ``req_to_token[row, i]`` is the physical KV slot of the
request's i-th token. Row 0 is padding: padded batch entries point at it and may write it freely.
"""

from __future__ import annotations

from typing import Iterable

import torch

from memlab.common import _checks
from memlab.common.env import resolve_device


class Req:
    """The slice of a request the memory books care about."""

    __slots__ = ("rid", "req_pool_idx", "kv_allocated_len", "generation")

    def __init__(self, rid, req_pool_idx: int | None = None, kv_allocated_len: int = 0):
        self.rid = rid
        self.req_pool_idx = req_pool_idx
        self.kv_allocated_len = kv_allocated_len  # tokens of this request that already hold KV slots
        self.generation = -1  # row generation seen when the row was taken

    def __repr__(self):
        return f"Req({self.rid!r}, row={self.req_pool_idx}, kv={self.kv_allocated_len})"


class ReqToTokenPool:
    """``size`` usable rows (1..size) plus padding row 0, each ``max_context_len`` slots wide."""

    def __init__(self, size: int, max_context_len: int, device="cpu"):
        self.size, self.max_context_len = _checks.req_to_token_pool(size, max_context_len)
        self.device = resolve_device(device)
        self.req_to_token = torch.zeros((self.size + 1, self.max_context_len), dtype=torch.int32, device=self.device)
        # Bumped on every allocation and never reset (not even by clear): an asynchronous reader
        # that stored (row, generation) detects reuse of the row by a changed generation.
        self.req_generation = torch.zeros(self.size + 1, dtype=torch.int64)
        self.clear()

    def clear(self) -> None:
        # Allocation takes from the tail (O(k)); which row a request gets does not matter.
        self.free_slots = list(range(1, self.size + 1))
        self._row_free = bytearray([0]) + bytearray([1]) * self.size  # O(1) double-free check

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc_rows(self, n: int) -> list[int] | None:
        """Take ``n`` rows, all or nothing (``None`` when short); bump their generations."""
        n = _checks.alloc_rows(n)
        if n > len(self.free_slots):
            return None
        if n == 0:
            return []  # free_slots[-0:] would be the whole list
        rows = self.free_slots[-n:]
        del self.free_slots[-n:]  # O(n) from the tail; popping the head would shift the whole list
        for r in rows:
            self._row_free[r] = 0
        self.req_generation[rows] += 1
        return rows

    def alloc(self, reqs: Iterable[Req]) -> list[int] | None:
        """Give each new request a row; a request continuing a chunked prefill keeps its row."""
        reqs = list(reqs)
        _checks.alloc_reqs(reqs)
        new = [r for r in reqs if r.req_pool_idx is None]
        rows = self.alloc_rows(len(new))
        if rows is None:
            return None
        gens = self.req_generation[rows].tolist()
        for r, row, gen in zip(new, rows, gens):
            r.req_pool_idx, r.generation = row, gen
        return [r.req_pool_idx for r in reqs]

    def free(self, row_or_req) -> None:
        """Return a row (an int or a Req, whose ``req_pool_idx`` is then cleared)."""
        req = row_or_req if isinstance(row_or_req, Req) else None
        row = req.req_pool_idx if req is not None else row_or_req
        _checks.free_row(self, row)
        row = int(row)
        self._row_free[row] = 1
        self.free_slots.append(row)
        if req is not None:
            req.req_pool_idx = None

    def write(self, indices, values) -> None:
        """``req_to_token[indices] = values``; indices as for tensor indexing, e.g. (row, slice)."""
        self.req_to_token[indices] = values
