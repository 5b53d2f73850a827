"""memlab's sliding-window books and request table against SGLang 0.5.23's, stream by stream.

One stream is a scheduler's life of requests on a hybrid SWA model: rows from the request
table, extends and decodes on the two pools (full and sliding-window) with the full -> SWA map
between them, out-of-window releases (with and without a prefix-sharing cache, with a protected
prefix), finished requests (alone or in a free group) and ``clear``. After every step both sides
must hold the same rows, hand out the same slots, keep the same free lists (content and order) on
both pools, the same map, the same evicted lengths and the same available sizes.

A finished request is freed the way SGLang's ``free_kv_row_segments`` does (the out-of-window
part on the full side only, the rest on both, in page-aligned segments), or now and then with a
plain ``free`` of all its slots, which reads the map and skips what the window released.
"""

import random
from types import SimpleNamespace

import pytest
import torch

from memlab.sglang.req_to_token import Req, ReqToTokenPool
from memlab.sglang.swa import SWAKVPool, SWATokenToKVPoolAllocator
from memlab.sglang.write_loc import KVWriteLoc
from memlab_tests.tools.engines.sglang_loader import load
from memlab_tests.tools.engines.sglang_streams import T, books

ROWS, WIDTH = 6, 256


class Side:
    """One engine's request table and SWA allocator, and the requests it runs."""

    def __init__(self, rt, alloc, make_req):
        self.rt, self.alloc, self.make_req = rt, alloc, make_req
        self.reqs = {}

    def row(self, rid):
        r = self.reqs[rid]
        return r.kv.req_pool_idx

    def state(self):
        a = self.alloc
        swa_books = books(a.swa_attn_allocator)
        return dict(
            full=books(a.full_attn_allocator),
            swa=swa_books,
            mapping=a.full_to_swa_index_mapping.tolist(),
            available=a.available_size(),
            # SGLang's size is min(full, swa); size_full and size_swa give each side
            sizes=(a.size, a.size_full, a.size_swa),
            rows=list(self.rt.free_slots),
            generation=self.rt.req_generation.tolist(),
        )


def sglang_side(sg, size, size_swa, ps, need_sort, triton):
    # only its mapping registry is used; no KV buffers are built
    kv = object.__new__(sg.SWAKVPool)
    kv.full_kv_pool = kv.swa_kv_pool = None
    alloc = sg.SWATokenToKVPoolAllocator(
        size, size_swa, ps, torch.float16, "cpu", kv, need_sort
    )
    for sub in (alloc.full_attn_allocator, alloc.swa_attn_allocator):
        sub.use_triton_kernels = triton
        sub.debug_mode = ps > 1
    rt = sg.ReqToTokenPool(
        size=ROWS, max_context_len=WIDTH, device="cpu", enable_memory_saver=False
    )
    return Side(rt, alloc, lambda rid: SimpleNamespace(rid=rid, kv=sg.ReqKvInfo()))


def memlab_side(size, size_swa, ps, need_sort, backend):
    alloc = SWATokenToKVPoolAllocator(
        size, size_swa, ps, need_sort=need_sort, debug_mode=True, backend=backend
    )
    return Side(ReqToTokenPool(ROWS, WIDTH), alloc, Req)


class SwaStream:
    def __init__(self, seed, ps, window):
        self.rng, self.ps, self.window = random.Random(seed), ps, window
        self.held, self.evicted, self.protected = {}, {}, {}
        self.next_rid, self.skipped = 0, 0

    def draw(self, free_full_pages, free_swa_pages):
        rng, ps, held = self.rng, self.ps, self.held
        r = rng.random()
        if r < 0.25 or not held:
            rids = []
            for _ in range(rng.randint(1, 3)):
                self.next_rid += 1
                rids.append(self.next_rid)
            return ("arrive", [(rid, rng.randint(1, 4 * ps + 3)) for rid in rids])
        if r < 0.35:
            rid = rng.choice(sorted(held))
            return ("chunk", [(rid, rng.randint(1, 3 * ps))])
        if r < 0.62:
            rids = rng.sample(sorted(held), rng.randint(1, len(held)))
            opening = sum(1 for rid in rids if len(held[rid]) % ps == 0)
            if opening > min(free_full_pages, free_swa_pages):
                # SGLang 0.5.23's SWA alloc_decode takes one side's pages before the other refuses
                # (its scheduler checks capacity first); memlab refuses before taking any.
                self.skipped += 1
                return ("nothing",)
            return ("decode", rids)
        if r < 0.80:
            return ("release", rng.choice(sorted(held)), rng.random() < 0.5)
        if r < 0.90:
            return ("finish", [rng.choice(sorted(held))], rng.random() < 0.3)
        if r < 0.98:
            return (
                "group",
                rng.sample(sorted(held), rng.randint(1, min(3, len(held)))),
                rng.random() < 0.3,
            )
        return ("clear",)


def apply(side: Side, stream: SwaStream, op, sglang: bool, sg):
    kind, held, a, rt = op[0], stream.held, side.alloc, side.rt
    if kind in ("arrive", "chunk"):
        new = [rid for rid, _ in op[1] if rid not in side.reqs]
        for rid in new:
            side.reqs[rid] = side.make_req(rid)
        reqs = [side.reqs[rid] for rid, _ in op[1]]
        for r, (rid, _) in zip(reqs, op[1]):  # a continuing chunk already owns KV
            r.kv.kv_allocated_len = len(held.get(rid, ()))
        rows = rt.alloc(reqs)
        if rows is None:
            for rid in new:
                side.reqs.pop(rid)
            return ("rows", None)
        pre = [len(held.get(rid, ())) for rid, _ in op[1]]
        seq = [p + n for p, (_, n) in zip(pre, op[1])]
        last = [held[rid][-1] if held.get(rid) else -1 for rid, _ in op[1]]
        n = sum(k for _, k in op[1])
        if sglang and stream.ps == 1:
            out = a.alloc(n)  # SGLang's scheduler at page size 1
        else:
            out = a.alloc_extend(T(pre), T(pre), T(seq), T(seq), T(last), n)
        if out is None:
            for rid in new:
                rt.free(side.reqs.pop(rid))
            return (rows, None)
        at = 0
        for rid, p, s in zip([rid for rid, _ in op[1]], pre, seq):
            rt.write((side.row(rid), slice(p, s)), out[at : at + s - p].to(torch.int32))
            at += s - p
        return (rows, out.tolist())
    if kind == "decode":
        seq = [len(held[rid]) + 1 for rid in op[1]]
        last = T([held[rid][-1] for rid in op[1]])
        out = (
            a.alloc(len(seq))
            if sglang and stream.ps == 1
            else a.alloc_decode(T(seq), T(seq), last)
        )
        if out is not None:
            for rid, s, slot in zip(op[1], seq, out.tolist()):
                rt.write((side.row(rid), s - 1), slot)
        return None if out is None else out.tolist()
    if kind == "release":
        rid, sharing = op[1], op[2]
        pre_len, protected = len(held[rid]), stream.protected[rid]
        if sglang:
            req = side.reqs[rid]
            req.kv.cache_protected_len = protected
            sg.free_swa_out_of_window_slots(
                req,
                pre_len,
                sliding_window_size=stream.window,
                page_size=stream.ps,
                req_to_token_pool=rt,
                token_to_kv_pool_allocator=a,
                supports_prefix_sharing=sharing,
            )
            return req.kv.get_evicted_seqlen(sg.ComponentType.SWA)
        return a.release_out_of_window(
            rt.req_to_token,
            side.row(rid),
            pre_len,
            stream.evicted[rid],
            stream.window,
            cache_protected_len=protected,
            supports_prefix_sharing=sharing,
        )
    if kind in ("finish", "group"):
        rids = op[1]
        if kind == "group":
            a.free_group_begin()
        for rid in rids:
            slots, ev, protected = (
                T(held[rid]),
                stream.evicted[rid],
                stream.protected[rid],
            )
            if op[2] and (stream.ps > 1 or ev <= protected):
                # At page size 1 SGLang's free() would hand page 0 to the SWA side for
                # slots the window already released: its scheduler frees them as below.
                a.free(slots)
            else:
                # As SGLang's free_kv_row_segments: [protected, evicted) full side only, the
                # rest both.
                hi = max(ev, protected)
                if protected:
                    a.free_segment(slots[:protected], start_pos=0)
                if hi > protected:
                    a.free_full_segment(slots[protected:hi], start_pos=protected)
                if len(slots) > hi:
                    a.free_segment(slots[hi:], start_pos=hi)
            rt.free(side.reqs.pop(rid))
        if kind == "group":
            a.free_group_end()
        return ()
    if kind == "clear":
        a.clear()
        rt.clear()
        side.reqs.clear()
    return ()


def record(stream: SwaStream, op, out):
    kind, held = op[0], stream.held
    if kind in ("arrive", "chunk") and out[1] is not None:
        at = 0
        for rid, n in op[1]:
            if rid not in held:
                held[rid], stream.evicted[rid] = [], 0
                # a prefix the cache owns (page-aligned), as after a prefix hit
                stream.protected[rid] = stream.rng.choice(
                    [0, 0, stream.ps * stream.rng.randint(0, n // stream.ps)]
                )
            held[rid] += out[1][at : at + n]
            at += n
    elif kind == "decode" and out is not None:
        for rid, slot in zip(op[1], out):
            held[rid].append(slot)
    elif kind == "release":
        stream.evicted[op[1]] = out
    elif kind in ("finish", "group"):
        for rid in op[1]:
            for d in (held, stream.evicted, stream.protected):
                d.pop(rid)
    elif kind == "clear":
        for d in (held, stream.evicted, stream.protected):
            d.clear()


STEPS = 50


def run_stream(sg, seed, ps, need_sort, kernels):
    size, size_swa, window = 24 * ps, 12 * ps, max(1, (seed % 3) * ps + seed % 5)
    sides = [sglang_side(sg, size, size_swa, ps, need_sort, False)]
    sides += (
        [sglang_side(sg, size, size_swa, ps, need_sort, True)]
        if kernels and ps > 1
        else []
    )
    n_sglang = len(sides)
    backends = (
        ("torch", "triton", "python") if kernels and ps > 1 else ("torch", "python")
    )
    sides += [memlab_side(size, size_swa, ps, need_sort, b) for b in backends]
    stream = SwaStream(seed, ps, window)
    for step in range(STEPS):
        ref = sides[0].alloc
        op = stream.draw(
            ref.full_attn_allocator.available_size() // ps,
            ref.swa_attn_allocator.available_size() // ps,
        )
        outs = [apply(s, stream, op, i < n_sglang, sg) for i, s in enumerate(sides)]
        where = (
            f"step {step} ({op!r}, page {ps}, window {window}, need_sort {need_sort})"
        )
        for i, (s, out) in enumerate(zip(sides, outs)):
            who = "SGLang" if i < n_sglang else "memlab"
            assert out == outs[0], (
                f"{where}: {who} side {i} answered {out}, SGLang {outs[0]}"
            )
            got, want = s.state(), sides[0].state()
            for k in want:
                assert got[k] == want[k], (
                    f"{where}: {who} side {i} {k} {got[k]} != SGLang's {want[k]}"
                )
        record(stream, op, outs[0])
        assert sorted(stream.held) == sorted(sides[0].reqs)
    return STEPS, stream.skipped


@pytest.mark.parametrize("need_sort", [False, True], ids=["fifo", "need_sort"])
@pytest.mark.parametrize("ps", [1, 2, 4, 16])
def test_swa_streams_match_sglang(ps, need_sort, tally):
    sg = load()
    steps = skipped = 0
    streams = 4
    for seed in range(streams):
        n, s = run_stream(
            sg, 10 * ps + seed + 500 * need_sort, ps, need_sort, kernels=seed == 0
        )
        steps, skipped = steps + n, skipped + s
    tally(f"SWATokenToKVPoolAllocator page {ps:>2} + ReqToTokenPool", streams, steps)
    assert skipped < steps // 4  # a stream that never decodes would compare little


def test_swa_decode_refusal_is_where_memlab_differs_on_purpose():
    """SGLang 0.5.23 takes the full side's pages, then returns None when the SWA side is short
    (its scheduler never asks beyond capacity); memlab settles both sides first, so a refusal
    changes nothing. The one deliberate difference of the SWA books."""
    sg = load()
    ps = 4
    # 4 and 2 pages
    sides = [
        sglang_side(sg, 16, 8, ps, False, False),
        memlab_side(16, 8, ps, False, "torch"),
    ]
    for side in sides:
        # A: a page on each side
        a = side.alloc.alloc_extend(T([0]), T([0]), T([4]), T([4]), T([-1]), 4)
        # B: the SWA pool is now full
        side.alloc.alloc_extend(T([0]), T([0]), T([4]), T([4]), T([-1]), 4)
        side.last = T([a[-1].item()])
    theirs, ours = (s.alloc for s in sides)
    assert theirs.swa_available_size() == ours.swa_available_size() == 0
    assert theirs.full_available_size() == ours.full_available_size() == 8
    # A's 5th token opens a page: there is one on the full side, none on the SWA side
    assert theirs.alloc_decode(T([5]), T([5]), sides[0].last) is None
    # SGLang: the full side's page is gone all the same
    assert theirs.full_available_size() == 4
    assert ours.alloc_decode(T([5]), T([5]), sides[1].last) is None
    assert ours.full_available_size() == 8  # memlab: nothing taken


def test_swa_pool_writes_where_sglang_writes():
    """The write location (issue 10 §2.3): a plain KVWriteLoc with the SWA-side ids, no mark."""
    sg = load()
    calls = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def set_kv_buffer(
            self, layer, loc, cache_k, cache_v, *args, layer_id_override=None
        ):
            calls.append((self.name, layer_id_override, loc.tolist()))

    theirs = object.__new__(sg.SWAKVPool)
    theirs.full_kv_pool, theirs.swa_kv_pool = Recorder("full"), Recorder("swa")
    theirs.layers_mapping = {0: (0, True), 1: (0, False), 2: (1, True)}
    ours = SWAKVPool(
        16,
        8,
        1,
        torch.float32,
        1,
        2,
        full_attention_layer_ids=[1],
        swa_attention_layer_ids=[0, 2],
    )
    loc, swa = T([5, 6]), T([2, 3])
    k = torch.arange(4.0).reshape(2, 1, 2)
    for layer, with_swa in ((1, True), (1, False), (2, True)):
        calls.clear()
        theirs.set_kv_buffer(
            SimpleNamespace(layer_id=layer),
            sg.KVWriteLoc(loc, swa_loc=swa) if with_swa else loc,
            k,
            k,
        )
        ours.set_kv_buffer(
            layer, KVWriteLoc(loc, swa_loc=swa) if with_swa else loc, k, k
        )
        name, index, ids = calls[0]
        sub = ours.swa_kv_pool if name == "swa" else ours.full_kv_pool
        assert ours.is_swa_layer(layer) == (name == "swa") and torch.equal(
            sub.get_key_buffer(index)[ids], k
        )
    # an SWA layer without SWA-side ids: both refuse
    with pytest.raises(AssertionError):
        theirs.set_kv_buffer(SimpleNamespace(layer_id=0), loc, k, k)
    with pytest.raises(ValueError, match="no swa_loc"):
        ours.set_kv_buffer(0, loc, k, k)


def test_request_table_matches_sglang(tally):
    """Rows from the tail, chunked prefills keeping theirs, all-or-nothing refusals, generations
    that survive clear()."""
    sg = load()
    rng = random.Random(7)
    theirs = sg.ReqToTokenPool(
        size=5, max_context_len=8, device="cpu", enable_memory_saver=False
    )
    ours = ReqToTokenPool(5, 8)
    live, steps = {}, 300
    for step in range(steps):
        r = rng.random()
        if r < 0.5:
            keep = [rid for rid in live if rng.random() < 0.3]
            for rid in keep:
                live[rid][0].kv.kv_allocated_len = live[rid][1].kv.kv_allocated_len = 3
            fresh = [
                (SimpleNamespace(kv=sg.ReqKvInfo()), Req(step * 10 + i))
                for i in range(rng.randint(0, 3))
            ]
            got = (
                theirs.alloc([live[rid][0] for rid in keep] + [a for a, _ in fresh]),
                ours.alloc([live[rid][1] for rid in keep] + [b for _, b in fresh]),
            )
            assert got[0] == got[1], f"step {step}: rows {got}"
            if got[0] is not None:
                live.update({b.rid: (a, b) for a, b in fresh})
        elif r < 0.9 and live:
            rid = rng.choice(sorted(live))
            a, b = live.pop(rid)
            theirs.free(a)
            ours.free(b)
        elif r < 0.95:
            assert theirs.alloc_rows(0) == ours.alloc_rows(0) == []
        else:
            theirs.clear()
            ours.clear()
            for a, b in live.values():
                a.kv.req_pool_idx = b.kv.req_pool_idx = None
            live.clear()
        assert (
            theirs.free_slots == ours.free_slots
            and theirs.available_size() == ours.available_size()
        )
        assert torch.equal(theirs.req_generation, ours.req_generation), (
            f"step {step}: generations"
        )
    tally("ReqToTokenPool", 1, steps)
