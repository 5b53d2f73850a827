"""Sizing: each formula on hand-computed cases, and the real-model report against arithmetic
written out here (never by calling the code under test)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memlab.sglang.sizing import (
    GiB,
    GPUConfig,
    ParallelConfig,
    RunningReq,
    ScheduleConfig,
    ServingConfig,
    SpeculativeConfig,
    alloc_len_per_decode,
    alloc_page_size,
    alloc_reserve_per_decode,
    check_decode_mem,
    max_new_tokens_for_memory,
    new_tokens_required_next_decode,
    pool_sizes,
    req_to_token_row_width,
    retract_decode,
    retract_order,
    what_if_reserve_without_overlap_lag,
)

EAGLE = dict(algorithm="EAGLE")


# ---- per-step formulas --------------------------------------------------------------------
def test_alloc_page_size_is_page_times_dcp():
    assert (
        alloc_page_size(ScheduleConfig(page_size=16), ParallelConfig(dcp_size=2)) == 32
    )
    assert alloc_page_size(ScheduleConfig()) == 1


@pytest.mark.parametrize(
    "spec, ps, want",
    [
        (SpeculativeConfig(), 64, 1),  # no speculative decoding: one token per step
        (
            SpeculativeConfig(**EAGLE, num_steps=3, eagle_topk=1, num_draft_tokens=4),
            16,
            4,
        ),  # chain: max(3*1, 4)
        (
            SpeculativeConfig(**EAGLE, num_steps=5, eagle_topk=4, num_draft_tokens=8),
            1,
            20,
        ),  # tree, ps 1: 5*4
        # tree on pages: each of 4 branches may need ceil((16-1+3)/16) = 2 pages of 16
        (
            SpeculativeConfig(**EAGLE, num_steps=3, eagle_topk=4, num_draft_tokens=8),
            16,
            2 * 16 * 4,
        ),
        (
            SpeculativeConfig(**EAGLE, num_steps=1, eagle_topk=2, num_draft_tokens=16),
            4,
            16,
        ),  # max(1*4*2, 16)
        # a draft with no KV of its own (NGRAM) never copies pages: max(3*4, 8)
        (
            SpeculativeConfig(
                algorithm="NGRAM",
                num_steps=3,
                eagle_topk=4,
                num_draft_tokens=8,
                has_draft_kv=False,
            ),
            16,
            12,
        ),
    ],
)
def test_alloc_len_per_decode_hand_cases(spec, ps, want):
    assert alloc_len_per_decode(spec, ps) == want


@given(ps=st.integers(2, 64), steps=st.integers(1, 20))
def test_branch_pages_are_the_worst_case_over_partial_last_pages(ps, steps):
    # A branch copies the partial last page (L tokens, 0 <= L < ps) and writes `steps` more:
    # it touches ceil((L + steps) / ps) pages of its own; the rule must cover the worst L.
    worst = max(-(-(last + steps) // ps) for last in range(ps))
    spec = SpeculativeConfig(**EAGLE, num_steps=steps, eagle_topk=2, num_draft_tokens=1)
    assert alloc_len_per_decode(spec, ps) == worst * ps * 2


def _buggy_reserve(spec, ps):
    return alloc_len_per_decode(spec, ps)  # the doubled reserve forgotten


def _lagged_writes_fit(reserve_fn, spec, ps):
    """Overlap scheduler: the host has committed `c` tokens while the GPU is one step ahead at
    c + W; the step being prepared writes W more. Slots allocated: c + reserve."""
    w = alloc_len_per_decode(spec, ps)
    c = 100
    return c + w + w <= c + reserve_fn(spec, ps)


@pytest.mark.parametrize(
    "spec",
    [SpeculativeConfig(), SpeculativeConfig(**EAGLE, num_steps=3, num_draft_tokens=4)],
)
def test_reserve_is_always_doubled_and_the_buggy_variant_is_caught(spec):
    # SGLang 0.5.23 reserves 2x whatever the scheduler mode; 1x is only a named what-if
    assert alloc_reserve_per_decode(spec, 1) == 2 * alloc_len_per_decode(spec, 1)
    assert what_if_reserve_without_overlap_lag(spec, 1) == alloc_len_per_decode(spec, 1)
    assert _lagged_writes_fit(alloc_reserve_per_decode, spec, 1)
    assert not _lagged_writes_fit(_buggy_reserve, spec, 1)
    assert not _lagged_writes_fit(what_if_reserve_without_overlap_lag, spec, 1)


def test_uno_keeps_one_more_position():
    uno = SpeculativeConfig(algorithm="UNO", num_steps=3, num_draft_tokens=6)
    assert alloc_len_per_decode(uno, 1) == alloc_len_per_decode(uno, 16) == 7
    # reserve 14 at every page size
    assert req_to_token_row_width(4096, uno, 1) == 4096 + 14 + 0


def test_request_table_row_headroom():
    none = SpeculativeConfig()
    assert req_to_token_row_width(4096, none, 1) == 4096 + 4
    chain = SpeculativeConfig(**EAGLE, num_steps=3, num_draft_tokens=4)
    assert req_to_token_row_width(4096, chain, 1) == 4096 + 4 + 4
    tree = SpeculativeConfig(**EAGLE, num_steps=3, eagle_topk=4, num_draft_tokens=8)
    # reserve 2 * 128 = 256 plus a partial page of up to 15 beats the default 4 + 8
    assert req_to_token_row_width(4096, tree, 16) == 4096 + 256 + 15


@pytest.mark.parametrize(
    "inp, new, cap, ps, want",
    [
        (100, 2000, 1000, 16, 1000 - 112 - 16 - 1),  # the prompt rounds up to 112
        (100, 50, 1000, 16, 50),  # the request's own limit is lower
        (100, 2000, 1000, 1, 1000 - 100 - 1 - 1),
        (990, 10, 1000, 16, 0),  # the prompt nearly fills the pool: never negative
        (0, 10, 1000, 16, 10),
    ],
)
def test_max_new_tokens_for_memory_hand_cases(inp, new, cap, ps, want):
    assert max_new_tokens_for_memory(inp, new, cap, ps) == want


@given(
    inp=st.integers(0, 5000),
    new=st.integers(0, 5000),
    cap=st.integers(1, 10000),
    ps=st.sampled_from([1, 4, 16, 64]),
)
def test_clipped_generation_always_fits_an_empty_pool(inp, new, cap, ps):
    got = max_new_tokens_for_memory(inp, new, cap, ps)
    assert 0 <= got <= new
    if got:  # prompt + generation in whole pages leaves room in an empty pool
        assert -(-inp // ps) * ps + got + ps + 1 <= cap
        assert -(-(inp + got) // ps) * ps <= cap - 2


def test_new_tokens_required_next_decode_by_hand():
    # no speculative decoding: a page for each request whose next token opens one
    # lengths 16, 15, 8
    reqs = [RunningReq("a", 10, 6), RunningReq("b", 10, 5), RunningReq("c", 4, 4)]
    assert new_tokens_required_next_decode(reqs, 4) == 2 * 4
    assert new_tokens_required_next_decode(reqs, 1) == 3
    # with a reserve (speculative decoding): grow to seq_len + reserve, in pages past what is held
    # seq 5 holding 8 slots needs ceil(7/4)=2 pages: nothing new; seq 7 holding 8 needs 3: one more
    assert (
        new_tokens_required_next_decode([RunningReq("a", 3, 2, 8)], 4, reserve=2) == 0
    )
    assert (
        new_tokens_required_next_decode([RunningReq("b", 5, 2, 8)], 4, reserve=2) == 4
    )
    assert check_decode_mem([RunningReq("b", 5, 2, 8)], 4, 4, reserve=2)
    assert not check_decode_mem([RunningReq("b", 5, 2, 8)], 3, 4, reserve=2)


def test_retract_order_fewest_outputs_first_ties_by_longest_prompt():
    reqs = [
        RunningReq("A", 100, 5),
        RunningReq("B", 50, 1),
        RunningReq("C", 200, 1),
        RunningReq("D", 10, 9),
    ]
    assert [reqs[i].rid for i in retract_order(reqs)] == ["C", "B", "A", "D"]


def test_retract_until_it_fits():
    reqs = [
        RunningReq("A", 100, 5),
        RunningReq("B", 50, 1),
        RunningReq("C", 200, 1),
        RunningReq("D", 10, 9),
    ]
    # page size 1, reserve 2: 4 requests need 8 slots; 0 free. Retracting C frees 201 slots.
    kept, gone, fits = retract_decode(reqs, 0, 1, reserve=2)
    assert (
        [r.rid for r in gone] == ["C"]
        and [r.rid for r in kept] == ["A", "B", "D"]
        and fits
    )


def test_an_engine_releases_each_victim_and_reads_its_books_again():
    # C's first 150 slots are a cached prefix another request maps: retracting C frees only 51.
    reqs = [
        RunningReq("A", 100, 5),
        RunningReq("B", 50, 1),
        RunningReq("C", 200, 1),
        RunningReq("D", 10, 9),
    ]
    books = {"free": 0}
    freed = {"A": 106, "B": 51, "C": 51, "D": 19}
    released = []

    def release(r):
        released.append(r.rid)
        books["free"] += freed[r.rid]

    kept, gone, fits = retract_decode(
        reqs, lambda: books["free"], 1, reserve=30, release=release
    )
    # C (51 back) leaves 3 requests needing 90; B (51 more, 102 free) then fits the other two (60)
    assert (
        released == [r.rid for r in gone] == ["C", "B"]
        and [r.rid for r in kept] == ["A", "D"]
        and fits
    )
    # counted as a plain number, C would be taken to give back all 201 slots and B would stay
    kept, gone, _ = retract_decode(reqs, 0, 1, reserve=30)
    assert [r.rid for r in gone] == ["C"]


def test_retraction_always_keeps_one_request():
    reqs = [RunningReq("A", 100, 5), RunningReq("B", 50, 1)]
    # nothing could ever fit
    kept, gone, fits = retract_decode(reqs, 0, 1, reserve=10_000)
    assert (
        [r.rid for r in kept] == ["A"] and [r.rid for r in gone] == ["B"] and not fits
    )
    # SGLang calls retract_decode only after the check failed: its first pass retracts unchecked
    kept, gone, fits = retract_decode(reqs, 10, 1, reserve=2)
    assert [r.rid for r in gone] == ["B"] and fits
    # one request: kept, whatever happens
    kept, gone, fits = retract_decode(reqs[:1], 0, 1)
    assert gone == [] and not fits


# ---- the KV budget (SGLang 0.5.23's _profile_available_bytes) -------------------------------


def test_kv_budget_is_free_after_load_minus_the_non_static_share_of_free_before():
    from memlab.common.models import MODELS

    m = MODELS["Llama-3.1-8B"]
    f, in_use = 0.85, 1 * GiB
    gpu = GPUConfig(80 * GiB, "80", in_use_bytes=in_use)
    z = pool_sizes(
        ServingConfig(m, gpu, ScheduleConfig(page_size=16, mem_fraction_static=f))
    )
    free_before = 80 * GiB - in_use
    free_after = free_before - z.weight_bytes  # the load adds exactly the weights
    assert z.usable_bytes == int(free_after - (1 - f) * free_before)  # SGLang's formula
    # mem_fraction_static is (weights + KV pools) / free memory before the load:
    # activations live in 1 - f
    kv = z.bytes_by_kind["full_attention"]
    assert (
        z.weight_bytes + kv
        <= f * free_before
        < z.weight_bytes + kv + 16 * m.kv_bytes_per_token("full_attention")
    )
    # memory in use before the load costs f of itself, not all of it (the older total * f - weights
    # would not move at all)
    z0 = pool_sizes(
        ServingConfig(
            m, GPUConfig(80 * GiB), ScheduleConfig(page_size=16, mem_fraction_static=f)
        )
    )
    assert z0.usable_bytes - z.usable_bytes == pytest.approx(f * in_use, abs=1)


def test_a_gpu_cannot_have_more_in_use_than_it_holds():
    with pytest.raises(ValueError, match="leaves nothing"):
        GPUConfig(GiB, in_use_bytes=GiB)
    with pytest.raises(ValueError, match="in_use_bytes must be an int >= 0"):
        GPUConfig(GiB, in_use_bytes=-1)


# ---- the decode check evicts inside it (ScheduleBatch.check_decode_mem, check_decode_capacity) ---


def test_the_decode_check_evicts_the_shortfall_then_reads_the_free_slots():
    books = {"free": 4, "cached": 12}
    asked = []

    def evict(n):  # evict_from_tree_cache: the shortfall, if the tree holds it
        asked.append(n)
        short = max(0, n - books["free"])
        took = min(books["cached"], -(-short // 4) * 4)  # whole pages
        books["cached"] -= took
        books["free"] += took

    # page size 4, committed lengths 16, 15, 8: only 16 and 8 sit on a boundary, 2 pages
    reqs = [RunningReq("a", 10, 6), RunningReq("b", 10, 5), RunningReq("c", 4, 4)]
    assert check_decode_mem(reqs, lambda: books["free"], 4, evict=evict)
    # the check itself evicted one page
    assert asked == [8] and books == {"free": 8, "cached": 8}
    books.update(free=0, cached=4)
    assert (
        not check_decode_mem(reqs, lambda: books["free"], 4, evict=evict)
        and books["free"] == 4
    )
    # without speculative decoding no reserve is read: a request mid-page needs nothing
    assert check_decode_mem([RunningReq("b", 10, 5)], 0, 4)
