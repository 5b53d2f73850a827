"""The scheduler's side of allocation (sglang/srt/mem_cache/allocation.py, common.py).

SGLang keeps this glue in ``sglang/srt/mem_cache/allocation.py``: ``alloc_for_extend`` gives a
prefill batch its rows and slots and writes them into the request table (``write_cache_indices``),
``alloc_for_decode`` does the same for one new token per request, both reading each request's
last slot from its row (``get_last_loc``) and evicting from the prefix cache first when the pool
is short (``evict_from_tree_cache``). memlab's chapters, its tests, the side-by-side comparison
and the capstone engine all drive the allocators through these functions.

A request meets the prefix cache through ``sglang/srt/mem_cache/common.py``: after each prefill
chunk ``checkpoint_kv_cache`` puts what it computed into the tree, and when it ends
``release_kv_cache(req, tree_cache, checkpoint=...)`` checkpoints once more, frees what the tree
did not take (``free_kv_row``: row ranges as page-aligned segments), unlocks, frees the row.
Chapters 03 to 06 run before any tree exists; their requests end with ``release_kv_row``, what
``release_kv_cache`` does under a disabled tree.

Where memlab differs: SGLang passes a ``ScheduleBatch`` and raises when the pool is short (its
admission already counted the pages); memlab passes the pieces and returns None, having checked
the pool (whole pages) before taking anything, so a refused batch changes nothing, not even the
request table's generations.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from memlab.common import _checks
from memlab.common.utils import ceil_align
from memlab.sglang.allocator.reference import num_new_pages, num_new_pages_decode
from memlab.sglang.req_to_token import Req, ReqKvInfo


def _lens(xs, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A device tensor and its host copy (the allocators settle capacity on the host)."""
    cpu = torch.as_tensor(xs, dtype=torch.int64, device="cpu")
    return cpu.to(device), cpu


def get_last_loc(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
) -> torch.Tensor:
    """Each request's last slot (the one before its new tokens), -1 for an empty prefix."""
    _check_last_loc(req_to_token, req_pool_indices, prefix_lens)
    last = req_to_token[req_pool_indices, (prefix_lens - 1).clamp(min=0)].to(
        torch.int64
    )
    return torch.where(prefix_lens > 0, last, -1)


def evict_from_tree_cache(tree_cache, num_tokens: int) -> None:
    """Make ``num_tokens`` slots free if the prefix cache holds enough it may evict: the shortfall
    goes (SGLang's ``evict_from_tree_cache``, through the allocator's ``evict_to_free_tokens``)."""
    if tree_cache is not None and tree_cache.supports_prefix_sharing():
        # the allocator knows what it is short of (one pool, or each side of a composite)
        tree_cache.token_to_kv_pool_allocator.evict_to_free_tokens(
            tree_cache, num_tokens
        )


def alloc_paged_token_slots_extend(
    allocator,
    prefix_lens: Sequence[int],
    seq_lens: Sequence[int],
    last_loc: Sequence[int] | torch.Tensor,
) -> torch.Tensor | None:
    """Slots for tokens ``prefix_lens[i]..seq_lens[i]`` of each request (``last_loc``: the slot of
    its last prefix token, -1 for none), or None when the pool is short. (SGLang evicts from the
    tree cache here; memlab's ``alloc_for_extend`` has done so already, before its capacity
    check.)"""
    dev = allocator.device
    prefix, prefix_cpu = _lens(prefix_lens, dev)
    seq, seq_cpu = _lens(seq_lens, dev)
    last = torch.as_tensor(last_loc, dtype=torch.int64, device=dev)
    return allocator.alloc_extend(
        prefix, prefix_cpu, seq, seq_cpu, last, int((seq_cpu - prefix_cpu).sum())
    )


def alloc_paged_token_slots_decode(
    allocator,
    seq_lens: Sequence[int],
    last_loc: Sequence[int] | torch.Tensor,
    tree_cache=None,
) -> torch.Tensor | None:
    """One slot per request for its new token (``seq_lens`` count it), or None when short."""
    dev = allocator.device
    seq, seq_cpu = _lens(seq_lens, dev)
    if tree_cache is not None and tree_cache.evictable_size():
        ps = allocator.page_size
        evict_from_tree_cache(tree_cache, num_new_pages_decode(seq_cpu, ps) * ps)
    return allocator.alloc_decode(
        seq, seq_cpu, torch.as_tensor(last_loc, dtype=torch.int64, device=dev)
    )


def extend_positions(prefix_lens: torch.Tensor, extend_lens: torch.Tensor):
    """Token-level views of a prefill batch (host tensors): each token's request (its index in the
    batch), each request's first token in the batch, and each token's position in its request."""
    tok_req = torch.repeat_interleave(torch.arange(len(extend_lens)), extend_lens)
    starts = torch.cumsum(extend_lens, 0) - extend_lens
    return (
        tok_req,
        starts,
        torch.arange(len(tok_req)) - starts[tok_req] + prefix_lens[tok_req],
    )


def write_cache_indices(
    req_to_token_pool,
    rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """Row ``rows[i]`` gets its new slots at positions ``prefix_lens[i]..``: one scatter for the
    whole batch (``rows``, ``prefix_lens``, ``extend_lens``: host tensors)."""
    dev = req_to_token_pool.device
    tok_req, _, pos = extend_positions(prefix_lens, extend_lens)
    req_to_token_pool.write(
        (rows[tok_req].to(dev), pos.to(dev)), out_cache_loc.to(dev, torch.int32)
    )


def alloc_for_extend(
    req_to_token_pool,
    allocator,
    reqs: Sequence[Req],
    extend_lens: Sequence[int],
    prefix_indices: Sequence[torch.Tensor | None] | None = None,
    tree_cache=None,
) -> torch.Tensor | None:
    """A prefill batch: each request's next ``extend_lens[i]`` tokens get slots, in its row.

    A request that holds a row (a chunked prefill continuing) extends from its
    ``kv_allocated_len``; a new one takes a row and starts after ``prefix_indices[i]`` (the slots
    of a prefix-cache hit, written into its row first) or at 0. The pool is checked first (whole
    pages, after evicting from ``tree_cache``), then the rows: None when either is short, and
    then nothing was taken. Returns the new slots in batch order (``out_cache_loc``); each
    request's ``kv_allocated_len`` and ``kv_committed_len`` move to its new length.

    ``prefix_indices`` come from the tree's match, and SGLang trusts them: so does memlab, but
    debug mode refuses slots the allocator does not hold.
    """
    _check_extend(
        req_to_token_pool, allocator, reqs, extend_lens, prefix_indices, tree_cache
    )
    prefix_indices = [None] * len(reqs) if prefix_indices is None else prefix_indices
    # a continuing chunk's window has moved on since its last chunk
    if tree_cache is not None:
        maybe_evict_swa(
            tree_cache, reqs, [r.kv.kv_allocated_len for r in reqs], decode=False
        )
    fresh = [not r.kv.holds_kv for r in reqs]
    prefix_lens = torch.tensor(
        [
            len(p) if new and p is not None else (0 if new else r.kv.kv_allocated_len)
            for r, p, new in zip(reqs, prefix_indices, fresh)
        ],
        dtype=torch.int64,
    )
    extend = torch.as_tensor(extend_lens, dtype=torch.int64)
    seq_lens = prefix_lens + extend
    ps = allocator.page_size
    need = num_new_pages(prefix_lens, seq_lens, ps) * ps
    if tree_cache is not None and tree_cache.evictable_size():
        evict_from_tree_cache(tree_cache, need)
    if need > allocator.available_size():
        return None
    if req_to_token_pool.alloc(reqs) is None:
        return None
    rows = torch.tensor([r.kv.req_pool_idx for r in reqs], dtype=torch.int64)
    for r, p, new in zip(reqs, prefix_indices, fresh):
        if new and p is not None and len(p):
            req_to_token_pool.write(
                (r.kv.req_pool_idx, slice(0, len(p))), p.to(torch.int32)
            )
    dev = req_to_token_pool.device
    last = get_last_loc(
        req_to_token_pool.req_to_token, rows.to(dev), prefix_lens.to(dev)
    )
    out = alloc_paged_token_slots_extend(allocator, prefix_lens, seq_lens, last)
    assert out is not None, "alloc_extend refused after the pool was checked"
    write_cache_indices(req_to_token_pool, rows, prefix_lens, extend, out)
    for r, s in zip(reqs, seq_lens.tolist()):
        r.kv.kv_allocated_len = r.kv.kv_committed_len = s
    return out


def alloc_for_decode(
    req_to_token_pool, allocator, reqs: Sequence[Req], tree_cache=None
) -> torch.Tensor | None:
    """A decode step: one new slot per request, written into its row; None when the pool is short
    even after evicting from ``tree_cache`` (nothing taken). The new token's position is each
    request's ``kv_allocated_len``: what its window no longer reads goes back first."""
    _check_decode(req_to_token_pool, allocator, reqs, tree_cache)
    if tree_cache is not None:
        maybe_evict_swa(
            tree_cache, reqs, [r.kv.kv_allocated_len for r in reqs], decode=True
        )
    dev = req_to_token_pool.device
    rows = torch.tensor(
        [r.kv.req_pool_idx for r in reqs], device=dev, dtype=torch.int64
    )
    seq = torch.tensor([r.kv.kv_allocated_len + 1 for r in reqs], dtype=torch.int64)
    # the new token's position; a decoding request holds KV before it
    pos = (seq - 1).to(dev)
    last = req_to_token_pool.req_to_token[rows, pos - 1].to(torch.int64)
    out = alloc_paged_token_slots_decode(allocator, seq, last, tree_cache)
    if out is None:
        return None
    req_to_token_pool.write((rows, pos), out.to(torch.int32))
    # one token per request without speculative decoding: written this step
    for r in reqs:
        r.kv.kv_allocated_len += 1
        r.kv.kv_committed_len += 1
    return out


def maybe_evict_swa(
    tree_cache, reqs: Sequence[Req], pre_lens: Sequence[int], *, decode: bool
) -> None:
    """Before a batch's allocation, free the SWA slots each request's window left behind (SGLang's
    ``ScheduleBatch.maybe_evict_swa``, then ``free_swa_out_of_window_slots`` per request):
    ``pre_lens[i]`` is the first position the batch computes for ``reqs[i]``, whose query reads
    back ``tree_cache.sliding_window_size`` positions. A decode batch always slides; a prefill
    batch only where nothing is shared (a new request holds no slots yet and is skipped). The
    frees go in one group. SGLang's overlap scheduler skips a request's first decode step (its
    prefill may still be running); memlab runs one batch at a time and has no such step."""
    _checks.duck("tree_cache", tree_cache, *TREE)
    if not tree_cache.supports_swa() or (
        not decode and tree_cache.supports_prefix_sharing()
    ):
        return
    allocator = tree_cache.token_to_kv_pool_allocator
    req_to_token = tree_cache.req_to_token_pool.req_to_token
    allocator.free_group_begin()
    for req, pre_len in zip(reqs, pre_lens):
        kv = req.kv
        if kv.holds_kv:
            kv.swa_evicted_seqlen = allocator.release_out_of_window(
                req_to_token,
                kv.req_pool_idx,
                pre_len,
                kv.swa_evicted_seqlen,
                tree_cache.sliding_window_size,
                kv.cache_protected_len,
                tree_cache.supports_prefix_sharing(),
            )
    allocator.free_group_end()


# -- the request and the prefix cache (sglang/srt/mem_cache/common.py) -------------------------


def coalesce_ranges(ranges):
    """Merge adjacent half-open ranges, so a page a seam falls inside is freed once."""
    _ranges(ranges)
    merged: list[tuple[int, int]] = []
    for start, end in ranges:
        if merged and start == merged[-1][1]:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def free_kv_row_segments(
    allocator, segments, *, swa_evicted_seqlen: int = 0, swa_dead_lo: int = 0
) -> None:
    """Free ascending, page-disjoint ``(slots, start_pos)`` pieces of one request's row, each as a
    segment: a whole page per page touched, no dedup (SGLang's ``free_kv_row_segments``).

    With a sliding window, positions ``[swa_dead_lo, swa_evicted_seqlen)`` already gave their SWA
    slots back (``release_out_of_window``): that part goes back on the full side only
    (``free_full_segments``), the rest on both sides (``free_segments``)."""
    dead_lo, dead_hi = swa_dead_lo, max(swa_evicted_seqlen, swa_dead_lo)
    dead, alive = [], []
    for slots, start_pos in segments:
        end_pos = start_pos + slots.numel()
        lo, hi = (
            min(max(dead_lo, start_pos), end_pos),
            min(max(dead_hi, start_pos), end_pos),
        )
        if hi <= lo:
            alive.append((slots, start_pos))
            continue
        dead.append((slots[lo - start_pos : hi - start_pos], lo))
        if lo > start_pos:
            alive.append((slots[: lo - start_pos], start_pos))
        if end_pos > hi:
            alive.append((slots[hi - start_pos :], hi))
    # two separate frees: a page split between them would be freed twice
    aligned = not (dead and alive) or swa_evicted_seqlen % allocator.page_size == 0
    assert aligned, f"SWA eviction cursor {swa_evicted_seqlen} splits a page"
    if dead:
        allocator.free_full_segments(dead)
    if alive:
        allocator.free_segments(alive)


def free_kv_row(
    req_to_token_pool, allocator, kv: ReqKvInfo, ranges, swa_evicted_seqlen: int = 0
) -> None:
    """Give back row positions ``ranges`` (ascending, disjoint, half-open) of ``kv``'s row
    (SGLang's ``BasePrefixCache.free_kv_row``; a tree calls it with its own pool and allocator).
    ``swa_evicted_seqlen``: how far a sliding window already released (memlab keeps that cursor
    beside the request, SGLang in ``kv``). The ranges lie in what the request owns,
    ``[cache_protected_len, kv_allocated_len)``: the tree's part is the tree's to free."""
    ranges = _check_free_kv_row(
        req_to_token_pool, allocator, kv, ranges, swa_evicted_seqlen
    )
    row = req_to_token_pool.req_to_token[kv.req_pool_idx]
    dev = allocator.device
    free_kv_row_segments(
        allocator,
        [(row[s:e].to(dev), s) for s, e in coalesce_ranges(ranges) if e > s],
        swa_evicted_seqlen=swa_evicted_seqlen,
        swa_dead_lo=kv.cache_protected_len,
    )


def checkpoint_kv_cache(req: Req, tree_cache) -> None:
    """After a prefill chunk of a running request: the tree takes what it computed so far
    (``tree_cache.checkpoint(req, up_to=req.extend_end)``); the next chunk starts there."""
    _check_running(req, "checkpoint_kv_cache")
    _checks.duck("tree_cache", tree_cache, *TREE)
    _checks.integer("req.extend_end", req.extend_end, 0, req.kv.kv_allocated_len)
    tree_cache.checkpoint(req, up_to=req.extend_end)
    req.prefix_len = req.extend_end


def release_kv_cache(req: Req, tree_cache, *, checkpoint: bool) -> None:
    """The request gives its KV back (SGLang's ``release_kv_cache``): with ``checkpoint`` (it
    finished) the tree first keeps what it can key; then whatever the tree does not own,
    ``[cache_protected_len, kv_committed_len)``, goes back, the lock is dropped, the slots
    allocated past the committed length go back, and the row returns to the request table.

    Without ``checkpoint`` (a retraction, an abort) the tree keeps only what earlier checkpoints
    gave it. A disabled tree checkpoints nothing, so the whole row goes back. SGLang's owned
    length is the committed one unless a stop ends the output inside it; memlab's outputs end on
    a token, so it is ``kv_committed_len``.

    A request whose prefix the tree protects holds the lock on it (``req.lock``): releasing it
    without one would leave that prefix locked for good, so it is refused, as is a request
    released twice (it holds no row).
    """
    _check_running(req, "release_kv_cache")
    _check_release(req, tree_cache, checkpoint)
    kv = req.kv
    owned_kv_len = kv.kv_committed_len
    if checkpoint:
        tree_cache.checkpoint(req, up_to=owned_kv_len)
    # the protected prefix is the tree's
    tree_cache.free_kv_row(kv, [(kv.cache_protected_len, owned_kv_len)])
    tree_cache.unlock(req.lock)
    req.lock = None
    ps = tree_cache.token_to_kv_pool_allocator.page_size
    # allocated past the commit: whole pages after the last one used
    start = ceil_align(owned_kv_len, ps)
    if start < kv.kv_allocated_len:
        tree_cache.free_kv_row(kv, [(start, kv.kv_allocated_len)])
    tree_cache.req_to_token_pool.free(req)
    kv.mark_kv_released()


def release_kv_row(
    req_to_token_pool, allocator, req: Req, swa_evicted_seqlen: int = 0
) -> torch.Tensor:
    """A request ends where no prefix cache exists yet (chapters 03 to 07): what
    ``release_kv_cache`` does under a disabled tree (SGLang 0.5.23 always builds one): its slots
    go back as segments, its row to the request table. Returns the slots it held."""
    _checks.duck("req_to_token_pool", req_to_token_pool, *TABLE)
    _check_running(req, "release_kv_row")
    _checks.integer(
        "swa_evicted_seqlen", swa_evicted_seqlen, 0, req.kv.kv_allocated_len
    )
    kv = req.kv
    slots = req_to_token_pool.req_to_token[kv.req_pool_idx, : kv.kv_allocated_len].to(
        torch.int64
    )
    free_kv_row(
        req_to_token_pool,
        allocator,
        kv,
        [(kv.cache_protected_len, kv.kv_allocated_len)],
        swa_evicted_seqlen,
    )
    req_to_token_pool.free(req)
    kv.mark_kv_released()
    kv.kv_committed_len = 0
    return slots


# -- argument checks (memlab's, at the boundary: SGLang's scheduler builds these batches itself) --


TABLE = (("req_to_token", "alloc", "free", "write"), "a ReqToTokenPool")
ALLOCATOR = (("alloc_extend", "alloc_decode", "page_size"), "an allocator")
TREE = (("supports_prefix_sharing", "evictable_size", "checkpoint"), "a prefix cache")


def _check_batch(pool, allocator, tree, reqs) -> None:
    """The books a batch runs on (the tree may be None), and its requests, each once."""
    _checks.duck("req_to_token_pool", pool, *TABLE)
    _checks.duck("allocator", allocator, *ALLOCATOR)
    _checks.duck("tree_cache", tree, *TREE, optional=True)
    _checks.each_once("reqs", reqs, Req, "alloc")


def _check_extend(pool, allocator, reqs, extend_lens, prefix_indices, tree) -> None:
    # before any row is taken: a bad argument found later would leave its row taken
    _check_batch(pool, allocator, tree, reqs)
    _checks.int_list("extend_lens", extend_lens, -_checks.INT32_MAX)
    hits = [None] * len(reqs) if prefix_indices is None else prefix_indices
    _checks.instance("prefix_indices", hits, (list, tuple), "a list")
    if not len(extend_lens) == len(hits) == len(reqs):
        raise ValueError(f"{len(extend_lens)} extend_lens, {len(hits)} prefix_indices")
    for i, (r, n, hit) in enumerate(zip(reqs, extend_lens, hits)):
        _check_hit(allocator, hit)
        # the prefix: a continuing chunk's so far, or the hit's
        p = r.kv.kv_allocated_len if r.kv.holds_kv else (0 if hit is None else len(hit))
        if n < 0:
            raise ValueError(
                f"request {i}: seq_len {p + n} is shorter than its prefix {p} "
                f"(extend_lens[{i}] = {n})"
            )
        # A row holds max_context_len positions. SGLang's scheduler never asks for more: it
        # refuses or cuts a longer prompt (validate_input_length in
        # sglang/srt/managers/utils.py) and caps max_new_tokens below the context length
        # (Scheduler.init_req_max_new_tokens in sglang/srt/managers/scheduler.py). memlab
        # refuses it here, before a slot is taken.
        _checks.integer(f"request {i}: seq_len", p + n, 0, pool.max_context_len)


def _check_hit(allocator, hit) -> None:
    """A cache hit's slots: 1-D ids (in debug mode, slots the allocator holds: they are the tree's,
    and SGLang trusts the tree that found them)."""
    if hit is not None:
        _checks.index_tensor("prefix_indices[i]", hit, ndim=1)
        if allocator.debug_mode and len(hit) and hasattr(allocator, "_ledger"):
            _checks.held_slots(allocator, "prefix_indices", hit)


def _check_decode(pool, allocator, reqs, tree) -> None:
    _check_batch(pool, allocator, tree, reqs)
    width = pool.max_context_len  # the new token must fit its row, as in _check_extend
    for i, r in enumerate(reqs):
        _check_running(r, "a decode step (it continues what alloc_for_extend began)")
        _checks.integer(f"request {i}: seq_len", r.kv.kv_allocated_len + 1, 0, width)


def _check_running(req, where: str) -> None:
    """A request that holds a row (one released already holds none)."""
    _checks.instance("req", req, Req)
    if not req.kv.holds_kv:
        raise ValueError(f"{where}: {req!r} holds no row (released, or never begun)")


def _check_release(req, tree, checkpoint) -> None:
    _checks.duck("tree_cache", tree, *TREE)
    _checks.instance("checkpoint", checkpoint, bool)
    # the tree protects them: the request holds their lock
    n = req.kv.cache_protected_len
    if req.lock is None and n > 0 and not getattr(tree, "disable", False):
        raise ValueError(f"{req!r} has no lock on its {n} protected tokens")


def _check_free_kv_row(pool, allocator, kv, ranges, swa_evicted_seqlen) -> list:
    """Half-open ``(start, end)`` int pairs inside what the request owns, and the window's
    cursor: whole pages of the row."""
    _checks.duck("req_to_token_pool", pool, *TABLE)
    _checks.duck("allocator", allocator, *ALLOCATOR)
    _checks.instance("kv", kv, ReqKvInfo)
    lo, hi = kv.cache_protected_len, kv.kv_allocated_len
    for start, end in _ranges(ranges):
        if not (kv.holds_kv and lo <= start <= end <= hi):
            raise ValueError(f"range ({start}, {end}) is not inside what {kv!r} owns")
    cursor = _checks.integer("swa_evicted_seqlen", swa_evicted_seqlen, 0, hi)
    if cursor % allocator.page_size:
        raise ValueError(f"swa_evicted_seqlen {cursor} is not whole pages")
    return ranges


def _ranges(ranges) -> list:
    """Half-open ``(start, end)`` pairs of ints."""
    _checks.instance("ranges", ranges, (list, tuple), "a list of (start, end)")
    for rng in ranges:
        _checks.instance("each range", rng, (list, tuple), "a (start, end) pair")
        if len(_checks.int_list("a range", rng)) != 2:
            raise TypeError(f"a range is (start, end), got {rng!r}")
    return ranges


def _check_last_loc(req_to_token, rows, prefix_lens) -> None:
    """The table (2-D), one row and one prefix length per request; on the CPU, each inside it."""
    _checks.index_tensor("req_to_token", req_to_token, ndim=2)
    _checks.index_tensor("req_pool_indices", rows, req_to_token.device, ndim=1)
    _checks.index_tensor("prefix_lens", prefix_lens, req_to_token.device, ndim=1)
    if rows.shape != prefix_lens.shape:
        raise ValueError(f"{len(rows)} rows for {len(prefix_lens)} prefix lengths")
    if req_to_token.device.type == "cpu" and len(rows):
        _checks.values_in("req_pool_indices", rows, 0, req_to_token.shape[0] - 1)
        _checks.values_in("prefix_lens", prefix_lens, 0, req_to_token.shape[1])
