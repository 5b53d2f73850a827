"""Layer 1, the request table: request -> row (SGLang's ``ReqToTokenPool``).

Each running request owns one row; ``req_to_token[row, i]`` is the physical KV slot of the
request's i-th token. Row 0 is padding: padded batch entries point at it and may write it freely.
"""

from __future__ import annotations

from typing import Iterable

import torch

from memlab.env import resolve_device


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


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class ReqToTokenPool:
    """``size`` usable rows (1..size) plus padding row 0, each ``max_context_len`` slots wide."""

    def __init__(self, size: int, max_context_len: int, device="cpu"):
        self.size = _positive_int("size", size)
        self.max_context_len = _positive_int("max_context_len", max_context_len)
        self.device = resolve_device(device)
        self.req_to_token = torch.zeros((size + 1, max_context_len), dtype=torch.int32, device=self.device)
        # Bumped on every allocation and never reset (not even by clear): an asynchronous reader
        # that stored (row, generation) detects reuse of the row by a changed generation.
        self.req_generation = torch.zeros(size + 1, dtype=torch.int64)
        self.clear()

    def clear(self) -> None:
        # Allocation takes from the tail (O(k)); which row a request gets does not matter.
        self.free_slots = list(range(1, self.size + 1))
        self._row_free = bytearray([0]) + bytearray([1]) * self.size  # O(1) double-free check

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc_rows(self, n: int) -> list[int] | None:
        """Take ``n`` rows, all or nothing (``None`` when short); bump their generations."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"alloc_rows needs a count >= 0, got {n!r}")
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
        new = [r for r in reqs if r.req_pool_idx is None]
        if len({id(r) for r in reqs}) != len(reqs):
            dup = next(r for i, r in enumerate(reqs) if any(r is q for q in reqs[:i]))
            raise ValueError(f"{dup!r} appears twice in one alloc: it would take two rows and leak one")
        for r in reqs:
            if r.req_pool_idx is not None and r.kv_allocated_len <= 0:
                raise ValueError(f"{r!r} holds row {r.req_pool_idx} but owns no KV yet: "
                                 "only a chunked prefill that already wrote KV may keep its row")
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
        if isinstance(row, bool) or not isinstance(row, int) or not 1 <= row <= self.size:
            raise ValueError(f"cannot free row {row!r}: rows are 1..{self.size} (row 0 is padding)")
        if self._row_free[row]:
            raise ValueError(f"double free: row {row} is already free")
        self._row_free[row] = 1
        self.free_slots.append(row)
        if req is not None:
            req.req_pool_idx = None

    def write(self, indices, values) -> None:
        """``req_to_token[indices] = values``; indices as for tensor indexing, e.g. (row, slice)."""
        self.req_to_token[indices] = values
