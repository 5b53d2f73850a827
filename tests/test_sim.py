"""The workload simulator (chapter 10): hand-worked toy streams, the fast replay against the
one-iteration-at-a-time reference, invariants as properties, and a small bug zoo."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memlab import sim
from memlab.sim import FirstFit, Oracle, Paged, Pow2, Workload

KEYS = ("iterations", "slot_iterations", "external_slot_iterations", "generated_tokens", "prefill_tokens",
        "recomputed_tokens", "preemptions", "peak_running", "max_request_internal")


def books(r):
    return {k: getattr(r, k) for k in KEYS}


def run_both(wl, pool, policy, **kw):
    """The fast replay, checked against the reference on the way: the two must agree exactly."""
    fast = sim.simulate(wl, pool, policy, progress=False, **kw)
    slow = sim.simulate_reference(wl, pool, policy, **kw)
    assert books(fast) == books(slow)
    return fast


def toy():
    # A: prompt 2, output 3 (final 5); B: 1, 1 (final 2); C: 2, 2 (final 4). Context limit 6.
    return Workload("toy", [2, 1, 2], [3, 1, 2], max_context=6)


# ---------------------------------------------------------------------------------------------
# Hand-worked streams. Each line: the iteration's snapshot (after decode, before frees) as
# used / reserved / internal / free slots of a pool of 8.
# ---------------------------------------------------------------------------------------------
def test_toy_oracle_by_hand():
    # it1: admit A [0,5) and B [5,7); C (4) does not fit in 1. A 2->3, B 1->2.  5/2/0/1; B frees
    # it2: C does not fit in 3. A 3->4.                                         4/1/0/3
    # it3: A 4->5.                                                              5/0/0/3; A frees
    # it4: admit C [0,4). C 2->3.                                               3/1/0/4
    # it5: C 3->4.                                                              4/0/0/4
    r = run_both(toy(), 8, "oracle")
    assert r.iterations == 5
    assert r.slot_iterations == {"used": 21, "reserved": 4, "internal": 0, "free": 15}
    assert r.shares == {"used": 21 / 40, "reserved": 4 / 40, "internal": 0.0, "free": 15 / 40}
    assert r.avg_batch == 6 / 5 and r.external_slot_iterations == 0 and r.preemptions == 0


def test_toy_max_context_by_hand():
    # Every request reserves 6 of 8 slots: one at a time.
    # it1: admit A. A 2->3.  3/2/1/2     it2: A->4  4/1/1/2     it3: A->5  5/0/1/2; A frees
    # it4: admit B. B 1->2.  2/0/4/2; B frees
    # it5: admit C. C 2->3.  3/1/2/2     it6: C->4  4/0/2/2
    r = run_both(toy(), 8, "max")
    assert r.iterations == 6
    assert r.slot_iterations == {"used": 21, "reserved": 4, "internal": 11, "free": 12}


TOY_PAGED = {"used": 21, "reserved": 2, "internal": 1, "free": 8}


def test_toy_paged_with_a_preemption_by_hand():
    # B = 2: 4 blocks. Admission takes the blocks for prompt + 1 token.
    # it1: admit A (2 blocks), B (1); C needs 2 > 1. A 2->3, B 1->2.
    #      A: used 3, holds 4 of final 5 -> reserved 1; B: used 2.            5/1/0/2; B frees
    # it2: admit C (2 blocks, 0 left). A 3->4, C 2->3.                       7/1/0/0
    # it3: A's 5th token needs a 3rd block, none free: preempt the youngest (C, 2 blocks back).
    #      A 4->5 in 3 blocks = 6 slots, final 5 -> 1 slot never used.       5/0/1/2; A frees
    # it4: readmit C, re-prefilling prompt + its 1 generated token (3). C 3->4.  4/0/0/4
    r = run_both(toy(), 8, Paged(2))
    assert r.iterations == 4
    assert r.slot_iterations == TOY_PAGED
    assert (r.preemptions, r.recomputed_tokens, r.prefill_tokens) == (1, 3, 2 + 1 + 2 + 3)
    assert r.max_request_internal == 1


def test_external_fragmentation_by_hand():
    # X, Y, Z reserve [0,2), [2,6), [6,8); W needs 4. X and Z finish first: 4 slots free, in two
    # runs of 2, so contiguous W waits: those free slots are external fragmentation.
    wl = Workload("frag", [1, 1, 1, 3], [1, 3, 1, 1], max_context=8)
    # it1: X, Y, Z 1->2.   used 6, reserved 2 (Y's), free 0; X, Z free
    # it2: W refused, 4 free.  Y->3: 3/1/0/4, external 4
    # it3: W refused.          Y->4: 4/0/0/4, external 4; Y frees
    # it4: admit W [0,4). W 3->4: 4/0/0/4 (nobody waiting: no external)
    r = run_both(wl, 8, Oracle(contiguous=True))
    assert r.iterations == 4
    assert r.slot_iterations == {"used": 17, "reserved": 3, "internal": 0, "free": 12}
    assert r.external_slot_iterations == 8
    # Any-slot placement admits W at it2: it2 7/1/0/0, it3 4/0/0/4.
    r = run_both(wl, 8, Oracle(contiguous=False))
    assert r.iterations == 3 and r.external_slot_iterations == 0
    assert r.slot_iterations == {"used": 17, "reserved": 3, "internal": 0, "free": 4}


# ---------------------------------------------------------------------------------------------
# Random streams: fast == reference, and the invariants.
# ---------------------------------------------------------------------------------------------
@st.composite
def streams(draw, max_requests=14, max_len=12):
    n = draw(st.integers(1, max_requests))
    inp = draw(st.lists(st.integers(0, max_len), min_size=n, max_size=n))
    out = draw(st.lists(st.integers(1, max_len), min_size=n, max_size=n))
    extra = draw(st.integers(0, 6))
    return Workload("random", inp, out, max_context=max(i + o for i, o in zip(inp, out)) + extra)


def policies_for(wl, block_size, watermark):
    return [sim.MaxContext(), Pow2(), Oracle(), Oracle(contiguous=False), Paged(block_size, watermark)]


def smallest_pool(wl, policy):
    if policy.paged:
        blocks = int(policy.blocks_for(wl.final_lens.max()))
        return (int(blocks / (1 - policy.watermark)) + 1) * policy.block_size
    return int(policy.reservation(wl.input_lens, wl.output_lens, wl.max_context).max())


PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(wl=streams(), block_size=st.sampled_from([1, 2, 3, 4, 8]), extra=st.integers(0, 40),
       watermark=st.sampled_from([0.0, 0.0, 0.1]), max_running=st.sampled_from([None, None, 2]))
def test_fast_replay_equals_reference_and_shares_add_up(wl, block_size, extra, watermark, max_running):
    used = int(sum(o * i + o * (o + 1) // 2 for i, o in zip(wl.input_lens, wl.output_lens)))
    for policy in policies_for(wl, block_size, watermark):
        pool = smallest_pool(wl, policy) + extra
        r = run_both(wl, pool, policy, max_running=max_running)
        # the four shares cover the pool exactly at every iteration, so their sums add up
        assert sum(r.slot_iterations.values()) == r.iterations * pool
        assert all(v >= 0 for v in r.slot_iterations.values())
        assert abs(sum(r.shares.values()) - 1.0) < 1e-12
        assert 0 <= r.external_slot_iterations <= r.slot_iterations["free"]
        # nothing is lost: every request passes through every length from input+1 to final once,
        # whatever the policy and however often it was preempted
        assert r.slot_iterations["used"] == used
        assert r.generated_tokens == int(wl.output_lens.sum())
        if not policy.paged:
            assert r.preemptions == 0 and r.recomputed_tokens == 0


@PROPS
@given(wl=streams(), extra=st.integers(0, 40))
def test_oracle_never_wastes_more_than_max(wl, extra):
    pool = smallest_pool(wl, sim.MaxContext()) + extra
    mx = sim.simulate(wl, pool, "max", progress=False)
    orc = sim.simulate(wl, pool, "oracle", progress=False)
    p2 = sim.simulate(wl, pool, "pow2", progress=False)
    held_unused = [r.slot_iterations["reserved"] + r.slot_iterations["internal"] for r in (orc, p2, mx)]
    assert held_unused[0] <= held_unused[1] <= held_unused[2]  # per request R_oracle <= R_pow2 <= R_max
    assert orc.slot_iterations["internal"] == 0 and orc.max_request_internal == 0


@PROPS
@given(wl=streams(max_len=40), block_size=st.sampled_from([1, 2, 4, 7, 16]), extra=st.integers(0, 64))
def test_paged_waste_per_request_is_at_most_block_size_minus_one(wl, block_size, extra):
    policy = Paged(block_size)
    r = sim.simulate(wl, smallest_pool(wl, policy) + extra, policy, progress=False)
    assert r.max_request_internal <= block_size - 1
    # and the bound is reached exactly when some request ends one token into its last block
    if (wl.final_lens % block_size == 1).any():
        assert r.max_request_internal == (block_size - 1)


def test_small_pool_preempts_and_every_request_finishes():
    wl = sim.sharegpt_like(60, seed=3, mean_input=20, mean_output=40, max_total=200)
    r = run_both(wl, 256, Paged(4))
    assert r.preemptions > 0 and r.recomputed_tokens > 0
    assert r.generated_tokens == int(wl.output_lens.sum())
    assert r.prefill_tokens == int(wl.input_lens.sum()) + r.recomputed_tokens
    # a watermark at admission leaves room to grow: fewer preemptions here
    assert run_both(wl, 256, Paged(4, watermark=0.1)).preemptions < r.preemptions


# ---------------------------------------------------------------------------------------------
# Bug zoo: each variant is caught by a check above.
# ---------------------------------------------------------------------------------------------
class PagedLastBlockOffByOne(Paged):
    """Counts blocks as tokens // B + 1: one block too many whenever tokens is a multiple of B."""

    def blocks_for(self, tokens):
        return tokens // self.block_size + 1


class Pow2RoundsDown(Pow2):
    """Rounds the expected output down to a power of two: the reservation can fall short."""

    def reservation(self, input_lens, output_lens, max_context):
        return input_lens + np.left_shift(1, np.floor(np.log2(output_lens)).astype(np.int64))


def test_bug_zoo_off_by_one_last_block_is_caught():
    # the hand-worked toy no longer matches (C's prompt of 2 already takes 2 blocks)...
    r = sim.simulate(toy(), 8, PagedLastBlockOffByOne(2), progress=False)
    assert r.slot_iterations != TOY_PAGED
    # ...and a request ending on a block boundary holds a whole block it never writes
    wl = Workload("aligned", [3, 5], [1, 3], max_context=8)  # finals 4 and 8: multiples of B = 4
    r = sim.simulate(wl, 64, PagedLastBlockOffByOne(4), progress=False)
    assert r.max_request_internal > 4 - 1  # the B - 1 property fails


def test_bug_zoo_pow2_rounding_down_is_refused():
    wl = Workload("w", [10, 10], [5, 8], max_context=64)  # 5 -> 4 < 5: short by one slot
    with pytest.raises(ValueError, match="request 0 reserves 14 slots but ends at 15"):
        sim.simulate(wl, 64, Pow2RoundsDown(), progress=False)
    assert sim.simulate(wl, 64, Pow2(), progress=False).max_request_internal == 3  # 8 for 5


# ---------------------------------------------------------------------------------------------
# Workloads, bad input, the free-run allocator, plots.
# ---------------------------------------------------------------------------------------------
def test_sharegpt_like_hits_its_means_under_the_cap():
    wl = sim.sharegpt_like(20_000, seed=0)
    assert abs(wl.input_lens.mean() - 161) < 1 and abs(wl.output_lens.mean() - 338) < 1
    assert wl.final_lens.max() <= 2048 and wl.input_lens.min() >= 1 and wl.output_lens.min() >= 1
    assert np.array_equal(wl.output_lens, sim.sharegpt_like(20_000, seed=0).output_lens)
    assert not np.array_equal(wl.output_lens, sim.sharegpt_like(20_000, seed=1).output_lens)


def test_azure_traces_load_with_their_published_means():
    conv, code = sim.load_azure("conv"), sim.load_azure("code")
    assert (len(conv), len(code)) == (19_366, 8_819)
    assert abs(conv.input_lens.mean() - 1155) < 1 and abs(conv.output_lens.mean() - 211) < 1
    assert abs(code.input_lens.mean() - 2048) < 1 and abs(code.output_lens.mean() - 28) < 1
    assert len(sim.load_azure("code", n=100)) == 100
    with pytest.raises(ValueError, match="'chat'"):
        sim.load_azure("chat")


def test_bad_input_raises_clear_errors():
    wl = toy()
    with pytest.raises(ValueError, match="request 0 needs 3 blocks"):
        sim.simulate(wl, 5, Paged(2), progress=False)
    with pytest.raises(ValueError, match="request 0 needs 6 slots"):
        sim.simulate(wl, 5, "max", progress=False)
    with pytest.raises(ValueError, match="'lru'"):
        sim.simulate(wl, 8, "lru", progress=False)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        Paged(0)
    with pytest.raises(ValueError, match="past max_context=4"):
        Workload("w", [3], [2], max_context=4)
    with pytest.raises(ValueError, match="output >= 1"):
        Workload("w", [3], [0], max_context=4)


def test_first_fit_merges_runs_and_refuses_double_free():
    space = FirstFit(10)
    a, b, c = space.alloc(3), space.alloc(3), space.alloc(3)
    assert (a, b, c, space.free) == (0, 3, 6, 1)
    assert space.alloc(2) == -1 and space.free == 1  # a refusal takes nothing
    space.release(a, 3)
    space.release(c, 3)
    assert (space.starts, space.ends) == ([0, 6], [3, 10])
    assert space.alloc(5) == -1  # 7 free, but no run of 5: external fragmentation
    space.release(b, 3)
    assert (space.starts, space.ends, space.free) == ([0], [10], 10)
    with pytest.raises(ValueError, match="already"):
        space.release(2, 3)


def test_entry_points_and_plots():
    wl = sim.sharegpt_like(300, seed=1)
    results = sim.compare_policies(wl, pool_size=4096, progress=False)
    assert [r.policy for r in results] == ["max", "pow2", "oracle", "paged B=16"]
    table = sim.breakdown_table(results)
    assert table.count("\n") == 5 and "paged B=16" in table
    sweep = sim.block_size_sweep(wl, pool_size=4096, block_sizes=(1, 16, 64), progress=False)
    assert [r.policy for r in sweep] == ["paged B=1", "paged B=16", "paged B=64"]
    fig = sim.plot_breakdown(results)
    assert len(fig.axes[0].patches) == 4 * len(results)
    fig = sim.plot_sweep(sweep)
    assert len(fig.axes[0].patches) == 4 * len(sweep)
    fig = sim.plot_timeline(results[-1])
    assert fig.axes[0].get_xlim()[1] == results[-1].iterations
    with pytest.raises(ValueError, match="no timeline"):
        sim.plot_timeline(sim.simulate(wl.head(5), 4096, progress=False, timeline=False))
