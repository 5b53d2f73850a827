"""Graded: chapter 10, admission against the allocator's capacity hooks (exercises/ch10_admission.py)."""

import pytest

from memlab.grading.checks import expect, expect_equal
from memlab.grading.loader import load


def points(n):
    return pytest.mark.points(n, exercise="ch10.admission")


def setup(available, lens, capacity=10_000, page_size=16, reserve=4):
    m = load("ch10_admission")
    reqs = [m.Request(f"r{i}", inp, new) for i, (inp, new) in enumerate(lens)]
    return m, m.CapacityHooks(available, capacity, page_size, reserve), reqs


def ids(reqs):
    return [r.rid for r in reqs]


@points(2)
def test_admits_in_order_until_budget():
    # Costs with pages of 16 and reserve 4: 32 + 4, 16 + 4, 64 + 4, 16 + 4.
    m, hooks, reqs = setup(100, [(20, 50), (10, 50), (60, 50), (5, 50)])
    admitted, rejected = m.admit(reqs, 0, hooks, max_running_requests=10)
    expect_equal(ids(admitted), ["r0", "r1"], "with 100 free slots: r0 costs 36, r1 20, r2 68 (too much)")
    expect_equal(ids(rejected), [], "nothing is rejected")
    expect_equal(ids(reqs), ["r0", "r1", "r2", "r3"], "admit must not change the waiting list")


@points(2)
def test_no_overtaking():
    m, hooks, reqs = setup(100, [(20, 50), (200, 50), (5, 50)])
    admitted, _ = m.admit(reqs, 0, hooks, max_running_requests=10)
    expect_equal(ids(admitted), ["r0"], "r1 (cost 212) does not fit in the 64 slots left: admission must STOP "
                 "there; r2 may not overtake it (first come, first served, or r1 starves)")


@points(1)
def test_running_requests_keep_their_reserve():
    m, hooks, reqs = setup(100, [(30, 50), (30, 50)], reserve=10)
    admitted, _ = m.admit(reqs, 3, hooks, max_running_requests=10)
    expect_equal(ids(admitted), ["r0"], "100 free slots minus 3 running x reserve 10 leaves 70: r0 costs 42, "
                 "r1 another 42")


@points(1)
def test_prompt_in_whole_pages():
    m, hooks, reqs = setup(40, [(17, 10), (1, 10)], page_size=16, reserve=4)
    admitted, _ = m.admit(reqs, 0, hooks, max_running_requests=10)
    expect_equal(ids(admitted), ["r0"], "with 40 free slots: r0's 17-token prompt takes 2 pages (32) + 4, so r1 "
                 "(16 + 4) no longer fits")


@points(1)
def test_reject_and_clip():
    m, hooks, reqs = setup(1000, [(3000, 10), (100, 5000), (50, 20)], capacity=1000, page_size=16, reserve=4)
    admitted, rejected = m.admit(reqs, 0, hooks, max_running_requests=10)
    expect_equal(ids(rejected), ["r0"], "a 3000-token prompt can never run in a pool of 1000: rejected")
    expect_equal(ids(admitted), ["r1", "r2"], "after the rejection the next requests are considered")
    expect_equal(reqs[1].max_new_tokens, 1000 - 112 - 16 - 1, "r1's max_new_tokens clipped by the hook")
    expect_equal(reqs[2].max_new_tokens, 20, "r2's max_new_tokens fits: unchanged")


@points(1)
def test_max_running_requests():
    m, hooks, reqs = setup(10_000, [(10, 10)] * 5)
    admitted, _ = m.admit(reqs, 2, hooks, max_running_requests=4)
    expect(len(admitted) == 2, f"2 running with max_running_requests 4: admit 2 more, admitted {ids(admitted)}")
