"""The scheduler's side of allocation (sglang/srt/mem_cache/allocation.py, common.py): rows, slots, the table.

SGLang keeps this glue in ``sglang/srt/mem_cache/allocation.py``: ``alloc_for_extend`` gives a
prefill batch its rows and slots and writes them into the request table (``write_cache_indices``),
``alloc_for_decode`` does the same for one new token per request, both reading each request's
last slot from its row (``get_last_loc``) and evicting from the prefix cache first when the pool
is short (``evict_from_tree_cache``). memlab's chapters, its tests, the side-by-side comparison
and the capstone engine all drive the allocators through these functions.

Where memlab differs: SGLang passes a ``ScheduleBatch`` and raises when the pool is short (its
admission already counted the pages); memlab passes the pieces and returns None, having checked
the pool (whole pages) before taking anything, so a refused batch changes nothing, not even the
request table's generations.
"""

from __future__ import annotations

from typing import Sequence

import torch

from memlab.sglang.allocator.reference import num_new_pages, num_new_pages_decode
from memlab.sglang.req_to_token import Req


def _lens(xs, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A device tensor and its host copy (the allocators settle capacity on the host)."""
    cpu = torch.as_tensor(xs, dtype=torch.int64, device="cpu")
    return cpu.to(device), cpu


def get_last_loc(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
    """Each request's last slot (the one before its new tokens), -1 for an empty prefix."""
    last = req_to_token[req_pool_indices, (prefix_lens - 1).clamp(min=0)].to(torch.int64)
    return torch.where(prefix_lens > 0, last, -1)


def evict_from_tree_cache(tree_cache, allocator, num_tokens: int) -> None:
    """Make ``num_tokens`` slots free if the prefix cache holds enough it may evict."""
    short = num_tokens - allocator.available_size()
    if tree_cache is not None and short > 0:
        tree_cache.evict(short)


def alloc_paged_token_slots_extend(allocator, prefix_lens: Sequence[int], seq_lens: Sequence[int],
                                   last_loc: Sequence[int] | torch.Tensor) -> torch.Tensor | None:
    """Slots for tokens ``prefix_lens[i]..seq_lens[i]`` of each request (``last_loc``: the slot of
    its last prefix token, -1 for none), or None when the pool is short. (SGLang evicts from the
    tree cache here; memlab's ``alloc_for_extend`` has already done so, before its capacity check.)"""
    dev = allocator.device
    prefix, prefix_cpu = _lens(prefix_lens, dev)
    seq, seq_cpu = _lens(seq_lens, dev)
    last = torch.as_tensor(last_loc, dtype=torch.int64, device=dev)
    return allocator.alloc_extend(prefix, prefix_cpu, seq, seq_cpu, last, int((seq_cpu - prefix_cpu).sum()))


def alloc_paged_token_slots_decode(allocator, seq_lens: Sequence[int], last_loc: Sequence[int] | torch.Tensor,
                                   tree_cache=None) -> torch.Tensor | None:
    """One slot per request for its new token (``seq_lens`` count it), or None when short."""
    dev = allocator.device
    seq, seq_cpu = _lens(seq_lens, dev)
    if tree_cache is not None and tree_cache.evictable_size():
        ps = allocator.page_size
        evict_from_tree_cache(tree_cache, allocator, num_new_pages_decode(seq_cpu, ps) * ps)
    return allocator.alloc_decode(seq, seq_cpu, torch.as_tensor(last_loc, dtype=torch.int64, device=dev))


def extend_positions(prefix_lens: torch.Tensor, extend_lens: torch.Tensor):
    """Token-level views of a prefill batch (host tensors): each token's request (its index in the
    batch), each request's first token in the batch, and each token's position in its request."""
    tok_req = torch.repeat_interleave(torch.arange(len(extend_lens)), extend_lens)
    starts = torch.cumsum(extend_lens, 0) - extend_lens
    return tok_req, starts, torch.arange(len(tok_req)) - starts[tok_req] + prefix_lens[tok_req]


def write_cache_indices(req_to_token_pool, rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                        out_cache_loc: torch.Tensor) -> None:
    """Row ``rows[i]`` gets its new slots at positions ``prefix_lens[i]..``: one scatter for the
    whole batch (``rows``, ``prefix_lens``, ``extend_lens``: host tensors)."""
    dev = req_to_token_pool.device
    tok_req, _, pos = extend_positions(prefix_lens, extend_lens)
    req_to_token_pool.write((rows[tok_req].to(dev), pos.to(dev)), out_cache_loc.to(dev, torch.int32))


def alloc_for_extend(req_to_token_pool, allocator, reqs: Sequence[Req], extend_lens: Sequence[int],
                     prefix_indices: Sequence[torch.Tensor | None] | None = None,
                     tree_cache=None) -> torch.Tensor | None:
    """A prefill batch: each request's next ``extend_lens[i]`` tokens get slots, written into its row.

    A request that holds a row (a chunked prefill continuing) extends from its
    ``kv_allocated_len``; a new one takes a row and starts after ``prefix_indices[i]`` (the slots
    of a prefix-cache hit, written into its row first) or at 0. The pool is checked first (whole
    pages, after evicting from ``tree_cache``), then the rows: None when either is short, and
    then nothing was taken. Returns the new slots in batch order (``out_cache_loc``).
    """
    prefix_indices = [None] * len(reqs) if prefix_indices is None else prefix_indices
    fresh = [r.req_pool_idx is None for r in reqs]
    prefix_lens = torch.tensor([len(p) if new and p is not None else (0 if new else r.kv_allocated_len)
                                for r, p, new in zip(reqs, prefix_indices, fresh)], dtype=torch.int64)
    extend = torch.as_tensor(extend_lens, dtype=torch.int64)
    seq_lens = prefix_lens + extend
    ps = allocator.page_size
    need = num_new_pages(prefix_lens, seq_lens, ps) * ps
    if tree_cache is not None and tree_cache.evictable_size():
        evict_from_tree_cache(tree_cache, allocator, need)
    if need > allocator.available_size():
        return None
    if req_to_token_pool.alloc(reqs) is None:
        return None
    rows = torch.tensor([r.req_pool_idx for r in reqs])
    for r, p, new in zip(reqs, prefix_indices, fresh):
        if new and p is not None and len(p):
            req_to_token_pool.write((r.req_pool_idx, slice(0, len(p))), p.to(torch.int32))
    dev = req_to_token_pool.device
    last = get_last_loc(req_to_token_pool.req_to_token, rows.to(dev), prefix_lens.to(dev))
    out = alloc_paged_token_slots_extend(allocator, prefix_lens, seq_lens, last)
    assert out is not None, "alloc_extend refused after the pool was checked"
    write_cache_indices(req_to_token_pool, rows, prefix_lens, extend, out)
    for r, s in zip(reqs, seq_lens.tolist()):
        r.kv_allocated_len = s
    return out


def alloc_for_decode(req_to_token_pool, allocator, reqs: Sequence[Req], tree_cache=None) -> torch.Tensor | None:
    """A decode step: one new slot per request, written into its row; None when the pool is short
    even after evicting from ``tree_cache`` (nothing taken)."""
    dev = req_to_token_pool.device
    rows = torch.tensor([r.req_pool_idx for r in reqs], device=dev)
    seq = torch.tensor([r.kv_allocated_len + 1 for r in reqs], dtype=torch.int64)
    pos = (seq - 1).to(dev)  # the new token's position; a decoding request holds KV before it
    last = req_to_token_pool.req_to_token[rows, pos - 1].to(torch.int64)
    out = alloc_paged_token_slots_decode(allocator, seq, last, tree_cache)
    if out is None:
        return None
    req_to_token_pool.write((rows, pos), out.to(torch.int32))
    for r in reqs:
        r.kv_allocated_len += 1
    return out


def release_kv_cache(req_to_token_pool, allocator, req: Req, start: int = 0) -> torch.Tensor:
    """A request without a prefix cache ends: its slots from ``start`` on go back to the allocator
    (the first ``start`` belong to someone else, e.g. a prefix cache), its row to the request
    table. Returns the slots it held."""
    slots = req_to_token_pool.req_to_token[req.req_pool_idx, :req.kv_allocated_len].to(torch.int64)
    if len(slots) > start:
        allocator.free(slots[start:].to(allocator.device))
    req_to_token_pool.free(req)
    req.kv_allocated_len = 0
    return slots
