"""Graded: chapter 10, admission against the allocator's capacity hooks
(exercises/ch10_admission.py)."""

import pytest

from memlab.course.grading.checks import expect, expect_equal
from memlab.course.grading.loader import load


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch10.admission", requires=requires)


def setup(available, lens, capacity=10_000, page_size=16):
    m = load("ch10_admission")
    reqs = [m.Request(f"r{i}", inp, new) for i, (inp, new) in enumerate(lens)]
    return m, m.CapacityHooks(available, capacity, page_size), reqs


def ids(reqs):
    return [r.rid for r in reqs]


def admit(m, reqs, running, hooks, max_running_requests):
    """admit(); the waiting list, the running lengths and every request it does not admit must
    come back unchanged."""
    waiting, running_before = list(reqs), list(running)
    fields = {id(r): (r.rid, r.input_len, r.max_new_tokens) for r in reqs}
    got = m.admit(waiting, running, hooks, max_running_requests)
    expect(
        isinstance(got, tuple) and len(got) == 2 and all(type(x) is list for x in got),
        f"admit must return a tuple of two lists (admitted, rejected), got {got!r}",
    )
    admitted, rejected = got
    expect(
        len(waiting) == len(reqs) and all(a is b for a, b in zip(waiting, reqs)),
        f"admit changed the waiting list to {ids(waiting)} (was {ids(reqs)})",
    )
    expect(
        running == running_before,
        f"admit changed running_seq_lens to {running} (was {running_before})",
    )
    for r in reqs:
        rid, inp, new = fields[id(r)]
        expect(
            r.rid == rid and r.input_len == inp,
            f"admit changed request {rid}'s rid or input_len",
        )
        if not any(r is a for a in admitted):
            expect_equal(
                r.max_new_tokens,
                new,
                f"request {rid} was not admitted: its max_new_tokens must stay "
                "(set the clip only when admitting)",
            )
    return admitted, rejected


@points(2)
def test_admits_in_order_until_budget():
    # Costs with pages of 16: 32, 16, 64 (prompts inside their last page), 16.
    m, hooks, reqs = setup(100, [(20, 50), (10, 50), (60, 50), (5, 50)])
    admitted, rejected = admit(m, reqs, [], hooks, max_running_requests=10)
    expect_equal(
        ids(admitted),
        ["r0", "r1"],
        "with 100 free slots: r0 costs 32, r1 16, r2 64 (too much for the 52 left)",
    )
    expect_equal(ids(rejected), [], "nothing is rejected")
    m, hooks, reqs = setup(112, [(20, 50), (10, 50), (60, 50), (5, 50)])
    admitted, _ = admit(m, reqs, [], hooks, max_running_requests=10)
    expect_equal(
        ids(admitted),
        ["r0", "r1", "r2"],
        "with 112 free slots: r0 costs 32, r1 16, r2 64: 112 in all, "
        "exactly the budget (a request fits when its cost equals what is left)",
    )
    m, hooks, reqs = setup(31, [(20, 50)])
    admitted, rejected = admit(m, reqs, [], hooks, max_running_requests=10)
    expect_equal(
        (ids(admitted), ids(rejected)),
        ([], []),
        "with 31 free slots r0 (cost 32) waits: neither admitted nor rejected",
    )


@points(2)
def test_no_overtaking():
    m, hooks, reqs = setup(100, [(20, 50), (200, 50), (5, 50)])
    admitted, _ = admit(m, reqs, [], hooks, max_running_requests=10)
    expect_equal(
        ids(admitted),
        ["r0"],
        "r1 (cost 208) does not fit in the 68 slots left: admission must STOP "
        "there; r2 may not overtake it (first come, first served, or r1 starves)",
    )


@points(1)
def test_running_requests_keep_their_reserve():
    m, hooks, reqs = setup(100, [(30, 50), (30, 50), (30, 50)])
    admitted, _ = admit(m, reqs, [16, 20, 32], hooks, max_running_requests=10)
    expect_equal(
        ids(admitted),
        ["r0", "r1"],
        "100 free slots; the running requests at 16 and 32 tokens sit on a page boundary, so their "
        "next token opens a page (2 x 16), the one at 20 needs nothing: 68 left, r0 and r1 cost 32 "
        "each",
    )
    m, hooks, reqs = setup(30, [(1, 5)])
    admitted, _ = admit(m, reqs, [32, 48], hooks, max_running_requests=10)
    expect_equal(
        ids(admitted),
        [],
        "30 free slots and 2 running requests whose next token each opens a page of "
        "16: they already need more than is free, so nothing is admitted",
    )
    m, hooks, reqs = setup(5, [(1, 5), (1, 5)], page_size=1)
    admitted, _ = admit(m, reqs, [7, 3, 9], hooks, max_running_requests=10)
    expect_equal(
        ids(admitted),
        ["r0"],
        "page size 1: every running request's next token takes a slot (3 of the "
        "5 free); r0 costs its 1-token prompt and the slot of its own first decode step",
    )


@points(1)
def test_prompt_in_whole_pages():
    m, hooks, reqs = setup(64, [(17, 10), (16, 10), (1, 10)], page_size=16)
    admitted, _ = admit(m, reqs, [], hooks, max_running_requests=10)
    expect_equal(
        ids(admitted),
        ["r0", "r1"],
        "with 64 free slots: r0's 17-token prompt takes 2 pages (32); r1's 16-token prompt fills "
        "its page exactly, so its first decode step opens another: 16 + 16; r2 (16) no longer fits",
    )
    m, hooks, reqs = setup(47, [(32, 0), (1, 3)], page_size=16)
    admitted, _ = admit(m, reqs, [], hooks, max_running_requests=10)
    expect_equal(
        ids(admitted),
        [],
        "with 47 free slots: r0 (a prefill-only 32-token prompt, on a page boundary) "
        "costs 32 + 16 like any request, so it waits",
    )
    m, hooks, reqs = setup(63, [(32, 0), (1, 3)], page_size=16)
    admitted, _ = admit(m, reqs, [], hooks, max_running_requests=10)
    expect_equal(
        ids(admitted),
        ["r0"],
        "with 63 free slots r0 costs 48: the page of its decode step is taken off "
        "the budget, not only checked, so r1 (16) does not fit in the 15 left",
    )


@points(1)
def test_reject_and_clip():
    m, hooks, reqs = setup(
        1000, [(3000, 10), (100, 5000), (50, 20)], capacity=1000, page_size=16
    )
    admitted, rejected = admit(m, reqs, [], hooks, max_running_requests=10)
    expect_equal(
        ids(rejected),
        ["r0"],
        "a 3000-token prompt can never run in a pool of 1000: rejected",
    )
    expect_equal(
        ids(admitted),
        ["r1", "r2"],
        "after the rejection the next requests are considered",
    )
    expect_equal(
        reqs[1].max_new_tokens,
        1000 - 112 - 16 - 1,
        "r1's max_new_tokens clipped by the hook",
    )
    expect_equal(reqs[2].max_new_tokens, 20, "r2's max_new_tokens fits: unchanged")
    # A prefill-only request (max_new_tokens 0) clips to 0 too, yet it can run: it is not rejected.
    m, hooks, reqs = setup(
        1000, [(900, 0), (5000, 0), (100, 1)], capacity=1000, page_size=16
    )
    admitted, rejected = admit(m, reqs, [], hooks, max_running_requests=10)
    expect_equal(
        ids(admitted),
        ["r0"],
        "a prefill-only request (max_new_tokens 0) of 900 tokens in an empty pool of 1000 must be "
        "admitted (its clip is 0 because it asks for 0, not because it cannot run); r1 (5000 "
        "tokens, 0 new) then does not fit the budget and stops admission",
    )
    expect_equal(
        ids(rejected),
        [],
        "nothing is rejected: r1 asks for no new token, so a clip of 0 is no refusal",
    )
    m, hooks, reqs = setup(1000, [(983, 1), (10, 1)], capacity=1000, page_size=16)
    admitted, rejected = admit(m, reqs, [], hooks, max_running_requests=10)
    expect_equal(
        (ids(admitted), ids(rejected)),
        (["r1"], ["r0"]),
        "r0 (983 tokens in pages of 16, 1 new token) "
        "has no room for even one token next to its prompt: rejected; r1 is admitted",
    )


@points(1)
def test_max_running_requests():
    m, hooks, reqs = setup(10_000, [(10, 10)] * 5)
    admitted, _ = admit(m, reqs, [5, 9], hooks, max_running_requests=4)
    expect_equal(
        ids(admitted),
        ["r0", "r1"],
        "2 running with max_running_requests 4: admit 2 more",
    )
    m, hooks, reqs = setup(10_000, [(10, 10), (20_000, 10)], capacity=10_000)
    admitted, rejected = admit(m, reqs, [5, 9, 11], hooks, max_running_requests=4)
    expect_equal(
        (ids(admitted), ids(rejected)),
        (["r0"], []),
        "3 running with max_running_requests 4: admit r0, "
        "then stop; r1 is not even looked at (not rejected either)",
    )
    m, hooks, reqs = setup(10_000, [(20_000, 10), (10, 10), (10, 10)], capacity=10_000)
    admitted, rejected = admit(m, reqs, [5, 9], hooks, max_running_requests=3)
    expect_equal(
        (ids(admitted), ids(rejected)),
        (["r1"], ["r0"]),
        "2 running with max_running_requests 3: r0 is "
        "rejected (it takes no place among the running), r1 is admitted, then the limit stops r2",
    )
    m, hooks, reqs = setup(10_000, [(10, 10)])
    admitted, _ = admit(m, reqs, [5, 9, 11, 13], hooks, max_running_requests=4)
    expect_equal(
        ids(admitted), [], "4 running with max_running_requests 4: nothing more"
    )


# -- the learner's admission against the engine's rule, step after step over a queue ---------------


def engine_admit(waiting, running, available, capacity, ps, max_running):
    """The docstring's admission (the next decode step counted as SGLang 0.5.23's
    new_tokens_required_next_decode counts it, memlab.sglang.sizing): (admitted, rejected, clips)
    as indices into ``waiting`` (pairs of input_len, max_new_tokens)."""
    from memlab.sglang.sizing import (
        RunningReq,
        max_new_tokens_for_memory,
        new_tokens_required_next_decode,
    )

    budget = available - new_tokens_required_next_decode(
        [RunningReq(i, s, 0) for i, s in enumerate(running)], ps
    )
    admitted, rejected, clips = [], [], {}
    for i, (inp, new) in enumerate(waiting):
        if len(running) + len(admitted) >= max_running:
            break
        clip = max_new_tokens_for_memory(inp, new, capacity, ps)
        if clip == 0 and new > 0:
            rejected.append(i)
            continue
        cost = -(-inp // ps) * ps + new_tokens_required_next_decode(
            [RunningReq(i, inp, 0)], ps
        )
        if cost > budget:
            break
        admitted.append(i)
        clips[i] = clip
        budget -= cost
    return admitted, rejected, clips


def random_case(d):
    from memlab_tests.exercises.exercise_refs import SIZES

    m = load("ch10_admission")
    ps = d.pick(SIZES)
    capacity = d.int(4, 40) * ps + d.int(0, ps)
    available = d.int(0, capacity)
    max_running = d.int(1, 8)
    running = [d.pick((d.int(1, 3) * ps, d.int(1, 4 * ps))) for _ in d.count(0, 4, 0.5)]
    # (rid, input_len, max_new_tokens): lengths on and around page boundaries, some too long
    queue = []
    for i in d.count(1, 8, 0.7):
        inp = d.pick(
            (
                d.int(1, 3) * ps,
                d.int(1, 3 * ps + 2),
                capacity - d.int(0, 2 * ps),
                capacity + d.int(1, 9),
            )
        )
        queue.append((f"r{i}", inp, d.pick((0, 1, d.int(2, 50), 10 * capacity))))
    d.given(page_size=ps, token_capacity=capacity, max_running_requests=max_running)
    d.code(f"hooks = ex.CapacityHooks({available}, {capacity}, {ps})")
    d.code(f"waiting = [ex.Request(*q) for q in {queue}]")
    reqs = {rid: m.Request(rid, inp, new) for rid, inp, new in queue}
    news = {rid: new for rid, _, new in queue}
    waiting = [rid for rid, _, _ in queue]
    # Scheduler steps: admit, then the running requests decode a token.
    for _ in d.count(1, 3, 0.6):
        hooks = m.CapacityHooks(available, capacity, ps)
        d.step(
            f"admit(waiting={[(r, reqs[r].input_len, news[r]) for r in waiting]}, "
            f"running_seq_lens={running}, available={available})"
        )
        d.code(f"hooks.available = {available}")
        d.code(
            "admitted, rejected = "
            f"ex.admit([r for r in waiting if r.rid in {waiting}], {running}, hooks, "
            f"{max_running}); print([r.rid for r in admitted], [r.rid for r in rejected])"
        )
        got = d.call(
            "admit",
            m.admit,
            [reqs[r] for r in waiting],
            list(running),
            hooks,
            max_running,
        )
        adm, rej, clips = engine_admit(
            [(reqs[r].input_len, news[r]) for r in waiting],
            running,
            available,
            capacity,
            ps,
            max_running,
        )
        want = ([waiting[i] for i in adm], [waiting[i] for i in rej])
        if (
            isinstance(got, tuple)
            and len(got) == 2
            and all(isinstance(x, list) for x in got)
        ):
            got = ([r.rid for r in got[0]], [r.rid for r in got[1]])
        d.returns("admit", got, want, "(admitted, rejected), by rid")
        for i, r in enumerate(waiting):  # only the admitted ones get their clip
            news[r] = clips.get(i, news[r])
        d.books(
            "admit",
            "each request's max_new_tokens",
            [reqs[r].max_new_tokens for r, _, _ in queue],
            [news[r] for r, _, _ in queue],
            "a request that was not admitted keeps its own",
        )
        # The prefill runs, then a decode step (a page for each request on a boundary); some finish.
        prompts = sum(-(-reqs[r].input_len // ps) * ps for r in want[0])
        running = running + [reqs[r].input_len for r in want[0]]
        waiting = [r for r in waiting if r not in set(want[0]) | set(want[1])]
        available = max(
            0, available - prompts - ps * sum(1 for x in running if x % ps == 0)
        )
        running = [x + 1 for x in running]
        if running and d.chance(0.4):
            available += -(-running.pop(d.int(0, len(running) - 1)) // ps) * ps


@points(2)
def test_random_queues_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, trials=200, name="ch10_admission")
