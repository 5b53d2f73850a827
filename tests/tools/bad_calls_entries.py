"""The entry points ``bad_calls.py`` drives: SGLang's side of memlab and the common layer.

Each is a good call on small fresh objects; ``bad_calls`` makes it bad. The books functions read
the objects against what the harness knows the requests hold (``env.held``: slot tensors of
requests that are still running)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from memlab_tests.tools.bad_calls import T, entry, scenario

E = SimpleNamespace


# ---- books -------------------------------------------------------------------------------------


def page_books(alloc, held_slots=(), extra_pages=(), lost_ok=False) -> None:
    """Every page is free or held, once; no padding page and no foreign page is free. With
    ``lost_ok`` (after a free the harness cannot follow) a page may be neither: the caller let
    go of it without freeing it, which is the caller's leak, not the allocator's."""
    free = alloc.get_all_free_pages().tolist()
    lo, hi = alloc.page_id_range()
    assert len(set(free)) == len(free), "a page is on the free list twice"
    assert all(lo <= p <= hi for p in free), (
        f"padding or a foreign page is free: {free}"
    )
    held = set(extra_pages)
    for s in held_slots:
        held |= set((s.to(torch.int64) // alloc.page_size).tolist())
    both = held & set(free)
    assert not both, f"pages {sorted(both)[:4]} are free and held"
    lost = (hi - lo + 1) - len(free) - len(held)
    assert lost == 0 or (lost > 0 and lost_ok), (
        f"{lost} pages are neither free nor held"
    )


def alloc_books(env, lost_ok=False) -> None:
    a, result = env.alloc, getattr(env, "result", None)
    got = isinstance(result, torch.Tensor) and result.dim() == 1
    held = list(env.held) + ([result] if got else [])
    tree_pages = env.tree.device_pages() if getattr(env, "tree", None) else ()
    if hasattr(a, "full_to_swa_index_mapping"):  # the two-pool SWA allocator
        page_books(a.full_attn_allocator, held, tree_pages, lost_ok)
        if a.swa_attn_allocator is not None:
            swa = [a.full_to_swa_index_mapping[s.to(torch.int64)] for s in held]
            page_books(a.swa_attn_allocator, [s[s > 0] for s in swa], (), True)
    elif hasattr(a, "swa_attn_allocator"):  # the unified composite
        a.debug_mode = True
        a.full_attn_allocator.debug_mode = a.swa_attn_allocator.debug_mode = True
        a.check_books()
        page_books(a.full_attn_allocator, held, tree_pages, lost_ok)
    else:
        page_books(a, held, tree_pages, lost_ok)


def freed_books(env) -> None:
    """After a free of r1: r0 still held; r1's pages free, or let go by the caller."""
    alloc_books(E(**{**vars(env), "held": env.held[:1]}), lost_ok=True)


def rtp_books(pool) -> None:
    free = pool.free_slots
    assert len(set(free)) == len(free), "a row is free twice"
    assert all(1 <= r <= pool.size for r in free), (
        "padding row 0 or a foreign row is free"
    )
    flags = [r for r in range(1, pool.size + 1) if pool._row_free[r]]
    assert sorted(free) == flags, "the row flags disagree with the free list"


def tree_books(env) -> None:
    t = env.tree
    t.debug_mode = True
    t._check_tree()
    locked = sum(1 for r in env.reqs if r.lock is not None)
    assert t.protected_size() == 0 or locked, "tokens locked by no running request"


class _NoTree:
    """A prefix cache that holds nothing evictable (what the scheduler's questions read)."""

    @staticmethod
    def evictable_size():
        return 0

    @staticmethod
    def supports_prefix_sharing():
        return True

    @staticmethod
    def evict(params):
        return None


# ---- the request table, chapter 01 ---------------------------------------------------------------


def _rtp(debug):
    from memlab.sglang.req_to_token import Req, ReqToTokenPool

    pool = ReqToTokenPool(4, 16)
    reqs = [Req(i, [1, 2, 3]) for i in range(2)]
    pool.alloc(reqs[:1])
    reqs[0].kv.kv_allocated_len = 3
    return E(pool=pool, reqs=reqs, fresh=Req(9, [1]))


def register_request_table():
    from memlab.sglang.req_to_token import ReqToTokenPool

    books = lambda env: rtp_books(env.pool)  # noqa: E731
    entry(
        "ReqToTokenPool()",
        lambda d: E(),
        lambda env, **a: ReqToTokenPool(**a),
        lambda env: dict(size=4, max_context_len=8, device="cpu"),
    )
    entry(
        "ReqToTokenPool.alloc_rows",
        _rtp,
        lambda env, n: env.pool.alloc_rows(n),
        lambda env: dict(n=2),
        books,
        refuses=True,
    )
    entry(
        "ReqToTokenPool.alloc",
        _rtp,
        lambda env, reqs: env.pool.alloc(reqs),
        lambda env: dict(reqs=[env.fresh]),
        books,
        refuses=True,
        also=lambda env: [
            ("reqs", "a running request twice", [env.reqs[0], env.reqs[0]]),
            ("reqs", "a Req of another pool's row", [_foreign_req()]),
        ],
    )
    entry(
        "ReqToTokenPool.free",
        _rtp,
        lambda env, row: env.pool.free(row),
        lambda env: dict(row=env.reqs[0].kv.req_pool_idx),
        books,
        also=lambda env: [("row", "a Req without a row", env.fresh)],
    )
    entry(
        "ReqToTokenPool.write",
        _rtp,
        lambda env, indices, values: env.pool.write(indices, values),
        lambda env: dict(
            indices=(env.reqs[0].kv.req_pool_idx, slice(0, 2)),
            values=T(5, 6, dtype=torch.int32),
        ),
        books,
        also=lambda env: [
            ("indices", "a position past the row", (1, 99)),
            ("indices", "row tensor past the table", (T(9), T(0))),
            ("values", "slot ids of int8", T(5, 6, dtype=torch.int8)),
        ],
    )
    scenario(
        entry("ReqToTokenPool.free (order)", _rtp, None, lambda env: {}, books),
        "a row freed twice",
        lambda env: env.pool.free(env.reqs[0].kv.req_pool_idx),
        lambda env: env.pool.free(env.reqs[0].kv.req_pool_idx),
    )


def _foreign_req():
    from memlab.sglang.req_to_token import Req, ReqToTokenPool

    other, r = ReqToTokenPool(4, 16), Req(7, [1, 2])
    other.alloc([r])
    r.kv.kv_allocated_len = 2
    return r


# ---- the allocators, chapters 03 to 05 ---------------------------------------------------------


def _paged(debug, ps=4, backend="torch", need_sort=False):
    """A paged allocator with two running requests: r0 holds 6 tokens (pages 1-2, the second
    half full), r1 holds 4 (page 3): what the bad calls may not disturb."""
    from memlab.sglang.allocator import make_allocator

    a = make_allocator(32, ps, debug_mode=debug, backend=backend, need_sort=need_sort)
    r0 = a.alloc(8)[:6] if ps > 1 else a.alloc(6)
    r1 = a.alloc(4)
    if ps > 1:  # r0's unused 2 slots stay in its page
        pass
    return E(alloc=a, held=[r0, r1], r0=r0, r1=r1)


def _token(debug):
    return _paged(debug, ps=1)


def _extend_args(env):
    """r0 extends by 5 (from 6: its page's last 2 slots, then a new page), a new request by 3."""
    ps = env.alloc.page_size
    pre, seq = T(6, 0), T(11, 3)
    last = T(int(env.r0[-1]), -1)
    return dict(
        prefix_lens=pre,
        prefix_lens_cpu=pre.clone(),
        seq_lens=seq,
        seq_lens_cpu=seq.clone(),
        last_loc=last if ps > 1 else T(int(env.r0[-1]), -1),
        extend_num_tokens=8,
    )


def _decode_args(env):
    return dict(
        seq_lens=T(7, 5),
        seq_lens_cpu=T(7, 5),
        last_loc=T(int(env.r0[-1]), int(env.r1[-1])),
    )


def _alloc_entries(kind, build):
    books = alloc_books
    also_free = lambda env: [  # noqa: E731
        ("free_index", "the padding slot", T(0)),
        ("free_index", "a free slot", T(31)),
        ("free_index", "a slot held twice in one call", torch.cat((env.r1, env.r1))),
    ]
    entry(
        f"{kind}.alloc",
        build,
        lambda env, need_size: env.alloc.alloc(need_size),
        lambda env: dict(need_size=env.alloc.page_size * 2),
        books,
        refuses=True,
    )
    entry(
        f"{kind}.alloc_extend",
        build,
        lambda env, **a: env.alloc.alloc_extend(**a),
        _extend_args,
        books,
        refuses=True,
        also=lambda env: [
            ("last_loc", "last_loc of a free page", T(30, -1)),
            ("last_loc", "last_loc of the other request", T(int(env.r1[-1]), -1)),
            ("seq_lens_cpu", "host copy disagrees", T(12, 3)),
            ("prefix_lens_cpu", "host copy disagrees", T(5, 0)),
        ],
    )
    entry(
        f"{kind}.alloc_decode",
        build,
        lambda env, **a: env.alloc.alloc_decode(**a),
        _decode_args,
        books,
        refuses=True,
        also=lambda env: [("last_loc", "last_loc of a free page", T(30, 29))],
    )
    entry(
        f"{kind}.free",
        build,
        lambda env, free_index: env.alloc.free(free_index),
        lambda env: dict(free_index=env.r1),
        freed_books,
        also=also_free,
    )
    entry(
        f"{kind}.free_segment",
        build,
        lambda env, free_index, start_pos: env.alloc.free_segment(
            free_index, start_pos
        ),
        lambda env: dict(free_index=env.r1, start_pos=0),
        freed_books,
        also=also_free,
    )
    entry(
        f"{kind}.free_page_ids",
        build if "SWA" not in kind else None,
        lambda env, page_ids: env.alloc.free_page_ids(page_ids),
        lambda env: dict(page_ids=env.r1[:1] // env.alloc.page_size),
        freed_books,
    )
    entry(
        f"{kind}.free_segments",
        build,
        lambda env, segments: env.alloc.free_segments(segments),
        lambda env: dict(segments=[(env.r1, 0)]),
        freed_books,
        also=lambda env: [
            (
                "segments",
                "two segments on one page",
                [(env.r1[:1], 0), (env.r1[1:], 1)],
            ),
            ("segments", "a segment of three", [(env.r1, 0, 0)]),
        ],
    )
    entry(
        f"{kind}.max_new_tokens_for_memory",
        build,
        lambda env, **a: env.alloc.max_new_tokens_for_memory(**a),
        lambda env: dict(
            input_tokens=10,
            max_new_tokens=20,
            token_capacity=32,
            sliding_window_size=None,
            chunk_size=None,
        ),
        books,
    )
    entry(
        f"{kind}.prealloc_fits",
        build,
        lambda env, **a: env.alloc.prealloc_fits(**a),
        lambda env: dict(
            tree_cache=_NoTree,
            full_tokens=8,
            swa_tokens=0,
            full_budget_tokens=16,
            swa_budget_tokens=None,
        ),
        books,
        skip=("tree_cache",),
    )
    e = entry(f"{kind} (order)", build, None, lambda env: {}, books)
    scenario(
        e,
        "a request freed twice",
        lambda env: (env.alloc.free(env.r1), env.held.pop()),
        lambda env: env.alloc.free(env.r1),
    )
    scenario(
        e,
        "free after clear",
        lambda env: (env.alloc.clear(), env.held.clear()),
        lambda env: env.alloc.free(env.r1),
    )
    scenario(
        e,
        "freed, then freed again inside a free group",
        lambda env: (
            env.alloc.free(env.r1),
            env.held.pop(),
            env.alloc.free_group_begin(),
        ),
        lambda env: env.alloc.free(env.r1),
    )
    scenario(
        e,
        "free_group_end twice",
        lambda env: (env.alloc.free_group_begin(), env.alloc.free_group_end()),
        lambda env: env.alloc.free_group_end(),
    )
    scenario(
        e,
        "a free group opened twice",
        lambda env: env.alloc.free_group_begin(),
        lambda env: env.alloc.free_group_begin(),
    )
    scenario(
        e,
        "slots of another allocator",
        lambda env: None,
        lambda env: env.alloc.free(_paged(False, env.alloc.page_size).r1 + 4),
    )


def register_allocators():
    from memlab.sglang.allocator import PagedTokenToKVPoolAllocator, make_allocator

    _alloc_entries("TokenToKVPoolAllocator", _token)
    _alloc_entries("PagedTokenToKVPoolAllocator", _paged)
    _alloc_entries(
        "PagedTokenToKVPoolAllocator[need_sort]",
        lambda d: _paged(d, need_sort=True),
    )
    entry(
        "make_allocator",
        lambda d: E(),
        lambda env, **a: make_allocator(**a),
        lambda env: dict(size=16, page_size=4, backend="torch", debug_mode=True),
    )
    entry(
        "PagedTokenToKVPoolAllocator()",
        lambda d: E(),
        lambda env, **a: PagedTokenToKVPoolAllocator(**a),
        lambda env: dict(
            size=16,
            page_size=4,
            dtype=torch.float16,
            device="cpu",
            kvcache=None,
            need_sort=False,
            debug_mode=False,
            backend="torch",
        ),
    )


# ---- hybrid pools, chapter 07, and the unified pool, chapter 12 ---------------------------------


def _swa(debug, ps=4):
    """The two-pool SWA allocator with r0 (6 tokens) and r1 (4 tokens) running."""
    from memlab.sglang.swa import SWATokenToKVPoolAllocator

    a = SWATokenToKVPoolAllocator(32, 24, ps, debug_mode=debug)
    pre, seq = T(0, 0), T(6, 4)
    out = a.alloc_extend(pre, pre.clone(), seq, seq.clone(), T(-1, -1), 10)
    r0, r1 = out[:6], out[6:]
    return E(alloc=a, held=[r0, r1], r0=r0, r1=r1)


def _unified(debug, ps=4):
    from memlab.sglang.unified import (
        MHASubPoolSpec,
        UnifiedKVPool,
        UnifiedSWATokenToKVPoolAllocator,
    )

    spec = dict(head_num=1, head_dim=4, store_dtype=torch.float32)
    buf = UnifiedKVPool(
        total_bytes=64 * 96,
        sub_pool_specs=[
            MHASubPoolSpec(name="full", layer_num=1, grow_direction="down", **spec),
            MHASubPoolSpec(name="swa", layer_num=1, grow_direction="up", **spec),
        ],
        page_size=ps,
    )
    a = UnifiedSWATokenToKVPoolAllocator(
        unified_buffer=buf, page_size=ps, debug_mode=debug
    )
    pre, seq = T(0, 0), T(6, 4)
    out = a.alloc_extend(pre, pre.clone(), seq, seq.clone(), T(-1, -1), 10)
    return E(alloc=a, held=[out[:6], out[6:]], r0=out[:6], r1=out[6:])


def register_hybrid():
    from memlab.sglang.swa import SWAKVPool, SWATokenToKVPoolAllocator

    for kind, build in (
        ("SWATokenToKVPoolAllocator", _swa),
        ("UnifiedSWATokenToKVPoolAllocator", _unified),
    ):
        _alloc_entries(kind, build)
        entry(
            f"{kind}.free_swa",
            build,
            lambda env, free_index: env.alloc.free_swa(free_index),
            lambda env: dict(free_index=env.r1),
            alloc_books,
        )
        entry(
            f"{kind}.release_out_of_window",
            build,
            lambda env, **a: env.alloc.release_out_of_window(**a),
            lambda env: dict(
                req_to_token=torch.cat((env.r0, env.r0)).to(torch.int32).reshape(2, 6),
                req_pool_idx=1,
                pre_len=6,
                swa_evicted_len=0,
                sliding_window=1,
                cache_protected_len=0,
                supports_prefix_sharing=False,
            ),
            alloc_books,
        )
        entry(
            f"{kind}.write_loc",
            build,
            lambda env, out_cache_loc: env.alloc.write_loc(out_cache_loc),
            lambda env: dict(out_cache_loc=env.r1),
            alloc_books,
        )
    entry(
        "SWATokenToKVPoolAllocator()",
        lambda d: E(),
        lambda env, **a: SWATokenToKVPoolAllocator(**a),
        lambda env: dict(size=16, size_swa=8, page_size=4, debug_mode=False),
    )
    entry(
        "SWAKVPool()",
        lambda d: E(),
        lambda env, **a: SWAKVPool(**a),
        lambda env: dict(
            size=16,
            size_swa=8,
            page_size=4,
            dtype=torch.float32,
            head_num=1,
            head_dim=4,
            full_attention_layer_ids=[0],
            swa_attention_layer_ids=[1, 2],
        ),
    )
    entry(
        "SWAKVPool.set_kv_buffer",
        lambda d: E(pool=SWAKVPool(16, 8, 4, torch.float32, 1, 4, [0], [1])),
        lambda env, layer_id, loc, cache_k, cache_v: env.pool.set_kv_buffer(
            layer_id, loc, cache_k, cache_v
        ),
        lambda env: dict(
            layer_id=1,
            loc=__import__("memlab.sglang.write_loc").sglang.write_loc.KVWriteLoc(
                T(5, 6), swa_loc=T(4, 5)
            ),
            cache_k=torch.ones(2, 1, 4),
            cache_v=torch.ones(2, 1, 4),
        ),
        kinds={"cache_k": "data", "cache_v": "data"},
    )


def _mamba(debug):
    from memlab.sglang.mamba import HybridReqToTokenPool
    from memlab.sglang.req_to_token import Req

    pool = HybridReqToTokenPool(
        4,
        16,
        6,
        [(3, 2)],
        (2, 2, 2),
        [1, 3],
        enable_mamba_extra_buffer=True,
        debug_mode=debug,
    )
    reqs = [Req(i, [1, 2]) for i in range(2)]
    pool.alloc(reqs[:1])
    reqs[0].kv.kv_allocated_len = 2
    return E(pool=pool, reqs=reqs, fresh=reqs[1])


def mamba_books(env) -> None:
    rtp_books(env.pool)
    a = env.pool.mamba_allocator
    free = a.free_slots.tolist()
    assert len(set(free)) == len(free), "a mamba slot is free twice"
    assert all(1 <= x <= a.size for x in free), (
        "padding or a foreign mamba slot is free"
    )
    held = set()
    for r in env.reqs:
        if r.kv.holds_mamba:
            held.add(int(r.kv.mamba_pool_idx))
            buf = r.kv.mamba_ping_pong_track_buffer
            held |= {int(x) for x in buf if x > 0} if buf is not None else set()
    assert not held & set(free), f"mamba slots {held & set(free)} are free and held"
    assert len(held) + len(free) == a.size, "a mamba slot is lost"


def register_mamba():
    from memlab.sglang.mamba import MambaPool, MambaSlotAllocator, mamba_tracking_slots

    entry(
        "mamba_tracking_slots",
        lambda d: E(),
        lambda env, **a: mamba_tracking_slots(**a),
        lambda env: dict(extra_buffer=True, overlap=True, lazy=False),
    )
    entry(
        "MambaPool()",
        lambda d: E(),
        lambda env, **a: MambaPool(**a),
        lambda env: dict(
            size=4,
            num_mamba_layers=2,
            conv_state_shape=[(3, 2)],
            temporal_state_shape=(2, 2, 2),
        ),
    )
    entry(
        "MambaSlotAllocator()",
        lambda d: E(),
        lambda env, **a: MambaSlotAllocator(**a),
        lambda env: dict(size=4, device="cpu", debug_mode=False),
    )
    for name, call, args in (
        (
            "alloc",
            lambda env, reqs: env.pool.alloc(reqs),
            lambda env: dict(reqs=[env.fresh]),
        ),
        (
            "free",
            lambda env, row: env.pool.free(row),
            lambda env: dict(row=env.reqs[0]),
        ),
        (
            "free_mamba_cache",
            lambda env, req, keep: env.pool.free_mamba_cache(req, keep),
            lambda env: dict(req=env.reqs[0], keep=None),
        ),
        (
            "ensure_tracking_slots",
            lambda env, reqs: env.pool.ensure_tracking_slots(reqs),
            lambda env: dict(reqs=[env.reqs[0]]),
        ),
        (
            "next_track_slots",
            lambda env, rows: env.pool.next_track_slots(rows),
            lambda env: dict(rows=T(env.reqs[0].kv.req_pool_idx)),
        ),
        (
            "track_state",
            lambda env, rows, seq_lens: env.pool.track_state(rows, seq_lens),
            lambda env: dict(rows=T(env.reqs[0].kv.req_pool_idx), seq_lens=T(2)),
        ),
        (
            "get_mamba_indices",
            lambda env, rows: env.pool.get_mamba_indices(rows),
            lambda env: dict(rows=T(env.reqs[0].kv.req_pool_idx)),
        ),
        (
            "mamba_layer_index",
            lambda env, layer_id: env.pool.mamba_layer_index(layer_id),
            lambda env: dict(layer_id=3),
        ),
        (
            "execute_deferred_mamba_cow_and_clear",
            lambda env, reqs: env.pool.execute_deferred_mamba_cow_and_clear(reqs),
            lambda env: dict(reqs=[env.reqs[0]]),
        ),
    ):
        entry(
            f"HybridReqToTokenPool.{name}",
            _mamba,
            call,
            args,
            mamba_books,
            refuses=name == "alloc",
        )
    pool = lambda env: env.pool.mamba_pool  # noqa: E731
    for name, call, args in (
        (
            "clear_slots",
            lambda env, slots: pool(env).clear_slots(slots),
            lambda env: dict(slots=T(1)),
        ),
        (
            "copy_slots",
            lambda env, src, dst: pool(env).copy_slots(src, dst),
            lambda env: dict(src=T(1), dst=T(2)),
        ),
        (
            "move_slots",
            lambda env, src, dst: pool(env).move_slots(src, dst),
            lambda env: dict(src=T(1), dst=T(2)),
        ),
        (
            "get_state",
            lambda env, mamba_layer_idx: pool(env).get_state(mamba_layer_idx),
            lambda env: dict(mamba_layer_idx=1),
        ),
        (
            "register_slot_state",
            lambda env, state: pool(env).register_slot_state(state),
            lambda env: dict(state=torch.zeros(7, 2)),
        ),
    ):
        entry(f"MambaPool.{name}", _mamba, call, args, mamba_books)
    e = entry("HybridReqToTokenPool (order)", _mamba, None, lambda env: {}, mamba_books)
    scenario(
        e,
        "free_mamba_cache twice",
        lambda env: env.pool.free_mamba_cache(env.reqs[0]),
        lambda env: env.pool.free_mamba_cache(env.reqs[0]),
    )
    scenario(
        e,
        "a request's state freed after its row went, then the row freed again",
        lambda env: env.pool.free(env.reqs[0]),
        lambda env: env.pool.free(env.reqs[0]),
    )
    scenario(
        e,
        "a state slot freed twice through the slot allocator",
        lambda env: env.pool.free_mamba_cache(env.reqs[0]),
        lambda env: env.pool.mamba_allocator.free(T(1)),
    )


# ---- the KV stores, chapter 02, and the write location, 07 to 09 -------------------------------


def register_kv_pools():
    from memlab.sglang import kv_pool as kp
    from memlab.sglang.write_loc import KVWriteLoc, plain_loc, unwrap_write_loc

    pools = {
        "MHATokenToKVPool": lambda: kp.MHATokenToKVPool(16, 4, torch.float32, 2, 4, 2),
        "MLATokenToKVPool": lambda: kp.MLATokenToKVPool(16, 4, torch.float32, 6, 2, 2),
        "MHATokenToKOnlyPool": lambda: kp.MHATokenToKOnlyPool(
            16, 4, torch.float32, 2, 4, 2
        ),
        "DSATokenToKVPool": lambda: kp.DSATokenToKVPool(16, 4, torch.float32, 6, 2, 2),
        "MHATokenToKVPool[fp8]": lambda: kp.MHATokenToKVPool(
            16, 4, kp.FP8_DTYPES[0], 2, 4, 2
        ),
    }
    rows = {"MHATokenToKVPool": (2, 4), "MHATokenToKOnlyPool": (2, 4)}
    for name, make in pools.items():
        build = lambda d, make=make: E(pool=make())  # noqa: E731
        row = rows.get(name.split("[")[0], (1, 8))
        if "KOnly" in name:
            call = lambda env, layer_id, loc, cache_k: env.pool.set_k_buffer(  # noqa: E731
                layer_id, loc, cache_k
            )
            args = lambda env, row=row: dict(  # noqa: E731
                layer_id=1, loc=T(5, 6), cache_k=torch.ones(2, *row)
            )
        else:
            call = lambda env, layer_id, loc, cache_k, cache_v: (  # noqa: E731
                env.pool.set_kv_buffer(layer_id, loc, cache_k, cache_v)
            )
            args = lambda env, row=row, name=name: dict(  # noqa: E731
                layer_id=1,
                loc=T(5, 6),
                cache_k=torch.ones(2, *row),
                cache_v=torch.ones(2, *row) if "MHA" in name else None,
            )
        entry(f"{name}.set_kv_buffer", build, call, args)
        entry(
            f"{name}.get_key_buffer",
            build,
            lambda env, layer_id: env.pool.get_key_buffer(layer_id),
            lambda env: dict(layer_id=1),
        )
    entry(
        "MHATokenToKVPool()",
        lambda d: E(),
        lambda env, **a: kp.MHATokenToKVPool(**a),
        lambda env: dict(
            size=16,
            page_size=4,
            dtype=torch.float16,
            head_num=2,
            head_dim=4,
            layer_num=2,
            device="cpu",
            v_head_dim=4,
            start_layer=0,
            end_layer=1,
        ),
    )
    entry(
        "DSATokenToKVPool()",
        lambda d: E(),
        lambda env, **a: kp.DSATokenToKVPool(**a),
        lambda env: dict(
            size=16,
            page_size=4,
            dtype=torch.float16,
            kv_lora_rank=6,
            qk_rope_head_dim=2,
            layer_num=2,
            index_head_dim=128,
        ),
    )
    entry(
        "KVWriteLoc()",
        lambda d: E(),
        lambda env, **a: KVWriteLoc(**a),
        lambda env: dict(loc=T(1, 2), swa_loc=T(3, 4), full_loc=None, physical=False),
    )
    entry(
        "KVWriteLoc.narrow",
        lambda d: E(w=KVWriteLoc(T(1, 2, 3), swa_loc=T(4, 5, 6))),
        lambda env, n: env.w.narrow(n),
        lambda env: dict(n=2),
    )
    entry(
        "write_loc.plain_loc",
        lambda d: E(),
        lambda env, loc, where: plain_loc(loc, where),
        lambda env: dict(loc=T(1, 2), where="pool"),
    )
    entry(
        "write_loc.unwrap_write_loc",
        lambda d: E(),
        lambda env, loc: unwrap_write_loc(loc),
        lambda env: dict(loc=T(1, 2)),
    )


# ---- the scheduler's side (allocation.py) and the prefix caches, chapters 04 to 11 -------------


def _books_tree(env) -> None:
    """The table, the allocator (the requests' slots and the tree's pages held) and the tree."""
    rtp_books(env.pool)
    held = [
        env.pool.req_to_token[
            r.kv.req_pool_idx, r.kv.cache_protected_len : r.kv.kv_allocated_len
        ]
        for r in env.reqs
        if r.kv.holds_kv
    ] + list(env.held)
    alloc_books(E(alloc=env.alloc, held=held, tree=env.tree))
    tree_books(env)


def _lifecycle(debug, ps=4, disable=False, hicache=False):
    """A request table, an allocator and a radix tree (or HiCache's), with two running requests:
    r0 matched nothing and prefilled 10 tokens, checkpointed (the tree holds its 8 page-aligned
    ones, locked by it); r1 prefilled 6 tokens; r2 is new."""
    from memlab.sglang.allocation import alloc_for_extend, checkpoint_kv_cache
    from memlab.sglang.allocator import make_allocator
    from memlab.sglang.radix_cache import RadixCache
    from memlab.sglang.req_to_token import Req, ReqToTokenPool

    pool = ReqToTokenPool(4, 32)
    if hicache:
        from memlab.sglang.hicache import HiRadixCache, HostKVCache
        from memlab.sglang.kv_pool import MHATokenToKVPool

        kv = MHATokenToKVPool(64, ps, torch.float32, 1, 4, 1)
        alloc = make_allocator(64, ps, kvcache=kv, debug_mode=debug)
        host = HostKVCache(kv.host_pool_decls()[0], 64, ps, pin_memory=False)
        tree = HiRadixCache(
            alloc, host, debug_mode=debug, req_to_token_pool=pool, io_backend="torch"
        )
    else:
        alloc = make_allocator(64, ps, debug_mode=debug)
        tree = RadixCache(
            alloc, disable=disable, debug_mode=debug, req_to_token_pool=pool
        )
    reqs = [Req(0, list(range(1, 11))), Req(1, [7] * 6), Req(2, [1, 2, 3, 4, 5])]
    for r, n in ((reqs[0], 10), (reqs[1], 6)):
        r.lock = tree.lock(tree.root_node) if disable else None
        alloc_for_extend(pool, alloc, [r], [n], tree_cache=tree)
        r.extend_end = n
        checkpoint_kv_cache(r, tree)
    return E(pool=pool, alloc=alloc, tree=tree, reqs=reqs, held=[])


def register_allocation():
    from memlab.sglang import allocation as al
    from memlab.sglang.schedule_policy import match_and_lock

    for tag, build in (
        ("", _lifecycle),
        ("[disabled tree]", lambda d: _lifecycle(d, disable=True)),
        ("[hicache]", lambda d: _lifecycle(d, hicache=True)),
    ):
        entry(
            f"alloc_for_extend{tag}",
            build,
            lambda env, **a: al.alloc_for_extend(**a),
            lambda env: dict(
                req_to_token_pool=env.pool,
                allocator=env.alloc,
                reqs=[env.reqs[2], env.reqs[1]],
                extend_lens=[5, 2],
                prefix_indices=None,
                tree_cache=env.tree,
            ),
            _books_tree,
            refuses=True,
            kinds={"extend_lens": "counts"},
            also=lambda env: [
                ("reqs", "a request twice", [env.reqs[1], env.reqs[1]]),
                (
                    "prefix_indices",
                    "slots the tree does not hold",
                    [T(60, 61, 62, 63), None],
                ),
                ("prefix_indices", "free slots", [T(40), None]),
            ],
        )
        entry(
            f"alloc_for_decode{tag}",
            build,
            lambda env, **a: al.alloc_for_decode(**a),
            lambda env: dict(
                req_to_token_pool=env.pool,
                allocator=env.alloc,
                reqs=[env.reqs[0], env.reqs[1]],
                tree_cache=env.tree,
            ),
            _books_tree,
            refuses=True,
            also=lambda env: [("reqs", "a request without a row", [env.reqs[2]])],
        )
        entry(
            f"release_kv_cache{tag}",
            build,
            lambda env, req, tree_cache, checkpoint: al.release_kv_cache(
                req, tree_cache, checkpoint=checkpoint
            ),
            lambda env: dict(req=env.reqs[0], tree_cache=env.tree, checkpoint=True),
            _books_tree,
            also=lambda env: [("req", "a request without a row", env.reqs[2])],
        )
        entry(
            f"checkpoint_kv_cache{tag}",
            build,
            lambda env, req, tree_cache: al.checkpoint_kv_cache(req, tree_cache),
            lambda env: dict(req=env.reqs[1], tree_cache=env.tree),
            _books_tree,
            also=lambda env: [("req", "a request without a row", env.reqs[2])],
        )
        entry(
            f"match_and_lock{tag}",
            build,
            lambda env, tree_cache, req: match_and_lock(tree_cache, req),
            lambda env: dict(tree_cache=env.tree, req=env.reqs[2]),
            _books_tree,
        )
        e = entry(
            f"release_kv_cache{tag} (order)", build, None, lambda env: {}, _books_tree
        )
        scenario(
            e,
            "a request released twice",
            lambda env: al.release_kv_cache(env.reqs[0], env.tree, checkpoint=True),
            lambda env: al.release_kv_cache(env.reqs[0], env.tree, checkpoint=True),
        )
        scenario(
            e,
            "released while its lock was dropped (lock None, tokens held)",
            lambda env: setattr(env.reqs[0], "lock", None),
            lambda env: al.release_kv_cache(env.reqs[0], env.tree, checkpoint=False),
        )
        scenario(
            e,
            "a lock released twice",
            lambda env: env.tree.unlock(env.reqs[0].lock),
            lambda env: env.tree.unlock(env.reqs[0].lock),
        )
        scenario(
            e,
            "a checkpoint after the release",
            lambda env: al.release_kv_cache(env.reqs[1], env.tree, checkpoint=True),
            lambda env: al.checkpoint_kv_cache(env.reqs[1], env.tree),
        )
        scenario(
            e,
            "decode a request after its release",
            lambda env: al.release_kv_cache(env.reqs[1], env.tree, checkpoint=True),
            lambda env: al.alloc_for_decode(
                env.pool, env.alloc, [env.reqs[1]], env.tree
            ),
        )
    entry(
        "release_kv_row",
        _lifecycle,
        lambda env, **a: al.release_kv_row(**a),
        lambda env: dict(
            req_to_token_pool=env.pool,
            allocator=env.alloc,
            req=env.reqs[1],
            swa_evicted_seqlen=0,
        ),
        _books_tree,
    )
    entry(
        "free_kv_row",
        _lifecycle,
        lambda env, **a: al.free_kv_row(**a),
        lambda env: dict(
            req_to_token_pool=env.pool,
            allocator=env.alloc,
            kv=env.reqs[1].kv,
            ranges=[(4, 6)],
            swa_evicted_seqlen=0,
        ),
        _books_tree,
        also=lambda env: [
            ("ranges", "a range past the row", [(4, 40)]),
            ("ranges", "backwards", [(6, 4)]),
            ("ranges", "the tree's part", [(0, 6)]),
            ("ranges", "overlapping", [(4, 6), (5, 6)]),
        ],
    )
    entry(
        "get_last_loc",
        _lifecycle,
        lambda env, **a: al.get_last_loc(**a),
        lambda env: dict(
            req_to_token=env.pool.req_to_token,
            req_pool_indices=T(env.reqs[0].kv.req_pool_idx),
            prefix_lens=T(3),
        ),
    )
    entry(
        "coalesce_ranges",
        lambda d: E(),
        lambda env, ranges: al.coalesce_ranges(ranges),
        lambda env: dict(ranges=[(0, 4), (4, 8)]),
    )


def _tree_only(debug, hicache=False):
    env = _lifecycle(debug, hicache=hicache)
    env.free = env.alloc.alloc(4)  # slots a new insert may bring
    env.held = [env.free]
    return env


def tree_alloc_books(env) -> None:
    """The tree's books, and the allocator's: the inserted slots are the tree's or, when the tree
    held their tokens already, still the caller's (``env.free``)."""
    _books_tree(env)


def register_trees():
    from memlab.sglang.hicache import HiRadixCache, HostKVCache
    from memlab.sglang.radix_cache import (
        EvictParams,
        InsertParams,
        MatchPrefixParams,
        RadixCache,
        RadixKey,
    )

    for tag, hi in (("RadixCache", False), ("HiRadixCache", True)):
        build = lambda d, hi=hi: _tree_only(d, hicache=hi)  # noqa: E731
        entry(
            f"{tag}.match_prefix",
            build,
            lambda env, key: env.tree.match_prefix(key),
            lambda env: dict(key=[1, 2, 3, 4, 5, 6, 7, 8, 9]),
            _books_tree,
            kinds={"key": "tokens"},
            also=lambda env: [
                ("key", "MatchPrefixParams(None)", MatchPrefixParams(None)),
                ("key", "a RadixKey of a dict", RadixKey({1: 2})),
                ("key", "a RadixKey with limit -1", RadixKey([1, 2], limit=-1)),
            ],
        )
        entry(
            f"{tag}.insert",
            build,
            lambda env, key, value: env.tree.insert(key, value),
            lambda env: dict(key=[9, 9, 9, 9], value=env.free),
            tree_alloc_books,
            kinds={"key": "tokens"},
            also=lambda env: [
                (
                    "key",
                    "InsertParams with a str key",
                    InsertParams(key="abcd", value=env.free),
                ),
                ("value", "slots of a free page", T(60, 61, 62, 63)),
                (
                    "value",
                    "slots the tree holds",
                    env.tree.path_device_indices(env.reqs[0].lock.node)[:4],
                ),
            ],
        )
        entry(
            f"{tag}.evict",
            build,
            lambda env, params: env.tree.evict(params),
            lambda env: dict(params=4),
            _books_tree,
            also=lambda env: [
                ("params", "EvictParams(num_tokens=-1)", EvictParams(num_tokens=-1)),
                ("params", "EvictParams(num_tokens='4')", EvictParams(num_tokens="4")),
            ],
        )
        entry(
            f"{tag}.lock",
            build,
            lambda env, node: env.tree.lock(node),
            lambda env: dict(node=env.reqs[0].lock.node),
            _books_tree,
            also=lambda env: [
                ("node", "a node of another tree", _tree_only(False).tree.root_node)
            ],
        )
        entry(
            f"{tag}.dec_lock_ref",
            build,
            lambda env, node: env.tree.dec_lock_ref(node),
            lambda env: dict(node=env.reqs[0].lock.node),
            lambda env: env.tree._check_tree(),
        )
        entry(
            f"{tag}.path_device_indices",
            build,
            lambda env, node: env.tree.path_device_indices(node),
            lambda env: dict(node=env.reqs[0].lock.node),
        )
        entry(
            f"{tag}.check_idle",
            build,
            lambda env, total: env.tree.check_idle(total),
            lambda env: dict(
                total=env.alloc.available_size()
                + env.tree.evictable_size()
                + env.tree.protected_size()
            ),
        )
        entry(
            f"{tag}.touch_prefix",
            build,
            lambda env, key: env.tree.touch_prefix(key),
            lambda env: dict(key=[1, 2, 3, 4]),
            _books_tree,
            kinds={"key": "tokens"},
        )
    hi = lambda d: _tree_only(d, hicache=True)  # noqa: E731
    entry(
        "HiRadixCache.evict_host",
        hi,
        lambda env, num_tokens: env.tree.evict_host(num_tokens),
        lambda env: dict(num_tokens=4),
        _books_tree,
    )

    def evicted(d):
        env = _tree_only(d, hicache=True)
        env.node = env.reqs[1].lock.node
        env.tree.unlock(env.reqs[1].lock)
        env.reqs[1].lock = None
        env.reqs[1].kv.cache_protected_len = 0  # its prefix is the tree's alone now
        env.tree.evict(100)
        return env

    entry(
        "HiRadixCache.load_back",
        evicted,
        lambda env, node: env.tree.load_back(node),
        lambda env: dict(node=env.node),
        _books_tree,
    )
    entry(
        "HiRadixCache.init_load_back",
        hi,
        lambda env, last_node, host_hit_length: env.tree.init_load_back(
            last_node, host_hit_length
        ),
        lambda env: dict(last_node=env.reqs[0].lock.node, host_hit_length=0),
        _books_tree,
    )
    entry(
        "HiRadixCache.write_backup",
        hi,
        lambda env, node: env.tree.write_backup(node),
        lambda env: dict(node=env.reqs[0].lock.node),
        _books_tree,
    )
    entry(
        "RadixCache()",
        lambda d: E(
            alloc=__import__("memlab.sglang.allocator").sglang.allocator.make_allocator(
                16, 4
            )
        ),
        lambda env, **a: RadixCache(**a),
        lambda env: dict(
            token_to_kv_pool_allocator=env.alloc,
            page_size=4,
            disable=False,
            debug_mode=False,
            req_to_token_pool=None,
            sliding_window_size=None,
        ),
        skip=("disable", "debug_mode"),
    )
    entry(
        "HostKVCache()",
        lambda d: E(
            kv=__import__("memlab.sglang.kv_pool").sglang.kv_pool.MHATokenToKVPool(
                16, 4, torch.float32, 1, 4, 1
            )
        ),
        lambda env, decl, size, page_size: HostKVCache(decl, size, page_size),
        lambda env: dict(decl=env.kv.host_pool_decls()[0], size=32, page_size=4),
    )
    entry(
        "HiRadixCache()",
        lambda d: _tree_only(d, hicache=True),
        lambda env, **a: HiRadixCache(**a),
        lambda env: dict(
            token_to_kv_pool_allocator=env.alloc,
            token_to_kv_pool_host=env.tree.token_to_kv_pool_host,
            write_policy="write_through",
            io_backend="torch",
            load_back_threshold=10,
        ),
    )
    e = entry("RadixCache (order)", _tree_only, None, lambda env: {}, _books_tree)
    scenario(
        e,
        "a node evicted, then locked",
        lambda env: (
            setattr(
                env, "node", env.tree.insert([8, 8, 8, 8], env.free).last_device_node
            ),
            env.held.clear(),
            env.tree.evict(100),
        ),
        lambda env: env.tree.lock(env.node),
    )
    scenario(
        e,
        "a lock taken after reset()",
        lambda env: (setattr(env, "node", env.reqs[0].lock.node), env.tree.reset()),
        lambda env: env.tree.lock(env.node),
    )


# ---- page copies (HiCache's transfers), chapter 11 ---------------------------------------------


def register_page_copy():
    from memlab.sglang.page_copy import copy_pages, transfer_pages

    def bufs(d):
        return E(src=torch.arange(32.0).reshape(16, 2), dst=torch.zeros(16, 2))

    for backend in ("torch", "python", "triton"):
        entry(
            f"copy_pages[{backend}]",
            bufs,
            lambda env, **a: copy_pages(**a),
            lambda env, backend=backend: dict(
                src=env.src,
                dst=env.dst,
                src_pages=T(1, 2),
                dst_pages=T(3, 0),
                page_size=4,
                backend=backend,
            ),
            kernel=backend == "triton",
            skip=("backend",),
        )
    entry(
        "transfer_pages",
        bufs,
        lambda env, **a: transfer_pages(**a),
        lambda env: dict(
            src=env.src,
            dst=env.dst,
            src_pages=T(1, 2),
            dst_pages=T(3, 0),
            page_size=4,
            backend="torch",
            path="device_to_host",
        ),
    )


# ---- sizing (08), models (02), attention (09), the environment -----------------------------------


def register_common():
    from memlab.common import attention as at
    from memlab.common import env as envmod
    from memlab.common import models
    from memlab.common.utils import ceil_align, ceil_div
    from memlab.sglang import sizing as sz

    m = models.LLAMA_3_1_8B
    for name, fn, args in (
        (
            "ModelConfig.layer_ids",
            lambda env, kind: m.layer_ids(kind),
            dict(kind="full_attention"),
        ),
        (
            "ModelConfig.kv_bytes_per_token",
            lambda env, **a: m.kv_bytes_per_token(**a),
            dict(kind=None, dtype_bytes=2, tp_size=1),
        ),
        (
            "ModelConfig.weight_bytes",
            lambda env, **a: m.weight_bytes(**a),
            dict(dtype_bytes=2, tp_size=2),
        ),
        (
            "ModelConfig.state_bytes_per_request",
            lambda env, **a: models.QWEN3_NEXT_80B_A3B.state_bytes_per_request(**a),
            dict(conv_dtype_bytes=2, ssm_dtype_bytes=4, tp_size=2),
        ),
        (
            "ModelConfig.conv_state_shape",
            lambda env, tp_size: models.QWEN3_NEXT_80B_A3B.conv_state_shape(tp_size),
            dict(tp_size=2),
        ),
        (
            "mha_bytes_per_token",
            lambda env, **a: models.mha_bytes_per_token(**a),
            dict(layer_num=2, head_num=4, head_dim=8, v_head_dim=None, dtype_bytes=2),
        ),
        (
            "mla_bytes_per_token",
            lambda env, **a: models.mla_bytes_per_token(**a),
            dict(layer_num=2, kv_lora_rank=8, qk_rope_head_dim=4, dtype_bytes=2),
        ),
        ("ceil_div", lambda env, a, b: ceil_div(a, b), dict(a=7, b=2)),
        (
            "ceil_align",
            lambda env, n, page_size: ceil_align(n, page_size),
            dict(n=7, page_size=4),
        ),
        (
            "env.resolve_device",
            lambda env, device: envmod.resolve_device(device),
            dict(device="cpu"),
        ),
        (
            "sizing.report",
            lambda env, **a: sz.report(m, **a),
            dict(gpu_mem=80, seq_len=4096),
        ),
        (
            "sizing.max_new_tokens_for_memory",
            lambda env, **a: sz.max_new_tokens_for_memory(**a),
            dict(input_tokens=10, max_new_tokens=20, token_capacity=64, page_size=4),
        ),
        (
            "sizing.alloc_len_per_decode",
            lambda env, spec, page_size: sz.alloc_len_per_decode(spec, page_size),
            dict(spec=sz.SpeculativeConfig("EAGLE", 3, 2, 4), page_size=4),
        ),
        (
            "sizing.req_to_token_row_width",
            lambda env, **a: sz.req_to_token_row_width(**a),
            dict(context_len=128, spec=sz.SpeculativeConfig(), page_size=4),
        ),
        (
            "sizing.new_tokens_required_next_decode",
            lambda env, **a: sz.new_tokens_required_next_decode(**a),
            dict(reqs=[sz.RunningReq("a", 5, 3)], page_size=4, reserve=None),
        ),
        (
            "sizing.check_decode_mem",
            lambda env, **a: sz.check_decode_mem(**a),
            dict(reqs=[sz.RunningReq("a", 5, 3)], available_tokens=8, page_size=4),
        ),
        (
            "sizing.retract_decode",
            lambda env, **a: sz.retract_decode(**a),
            dict(
                reqs=[sz.RunningReq("a", 5, 3), sz.RunningReq("b", 2, 1)],
                available_tokens=0,
                page_size=4,
            ),
        ),
        (
            "sizing.estimate_swa_kv_tokens",
            lambda env, **a: sz.estimate_swa_kv_tokens(**a),
            dict(
                extend_input_len=100,
                max_new_tokens=20,
                sliding_window_size=32,
                page_size=4,
                allocation_limit=None,
            ),
        ),
        (
            "sizing.RunningReq",
            lambda env, **a: sz.new_tokens_required_next_decode(
                [sz.RunningReq(**a)], 4
            ),
            dict(rid="a", input_len=5, output_len=3, kv_allocated_len=None),
        ),
        (
            "sizing.ServingConfig",
            lambda env, **a: sz.pool_sizes(sz.ServingConfig(**a)),
            dict(model=m, gpu=sz.GPUConfig.gib(80)),
        ),
    ):
        entry(name, lambda d: E(), fn, lambda env, args=args: dict(args), skip=("rid",))

    def attn(d, dtype=torch.float32):
        g = torch.Generator().manual_seed(0)
        return E(
            q=torch.randn(2, 4, 8, generator=g, dtype=dtype),
            k=torch.randn(16, 2, 8, generator=g, dtype=dtype),
            v=torch.randn(16, 2, 8, generator=g, dtype=dtype),
            table=torch.arange(32, dtype=torch.int32).reshape(2, 16) % 16,
            rows=T(0, 1),
            lens=T(5, 9),
        )

    entry(
        "decode_attention_fwd",
        attn,
        lambda env, **a: at.decode_attention_fwd(**a),
        lambda env: dict(
            q=env.q,
            k_buffer=env.k,
            v_buffer=env.v,
            req_to_token=env.table,
            req_pool_indices=env.rows,
            seq_lens=env.lens,
            sm_scale=None,
            o=None,
        ),
        kernel=True,
    )
    entry(
        "paged_attention",
        attn,
        lambda env, **a: at.paged_attention(**a),
        lambda env: dict(
            query=env.q,
            key_cache=env.k.view(4, 4, 2, 8),
            value_cache=env.v.view(4, 4, 2, 8),
            block_table=torch.tensor([[0, 1, 2], [3, 2, 1]], dtype=torch.int32),
            seq_lens=env.lens,
            scale=None,
            out=None,
        ),
        kernel=True,
    )
    entry(
        "attention_over_slots",
        attn,
        lambda env, **a: at.attention_over_slots(**a),
        lambda env: dict(
            q=env.q,
            k_buffer=env.k,
            v_buffer=env.v,
            slots=T(1, 2, 3, 4, 5, 6).reshape(2, 3),
            mask=torch.ones(2, 3, dtype=torch.bool),
            sm_scale=0.3,
        ),
    )
    entry(
        "slots_from_req_to_token",
        attn,
        lambda env, **a: at.slots_from_req_to_token(**a),
        lambda env: dict(
            req_to_token=env.table, req_pool_indices=env.rows, seq_lens=env.lens
        ),
    )
    entry(
        "slots_from_block_table",
        attn,
        lambda env, **a: at.slots_from_block_table(**a),
        lambda env: dict(
            block_table=torch.tensor([[0, 1, 2], [3, 2, 1]], dtype=torch.int32),
            seq_lens=env.lens,
            block_size=4,
        ),
    )


def register():
    register_common()
    register_request_table()
    register_allocators()
    register_hybrid()
    register_mamba()
    register_kv_pools()
    register_allocation()
    register_trees()
    register_page_copy()
