"""The scenarios the chapters' widgets replay, each built by driving the real library.

Every function returns an object whose ``frames`` a ``Stepper`` walks through and whose live
objects (pools, allocators) the chapter keeps using afterwards, so "the real code on the same
state" is literally the same state.
"""

from __future__ import annotations

import torch

from memlab.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from memlab.kv_pool import MHATokenToKVPool
from memlab.req_to_token import ReqToTokenPool
from memlab.viz.scene import Scene


def orientation(page_size: int = 4, size: int = 32, rows: int = 4, width: int = 12, dtype=torch.float16,
                head_dim: int = 8) -> Scene:
    """Chapter 00: three requests arrive, decode one token each, one leaves, a fourth reuses its room."""
    kv = MHATokenToKVPool(size, page_size, dtype, head_num=2, head_dim=head_dim, layer_num=2)
    sc = Scene(ReqToTokenPool(rows, width), PagedTokenToKVPoolAllocator(size, page_size, kvcache=kv), kv)
    sc.snap("Empty books: row 0, page 0 and slots 0-3 are padding and never handed out")
    for rid, n in (("A", 5), ("B", 3), ("C", 8)):
        out = sc.extend_batch({rid: n})
        r = sc.reqs[rid]
        sc.snap(f"{rid} arrives with {n} tokens: row {r.req_pool_idx} (taken from the tail of the free rows), "
                f"slots {out.tolist()}", new_slots=out.tolist())
    lens = [sc.reqs[r].kv_allocated_len + 1 for r in "ABC"]
    out = sc.decode(["A", "B", "C"])
    opened = [r for r, n in zip("ABC", lens) if (n - 1) % page_size == 0]
    sc.snap(f"One decode step: A, B, C each add a token, in slots {out.tolist()}"
            + (f"; {', '.join(opened)} opened a new page" if opened else ""), new_slots=out.tolist())
    slots = sc.finish("B")
    sc.snap(f"B finishes: its row and its page go back (slots {slots} are free again)")
    out = sc.extend_batch({"D": 4})
    sc.snap(f"D arrives with 4 tokens: row {sc.reqs['D'].req_pool_idx}, slots {out.tolist()}: B's row and B's "
            "page again (freed rows and pages are the next handed out)", new_slots=out.tolist())
    return sc


def _slots(out) -> list[int]:
    return [] if out is None else out.tolist()


def request_table(rows: int = 5, width: int = 8) -> Scene:
    """Chapter 01: rows from the tail, reuse and generations, a chunked prefill keeping its row, clear()."""
    sc = Scene(ReqToTokenPool(rows, width), TokenToKVPoolAllocator(rows * width))
    sc.snap(f"{rows} free rows; alloc_rows takes from the tail of free_slots, so row {rows} goes first")
    sc.extend_batch({"A": 3, "B": 2})
    sc.snap(f"A and B arrive together: alloc_rows(2) takes the last two free rows, "
            f"A -> row {sc.reqs['A'].req_pool_idx}, B -> row {sc.reqs['B'].req_pool_idx}; each generation is now 1")
    sc.extend_batch({"C": 4})
    sc.snap(f"C arrives: row {sc.reqs['C'].req_pool_idx}")
    b_row = sc.reqs["B"].req_pool_idx
    sc.finish("B")
    sc.snap(f"B finishes: row {b_row} is appended to free_slots, so it is the next one handed out")
    sc.extend_batch({"D": 2})
    d = sc.reqs["D"]
    sc.snap(f"D arrives and gets row {d.req_pool_idx} again, generation {d.generation}: a reader that stored "
            f"(row {d.req_pool_idx}, generation 1) for B now sees the row was reused")
    sc.extend_batch({"E": 3})
    e_row = sc.reqs["E"].req_pool_idx
    sc.snap(f"E's long prompt is prefilled in chunks; the first chunk (3 tokens) takes row {e_row}")
    before = sc.req_pool.available_size()
    sc.extend_batch({"E": 3})
    sc.snap(f"E's second chunk: alloc([E]) keeps row {e_row} (E already owns KV); free rows stay at {before}")
    rows0 = sc.req_pool.alloc_rows(0)
    sc.snap(f"alloc_rows(0) returns {rows0}: free_slots[-0:] would have been the whole list")
    short = sc.extend_batch({"F": 1, "G": 1, "H": 1})
    sc.snap(f"F, G, H arrive together but only {sc.req_pool.available_size()} row is free: alloc returns "
            f"{short}, and nothing changes (all or nothing)")
    sc.clear()
    sc.snap("clear(): every row is free again, but the generations stay: a reused row never repeats one")
    return sc


def token_allocator(need_sort: bool, size: int = 16) -> Scene:
    """Chapter 03: one slot per token; FIFO reuse, or staged frees merged and sorted on demand."""
    sc = Scene(ReqToTokenPool(5, 8), TokenToKVPoolAllocator(size, need_sort=need_sort))
    mode = "need_sort=True" if need_sort else "need_sort=False"
    sc.snap(f"{mode}: slots 1..{size} free, slot 0 is padding; allocation takes the head of free_pages")
    for rid, n in (("A", 4), ("B", 3), ("C", 6)):
        out = sc.extend_batch({rid: n})
        sc.snap(f"{rid} takes {n} slots from the head: {_slots(out)}", new_slots=_slots(out))
    for rid in ("A", "B"):
        freed = sc.finish(rid)
        where = "are staged in release_pages" if need_sort else "join the TAIL of free_pages (FIFO)"
        sc.snap(f"{rid} finishes: its slots {freed} {where}")
    free_now = len(sc.allocator.free_pages)
    out = sc.extend_batch({"D": 4})
    if need_sort:
        how = (f"only {free_now} slots are on free_pages, so the staged ones are merged and sorted first"
               if free_now < 4 else "free_pages is deep enough: nothing is merged")
    else:
        how = "the oldest free slots go first"
    sc.snap(f"D takes 4 slots: {_slots(out)} ({how})", new_slots=_slots(out))
    out = sc.extend_batch({"E": 2})
    sc.snap(f"E takes 2 slots: {_slots(out)}", new_slots=_slots(out))
    return sc


def extend_parts(prefix: int, seq: int, page_size: int) -> list[int]:
    """Which part (1, 2, 3) each new token of one request falls in: for colouring, not allocating."""
    old_end = -(-prefix // page_size) * page_size
    full_end = seq // page_size * page_size
    return [1 if pos < old_end else 2 if pos < full_end else 3 for pos in range(prefix, seq)]


def paged_extend(page_size: int = 4, size: int = 48, backend: str = "torch", device="cpu") -> Scene:
    """Chapter 04: prefill batches on a paged allocator, each new token coloured by its part.

    ``device``: where the allocator's free list lives (the kernel's device for backend="triton")."""
    sc = Scene(ReqToTokenPool(4, 24), PagedTokenToKVPoolAllocator(size, page_size, device=device, backend=backend))
    sc.snap(f"page_size {page_size}: pages 1..{size // page_size} free; part colours: 1 = rest of the old "
            "page, 2 = whole new pages, 3 = a new partial page")
    for batch in ({"A": 6, "B": 3}, {"A": 5, "B": 9, "C": 4}, {"C": 7}):
        pre = {r: sc.reqs[r].kv_allocated_len if r in sc.reqs else 0 for r in batch}
        out = sc.extend_batch(batch)
        part_of, i, desc = {}, 0, []
        for r, n in batch.items():
            parts = extend_parts(pre[r], pre[r] + n, page_size)
            for s, p in zip(out[i:i + n].tolist(), parts):
                part_of[s] = p
            i += n
            counts = [parts.count(k) for k in (1, 2, 3)]
            desc.append(f"{r} {pre[r]}->{pre[r] + n} (parts {counts[0]}/{counts[1]}/{counts[2]})")
        sc.snap("alloc_extend: " + ", ".join(desc), new_slots=_slots(out), part_of=part_of,
                note=f"slots in batch order: {_slots(out)}")
    return sc


def decode_steps(page_size: int = 4, steps: int = 6, prompts=(("A", 3), ("B", 4), ("C", 6))) -> Scene:
    """Chapter 05: decode steps; a request opens a page exactly when its new length % page_size == 1."""
    sc = Scene(ReqToTokenPool(4, 16), PagedTokenToKVPoolAllocator(64, page_size))
    out = sc.extend_batch(dict(prompts))
    sc.snap("Prefill: " + ", ".join(f"{r} has {n} tokens" for r, n in prompts), new_slots=_slots(out))
    rids = [r for r, _ in prompts]
    for step in range(1, steps + 1):
        lens = {r: sc.reqs[r].kv_allocated_len + 1 for r in rids}
        out = sc.decode(rids)
        opened = [r for r in rids if (lens[r] - 1) % page_size == 0]
        what = (f"{', '.join(opened)} open{'s' if len(opened) == 1 else ''} a page (seq_len % {page_size} == 1)"
                if opened else "nobody crosses a page boundary: every slot is last_loc + 1")
        sc.snap(f"decode step {step}: seq_lens {list(lens.values())}; {what}", new_slots=_slots(out))
    return sc


def _error(fn) -> str:
    try:
        fn()
    except (ValueError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def paged_free(story: str, page_size: int = 4) -> Scene:
    """Chapter 05: four ways to give pages back, on the state ``decode_steps`` leaves behind."""
    stories = ("free", "free_segment", "free group", "double free")
    if story not in stories:
        raise ValueError(f"story must be one of {stories}, got {story!r}")
    sc = Scene(ReqToTokenPool(4, 16), PagedTokenToKVPoolAllocator(64, page_size, debug_mode=True))
    sc.extend_batch({"A": 6, "B": 9, "C": 13})
    sc.snap("A, B and C hold 6, 9 and 13 tokens; the allocator runs in debug mode (it checks its books)")
    al = sc.allocator
    if story == "free":
        slots = sc.slots("A")
        pages = sorted({s // page_size for s in slots})
        sc.finish("A")
        sc.snap(f"A finishes: free({slots}) releases each page once, pages {pages} = unique(slot // {page_size}), "
                "at the HEAD of the free list (LIFO: the next allocation reuses them)")
        out = sc.extend_batch({"D": 5})
        sc.snap(f"D takes A's pages again: slots {_slots(out)}", new_slots=_slots(out))
    elif story == "free_segment":
        run = sc.slots("C")[:8]
        al.free_segment(torch.tensor(run), start_pos=0)
        sc.snap(f"C's first 8 positions leave a sliding window: free_segment(slots {run}, start_pos=0) takes every "
                f"{page_size}th slot ({run[::page_size]}), one per page, with no unique()")
        err = _error(lambda: al.free_segment(torch.tensor(sc.slots("C")[10:13]), start_pos=10))
        sc.snap("An unaligned run (positions 10..12) is refused: every 4th slot would not be one per page",
                note=err)
    elif story == "free group":
        al.free_group_begin()
        sc.finish("A")
        sc.snap("free_group_begin(), then A finishes: its slots are only queued (yellow), not released")
        sc.finish("B")
        sc.snap("B finishes inside the same group: queued too")
        c = sc.slots("C")
        al.free(torch.tensor(c[:10]))
        al.free(torch.tensor(c[10:]))  # as a scheduler frees a request and its over-allocated tail apart
        r = sc.reqs.pop("C")
        sc.req_pool.free(r)
        r.kv_allocated_len = 0
        sc.snap(f"C finishes, freed in two pieces ({c[:10]} and {c[10:]}): page {c[10] // page_size} is under both")
        al.free_group_end()
        sc.snap("free_group_end(): one release for the whole group, its pages deduplicated once, "
                "one concatenation instead of three")
        sc.snap("Groups do not nest", note=_error(lambda: (al.free_group_begin(), al.free_group_begin())))
        al.free_group_end()  # close the group the refused call left open
    else:
        slots = sc.slots("A")
        sc.finish("A")
        sc.snap("A finishes: its pages go back")
        sc.snap("A stale copy of A's slots is freed again: debug mode catches the double free",
                note=_error(lambda: al.free(torch.tensor(slots))))
    return sc


def prefix_cache(enable_caching: bool = True, num_blocks: int = 12, block_size: int = 4):
    """Chapter 06: vLLM's block pool; a prefix hit, reverse-order frees, lazy eviction."""
    from memlab.viz.vllm_books import VllmScene

    sc = VllmScene(num_blocks, block_size, enable_caching)
    mode = "prefix caching on" if enable_caching else "prefix caching off"
    sc.snap(f"{mode}: block 0 is the null block, popped at start; blocks 1..{num_blocks - 1} are free")

    def arrive(rid, tokens, what):
        r = sc.arrive(rid, tokens)
        if r is None:
            sc.snap(f"{rid} needs more blocks than are free: allocate_slots returns None, nothing changes")
            return
        hit = f"; {r['hit_tokens']} tokens hit the cache (blocks {sorted(r['hit'])})" if r["hit"] else ""
        ev = f"; block {sorted(r['evicted'])} still carried a hash: evicted now" if r["evicted"] else ""
        sc.snap(f"{rid} arrives with {len(tokens)} tokens{what}: new blocks {r['new']}{hit}{ev}",
                new=r["new"], hit=r["hit"], evicted=r["evicted"])

    prompt = list(range(10))
    arrive("A", prompt, "")
    for t in (100, 101):
        sc.decode("A", t)
    sc.snap("A decodes 2 tokens: its third block fills up"
            + (" and gets a hash (chained on the first two)" if enable_caching else ""))
    freed = sc.finish("A")
    where = ("in reverse, hashed ones to the TAIL: the prefix's end will be evicted before its start"
             if enable_caching else "in reverse, to the head (nothing is cached)")
    sc.snap(f"A finishes: blocks {freed[::-1]} are freed {where}")
    arrive("B", prompt[:8] + [50, 51, 52], " (its first 8 are A's)")
    arrive("C", list(range(200, 224)), "")
    arrive("D", list(range(300, 308)), "")
    freed = sc.finish("B")
    sc.snap(f"B finishes: reversed {freed[::-1]}; "
            + ("the unhashed partial block goes to the head, hashed ones to the tail" if enable_caching
               else "all to the head, in that order"))
    return sc


def sliding_window(page_size: int = 2, size: int = 32, size_swa: int = 12, window: int = 4):
    """Chapter 07: a sliding-window model's two ledgers; out-of-window SWA pages go back early."""
    from memlab.hybrid.swa import SWATokenToKVPoolAllocator
    from memlab.viz.hybrid_books import SwaScene

    al = SWATokenToKVPoolAllocator(size, size_swa, page_size, debug_mode=True)
    sc = SwaScene(ReqToTokenPool(4, 16), al, window)
    sc.snap(f"Two ledgers: {size // page_size} full pages, {size_swa // page_size} SWA pages (window {window} tokens)")
    out = sc.extend_batch({"A": 6, "B": 4})
    sc.snap("A (6 tokens) and B (4) arrive: every token gets a full slot AND an SWA slot, paired in the map",
            new_slots=_slots(out))
    for rid in ("A", "B"):
        freed = sc.release(rid)
        sc.snap(f"{rid}'s next token reads only the last {window}: SWA slots {freed} go back (whole pages); "
                "the full side keeps them" if freed else f"{rid}: nothing wholly outside the window yet")
    for step in (1, 2, 3):
        out = sc.decode(["A", "B"])
        freed = [s for rid in ("A", "B") for s in sc.release(rid)]
        sc.snap(f"decode step {step}: new full slots {_slots(out)}; out of window, SWA slots {freed} released",
                new_slots=_slots(out))
    slots = sc.finish("B")
    sc.snap(f"B finishes: SWA side first (it reads the map), then its full slots {slots}")
    return sc


def mamba_slots(extra_buffer: bool = True, overlap: bool = True, rows: int = 3, mamba_size: int = 9):
    """Chapter 07: a hybrid request table; each row owns a state slot and its tracking slots."""
    from memlab.hybrid.mamba import HybridReqToTokenPool
    from memlab.req_to_token import Req
    from memlab.viz.hybrid_books import read_mamba

    pool = HybridReqToTokenPool(rows, 16, mamba_size, conv_state_shape=[(8, 3)], temporal_state_shape=(2, 4, 4),
                                mamba_layer_ids=[0], enable_mamba_extra_buffer=extra_buffer,
                                enable_overlap_schedule=overlap, debug_mode=True)
    reqs = {}
    frames = []

    def snap(caption, note=""):
        frames.append(read_mamba(caption, pool, reqs.values(), note))

    per_row = 1 + pool.mamba_initial_tracking_slots
    snap(f"{mamba_size} state slots (0 is padding); each request takes {per_row}: its state"
         + (f" and {per_row - 1} tracking slot{'s' if per_row > 2 else ''}" if per_row > 1 else ""))
    for rid in ("A", "B"):
        r = Req(rid)
        pool.alloc([r])
        reqs[rid] = r
        snap(f"{rid} arrives: row {r.req_pool_idx}, state slot {int(pool.get_mamba_indices([r.req_pool_idx])[0])} "
             "(zeroed: no stale recurrent state)")
    if extra_buffer:
        row = reqs["A"].req_pool_idx
        for seq in (16, 32, 48):
            dst = int(pool.track_state([row], [seq])[0])
            snap(f"A snapshots its state at {seq} tokens into tracking slot {dst}; the * moves to the other "
                 "slot (ping-pong: the next write never hits the one still being read)")
    a = reqs.pop("A")
    row = a.req_pool_idx
    pool.free(a)
    snap(f"A finishes: row {row} and all its slots go back (to the tail), every tracking field reset")
    c = Req("C")
    if pool.alloc([c]) is None:
        snap("C arrives but the state slots are short: no row is taken")
    else:
        reqs["C"] = c
        pp = pool.req_index_to_mamba_ping_pong_track_buffer_mapping[c.req_pool_idx].tolist()
        state = int(pool.get_mamba_indices([c.req_pool_idx])[0])
        snap(f"C arrives: row {c.req_pool_idx} again, but slots {[state] + pp} "
             "from the head of the free list (A's went to the tail)")
    return frames
