"""Graded: chapter 04, paged alloc_extend in torch (exercises/ch04_alloc_extend.py)."""

import pytest
import torch

from memlab.course.grading.checks import (
    call_keeping_inputs,
    expect,
    expect_equal,
    expect_no_sharing,
    expect_raises,
    expect_tensor,
    plural,
    snapshot,
)
from memlab.course.grading.loader import load
from memlab_tests.exercises.exercise_refs import (
    alloc_extend_python,
    i64,
    split_by_request,
)


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch04.alloc_extend", requires=requires)


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
    """alloc_extend on int64 tensors; the inputs must come back unchanged. Returns (out,
    free_pages before)."""
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


def shuffled_pages(a, rng, pages):
    """The free pages 1..pages in a random order (a well-used pool); returns them."""
    order = rng.sample(range(1, pages + 1), pages)
    a.free_pages = t(order)
    return order


def old_slot(rng, prefix, ps, far=1000):
    """last_loc of a request holding ``prefix`` tokens: the last one's slot, on a page of its
    own far from the free pages (-1 for an empty prefix)."""
    return -1 if prefix == 0 else (far + rng.randint(0, 99)) * ps + (prefix - 1) % ps


@points(2)
def test_fresh_requests_whole_and_partial(rng):
    ps = rng.choice((2, 3, 4, 5, 8))
    a = allocator(64 * ps, ps)
    free = shuffled_pages(a, rng, 64)
    seq = [ps + rng.randint(1, ps - 1), 2 * ps, rng.randint(1, ps - 1)]
    out, _ = run(a, [0, 0, 0], seq, [-1, -1, -1])
    got = split_by_request(out, [0, 0, 0], seq)

    def slots(*pages):
        return [p * ps + o for p in pages for o in range(ps)]

    expect_equal(
        got[0],
        slots(free[0], free[1])[: seq[0]],
        f"request 0 (0 -> {plural(seq[0], 'token')}, page size {ps}) takes the first 2 free pages, "
        f"{free[0]} and {free[1]} (free_pages {free[:6]}...)",
    )
    expect_equal(
        got[1],
        slots(free[2], free[3]),
        f"request 1 (0 -> {plural(seq[1], 'token')}) takes the next 2, {free[2]} and {free[3]}",
    )
    expect_equal(
        got[2],
        slots(free[4])[: seq[2]],
        f"request 2 (0 -> {plural(seq[2], 'token')}) takes page {free[4]}",
    )
    expect_equal(
        out, i64(*got[0], *got[1], *got[2]), "the batch's slots: an int64 tensor"
    )
    expect_equal(a.free_pages, i64(*free[5:]), "free_pages after taking 5 pages")


@points(2)
def test_continues_from_last_loc(rng):
    ps = rng.choice((3, 4, 5, 8))
    a = allocator(64 * ps, ps)
    free = shuffled_pages(a, rng, 64)
    # Request 0 holds ps + 2 tokens; its last one is at offset 1 of a page of its own.
    pre = ps + 2
    last = old_slot(rng, pre, ps)
    seq = 3 * ps + 1
    out, _ = run(a, [pre], [seq], [last], strided=True)
    got = out.tolist()
    room = ps - 2
    expect_equal(
        got[:room],
        list(range(last + 1, last + 1 + room)),
        f"the first new tokens must fill the old page from last_loc + 1 = {last + 1} "
        "(part 1)",
    )
    expect_equal(
        got[room:],
        [free[0] * ps + o for o in range(ps)] + [free[1] * ps],
        f"then whole page {free[0]} and the start of page {free[1]} (parts 2 and 3)",
    )
    expect_equal(
        a.free_pages,
        i64(*free[2:]),
        f"exactly 2 new pages: ceil({seq}/{ps}) - ceil({pre}/{ps})",
    )
    # A request whose old page ends exactly at its prefix has no part 1.
    pres, seqs = [2 * ps, ps + 1], [2 * ps + 2, 2 * ps + 1]
    lasts = [old_slot(rng, p, ps, 2000 + 200 * i) for i, p in enumerate(pres)]
    out, _ = run(a, pres, seqs, lasts)
    expect_equal(
        out,
        i64(*alloc_extend_python(pres, seqs, lasts, free[2:], ps)),
        f"prefix {pres[0]} -> {seqs[0]} (page-aligned prefix: a new page at once, "
        f"{free[2]}) and prefix {pres[1]} -> {seqs[1]} (slots {lasts[1] + 1}.. fill its "
        f"old page, then a new one, {free[3]})",
    )


@points(1, requires="test_fresh_requests_whole_and_partial")
def test_no_new_page_when_old_page_has_room(rng):
    ps = rng.choice((4, 6, 8, 16))
    a = allocator(64 * ps, ps)
    shuffled_pages(a, rng, 64)
    pre = rng.randint(1, ps - 3)
    last0, last1 = old_slot(rng, pre, ps), old_slot(rng, ps, ps, 3000)
    out, free_before = run(a, [pre, ps], [pre + 3, ps], [last0, last1])
    expect_equal(
        out,
        i64(last0 + 1, last0 + 2, last0 + 3),
        f"request 0 ({pre} -> {pre + 3}, page size {ps}) stays on its page: slots "
        f"{last0 + 1}, {last0 + 2}, {last0 + 3}; request 1 ({ps} -> {ps}) gets nothing",
    )
    expect_equal(
        a.free_pages,
        free_before,
        "no page may be taken when every token fits in an old page",
    )
    pre = rng.randint(1, ps - 1)
    last0 = old_slot(rng, pre, ps)
    out, _ = run(a, [pre, 0], [ps, 0], [last0, -1])
    expect_equal(
        out,
        i64(*range(last0 + 1, last0 + 1 + ps - pre)),
        f"request 0 ({pre} -> {ps}, page size {ps}) fills its page to the last slot; "
        "request 1 (0 -> 0) gets nothing",
    )
    out, _ = run(a, [ps, 0], [ps, 0], [last1, -1])
    expect_equal(out, i64(), "a batch with no new token: an EMPTY int64 tensor")
    expect_equal(
        a.free_pages, free_before, "no page may be taken for a batch with no new page"
    )


@points(2, requires="test_fresh_requests_whole_and_partial")
def test_refusal_takes_nothing(rng):
    ps = rng.choice((2, 3, 4, 5))
    pages = rng.randint(6, 12)
    a = allocator(pages * ps, ps)
    free = shuffled_pages(a, rng, pages)
    whole = rng.randint(1, pages - 2)  # request 0's pages; request 1 needs the rest
    seq0, seq1 = whole * ps, (pages - whole + 1) * ps  # one page too many
    out, free_before = run(a, [0, 0], [seq0, seq1], [-1, -1])
    expect(
        out is None,
        f"{plural(pages + 1, 'page')} needed, {pages} free: alloc_extend must return None, got "
        f"{out!r}",
    )
    expect_equal(
        a.free_pages,
        free_before,
        "a refused alloc_extend must leave free_pages as it was (decide capacity BEFORE "
        "taking pages)",
    )
    # The same batch, request 1 holding tokens on a page of its own: an exact fit.
    pre1 = rng.randint(1, ps - 1)
    last1 = old_slot(rng, pre1, ps)
    out, _ = run(a, [0, pre1], [seq0, seq1], [-1, last1])
    expect(
        out is not None,
        f"{plural(pages, 'page')} needed, {pages} free: alloc_extend must succeed",
    )
    expect_equal(
        out,
        i64(*alloc_extend_python([0, pre1], [seq0, seq1], [-1, last1], free, ps)),
        f"request 0 takes pages {free[:whole]}; request 1 fills its old page from "
        f"{last1 + 1}, then takes the rest, {free[whole:]}",
    )
    expect_equal(
        out[-1:],
        i64(free[-1] * ps + ps - 1),
        "the last slot of an exact fit: the last slot of the last free page",
    )
    expect_equal(a.free_pages, i64(), "every page taken")
    last = old_slot(rng, ps - 1, ps)
    out, _ = run(a, [ps - 1], [ps], [last])
    expect_equal(
        out,
        i64(last + 1),
        f"{ps - 1} -> {plural(ps, 'token')} with page size {ps} and no page free: the token fits "
        "in "
        "the old page",
    )
    # 2 pages; the last request of an exact fit fills its page
    b = allocator(2 * ps, ps)
    two = shuffled_pages(b, rng, 2)
    pre1 = rng.randint(1, ps - 1)
    last1 = old_slot(rng, pre1, ps)
    out, _ = run(b, [0, pre1], [2 * ps, ps], [-1, last1])
    expect_equal(
        out,
        i64(*alloc_extend_python([0, pre1], [2 * ps, ps], [-1, last1], two, ps)),
        f"prefix 0 -> {2 * ps} takes both free pages {two}; prefix {pre1} -> {ps} fills "
        "its old page and needs no page",
    )
    expect_equal(b.free_pages, i64(), "every page taken")
    for pre, seq in (([5], [4]), ([0, 9], [3, 8]), ([0, 9], [9, 8])):
        expect_raises(
            ValueError,
            lambda: a.alloc_extend(t(pre), t(seq), t([3] * len(pre))),
            f"alloc_extend with prefix_lens {pre} and seq_lens {seq} (a seq_len below its "
            "prefix_len; no page is free either: the ValueError for invalid input comes "
            "first)",
        )
    expect_equal(a.free_pages, i64(), "free_pages after refused calls")


@points(2)
def test_matches_reference_on_random_batches(rng):
    for trial in range(60):
        ps = rng.choice([1, 2, 4, 16])
        bs = rng.randint(1, 6)
        a = allocator(4096 * ps, ps)
        shuffled_pages(a, rng, 4096)  # a well-used pool: pages in any order
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
                f"request {i} (prefix {pre[i]} -> {plural(seq[i], 'token')}, last_loc {last[i]}, "
                f"page size {ps})",
            )
        expect_no_sharing({i: g for i, g in enumerate(got)}, "slot")
        used = sum(-(-s // ps) - -(-p // ps) for p, s in zip(pre, seq))
        expect_equal(
            a.free_pages,
            free_before[used:],
            f"free_pages after taking {plural(used, 'page')} from its head",
        )


# -- the learner's alloc_extend against the engine's, on random batches ---------------------------


def engine_alloc_extend(pre, seq, last, free_pages, ps):
    """SGLang's answer (memlab.sglang.allocator: its checks, its capacity rule, alloc_extend_naive):
    (slots or None or the error, free_pages after)."""
    from memlab.course.grading.fuzz import Raised
    from memlab.sglang.allocator.reference import alloc_extend_python as engine

    # the engine's boundary check comes before capacity
    if any(s < p for p, s in zip(pre, seq)):
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
    # an invalid request: the docstring's ValueError must win, even when pages are short
    if d.chance(0.08):
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

    check(random_case, trials=150, name="ch04_alloc_extend")
