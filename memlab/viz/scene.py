"""A small scheduler stand-in that drives the real SGLang-side books and snapshots them.

``Scene`` owns a ``ReqToTokenPool``, an allocator and optionally a KV pool, and does what a
scheduler does around them: give a new request a row, allocate its tokens' slots with
``alloc_extend`` / ``alloc_decode``, write them into the request's row, free them when it ends.
After each step ``snap`` freezes the books into a ``Books`` for the drawings.
"""

from __future__ import annotations

import torch

from memlab.allocator.reference import num_new_pages
from memlab.req_to_token import Req, ReqToTokenPool
from memlab.viz.state import Books, read_books


def _t(xs, device="cpu") -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64, device=device)


class Scene:
    def __init__(self, req_pool: ReqToTokenPool, allocator, kvcache=None):
        self.req_pool, self.allocator, self.kvcache = req_pool, allocator, kvcache
        self.reqs: dict[str, Req] = {}
        self.frames: list[Books] = []

    # -- reading -----------------------------------------------------------------------------
    def books(self, caption: str = "", new_slots=(), part_of=None, note: str = "") -> Books:
        return read_books(caption, self.req_pool, self.allocator, self.reqs.values(), new_slots, part_of,
                          self.kvcache, note)

    def snap(self, caption: str, new_slots=(), part_of=None, note: str = "") -> Books:
        b = self.books(caption, new_slots, part_of, note)
        self.frames.append(b)
        return b

    def slots(self, rid) -> list[int]:
        r = self.reqs[rid]
        return self.req_pool.req_to_token[r.req_pool_idx, : r.kv_allocated_len].tolist()

    def last_loc(self, rid) -> int:
        s = self.slots(rid)
        return s[-1] if s else -1

    # -- scheduling ----------------------------------------------------------------------------
    def extend_batch(self, lens: dict) -> torch.Tensor | None:
        """One prefill batch: request ``rid`` gets ``lens[rid]`` new tokens (new requests get a row).

        Like a scheduler, it checks KV capacity first (whole pages, from ``available_size``), then
        asks the request table for rows (all or nothing), then allocates the slots. Returns the new
        slots in batch order, or None when pages or rows are short; a refused batch changes nothing.
        """
        batch = [self.reqs.get(rid) or Req(rid) for rid in lens]
        pre = [r.kv_allocated_len for r in batch]
        seq = [p + n for p, n in zip(pre, lens.values())]
        ps = self.allocator.page_size
        if num_new_pages(torch.tensor(pre), torch.tensor(seq), ps) * ps > self.allocator.available_size():
            return None
        if self.req_pool.alloc(batch) is None:  # rows only for requests without one
            return None
        last = [self.last_loc(r.rid) if r.rid in self.reqs else -1 for r in batch]
        dev = self.allocator.device
        out = self.allocator.alloc_extend(_t(pre, dev), _t(pre), _t(seq, dev), _t(seq), _t(last, dev),
                                          sum(lens.values()))
        i = 0
        for r, p, s in zip(batch, pre, seq):
            self.req_pool.write((r.req_pool_idx, slice(p, s)), out[i:i + s - p].to(torch.int32).cpu())
            r.kv_allocated_len = s
            self.reqs[r.rid] = r
            i += s - p
        return out

    def decode(self, rids) -> torch.Tensor | None:
        """One decode step: each request in ``rids`` gets one more token."""
        batch = [self.reqs[r] for r in rids]
        seq = [r.kv_allocated_len + 1 for r in batch]
        last = [self.last_loc(r) for r in rids]
        dev = self.allocator.device
        out = self.allocator.alloc_decode(_t(seq, dev), _t(seq), _t(last, dev))
        if out is None:
            return None
        for r, s, slot in zip(batch, seq, out.tolist()):
            self.req_pool.write((r.req_pool_idx, s - 1), slot)
            r.kv_allocated_len = s
        return out

    def clear(self) -> None:
        """Both tables back to empty (generations survive: ``ReqToTokenPool.clear`` never resets them)."""
        for r in self.reqs.values():
            r.req_pool_idx, r.kv_allocated_len = None, 0
        self.reqs.clear()
        self.req_pool.clear()
        self.allocator.clear()

    def finish(self, rid) -> list[int]:
        """The request ends: its slots go back to the allocator, its row to the request table."""
        slots = self.slots(rid)
        if slots:
            self.allocator.free(_t(slots, self.allocator.device))
        r = self.reqs.pop(rid)
        self.req_pool.free(r)
        r.kv_allocated_len = 0
        return slots
