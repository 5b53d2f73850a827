"""Sizing: each formula on hand-computed cases, and the real-model report against arithmetic
written out here (never by calling the code under test)."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlab.models import (DEEPSEEK_V3, FULL, GEMMA_3_27B, LINEAR, LLAMA_3_1_8B, QWEN2_5_7B, QWEN3_NEXT_80B_A3B,
                           SLIDING)
from memlab.sizing import (GiB, GPUConfig, ParallelConfig, RunningReq, ScheduleConfig, ServingConfig,
                           SpeculativeConfig, alloc_len_per_decode, alloc_page_size, alloc_reserve_per_decode,
                           check_decode_mem, decode_tokens_needed, max_new_tokens_for_memory, max_requests_at,
                           pool_sizes, report, req_to_token_row_width, retract_decode, retract_order)

EAGLE = dict(algorithm="EAGLE")


# ---- per-step formulas --------------------------------------------------------------------
def test_alloc_page_size_is_page_times_dcp():
    assert alloc_page_size(ScheduleConfig(page_size=16), ParallelConfig(dcp_size=2)) == 32
    assert alloc_page_size(ScheduleConfig()) == 1


@pytest.mark.parametrize("spec, ps, want", [
    (SpeculativeConfig(), 64, 1),  # no speculative decoding: one token per step
    (SpeculativeConfig(**EAGLE, num_steps=3, eagle_topk=1, num_draft_tokens=4), 16, 4),  # chain: max(3*1, 4)
    (SpeculativeConfig(**EAGLE, num_steps=5, eagle_topk=4, num_draft_tokens=8), 1, 20),  # tree, ps 1: 5*4
    # tree on pages: each of 4 branches may need ceil((16-1+3)/16) = 2 pages of 16
    (SpeculativeConfig(**EAGLE, num_steps=3, eagle_topk=4, num_draft_tokens=8), 16, 2 * 16 * 4),
    (SpeculativeConfig(**EAGLE, num_steps=1, eagle_topk=2, num_draft_tokens=16), 4, 16),  # max(1*4*2, 16)
    # a draft with no KV of its own (NGRAM) never copies pages: max(3*4, 8)
    (SpeculativeConfig(algorithm="NGRAM", num_steps=3, eagle_topk=4, num_draft_tokens=8, has_draft_kv=False), 16, 12),
])
def test_alloc_len_per_decode_hand_cases(spec, ps, want):
    assert alloc_len_per_decode(spec, ps) == want


@given(ps=st.integers(2, 64), steps=st.integers(1, 20))
def test_branch_pages_are_the_worst_case_over_partial_last_pages(ps, steps):
    # A branch copies the partial last page (L tokens, 0 <= L < ps) and writes `steps` more:
    # it touches ceil((L + steps) / ps) pages of its own; the rule must cover the worst L.
    worst = max(-(-(last + steps) // ps) for last in range(ps))
    spec = SpeculativeConfig(**EAGLE, num_steps=steps, eagle_topk=2, num_draft_tokens=1)
    assert alloc_len_per_decode(spec, ps) == worst * ps * 2


def _buggy_reserve(spec, ps, enable_overlap=True):
    return alloc_len_per_decode(spec, ps)  # the doubled reserve forgotten


def _lagged_writes_fit(reserve_fn, spec, ps):
    """Overlap scheduler: the host has committed `c` tokens while the GPU is one step ahead at
    c + W; the step being prepared writes W more. Slots allocated: c + reserve."""
    w = alloc_len_per_decode(spec, ps)
    c = 100
    return c + w + w <= c + reserve_fn(spec, ps, True)


@pytest.mark.parametrize("spec", [SpeculativeConfig(), SpeculativeConfig(**EAGLE, num_steps=3, num_draft_tokens=4)])
def test_overlap_reserve_is_doubled_and_the_buggy_variant_is_caught(spec):
    assert alloc_reserve_per_decode(spec, 1, enable_overlap=True) == 2 * alloc_len_per_decode(spec, 1)
    assert alloc_reserve_per_decode(spec, 1, enable_overlap=False) == alloc_len_per_decode(spec, 1)
    assert _lagged_writes_fit(alloc_reserve_per_decode, spec, 1)
    assert not _lagged_writes_fit(_buggy_reserve, spec, 1)


def test_request_table_row_headroom():
    none = SpeculativeConfig()
    assert req_to_token_row_width(4096, none, 1) == 4096 + 4
    chain = SpeculativeConfig(**EAGLE, num_steps=3, num_draft_tokens=4)
    assert req_to_token_row_width(4096, chain, 1) == 4096 + 4 + 4
    tree = SpeculativeConfig(**EAGLE, num_steps=3, eagle_topk=4, num_draft_tokens=8)
    # reserve 2 * 128 = 256 plus a partial page of up to 15 beats the default 4 + 8
    assert req_to_token_row_width(4096, tree, 16) == 4096 + 256 + 15
    assert req_to_token_row_width(4096, tree, 16, enable_overlap=False) == 4096 + 128 + 15


@pytest.mark.parametrize("inp, new, cap, ps, want", [
    (100, 2000, 1000, 16, 1000 - 112 - 16 - 1),  # the prompt rounds up to 112
    (100, 50, 1000, 16, 50),  # the request's own limit is lower
    (100, 2000, 1000, 1, 1000 - 100 - 1 - 1),
    (990, 10, 1000, 16, 0),  # the prompt nearly fills the pool: never negative
    (0, 10, 1000, 16, 10),
])
def test_max_new_tokens_for_memory_hand_cases(inp, new, cap, ps, want):
    assert max_new_tokens_for_memory(inp, new, cap, ps) == want


@given(inp=st.integers(0, 5000), new=st.integers(0, 5000), cap=st.integers(1, 10000), ps=st.sampled_from([1, 4, 16, 64]))
def test_clipped_generation_always_fits_an_empty_pool(inp, new, cap, ps):
    got = max_new_tokens_for_memory(inp, new, cap, ps)
    assert 0 <= got <= new
    if got:  # prompt + generation in whole pages leaves room in an empty pool
        assert -(-inp // ps) * ps + got + ps + 1 <= cap
        assert -(-(inp + got) // ps) * ps <= cap - 2


def test_decode_tokens_needed_by_hand():
    # page size 1: each request needs `reserve` more slots beyond what it holds
    reqs = [RunningReq(i, 10, 5) for i in range(3)]
    assert decode_tokens_needed(reqs, 2, 1) == 6
    # page size 4: seq 5 holding 8 slots (two pages) needs ceil(7/4)=2 pages: nothing new;
    # seq 7 holding 8 needs ceil(9/4)=3: one page more
    assert decode_tokens_needed([RunningReq("a", 3, 2, 8)], 2, 4) == 0
    assert decode_tokens_needed([RunningReq("b", 5, 2, 8)], 2, 4) == 4
    assert check_decode_mem([RunningReq("b", 5, 2, 8)], 4, 2, 4)
    assert not check_decode_mem([RunningReq("b", 5, 2, 8)], 3, 2, 4)


def test_retract_order_fewest_outputs_first_ties_by_longest_prompt():
    reqs = [RunningReq("A", 100, 5), RunningReq("B", 50, 1), RunningReq("C", 200, 1), RunningReq("D", 10, 9)]
    assert [reqs[i].rid for i in retract_order(reqs)] == ["C", "B", "A", "D"]
    assert retract_order(reqs, speculative=True) == [3, 2, 1, 0]  # only from the back


def test_retract_until_it_fits():
    reqs = [RunningReq("A", 100, 5), RunningReq("B", 50, 1), RunningReq("C", 200, 1), RunningReq("D", 10, 9)]
    # page size 1, reserve 2: 4 requests need 8 slots; 0 free. Retracting C frees 201 slots.
    kept, gone, fits = retract_decode(reqs, 0, 2, 1)
    assert [r.rid for r in gone] == ["C"] and [r.rid for r in kept] == ["A", "B", "D"] and fits


def test_retraction_always_keeps_one_request():
    reqs = [RunningReq("A", 100, 5), RunningReq("B", 50, 1)]
    kept, gone, fits = retract_decode(reqs, 0, 10_000, 1)  # nothing could ever fit
    assert [r.rid for r in kept] == ["A"] and [r.rid for r in gone] == ["B"] and not fits
    kept, gone, fits = retract_decode(reqs, 10, 2, 1)  # already fits: nothing retracted
    assert len(kept) == 2 and gone == [] and fits


# ---- configuration objects ----------------------------------------------------------------
@pytest.mark.parametrize("make, match", [
    (lambda: ScheduleConfig(page_size=0), "page_size"),
    (lambda: ScheduleConfig(mem_fraction_static=1.5), "mem_fraction_static"),
    (lambda: ScheduleConfig(activation_reserve_bytes=-1), "activation_reserve_bytes"),
    (lambda: SpeculativeConfig(num_steps=0), "num_steps"),
    (lambda: ParallelConfig(tp_size=0), "tp_size"),
    (lambda: GPUConfig(0), "total_bytes"),
])
def test_bad_knobs_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_one_knob_moves_every_derived_number():
    base = ServingConfig(LLAMA_3_1_8B, GPUConfig.gib(80), ScheduleConfig(page_size=1))
    paged = dataclasses.replace(base, schedule=dataclasses.replace(base.schedule, page_size=64))
    a, b = pool_sizes(base), pool_sizes(paged)
    assert a.full_tokens % 64 != 0 and b.full_tokens % 64 == 0 and b.full_tokens <= a.full_tokens
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.schedule.page_size = 2


# ---- the real-model report, against arithmetic written out here ---------------------------
def floor16(x):
    return x // 16 * 16


SCHED = ScheduleConfig(page_size=16, mem_fraction_static=0.88, activation_reserve_bytes=2 * GiB)


def test_llama_on_80_gib_by_hand():
    usable = int(80 * 2**30 * 0.88) - 8_030_261_248 * 2 - 2 * 2**30
    per_token = 32 * 8 * 128 * 2 * 2
    tokens = floor16(usable // per_token)
    r = report(LLAMA_3_1_8B, 80, seq_len=4096, schedule=SCHED)
    assert r.sizes.usable_bytes == usable and r.sizes.full_tokens == tokens == 437_792
    assert r.pages == tokens // 16 and r.requests == tokens // 4096 == 106
    assert r.sizes.bytes_by_kind == {FULL: tokens * per_token}
    assert r.row_width == 131072 + 4


def test_qwen2_5_on_80_gib_by_hand():
    usable = int(80 * 2**30 * 0.88) - 7_615_616_512 * 2 - 2 * 2**30
    tokens = floor16(usable // (28 * 4 * 128 * 2 * 2))
    r = report(QWEN2_5_7B, 80, seq_len=32768, schedule=SCHED)
    assert r.sizes.full_tokens == tokens and r.requests == tokens // 32768


def test_small_gpu_does_not_fit_bf16_but_fits_fp8_weights():
    r = report(LLAMA_3_1_8B, 16, schedule=SCHED)
    assert int(16 * 2**30 * 0.88) - 8_030_261_248 * 2 - 2 * 2**30 < 0
    assert not r.sizes.fits and r.requests == 0 and "does not fit" in r.format()
    fp8 = dataclasses.replace(SCHED, weight_dtype_bytes=1, activation_reserve_bytes=1 * GiB)
    usable = int(16 * 2**30 * 0.88) - 8_030_261_248 - 1 * 2**30
    r = report(LLAMA_3_1_8B, 16, seq_len=4096, schedule=fp8)
    assert r.sizes.full_tokens == floor16(usable // 131072) and r.requests == floor16(usable // 131072) // 4096


def test_gemma3_splits_full_and_sliding_by_hand():
    usable = int(80 * 2**30 * 0.88) - 27_009_346_304 * 2 - 2 * 2**30
    F, S, ratio = 10 * 16 * 128 * 4, 52 * 16 * 128 * 4, 0.8  # full / sliding bytes per token
    full = floor16(int(usable / (F + ratio * S)))
    swa = floor16(int(full * ratio))
    r = report(GEMMA_3_27B, 80, seq_len=4096, schedule=SCHED)
    assert (r.sizes.full_tokens, r.sizes.swa_tokens) == (full, swa)
    assert r.sizes.bytes_by_kind == {FULL: full * F, SLIDING: swa * S}
    # a 4096-token request holds 4096 full tokens but only 1024 + one page of 16 SWA tokens
    assert r.requests == min(full // 4096, swa // (1024 + 16))
    assert sum(r.sizes.bytes_by_kind.values()) <= usable


def test_qwen3_next_on_four_ranks_by_hand():
    par = ParallelConfig(tp_size=4)
    usable = int(80 * 2**30 * 0.88) - 80_000_000_000 * 2 // 4 - 2 * 2**30
    state = 36 * (2048 * 3 * 2 + 8 * 128 * 128 * 4)  # per rank: a quarter of the channels and heads
    slots = int(usable * 0.9 / 1.9) // state
    per_token = 12 * 1 * 256 * 2 * 2  # 2 KV heads over 4 ranks: one replicated head each
    full = floor16((usable - slots * state) // per_token)
    r = report(QWEN3_NEXT_80B_A3B, 80, seq_len=4096, schedule=SCHED, parallel=par)
    assert (r.sizes.mamba_slots, r.sizes.full_tokens) == (slots, full)
    assert r.state_bytes_per_request == state and r.bytes_per_token == {FULL: per_token}
    assert r.sizes.bytes_by_kind == {FULL: full * per_token, LINEAR: slots * state}
    assert r.requests == min(full // 4096, slots)


def test_deepseek_v3_needs_eight_big_gpus():
    assert not report(DEEPSEEK_V3, 80, schedule=SCHED, parallel=ParallelConfig(tp_size=8)).sizes.fits
    h200 = GPUConfig(141 * 10**9, "H200")
    usable = int(141 * 10**9 * 0.88) - 671_000_000_000 // 8 - 2 * 2**30
    tokens = usable // (61 * 576 * 2) // 64 * 64
    r = report(DEEPSEEK_V3, h200, schedule=dataclasses.replace(SCHED, page_size=64),
               parallel=ParallelConfig(tp_size=8))
    assert r.sizes.full_tokens == tokens


def test_report_format_lists_each_kind():
    text = report(GEMMA_3_27B, 80, schedule=SCHED).format()
    assert FULL in text and SLIDING in text and "requests of 4,096 tokens" in text


@settings(max_examples=50)
@given(small=st.integers(8, 200), extra=st.integers(0, 200), ps=st.sampled_from([1, 16, 64]))
def test_more_memory_never_means_fewer_tokens(small, extra, ps):
    sched = ScheduleConfig(page_size=ps)
    for model in (QWEN2_5_7B, GEMMA_3_27B, QWEN3_NEXT_80B_A3B):
        a = pool_sizes(ServingConfig(model, GPUConfig.gib(small), sched))
        b = pool_sizes(ServingConfig(model, GPUConfig.gib(small + extra), sched))
        assert (b.full_tokens, b.swa_tokens, b.mamba_slots) >= (a.full_tokens, a.swa_tokens, a.mamba_slots)
        assert a.full_tokens % ps == 0 and a.swa_tokens % ps == 0
        assert sum(a.bytes_by_kind.values()) <= max(a.usable_bytes, 0)


def test_max_requests_is_set_by_the_tightest_ledger():
    cfg = ServingConfig(GEMMA_3_27B, GPUConfig.gib(80), SCHED)
    z = pool_sizes(cfg)
    short, long = max_requests_at(cfg, 512), max_requests_at(cfg, 65536)
    assert short == min(z.full_tokens // 512, z.swa_tokens // 512)  # short requests: no window savings
    assert long == z.full_tokens // 65536  # long ones: the full pool runs out first
