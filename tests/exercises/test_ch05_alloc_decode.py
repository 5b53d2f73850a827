"""Graded: chapter 05, alloc_decode (exercises/ch05_alloc_decode.py)."""

import random

import pytest
import torch

from memlab.course.grading.checks import (
    call_keeping_inputs,
    expect,
    expect_equal,
    expect_no_sharing,
    snapshot,
)
from memlab.course.grading.loader import load
from memlab_tests.exercises.exercise_refs import alloc_decode_python, i64


def points(n):
    return pytest.mark.points(n, exercise="ch05.alloc_decode")


def allocator(size, page_size):
    return load("ch05_alloc_decode").PagedAllocator(size, page_size)


def t(values, strided=False):
    """An int64 tensor; ``strided``: a view of every other entry of a wider one (not contiguous)."""
    if strided:
        return torch.tensor([v for x in values for v in (x, -99)], dtype=torch.int64)[
            ::2
        ]
    return torch.tensor(values, dtype=torch.int64)


def decode(a, seq, last, strided=False):
    """alloc_decode on int64 tensors; the inputs must come back unchanged."""
    return call_keeping_inputs(
        a.alloc_decode,
        "alloc_decode",
        seq_lens=t(seq, strided),
        last_loc=t(last, strided),
    )


@points(1)
def test_within_page_continues():
    a = allocator(64, 4)
    out = decode(a, [3, 6], [41, 48])
    expect_equal(
        out,
        i64(42, 49),
        "seq_lens [3, 6] (after the step, page size 4): both tokens stay on their "
        "pages, at last_loc + 1 (an int64 tensor)",
    )
    expect_equal(
        a.free_pages,
        i64(*range(1, 17)),
        "no page may be taken when no token opens a page",
    )
    a.free_pages = i64()
    expect_equal(
        decode(a, [4, 2], [42, 8], strided=True),
        i64(43, 9),
        "seq_lens [4, 2] with no free page: no token opens a page, so nothing is missing",
    )


@points(2)
def test_crossing_boundary_takes_new_page():
    a = allocator(64, 4)
    out = decode(a, [5], [19])
    expect_equal(
        out,
        i64(4),
        "seq_len 5 with page size 4: the new token (position 4) opens a page, so it takes "
        "the first slot of page 1 (seq_len % page_size == 1)",
    )
    out = decode(a, [8], [42])
    expect_equal(
        out,
        i64(43),
        "seq_len 8 with page size 4: the new token (position 7) is the LAST slot of its "
        "page, not the first of a new one",
    )
    out = decode(a, [1, 9, 2], [-1, 63, 76])
    expect_equal(
        out,
        i64(8, 12, 77),
        "seq_lens [1, 9, 2] with page size 4: the first token of a request and the "
        "first of its third page open pages 2 and 3, in batch order",
    )
    expect_equal(
        a.free_pages,
        i64(*range(4, 17)),
        "exactly three pages taken over the three steps",
    )


@points(1)
def test_page_size_one():
    a = allocator(16, 1)
    out = decode(a, [1, 7, 3], [-1, 9, 2])
    expect_equal(
        out,
        i64(1, 2, 3),
        "with page size 1 every token opens a page: pages 1, 2, 3 in batch order",
    )
    expect_equal(
        a.free_pages, i64(*range(4, 17)), "free_pages after three pages were taken"
    )


@points(1)
def test_pages_in_batch_order():
    rng = random.Random(11)
    for _ in range(40):
        ps = rng.choice([1, 2, 4, 16])
        bs = rng.randint(1, 8)
        a = allocator(1024 * ps, ps)
        a.free_pages = t(rng.sample(range(1, 1025), 1024))
        seq = [rng.randint(1, 40) for _ in range(bs)]
        last = [
            (2000 + i) * ps + (s - 2) % ps if s > 1 else -1 for i, s in enumerate(seq)
        ]
        before = snapshot(a.free_pages)
        out = decode(a, seq, last, strided=bs % 2 == 0)
        expect_equal(
            out,
            i64(*alloc_decode_python(seq, last, before.tolist(), ps)),
            f"seq_lens {seq}, last_loc {last}, page size {ps}",
        )
        expect_no_sharing({i: [s] for i, s in enumerate(out.tolist())}, "slot")
        opened = sum((s - 1) % ps == 0 for s in seq)
        expect_equal(
            a.free_pages,
            before[opened:],
            f"free_pages after {opened} requests opened a page",
        )


@points(1)
def test_refusal():
    a = allocator(8, 4)  # 2 pages
    out = decode(a, [1, 5, 9], [-1, 3, 7])
    expect(
        out is None,
        f"3 requests open a page, 2 pages free: alloc_decode must return None, got {out!r}",
    )
    expect_equal(
        a.free_pages,
        i64(1, 2),
        "a refused alloc_decode must leave free_pages as it was",
    )
    out = decode(a, [1, 6, 9], [-1, 40, 7])
    expect_equal(
        out,
        i64(4, 41, 8),
        "2 requests open a page, exactly 2 pages free: alloc_decode must succeed",
    )
    expect_equal(a.free_pages, i64(), "every page taken")
    out = decode(a, [1], [-1])
    expect(
        out is None,
        f"1 request opens a page, no page free: alloc_decode must return None, got {out!r}",
    )


# -- the learner's alloc_decode against the engine's, over several decode steps --------------------


def random_case(d):
    from memlab.course.grading.fuzz import tensor_code
    from memlab.sglang.allocator.reference import alloc_decode_python as engine
    from memlab_tests.exercises.exercise_refs import INT31, SIZES, scribble, tensor

    ps = d.pick(SIZES)
    big = d.chance(
        0.25
    )  # lengths near 2**31: alloc_decode only computes with them (no pool needed)
    seq = [
        (d.big(1, INT31 - 10) if big else d.int(1, 3 * ps + 3)) for _ in d.count(1, 6)
    ]
    # the slot of each request's previous token (position seq - 2), on an old page far
    # from the new ones
    last = [
        -1 if s == 1 else (5000 + 3 * i) * ps + (s - 2) % ps for i, s in enumerate(seq)
    ]
    steps = list(d.count(1, 4, 0.5))
    opens = sum((s + k - 1) % ps == 0 for s in seq for k in range(len(steps)))
    free = d.ids(
        max(0, opens + d.int(-2, 2)), INT31
    )  # page ids in random order, small and large
    a = allocator(64 * ps, ps)
    a.free_pages = tensor(free)
    d.given(page_size=ps, seq_lens=seq, last_loc=last, free_pages=free)
    d.code(f"a = ex.PagedAllocator({64 * ps}, {ps})")
    d.code(f"a.free_pages = {tensor_code(free)}")
    for k in steps:
        if k:
            d.step(f"alloc_decode(seq_lens={seq}, last_loc={last})")
        d.code(f"print(a.alloc_decode({tensor_code(seq)}, {tensor_code(last)}))")
        args = [tensor(seq, d.chance(0.3)), tensor(last, d.chance(0.3))]
        got = d.call("alloc_decode", a.alloc_decode, *args)
        need = sum((s - 1) % ps == 0 for s in seq)
        want = None if need > len(free) else i64(*engine(seq, last, free, ps))
        d.returns("alloc_decode", got, want)
        scribble(*args)
        free = free if want is None else free[need:]
        d.books("alloc_decode", "free_pages", a.free_pages, tensor(free))
        if want is None:
            break
        seq, last = [s + 1 for s in seq], want.tolist()


@points(2)
def test_random_decode_steps_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, seed=505, trials=150, name="ch05_alloc_decode")
