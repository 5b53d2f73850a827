"""Graded: chapter 05, alloc_decode (exercises/ch05_alloc_decode.py)."""

import pytest
import torch

from memlab.course.grading.checks import (
    call_keeping_inputs,
    expect,
    expect_equal,
    expect_no_sharing,
    plural,
    snapshot,
)
from memlab.course.grading.loader import load
from memlab_tests.exercises.exercise_refs import alloc_decode_python, i64


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch05.alloc_decode", requires=requires)


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


def shuffled_pages(a, rng, pages):
    """The free pages 1..pages in a random order (a well-used pool); returns them."""
    order = rng.sample(range(1, pages + 1), pages)
    a.free_pages = t(order)
    return order


def last_slot(rng, seq, ps, far=1000):
    """last_loc of a request whose seq_len after the step is ``seq``: its previous token's slot
    (on a page of its own, far from the free pages); -1 for its first token."""
    return -1 if seq == 1 else (far + rng.randint(0, 99)) * ps + (seq - 2) % ps


@points(2)
def test_crossing_boundary_takes_new_page(rng):
    ps = rng.choice((3, 4, 5, 8))
    a = allocator(64 * ps, ps)
    free = shuffled_pages(a, rng, 64)
    k = rng.randint(1, 20)
    seq = k * ps + 1
    out = decode(a, [seq], [last_slot(rng, seq, ps)])
    expect_equal(
        out,
        i64(free[0] * ps),
        f"seq_len {seq} with page size {ps}: the new token (position {seq - 1}) opens a "
        f"page, so it takes the first slot of page {free[0]}, the first free one "
        "(seq_len % page_size == 1)",
    )
    seq = k * ps
    last = last_slot(rng, seq, ps)
    out = decode(a, [seq], [last])
    expect_equal(
        out,
        i64(last + 1),
        f"seq_len {seq} with page size {ps}: the new token (position {seq - 1}) is the "
        "LAST slot of its page, not the first of a new one",
    )
    seqs = [1, 2 * ps + 1, 2]
    lasts = [last_slot(rng, s, ps, 2000 + 200 * i) for i, s in enumerate(seqs)]
    out = decode(a, seqs, lasts)
    expect_equal(
        out,
        i64(free[1] * ps, free[2] * ps, lasts[2] + 1),
        f"seq_lens {seqs} with page size {ps}: the first token of a request and the first "
        f"of its third page open pages {free[1]} and {free[2]}, in batch order",
    )
    expect_equal(
        a.free_pages, i64(*free[3:]), "exactly three pages taken over the three steps"
    )


@points(1, requires="test_crossing_boundary_takes_new_page")
def test_within_page_continues(rng):
    ps = rng.choice((3, 4, 5, 8))
    a = allocator(64 * ps, ps)
    free = shuffled_pages(a, rng, 64)
    seqs = [rng.randint(0, 9) * ps + rng.randint(2, ps) for _ in range(2)]
    lasts = [last_slot(rng, s, ps, 1000 + 200 * i) for i, s in enumerate(seqs)]
    out = decode(a, seqs, lasts)
    expect_equal(
        out,
        i64(lasts[0] + 1, lasts[1] + 1),
        f"seq_lens {seqs} (after the step, page size {ps}): both tokens stay on their "
        "pages, at last_loc + 1 (an int64 tensor)",
    )
    expect_equal(
        a.free_pages, i64(*free), "no page may be taken when no token opens a page"
    )
    a.free_pages = i64()
    expect_equal(
        decode(a, seqs, lasts, strided=True),
        i64(lasts[0] + 1, lasts[1] + 1),
        f"seq_lens {seqs} with no free page: no token opens a page, so nothing is missing",
    )


@points(1, requires="test_crossing_boundary_takes_new_page")
def test_page_size_one(rng):
    a = allocator(16, 1)
    free = shuffled_pages(a, rng, 16)
    seqs = [1, rng.randint(2, 40), rng.randint(2, 40)]
    lasts = [-1, rng.randint(100, 200), rng.randint(300, 400)]
    out = decode(a, seqs, lasts)
    expect_equal(
        out,
        i64(*free[:3]),
        f"with page size 1 every token opens a page: pages {free[:3]}, the first free "
        "ones, in batch order",
    )
    expect_equal(
        a.free_pages, i64(*free[3:]), "free_pages after three pages were taken"
    )


@points(1)
def test_pages_in_batch_order(rng):
    for _ in range(40):
        ps = rng.choice([1, 2, 4, 16])
        bs = rng.randint(1, 8)
        a = allocator(1024 * ps, ps)
        shuffled_pages(a, rng, 1024)
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
            f"free_pages after {plural(opened, 'request')} opened a page",
        )


@points(1, requires="test_crossing_boundary_takes_new_page")
def test_refusal(rng):
    ps = rng.choice((2, 3, 4, 5))
    pages = rng.randint(2, 5)
    a = allocator(pages * ps, ps)
    free = shuffled_pages(a, rng, pages)
    opening = [1] + [rng.randint(1, 9) * ps + 1 for _ in range(pages)]  # pages + 1
    lasts = [last_slot(rng, s, ps, 1000 + 200 * i) for i, s in enumerate(opening)]
    out = decode(a, opening, lasts)
    expect(
        out is None,
        f"{plural(pages + 1, 'request')} open a page, {plural(pages, 'page')} free: "
        "alloc_decode must return "
        f"None, got {out!r}",
    )
    expect_equal(
        a.free_pages,
        i64(*free),
        "a refused alloc_decode must leave free_pages as it was",
    )
    stays = rng.randint(0, 9) * ps + 2
    seqs = opening[:-1] + [stays]  # one request stays on its page instead
    lasts[-1] = last_slot(rng, stays, ps, 3000)
    out = decode(a, seqs, lasts)
    expect_equal(
        out,
        i64(*[p * ps for p in free], lasts[-1] + 1),
        f"{plural(pages, 'request')} open a page, exactly {plural(pages, 'page')} free: "
        "alloc_decode must "
        "succeed",
    )
    expect_equal(a.free_pages, i64(), "every page taken")
    out = decode(a, [1], [-1])
    expect(
        out is None,
        "1 request opens a page, no page free: alloc_decode must return None, got "
        f"{out!r}",
    )


# -- the learner's alloc_decode against the engine's, over several decode steps --------------------


def random_case(d):
    from memlab.course.grading.fuzz import tensor_code
    from memlab.sglang.allocator.reference import alloc_decode_python as engine
    from memlab_tests.exercises.exercise_refs import INT31, SIZES, scribble, tensor

    ps = d.pick(SIZES)
    # lengths near 2**31: alloc_decode only computes with them (no pool needed)
    big = d.chance(0.25)
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
    # page ids in random order, small and large
    free = d.ids(max(0, opens + d.int(-2, 2)), INT31)
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

    check(random_case, trials=150, name="ch05_alloc_decode")
