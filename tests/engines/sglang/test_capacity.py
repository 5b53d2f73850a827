"""The scheduler's capacity questions (chapter 12) against SGLang 0.5.23's own methods, step by
step.

The wheel's allocators (token, paged, two-pool SWA from ``allocator/{base,token,paged,swa}.py``,
the unified SWA composite from ``allocator/unified_hybrid_swa.py``) and memlab's run the same
random stream of allocs and frees in lockstep; after every step both are asked the same questions
and must answer alike: ``available_size``, ``request_slot_reserve``, ``max_new_tokens_for_memory``
(several prompts, windows, chunk limits), ``prealloc_fits_assumes_reclaim``,
``prealloc_ceiling_fits``, ``prealloc_fits`` (budgets around what is free, evictable counts given)
and ``evict_to_free_tokens``, which both ask a stand-in tree to evict. The wheel's trees take
``EvictParams(num_tokens=..., swa_num_tokens=...)``, memlab's ``evict(num_tokens)`` and free both
sides of a node, so what is compared is: the single pools' shortfall (the same number), the SWA
pair's larger side (memlab asks for the larger of the wheel's two), and for the unified pool the
wheel's ``reclaim_plan`` against memlab's, and whether the demand fits afterwards.
``estimate_swa_kv_tokens`` is picked from the wheel's ``prefill_budget.py`` (the rest of that file
is the prefill adder's budgets, not loaded).
"""

import random

import pytest
import torch

from memlab.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from memlab.sglang.swa import SWATokenToKVPoolAllocator
from memlab_tests.tools.engines.sglang_loader import load

STEPS = 40


def T(xs):
    return torch.tensor(xs, dtype=torch.int64)


class Tree:
    """A prefix cache that holds nothing and records what it is asked to evict, in either engine's
    words; ``e`` evictable tokens on each side (the unified pool's plans read them)."""

    def __init__(self, evictable: int = 0):
        self.e, self.asked = evictable, []

    def supports_prefix_sharing(self):
        return True

    def evictable_size(self):
        return self.e

    full_evictable_size = swa_evictable_size = evictable_size

    def evict_for_alloc(self, params, **kw):  # the wheel's
        self.asked.append((params.num_tokens, params.swa_num_tokens))

    def evict(self, num_tokens):  # memlab's
        self.asked.append(num_tokens)


def questions(a, rng, ps, windows=(None,)):
    """Every capacity question, with arguments drawn once for both engines."""
    out = dict(
        available=a.available_size(),
        reserve=(
            a.request_slot_reserve(
                has_req_pool_slot=False, prefill_tokens=rng.randint(0, 50)
            ),
            a.request_slot_reserve(has_req_pool_slot=True),
        ),
        assumes=a.prealloc_fits_assumes_reclaim(),
    )
    mnt = []
    for window in windows:
        for _ in range(3):
            inp, new, cap = (
                rng.randint(1, 400),
                rng.randint(0, 400),
                rng.randint(16, 512),
            )
            chunk = rng.choice([None, 16, 64])
            mnt.append(
                a.max_new_tokens_for_memory(
                    inp,
                    new,
                    token_capacity=cap,
                    sliding_window_size=window,
                    chunk_size=chunk,
                )
            )
    out["max_new"] = mnt
    full_av = getattr(a, "full_available_size", a.available_size)()
    swa_av = getattr(a, "swa_available_size", a.available_size)()
    fits = []
    for _ in range(4):
        f, s = rng.randint(0, full_av + 3 * ps), rng.randint(0, swa_av + 3 * ps)
        out.setdefault("ceiling", []).append(a.prealloc_ceiling_fits(f, s))
        fb = full_av - rng.randint(0, 2 * ps)
        sb = rng.choice([None, swa_av - rng.randint(0, 2 * ps)])
        fits.append(
            a.prealloc_fits(Tree(), f, s, full_budget_tokens=fb, swa_budget_tokens=sb)
        )
    out["fits"] = fits
    return out


def same_answers(wheel, mine, seed, where):
    qw = questions(
        wheel, random.Random(seed), wheel.page_size, WINDOWS.get(type(mine), (None,))
    )
    qm = questions(
        mine, random.Random(seed), mine.page_size, WINDOWS.get(type(mine), (None,))
    )
    for k in qw:
        assert qw[k] == qm[k], f"{where}: {k}: SGLang {qw[k]} != memlab {qm[k]}"


WINDOWS = {}


def extend_alloc(e, n):
    """A new request's ``n`` tokens (no prefix) through ``alloc_extend``: the wheel's SWA pair has
    ``alloc`` at page size 1 only."""
    z, seq = T([0]), T([n])
    return e.alloc_extend(z, z, seq, seq, T([-1]), n)


def lockstep(rng, engines, held, ps, max_n, alloc=lambda e, n: e.alloc(n)):
    """One alloc or free on every engine; returns the ids handed out (all engines must agree)."""
    if held and rng.random() < 0.45:
        i = rng.randrange(len(held))
        for e, ids in zip(engines, held.pop(i)):
            e.free(T(ids))
        return "free"
    n = rng.randint(1, max_n) * ps
    outs = [alloc(e, n) for e in engines]
    assert len({o is None for o in outs}) == 1, "refused by some only"
    if outs[0] is not None:
        assert len({tuple(o.tolist()) for o in outs}) == 1, "different ids"
        held.append([o.tolist() for o in outs])
    return "alloc"


def evict_asks(a, n):
    tree = Tree()
    ret = a.evict_to_free_tokens(tree, n)
    return ret, tree.asked


# -- one pool ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_single_pool_questions_match_sglang(ps, tally):
    sg = load()
    streams = 3
    for seed in range(streams):
        rng = random.Random(100 * ps + seed)
        size = rng.choice([16, 32]) * ps
        if ps == 1:
            wheel, mine = (
                sg.TokenToKVPoolAllocator(size, torch.float16, "cpu", None, False),
                TokenToKVPoolAllocator(size, debug_mode=True),
            )
        else:
            wheel, mine = (
                sg.PagedTokenToKVPoolAllocator(
                    size, ps, torch.float16, "cpu", None, False
                ),
                PagedTokenToKVPoolAllocator(size, ps, debug_mode=True),
            )
        held = []
        for step in range(STEPS):
            what = lockstep(rng, [wheel, mine], held, ps, 6)
            where = f"page {ps} seed {seed} step {step} ({what})"
            same_answers(wheel, mine, rng.random(), where)
            n = rng.randint(0, size)
            (rw, aw), (rm, am) = evict_asks(wheel, n), evict_asks(mine, n)
            assert rw is rm is None, where
            assert [x for x, _ in aw] == am, f"{where}: asked SGLang {aw} memlab {am}"
    tally(
        f"capacity questions, {'token' if ps == 1 else 'paged'} allocator page {ps}",
        streams,
        streams * STEPS,
    )


@pytest.mark.parametrize("ps", [1, 4])
def test_two_pool_swa_questions_match_sglang(ps, tally):
    sg = load()
    streams = 3
    for seed in range(streams):
        rng = random.Random(200 * ps + seed)
        size, size_swa = rng.choice([24, 32]) * ps, rng.choice([8, 16]) * ps
        # only its mapping registry is used; no KV buffers are built
        kv = object.__new__(sg.SWAKVPool)
        kv.full_kv_pool = kv.swa_kv_pool = None
        wheel = sg.SWATokenToKVPoolAllocator(
            size, size_swa, ps, torch.float16, "cpu", kv, False
        )
        mine = SWATokenToKVPoolAllocator(size, size_swa, ps, debug_mode=True)
        held = []
        for step in range(STEPS):
            what = lockstep(
                rng,
                [wheel, mine],
                held,
                ps,
                4,
                alloc=extend_alloc if ps > 1 else lambda e, n: e.alloc(n),
            )
            where = f"page {ps} seed {seed} step {step} ({what})"
            same_answers(wheel, mine, rng.random(), where)
            n = rng.randint(0, size)
            (_, aw), (_, am) = evict_asks(wheel, n), evict_asks(mine, n)
            assert [max(x) for x in aw] == am, f"{where}: asked SGLang {aw} memlab {am}"
    tally(
        f"capacity questions, two-pool SWA allocator page {ps}",
        streams,
        streams * STEPS,
    )


# -- one buffer ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ps", [1, 2, 4])
def test_unified_questions_match_sglang(ps, tally):
    from memlab.sglang.unified import UnifiedSWATokenToKVPoolAllocator
    from memlab_tests.engines.sglang import test_unified as tu

    u = load()
    from memlab_tests.tools.engines import unified_loader

    uu = unified_loader.load()
    from memlab_tests.tools.engines import sglang_loader

    sglang_loader._Loader(u.root).pick(
        "sglang.srt.mem_cache.prefill_budget", ["estimate_swa_kv_tokens"]
    )
    WINDOWS[UnifiedSWATokenToKVPoolAllocator] = (None, 8, 64)
    streams = 3
    for seed in range(streams):
        rng = random.Random(300 * ps + seed)
        e_full, e_swa = rng.choice([32, 64, 128]), rng.choice([32, 64])
        total = rng.randint(20, 50) * 64 * ps
        wpool, mpool = tu.pools(uu, total, e_full, e_swa, ps, False, ("full", "swa"))
        wheel, mine = (
            tu.composite(uu, wpool, ps),
            tu.composite(uu, mpool, ps, wheel=False),
        )
        held = []
        for step in range(STEPS):
            what = lockstep(rng, [wheel, mine], held, ps, 5)
            where = f"page {ps} seed {seed} step {step} ({what})"
            same_answers(wheel, mine, rng.random(), where)
            full_live = mine.full_attn_allocator.allocated_count()
            for _ in range(3):
                f, s, e = (
                    rng.randint(0, 2 * full_live + 4 * ps),
                    rng.randint(0, 2 * full_live + 4 * ps),
                    rng.randint(0, full_live),
                )
                assert wheel.reclaim_plan(
                    f, s, full_evictable_tokens=e, swa_evictable_tokens=e
                ) == mine.reclaim_plan(
                    f, s, full_evictable_tokens=e, swa_evictable_tokens=e
                ), where
                assert wheel.prealloc_fits(
                    Tree(e), f, s, full_budget_tokens=f, swa_budget_tokens=s
                ) == mine.prealloc_fits(
                    Tree(e), f, s, full_budget_tokens=f, swa_budget_tokens=s
                ), where
            # nothing evictable: both answer None (cannot) or whether it fits now, and ask nothing
            n = rng.randint(0, mine.available_size() + 2 * ps)
            (rw, aw), (rm, am) = evict_asks(wheel, n), evict_asks(mine, n)
            assert rw == rm and aw == am == [], (
                f"{where}: SGLang {rw, aw} memlab {rm, am}"
            )
    tally(
        f"capacity questions, unified SWA allocator page {ps}", streams, streams * STEPS
    )
