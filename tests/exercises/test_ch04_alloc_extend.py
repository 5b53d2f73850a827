"""Graded: chapter 04, paged alloc_extend in torch (exercises/ch04_alloc_extend.py)."""

import random

import pytest
import torch

from memlab.course.grading.checks import (
    call_keeping_inputs,
    expect,
    expect_equal,
    expect_no_sharing,
    expect_raises,
    expect_tensor,
    snapshot,
)
from memlab.course.grading.loader import load
from memlab_tests.exercises.exercise_refs import (
    alloc_extend_python,
    i64,
    split_by_request,
)


def points(n):
    return pytest.mark.points(n, exercise="ch04.alloc_extend")


def allocator(size, page_size):
    return load("ch04_alloc_extend").PagedAllocator(size, page_size)


def t(values, strided=False):
    """An int64 tensor; ``strided``: a view of every other entry of a wider one (not contiguous)."""
    if strided:
        return torch.tensor([v for x in values for v in (x, -99)], dtype=torch.int64)[
            ::2
        ]
    return torch.tensor(values, dtype=torch.int64)


def run(a, pre, seq, last, strided=False):
    """alloc_extend on int64 tensors; the inputs must come back unchanged. Returns (out, free_pages before)."""
    free_before = snapshot(a.free_pages)
    out = call_keeping_inputs(
        a.alloc_extend,
        "alloc_extend",
        prefix_lens=t(pre, strided),
        seq_lens=t(seq, strided),
        last_loc=t(last, strided),
    )
    if out is not None:
        expect_tensor(out, "alloc_extend's result", torch.int64, sum(seq) - sum(pre))
    return out, free_before


@points(2)
def test_fresh_requests_whole_and_partial():
    a = allocator(64, 4)
    out, _ = run(a, [0, 0, 0], [5, 8, 3], [-1, -1, -1])
    got = split_by_request(out, [0, 0, 0], [5, 8, 3])
    expect_equal(
        got[0],
        [4, 5, 6, 7, 8],
        "request 0 (0 -> 5 tokens, page size 4) takes pages 1 and 2",
    )
    expect_equal(
        got[1],
        [12, 13, 14, 15, 16, 17, 18, 19],
        "request 1 (0 -> 8 tokens) takes the next pages, 3 and 4",
    )
    expect_equal(got[2], [20, 21, 22], "request 2 (0 -> 3 tokens) takes page 5")
    expect_equal(
        out,
        i64(*range(4, 9), *range(12, 20), 20, 21, 22),
        "the batch's slots: an int64 tensor",
    )
    expect_equal(a.free_pages, i64(*range(6, 17)), "free_pages after taking 5 pages")


@points(2)
def test_continues_from_last_loc():
    a = allocator(64, 4)
    # Request 0 holds 6 tokens; its last one is in slot 29 (page 7, offset 1).
    out, _ = run(a, [6], [13], [29], strided=True)
    got = out.tolist()
    expect_equal(
        got[:2],
        [30, 31],
        "the first new tokens must fill the old page from last_loc + 1 = 30 (part 1)",
    )
    expect_equal(
        got[2:],
        [4, 5, 6, 7, 8],
        "then whole page 1 and the start of page 2 (parts 2 and 3)",
    )
    expect_equal(
        a.free_pages, i64(*range(3, 17)), "exactly 2 new pages: ceil(13/4) - ceil(6/4)"
    )
    # A request whose old page ends exactly at its prefix (prefix 8, page size 4) has no part 1.
    out, _ = run(a, [8, 5], [10, 9], [43, 200])
    expect_equal(
        out,
        i64(12, 13, 201, 202, 203, 16),
        "prefix 8 -> 10 (page-aligned prefix: a new page at once) "
        "and prefix 5 -> 9 (slots 201, 202, 203 fill its old page, then a new one)",
    )


@points(1)
def test_no_new_page_when_old_page_has_room():
    a = allocator(64, 8)
    out, free_before = run(a, [3, 8], [6, 8], [42, 77])
    expect_equal(
        out,
        i64(43, 44, 45),
        "request 0 (3 -> 6, page size 8) stays on its page: slots 43, 44, 45; "
        "request 1 (8 -> 8) gets nothing",
    )
    expect_equal(
        a.free_pages,
        free_before,
        "no page may be taken when every token fits in an old page",
    )
    out, _ = run(a, [5, 0], [8, 0], [44, -1])
    expect_equal(
        out,
        i64(45, 46, 47),
        "request 0 (5 -> 8, page size 8) fills its page to the last slot; "
        "request 1 (0 -> 0) gets nothing",
    )
    out, _ = run(a, [4, 0], [4, 0], [3, -1])
    expect_equal(out, i64(), "a batch with no new token: an EMPTY int64 tensor")
    expect_equal(
        a.free_pages, free_before, "no page may be taken for a batch with no new page"
    )


@points(2)
def test_refusal_takes_nothing():
    a = allocator(32, 4)  # 8 pages
    out, free_before = run(a, [0, 0], [16, 20], [-1, -1])  # needs 4 + 5 pages
    expect(
        out is None,
        f"9 pages needed, 8 free: alloc_extend must return None, got {out!r}",
    )
    expect_equal(
        a.free_pages,
        free_before,
        "a refused alloc_extend must leave free_pages as it was "
        "(decide capacity BEFORE taking pages)",
    )
    out, _ = run(a, [0, 3], [16, 20], [-1, 202])
    expect(out is not None, "8 pages needed (4 + 4), 8 free: alloc_extend must succeed")
    expect_equal(
        out[15:18],
        i64(19, 203, 20),
        "the end of request 0 (page 4), then request 1: its old page's "
        "last slot 203 and its first new page, 5",
    )
    expect_equal(
        out[-1:],
        i64(35),
        "the last slot of an exact fit: the last slot of the last free page, 8",
    )
    expect_equal(a.free_pages, i64(), "every page taken")
    out, _ = run(a, [7], [8], [58])
    expect_equal(
        out,
        i64(59),
        "7 -> 8 tokens with page size 4 and no page free: the token fits in the old page",
    )
    b = allocator(
        8, 4
    )  # 2 pages; the last request of an exact fit only fills its old page
    out, _ = run(b, [0, 5], [8, 7], [-1, 20])
    expect_equal(
        out,
        i64(4, 5, 6, 7, 8, 9, 10, 11, 21, 22),
        "prefix 0 -> 8 takes both free pages; prefix 5 -> 7 "
        "fills its old page (slots 21, 22) and needs no page",
    )
    expect_equal(b.free_pages, i64(), "every page taken")
    for pre, seq in (([5], [4]), ([0, 9], [3, 8]), ([0, 9], [9, 8])):
        expect_raises(
            ValueError,
            lambda: a.alloc_extend(t(pre), t(seq), t([3] * len(pre))),
            f"alloc_extend with prefix_lens {pre} and seq_lens {seq} (a seq_len below its prefix_len; "
            "no page is free either: the ValueError for invalid input comes first)",
        )
    expect_equal(a.free_pages, i64(), "free_pages after refused calls")


@points(2)
def test_matches_reference_on_random_batches():
    rng = random.Random(4)
    for trial in range(60):
        ps = rng.choice([1, 2, 4, 16])
        bs = rng.randint(1, 6)
        a = allocator(4096 * ps, ps)
        a.free_pages = t(
            rng.sample(range(1, 4097), 4096)
        )  # a well-used pool: pages in any order
        pre = [rng.choice([0, rng.randint(0, 40)]) for _ in range(bs)]
        seq = [p + rng.randint(0, 40) for p in pre]
        # each request's old page lies far away from the new pages
        last = [
            -1 if p == 0 else (5000 + i) * ps + (p - 1) % ps for i, p in enumerate(pre)
        ]
        out, free_before = run(a, pre, seq, last, strided=trial % 2 == 1)
        want = alloc_extend_python(pre, seq, last, free_before.tolist(), ps)
        got = split_by_request(out, pre, seq)
        for i, (g, w) in enumerate(zip(got, split_by_request(want, pre, seq))):
            expect_equal(
                g,
                w,
                f"request {i} (prefix {pre[i]} -> {seq[i]} tokens, last_loc {last[i]}, page size {ps})",
            )
        expect_no_sharing({i: g for i, g in enumerate(got)}, "slot")
        used = sum(-(-s // ps) - -(-p // ps) for p, s in zip(pre, seq))
        expect_equal(
            a.free_pages,
            free_before[used:],
            f"free_pages after taking {used} pages from its head",
        )


# -- the learner's alloc_extend against the engine's, on random batches ---------------------------


def engine_alloc_extend(pre, seq, last, free_pages, ps):
    """SGLang's answer (memlab.sglang.allocator: its checks, its capacity rule, alloc_extend_naive):
    (slots or None or the error, free_pages after)."""
    from memlab.course.grading.fuzz import Raised
    from memlab.sglang.allocator.reference import alloc_extend_python as engine

    if any(
        s < p for p, s in zip(pre, seq)
    ):  # the engine's boundary check comes before capacity
        return Raised(ValueError("a seq_len below its prefix_len")), free_pages
    need = sum(-(-s // ps) - -(-p // ps) for p, s in zip(pre, seq))
    if need > len(free_pages):
        return None, free_pages
    return i64(*engine(pre, seq, last, free_pages, ps)), free_pages[need:]


def draw_batch(d, ps, big):
    """A batch: fresh and continued requests, some longer than a 64-token block; with ``big``,
    prefixes near 2**31 (a pure index computation: no pool needed); now and then an invalid one."""
    from memlab_tests.exercises.exercise_refs import INT31

    pre, seq = [], []
    for _ in d.count(1, 4):
        p = (
            d.big(0, INT31 - 300)
            if big
            else (0 if d.chance(0.3) else d.int(0, 3 * ps + 70))
        )
        pre.append(p)
        seq.append(p + d.int(0, 2 * 64 + 3 * ps + 8))
    if d.chance(
        0.08
    ):  # an invalid request: the docstring's ValueError must win, even when pages are short
        i = d.int(0, len(pre) - 1)
        pre[i], seq[i] = pre[i] + d.int(1, 5), pre[i]
    last = [
        -1 if p == 0 else (d.int(1, 9) + 1000 + 2 * i) * ps + (p - 1) % ps
        for i, p in enumerate(pre)
    ]
    return pre, seq, last


def random_case(d):
    from memlab.course.grading.fuzz import tensor_code
    from memlab_tests.exercises.exercise_refs import INT31, SIZES, scribble, tensor

    ps = d.pick(SIZES)
    big = d.chance(0.25)
    a = load("ch04_alloc_extend").PagedAllocator(64 * ps, ps)
    d.given(page_size=ps)
    d.code(f"a = ex.PagedAllocator({64 * ps}, {ps})")
    free = None
    for _step in d.count(1, 2, 0.4):
        pre, seq, last = draw_batch(d, ps, big)
        if free is None:  # page ids in random order, small and up to 2**31 / page_size
            need = sum(max(0, -(-s // ps) - -(-p // ps)) for p, s in zip(pre, seq))
            free = d.ids(max(0, need + d.int(-2, 3)), (INT31 - ps) // ps)
            a.free_pages = tensor(free)
            d.code(f"a.free_pages = {tensor_code(free)}")
            d.given(prefix_lens=pre, seq_lens=seq, last_loc=last, free_pages=free)
        else:
            d.step(f"alloc_extend(prefix_lens={pre}, seq_lens={seq}, last_loc={last})")
        strided = d.chance(0.3)
        args = [tensor(v, strided) for v in (pre, seq, last)]
        d.code(
            f"print(a.alloc_extend({tensor_code(pre)}, {tensor_code(seq)}, {tensor_code(last)}))"
        )
        got = d.call("alloc_extend", a.alloc_extend, *args)
        want, free = engine_alloc_extend(pre, seq, last, free, ps)
        d.returns("alloc_extend", got, want)
        scribble(*args)
        d.books("alloc_extend", "free_pages", a.free_pages, tensor(free))


@points(2)
def test_random_batches_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, seed=404, trials=150, name="ch04_alloc_extend")
