"""The scheduler's side of the allocators (chapter 12, SGLang 0.5.23's ``allocator/base.py``): the
capacity questions the scheduler asks any allocator without branching on its type, answered by the
token, paged, two-pool SWA and unified allocators; composites answer for all their pools at once.
The agreement with the wheel's own methods is tests/engines/sglang/test_capacity.py.
"""

import pytest
import torch

from memlab.capstone.engine import Engine, TinyConfig, TinyLlama
from memlab.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from memlab.sglang.sizing import estimate_swa_kv_tokens
from memlab.sglang.swa import SWATokenToKVPoolAllocator
from memlab.sglang.unified import (
    MHASubPoolSpec,
    UnifiedKVPool,
    UnifiedSWATokenToKVPoolAllocator,
)


class Tree:
    """A prefix cache holding ``held`` slots of its allocator, evicted in pieces of ``piece`` slots;
    records each ``evict`` it is asked for."""

    def __init__(
        self,
        alloc,
        held: torch.Tensor | None = None,
        piece: int = 1,
        sharing: bool = True,
    ):
        self.token_to_kv_pool_allocator, self.piece, self.sharing = (
            alloc,
            piece,
            sharing,
        )
        self.held = [] if held is None else list(held.split(piece))
        self.asked = []

    def supports_prefix_sharing(self):
        return self.sharing

    def evictable_size(self):
        return sum(len(h) for h in self.held)

    def evict(self, num_tokens):
        self.asked.append(num_tokens)
        done = 0
        while self.held and done < num_tokens:
            h = self.held.pop()
            self.token_to_kv_pool_allocator.free(h)
            done += len(h)


def single(kind, size=64, ps=4):
    if kind == "token":
        return TokenToKVPoolAllocator(size, debug_mode=True)
    return PagedTokenToKVPoolAllocator(size, ps, debug_mode=True)


def two_pool(size=64, size_swa=32, ps=4):
    return SWATokenToKVPoolAllocator(size, size_swa, ps, debug_mode=True)


def unified(total=4096, ps=2):
    """full: 1 layer of K+V bf16 at 16 dims, 64 B a slot; swa: 2 layers at 8 dims, 64 B a slot."""

    def mha(name, grow, layers, d):
        return MHASubPoolSpec(
            name=name,
            layer_num=layers,
            head_num=1,
            head_dim=d,
            store_dtype=torch.bfloat16,
            grow_direction=grow,
        )

    pool = UnifiedKVPool(
        total_bytes=total,
        sub_pool_specs=[mha("full", "down", 1, 16), mha("swa", "up", 2, 8)],
        page_size=ps,
    )
    return UnifiedSWATokenToKVPoolAllocator(
        unified_buffer=pool, page_size=ps, debug_mode=True
    )


ALL = [lambda: single("token"), lambda: single("paged"), two_pool, unified]
IDS = ["token", "paged", "swa", "unified"]


# -- one pool -----------------------------------------------------------------------------------


@pytest.mark.parametrize("make", ALL, ids=IDS)
def test_no_allocator_reserves_slots_per_request(make):
    a = make()
    assert a.request_slot_reserve(has_req_pool_slot=False, prefill_tokens=40) == 0
    assert a.request_slot_reserve(has_req_pool_slot=True) == 0


@pytest.mark.parametrize("kind,ps", [("token", 1), ("paged", 4)])
def test_a_single_pool_clips_new_tokens_to_its_capacity(kind, ps):
    a = single(kind, 64, ps)
    kw = dict(sliding_window_size=None, chunk_size=None)
    # 64 slots - the prompt in whole pages - one page - one slot
    assert (
        a.max_new_tokens_for_memory(10, 100, token_capacity=64, **kw)
        == 64 - (12 if ps == 4 else 10) - ps - 1
    )
    assert a.max_new_tokens_for_memory(10, 5, token_capacity=64, **kw) == 5
    # clipped to 0, never None
    assert a.max_new_tokens_for_memory(70, 5, token_capacity=64, **kw) == 0
    assert (
        a.max_new_tokens_for_memory(10, 100, token_capacity=32, **kw)
        == 32 - (12 if ps == 4 else 10) - ps - 1
    )


@pytest.mark.parametrize("make", ALL[:3], ids=IDS[:3])
def test_separate_pools_have_no_ceiling_and_check_each_budget(make):
    a = make()
    assert a.prealloc_ceiling_fits(10**6, 10**6) is None
    assert a.prealloc_fits_assumes_reclaim() is False
    assert a.prealloc_fits(None, 8, 8, full_budget_tokens=8)
    assert not a.prealloc_fits(None, 9, 8, full_budget_tokens=8)
    # no SWA budget: the SWA side is not checked
    assert a.prealloc_fits(None, 8, 100, full_budget_tokens=8)
    assert not a.prealloc_fits(None, 8, 5, full_budget_tokens=8, swa_budget_tokens=4)
    assert a.prealloc_fits(None, 8, 4, full_budget_tokens=8, swa_budget_tokens=4)


@pytest.mark.parametrize("kind", ["token", "paged"])
def test_a_single_pool_evicts_its_shortfall(kind):
    a = single(kind, 64, 4)
    ps = a.page_size
    held = a.alloc(48)
    tree = Tree(a, held, piece=ps)
    # 16 free: nothing to evict
    assert a.evict_to_free_tokens(tree, 10) is None and tree.asked == []
    assert a.evict_to_free_tokens(tree, 30) is None and tree.asked == [30 - 16]
    assert a.available_size() >= 30
    a.evict_to_free_tokens(Tree(a, sharing=False), 64)  # a disabled tree is never asked
    a.evict_to_free_tokens(None, 64)


def test_the_two_pool_allocator_evicts_for_its_shorter_side():
    a = two_pool(64, 32, 4)
    held = a.alloc(24)  # 40 full slots free, 8 SWA slots free
    tree = Tree(a, held, piece=4)
    assert (a.full_available_size(), a.swa_available_size(), a.available_size()) == (
        40,
        8,
        8,
    )
    a.evict_to_free_tokens(tree, 20)
    assert tree.asked == [12]  # the SWA side is 12 short, the full side not at all
    assert a.available_size() >= 20


# -- one buffer, both sides ---------------------------------------------------------------------


def test_the_unified_pool_prices_new_tokens_in_bytes():
    a = unified(4096, 2)
    ps, kw = 2, dict(token_capacity=10**6, chunk_size=None)

    # an empty pool: full pages and SWA pages against the whole gap
    def fits(n, prompt, window):
        swa = estimate_swa_kv_tokens(
            prompt, n, sliding_window_size=window, page_size=ps
        )
        return a.can_reserve(
            prompt + n + ps, swa, empty_pool=True, require_token_slack=True
        )

    for prompt, window in [(4, None), (10, None), (10, 8), (20, 4), (1, 16)]:
        got = a.max_new_tokens_for_memory(
            prompt, 10**4, sliding_window_size=window, **kw
        )
        assert (
            got is not None
            and fits(got, prompt, window)
            and not fits(got + 1, prompt, window)
        ), (prompt, window)
        assert (
            a.max_new_tokens_for_memory(prompt, 3, sliding_window_size=window, **kw)
            == 3
        )
    # the window lets a request grow past what both sides' full copies would hold
    assert a.max_new_tokens_for_memory(
        10, 10**4, sliding_window_size=8, **kw
    ) > a.max_new_tokens_for_memory(10, 10**4, sliding_window_size=None, **kw)
    # the prompt alone
    assert a.max_new_tokens_for_memory(10**4, 1, sliding_window_size=None, **kw) is None


def test_the_unified_pool_has_a_ceiling_and_prices_both_sides_together():
    a = unified(4096, 2)
    # pages the gap holds, either side's (2 x 64 B a page)
    pages = a._empty_shared_gap_bytes // 128
    assert a.prealloc_fits_assumes_reclaim() is True
    # any split of the bytes between the sides, not a page more
    for full in (1, pages // 2, pages - 1):
        assert a.prealloc_ceiling_fits(2 * full, 2 * (pages - full))
        assert not a.prealloc_ceiling_fits(2 * full, 2 * (pages - full) + 1)
    tree = Tree(a)
    budget = a.full_available_size()
    assert budget > pages  # the full side alone could take the SWA side's bytes
    half = 2 * (pages // 2)
    assert a.prealloc_fits(tree, half, 2 * pages - half, full_budget_tokens=budget)
    assert not a.prealloc_fits(
        tree, half, 2 * pages - half + 2, full_budget_tokens=budget
    )
    # what the budget holds back (decode reserve) is held back from the shared envelope too
    assert not a.prealloc_fits(
        tree, half, 2 * pages - half, full_budget_tokens=budget - 2
    )


def test_the_unified_pool_evicts_by_plan_and_answers():
    a = unified(4096, 2)
    n = a.available_size()
    held = a.alloc(n)
    tree = Tree(a, held, piece=2)
    assert a.available_size() == 0
    assert a.evict_to_free_tokens(tree, 8) is True and tree.asked == [8]
    assert a.available_size() >= 8
    # fits now: nothing asked
    assert a.evict_to_free_tokens(tree, 8) is True and tree.asked == [8]
    # even evicting everything is not enough
    assert a.evict_to_free_tokens(tree, 10**5) is None
    assert a.evict_to_free_tokens(None, 8) is None


# -- the engine asks only these --------------------------------------------------------------------

MODEL = TinyLlama(TinyConfig())


def engine(**kw):
    return Engine(
        MODEL,
        page_size=4,
        num_tokens=96,
        max_running=4,
        max_context=128,
        chunk_size=16,
        attention="torch",
        debug_mode=True,
        prefix_cache="radix",
        **kw,
    )


def test_the_engine_evicts_through_the_allocator(monkeypatch):
    prompts = [[1 + (i * 7 + j) % 60 for j in range(30)] for i in range(6)]
    e = engine()
    e.generate(prompts, 6)
    asked = []
    monkeypatch.setattr(
        PagedTokenToKVPoolAllocator,
        "evict_to_free_tokens",
        lambda self, tree, n: asked.append(n),
    )
    # nothing is evicted: the cached prompts block the pool
    with pytest.raises(RuntimeError):
        engine().generate(prompts, 6)
    assert asked


def test_the_engine_admits_on_the_allocators_answer(monkeypatch):
    monkeypatch.setattr(
        PagedTokenToKVPoolAllocator, "prealloc_fits", lambda self, *a, **k: False
    )
    with pytest.raises(RuntimeError, match="stuck"):
        engine().generate([[1, 2, 3]], 2)


def test_the_engine_refuses_what_the_allocator_says_can_never_fit(monkeypatch):
    e = engine()
    e.add_request([1] * 60, 20)  # 80 + a page <= 96
    monkeypatch.setattr(
        PagedTokenToKVPoolAllocator, "prealloc_ceiling_fits", lambda self, f, s: False
    )
    with pytest.raises(ValueError, match="can never fit"):
        e.add_request([1] * 4, 2)
    monkeypatch.setattr(
        PagedTokenToKVPoolAllocator, "prealloc_ceiling_fits", lambda self, f, s: None
    )
    monkeypatch.setattr(
        PagedTokenToKVPoolAllocator,
        "max_new_tokens_for_memory",
        lambda self, *a, **k: None,
    )
    with pytest.raises(ValueError, match="can never fit"):
        e.add_request([1] * 4, 2)
