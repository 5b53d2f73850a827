"""Graded: chapter 10, admission against the allocator's capacity hooks (exercises/ch10_admission.py)."""

import pytest

from memlab.course.grading.checks import expect, expect_equal
from memlab.course.grading.loader import load


def points(n):
    return pytest.mark.points(n, exercise="ch10.admission")


def setup(available, lens, capacity=10_000, page_size=16, reserve=4):
    m = load("ch10_admission")
    reqs = [m.Request(f"r{i}", inp, new) for i, (inp, new) in enumerate(lens)]
    return m, m.CapacityHooks(available, capacity, page_size, reserve), reqs


def ids(reqs):
    return [r.rid for r in reqs]


def admit(m, reqs, num_running, hooks, max_running_requests):
    """admit(); the waiting list and every request it does not admit must come back unchanged."""
    waiting = list(reqs)
    fields = {id(r): (r.rid, r.input_len, r.max_new_tokens) for r in reqs}
    got = m.admit(waiting, num_running, hooks, max_running_requests)
    expect(isinstance(got, tuple) and len(got) == 2 and all(type(x) is list for x in got),
           f"admit must return a tuple of two lists (admitted, rejected), got {got!r}")
    admitted, rejected = got
    expect(len(waiting) == len(reqs) and all(a is b for a, b in zip(waiting, reqs)),
           f"admit changed the waiting list to {ids(waiting)} (was {ids(reqs)})")
    for r in reqs:
        rid, inp, new = fields[id(r)]
        expect(r.rid == rid and r.input_len == inp, f"admit changed request {rid}'s rid or input_len")
        if not any(r is a for a in admitted):
            expect_equal(r.max_new_tokens, new, f"request {rid} was not admitted: its max_new_tokens must stay")
    return admitted, rejected


@points(2)
def test_admits_in_order_until_budget():
    # Costs with pages of 16 and reserve 4: 32 + 4, 16 + 4, 64 + 4, 16 + 4.
    m, hooks, reqs = setup(100, [(20, 50), (10, 50), (60, 50), (5, 50)])
    admitted, rejected = admit(m, reqs, 0, hooks, max_running_requests=10)
    expect_equal(ids(admitted), ["r0", "r1"], "with 100 free slots: r0 costs 36, r1 20, r2 68 (too much)")
    expect_equal(ids(rejected), [], "nothing is rejected")
    m, hooks, reqs = setup(124, [(20, 50), (10, 50), (60, 50), (5, 50)])
    admitted, _ = admit(m, reqs, 0, hooks, max_running_requests=10)
    expect_equal(ids(admitted), ["r0", "r1", "r2"], "with 124 free slots: r0 costs 36, r1 20, r2 68: 124 in all, "
                 "exactly the budget (a request fits when its cost equals what is left)")
    m, hooks, reqs = setup(35, [(20, 50)])
    admitted, rejected = admit(m, reqs, 0, hooks, max_running_requests=10)
    expect_equal((ids(admitted), ids(rejected)), ([], []), "with 35 free slots r0 (cost 36) waits: neither "
                 "admitted nor rejected")


@points(2)
def test_no_overtaking():
    m, hooks, reqs = setup(100, [(20, 50), (200, 50), (5, 50)])
    admitted, _ = admit(m, reqs, 0, hooks, max_running_requests=10)
    expect_equal(ids(admitted), ["r0"], "r1 (cost 212) does not fit in the 64 slots left: admission must STOP "
                 "there; r2 may not overtake it (first come, first served, or r1 starves)")


@points(1)
def test_running_requests_keep_their_reserve():
    m, hooks, reqs = setup(100, [(30, 50), (30, 50)], reserve=10)
    admitted, _ = admit(m, reqs, 3, hooks, max_running_requests=10)
    expect_equal(ids(admitted), ["r0"], "100 free slots minus 3 running x reserve 10 leaves 70: r0 costs 42, "
                 "r1 another 42")
    m, hooks, reqs = setup(30, [(1, 5)], reserve=10)
    admitted, _ = admit(m, reqs, 4, hooks, max_running_requests=10)
    expect_equal(ids(admitted), [], "30 free slots and 4 running requests x reserve 10: the running requests "
                 "already need more than is free, so nothing is admitted")


@points(1)
def test_prompt_in_whole_pages():
    m, hooks, reqs = setup(40, [(17, 10), (1, 10)], page_size=16, reserve=4)
    admitted, _ = admit(m, reqs, 0, hooks, max_running_requests=10)
    expect_equal(ids(admitted), ["r0"], "with 40 free slots: r0's 17-token prompt takes 2 pages (32) + 4, so r1 "
                 "(16 + 4) no longer fits")


@points(1)
def test_reject_and_clip():
    m, hooks, reqs = setup(1000, [(3000, 10), (100, 5000), (50, 20)], capacity=1000, page_size=16, reserve=4)
    admitted, rejected = admit(m, reqs, 0, hooks, max_running_requests=10)
    expect_equal(ids(rejected), ["r0"], "a 3000-token prompt can never run in a pool of 1000: rejected")
    expect_equal(ids(admitted), ["r1", "r2"], "after the rejection the next requests are considered")
    expect_equal(reqs[1].max_new_tokens, 1000 - 112 - 16 - 1, "r1's max_new_tokens clipped by the hook")
    expect_equal(reqs[2].max_new_tokens, 20, "r2's max_new_tokens fits: unchanged")
    # A prefill-only request (max_new_tokens 0) clips to 0 too, yet it can run: it is not rejected.
    m, hooks, reqs = setup(1000, [(900, 0), (5000, 0), (100, 1)], capacity=1000, page_size=16, reserve=4)
    admitted, rejected = admit(m, reqs, 0, hooks, max_running_requests=10)
    expect_equal(ids(admitted), ["r0"], "a prefill-only request (max_new_tokens 0) of 900 tokens in an empty pool "
                 "of 1000 must be admitted (its clip is 0 because it asks for 0, not because it cannot run); "
                 "r1 (5000 tokens, 0 new) then does not fit the budget and stops admission")
    expect_equal(ids(rejected), [], "nothing is rejected: r1 asks for no new token, so a clip of 0 is no refusal")
    m, hooks, reqs = setup(1000, [(983, 1), (10, 1)], capacity=1000, page_size=16, reserve=4)
    admitted, rejected = admit(m, reqs, 0, hooks, max_running_requests=10)
    expect_equal((ids(admitted), ids(rejected)), (["r1"], ["r0"]), "r0 (983 tokens in pages of 16, 1 new token) "
                 "has no room for even one token next to its prompt: rejected; r1 is admitted")


@points(1)
def test_max_running_requests():
    m, hooks, reqs = setup(10_000, [(10, 10)] * 5)
    admitted, _ = admit(m, reqs, 2, hooks, max_running_requests=4)
    expect_equal(ids(admitted), ["r0", "r1"], "2 running with max_running_requests 4: admit 2 more")
    m, hooks, reqs = setup(10_000, [(10, 10), (20_000, 10)], capacity=10_000)
    admitted, rejected = admit(m, reqs, 3, hooks, max_running_requests=4)
    expect_equal((ids(admitted), ids(rejected)), (["r0"], []), "3 running with max_running_requests 4: admit r0, "
                 "then stop; r1 is not even looked at (not rejected either)")
    m, hooks, reqs = setup(10_000, [(10, 10)])
    admitted, _ = admit(m, reqs, 4, hooks, max_running_requests=4)
    expect_equal(ids(admitted), [], "4 running with max_running_requests 4: nothing more")
