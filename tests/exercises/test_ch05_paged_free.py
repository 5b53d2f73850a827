"""Graded: chapter 05, freeing pages (exercises/ch05_paged_free.py)."""

import pytest
import torch

from memlab.course.grading.checks import (
    call_keeping_inputs,
    expect,
    expect_equal,
    expect_no_sharing,
    expect_raises,
    expect_tensor,
)
from memlab.course.grading.loader import load
from memlab_tests.exercises.exercise_refs import i64


def points(n):
    return pytest.mark.points(n, exercise="ch05.paged_free")


def free_list(num_pages=8, page_size=4):
    return load("ch05_paged_free").PagedFreeList(num_pages, page_size)


def slots_of(pages, ps, n=None):
    out = [p * ps + o for p in pages for o in range(ps)]
    return out[:n] if n is not None else out


def free(f, slots, what="free"):
    return call_keeping_inputs(f.free, what, slots)


def free_segment(f, slots, start_pos):
    return call_keeping_inputs(
        f.free_segment, "free_segment", slots, start_pos=start_pos
    )


@points(2)
def test_free_dedups_pages():
    f = free_list(8, 4)
    f.alloc_pages(
        8
    )  # everything in use: request 1 holds pages 7 and 3, request 2 page 5
    free(
        f, i64(*slots_of([7, 3], 4, 6))
    )  # request 1's 6 tokens: 4 slots on page 7, 2 on page 3
    got = expect_tensor(f.free_pages, "free_pages after a free", torch.int64)
    expect(
        len(got) == len(set(got)),
        f"freeing the 6 slots of pages 7 and 3 put {got} in free_pages: each page "
        "must be freed ONCE (unique of slot // page_size)",
    )
    expect_equal(
        f.free_pages,
        i64(3, 7),
        "pages freed by a request holding 6 tokens on pages 7 and 3 (an int64 "
        "tensor, ascending)",
    )
    # Hand the pages out again: with duplicates, two requests would share a page.
    owners = {}
    for req in (10, 11, 12):
        pages = f.alloc_pages(1)
        if pages is not None:
            owners[req] = pages.tolist()
    expect_no_sharing(owners, "page")
    g = free_list(8, 1)  # page size 1: a slot is a page
    g.alloc_pages(8)
    free(g, i64(6, 2, 6))
    expect_equal(
        g.free_pages,
        i64(2, 6),
        "page size 1, freeing slots [6, 2, 6]: pages 2 and 6, once each",
    )


@points(1)
def test_free_prepends_lifo():
    f = free_list(8, 4)
    f.alloc_pages(4)  # pages 1..4 in use, 5..8 free
    free(f, i64(13, 12, 5))  # pages 3 and 1
    expect_equal(
        f.free_pages,
        i64(1, 3, 5, 6, 7, 8),
        "free_pages after freeing pages 3 and 1: freed pages go to "
        "the HEAD (LIFO reuse), in ascending order (unique sorts)",
    )
    free(f, i64(8, 9))  # page 2
    expect_equal(
        f.free_pages,
        i64(2, 1, 3, 5, 6, 7, 8),
        "after freeing page 2 too: the latest free comes first",
    )


@points(1)
def test_free_empty_noop():
    f = free_list(8, 4)
    f.alloc_pages(3)
    free(f, i64(), "free of an empty tensor")
    expect_equal(
        f.free_pages, i64(4, 5, 6, 7, 8), "free of an empty tensor must change nothing"
    )
    free_segment(f, i64(), 8)
    expect_equal(
        f.free_pages,
        i64(4, 5, 6, 7, 8),
        "free_segment of an empty tensor must change nothing",
    )
    free_segment(f, i64(), 3)
    expect_equal(
        f.free_pages,
        i64(4, 5, 6, 7, 8),
        "free_segment of an empty tensor at start_pos 3 changes nothing "
        "(the empty check comes first, as in SGLang)",
    )


@points(1)
def test_free_segment_aligned():
    f = free_list(8, 4)
    f.alloc_pages(8)
    # Positions 8..17 of a request (page-aligned start), on pages 6, 2 and 8 (the last one partly).
    free_segment(f, i64(*slots_of([6, 2, 8], 4, 10)), start_pos=8)
    expect_equal(
        f.free_pages,
        i64(6, 2, 8),
        "free_segment of positions 8..17 on pages 6, 2, 8: one page per "
        "page_size slots, in run order, at the head",
    )
    free_segment(f, i64(*slots_of([3, 1], 4, 8)), start_pos=0)
    expect_equal(
        f.free_pages,
        i64(3, 1, 6, 2, 8),
        "free_segment of positions 0..7 on pages 3 and 1 (two whole "
        "pages), at the head",
    )
    g = free_list(8, 1)
    g.alloc_pages(8)
    free_segment(g, i64(5, 7, 2), start_pos=3)
    expect_equal(
        g.free_pages,
        i64(5, 7, 2),
        "page size 1: every slot is a page, every start is aligned",
    )


@points(1)
def test_free_segment_rejects_unaligned():
    f = free_list(8, 4)
    f.alloc_pages(8)
    # Positions 2..9 of a request: slots 26, 27 on page 6, then page 2, then 32, 33 on page 8.
    run = [26, 27] + slots_of([2], 4) + [32, 33]
    expect_raises(
        ValueError,
        lambda: f.free_segment(i64(*run), start_pos=2),
        "free_segment(start_pos=2) with page size 4 (taking every 4th slot would give pages 6 and 2 "
        "and miss page 8)",
        naming="2",
    )
    expect_raises(
        ValueError,
        lambda: f.free_segment(i64(*slots_of([5], 4)[1:]), start_pos=5),
        "free_segment(start_pos=5) with page size 4",
        naming="5",
    )
    expect_equal(f.free_pages, i64(), "a refused free_segment must free nothing")


@points(1)
def test_free_group_batches_once():
    f = free_list(8, 4)
    f.alloc_pages(8)
    f.free_group_begin()
    expect_equal(f.free_group, [], "free_group right after free_group_begin()")
    a = i64(*slots_of([5], 4), 8)  # page 5 and slot 8 of page 2
    f.free(a)
    a[:] = 0  # the caller reuses its tensor: the group must have kept a copy
    free(f, i64(9, 10))  # the rest of page 2: shared with the first call
    free(f, i64(), "free of an empty tensor inside a group")
    expect_equal(f.free_pages, i64(), "inside a free group nothing may be released yet")
    expect_equal(
        len(f.free_group),
        2,
        "tensors queued in the group after two frees and an empty one",
    )
    expect_raises(
        RuntimeError,
        f.free_group_begin,
        "free_group_begin() while a group is open (groups do not nest)",
    )
    f.free_group_end()
    expect(
        f.free_group is None,
        f"free_group after free_group_end() must be None, got {f.free_group!r}",
    )
    expect_equal(
        f.free_pages,
        i64(2, 5),
        "free_group_end() must free pages 2 and 5 once each (one free of "
        "everything queued; the first tensor was changed by its owner after queuing)",
    )
    expect_raises(RuntimeError, f.free_group_end, "free_group_end() with no group open")
    f.free_group_begin()
    expect_raises(
        RuntimeError,
        f.free_group_begin,
        "free_group_begin() while an EMPTY group is open (an open "
        "group is free_group is not None, even when nothing is queued yet)",
    )
    f.free_group_end()  # an empty group: nothing to free
    expect(f.free_group is None, "free_group after closing an empty group must be None")
    expect_equal(f.free_pages, i64(2, 5), "an empty free group must change nothing")
    free(f, i64(13))  # outside a group: released at once again
    expect_equal(
        f.free_pages, i64(3, 2, 5), "a free after the group closed is released at once"
    )


# -- the learner's frees against the engine's rules, over random sequences -------------------------


class Engine:
    """SGLang's paged free as the docstrings state it (memlab's allocator checks page ranges against a
    real pool, which this test does not build): pages deduplicated and sorted, released at the head;
    free groups queue copies and release them as one free."""

    def __init__(self, free_pages, ps):
        self.free_pages, self.ps, self.free_group = list(free_pages), ps, None

    def alloc_pages(self, n):
        if n > len(self.free_pages):
            return None
        out, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return out

    def free(self, slots):
        if not slots:
            return
        if self.free_group is not None:
            self.free_group.append(list(slots))
            return
        self.free_pages = sorted({s // self.ps for s in slots}) + self.free_pages

    def free_segment(self, slots, start_pos):
        from memlab.course.grading.fuzz import Raised

        if not slots:
            return None
        if start_pos % self.ps:
            return Raised(ValueError())
        self.free_pages = [s // self.ps for s in slots[:: self.ps]] + self.free_pages
        return None

    def free_group_begin(self):
        from memlab.course.grading.fuzz import Raised

        if self.free_group is not None:
            return Raised(RuntimeError())
        self.free_group = []

    def free_group_end(self):
        from memlab.course.grading.fuzz import Raised

        if self.free_group is None:
            return Raised(RuntimeError())
        queued, self.free_group = self.free_group, None
        self.free([s for q in queued for s in q])


def random_case(d):
    from memlab.course.grading.fuzz import tensor_code
    from memlab_tests.exercises.exercise_refs import INT31, SIZES, scribble, tensor

    ps = d.pick(SIZES)
    ids = d.ids(
        d.int(1, 10), INT31 // ps
    )  # page ids in random order: small (1 and 8 sort apart in a set) and large
    f, engine = free_list(8, ps), Engine(ids, ps)
    f.free_pages = tensor(ids)
    d.given(page_size=ps, free_pages=ids)
    d.code(f"f = ex.PagedFreeList(8, {ps})")
    d.code(f"f.free_pages = {tensor_code(ids)}")
    reqs = []  # the slots of each request's tokens, in position order
    for _ in d.count(1, 12, 0.85):
        op = d.pick(("alloc", "free", "free part", "segment", "begin", "end", "empty"))
        what = op
        if op == "alloc":
            n = d.int(0, 3)
            d.step(f"alloc_pages({n})")
            d.code(f"print(f.alloc_pages({n}))")
            pages = engine.alloc_pages(n)
            got = d.call("alloc_pages", f.alloc_pages, n)
            d.returns("alloc_pages", got, None if pages is None else tensor(pages))
            if pages:
                length = len(pages) * ps - d.int(
                    0, ps - 1
                )  # the last page may be partly filled
                reqs.append([pages[p // ps] * ps + p % ps for p in range(length)])
            what = "alloc_pages"
        elif op in ("free", "free part") and reqs:
            slots = reqs.pop(d.int(0, len(reqs) - 1))
            if (
                op == "free part" and len(slots) > 1
            ):  # a request freed in two pieces: they share a page
                cut = d.int(1, len(slots) - 1)
                slots, rest = slots[:cut], slots[cut:]
                reqs.append(rest)
            if d.chance(0.4):
                slots = d.shuffled(slots)  # any order
            d.step(f"free({slots})")
            d.code(f"f.free({tensor_code(slots)})")
            buf = tensor(slots)
            d.returns("free", d.call("free", f.free, buf), engine.free(slots))
            scribble(
                buf
            )  # the caller reuses its buffer (a free group must have kept a copy)
            what = "free"
        elif (
            op == "segment" and reqs and engine.free_group is None
        ):  # outside groups only (the docstring)
            i = d.int(0, len(reqs) - 1)
            start = d.int(0, len(reqs[i]) - 1)
            if d.chance(0.7):
                start = (
                    start // ps * ps
                )  # mostly aligned; else the ValueError (and nothing freed)
            slots = reqs[i][start:]
            d.step(f"free_segment({slots}, start_pos={start})")
            d.code(f"f.free_segment({tensor_code(slots)}, {start})")
            want = engine.free_segment(slots, start)
            if want is None:
                reqs[i] = reqs[i][:start]
            d.returns(
                "free_segment",
                d.call("free_segment", f.free_segment, tensor(slots), start),
                want,
            )
            what = "free_segment"
        elif op == "begin":
            d.step("free_group_begin()")
            d.code("f.free_group_begin()")
            d.returns(
                "free_group_begin",
                d.call("free_group_begin", f.free_group_begin),
                engine.free_group_begin(),
            )
            what = "free_group_begin"
        elif op == "end":
            d.step("free_group_end()")
            d.code("f.free_group_end()")
            d.returns(
                "free_group_end",
                d.call("free_group_end", f.free_group_end),
                engine.free_group_end(),
            )
            what = "free_group_end"
        else:
            d.step("free([])")
            d.code("f.free(torch.tensor([], dtype=torch.int64))")
            d.returns("free", d.call("free", f.free, tensor([])), engine.free([]))
            what = "free"
        d.code("print(f.free_pages, f.free_group)")
        d.books(what, "free_pages", f.free_pages, tensor(engine.free_pages))
        group = engine.free_group
        d.books(
            what,
            "free_group",
            f.free_group,
            None if group is None else [tensor(q) for q in group],
        )


@points(2)
def test_random_frees_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, seed=550, trials=150, name="ch05_paged_free")
