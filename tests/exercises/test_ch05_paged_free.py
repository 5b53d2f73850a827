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
    plural,
)
from memlab.course.grading.loader import load
from memlab_tests.exercises.exercise_refs import i64


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch05.paged_free", requires=requires)


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


def in_use(rng, pages=None):
    """A free list with every page in use: (it, page size, number of pages)."""
    ps = rng.choice((2, 3, 4, 5, 8))
    n = pages or rng.randint(8, 40)
    f = free_list(n, ps)
    f.alloc_pages(n)
    return f, ps, n


@points(2)
def test_free_dedups_pages(rng):
    f, ps, n = in_use(rng)
    a, b = rng.sample(range(1, n + 1), 2)
    tokens = ps + rng.randint(1, ps - 1)  # page a whole, page b in part
    free(f, i64(*slots_of([a, b], ps, tokens)))
    got = expect_tensor(f.free_pages, "free_pages after a free", torch.int64)
    expect(
        len(got) == len(set(got)),
        f"freeing the {plural(tokens, 'slot')} of pages {a} and {b} (page size {ps}) put {got} in "
        "free_pages: each page must be freed ONCE (unique of slot // page_size)",
    )
    expect_equal(
        f.free_pages,
        i64(*sorted((a, b))),
        f"pages freed by a request holding {plural(tokens, 'token')} on pages {a} and {b} (an "
        "int64 "
        "tensor, ascending)",
    )
    # Hand the pages out again: with duplicates, two requests would share a page.
    owners = {}
    for req in (10, 11, 12):
        pages = f.alloc_pages(1)
        if pages is not None:
            owners[req] = pages.tolist()
    expect_no_sharing(owners, "page")
    g = free_list(n, 1)  # page size 1: a slot is a page
    g.alloc_pages(n)
    x, y = rng.sample(range(1, n + 1), 2)
    free(g, i64(x, y, x))
    expect_equal(
        g.free_pages,
        i64(*sorted((x, y))),
        f"page size 1, freeing slots [{x}, {y}, {x}]: pages {x} and {y}, once each",
    )


@points(1)
def test_free_prepends_lifo(rng):
    ps = rng.choice((2, 3, 4, 5, 8))
    n = rng.randint(8, 40)
    taken = rng.randint(4, n - 2)
    f = free_list(n, ps)
    f.alloc_pages(taken)  # pages 1..taken in use, the rest free
    p, q, r = rng.sample(range(1, taken + 1), 3)
    slots = [q * ps + ps - 1, p * ps + 1, q * ps]
    free(f, i64(*slots))
    rest = list(range(taken + 1, n + 1))
    expect_equal(
        f.free_pages,
        i64(*sorted((p, q)), *rest),
        f"free_pages after freeing slots {slots} (pages {q} and {p}, page size {ps}): "
        "freed pages go to the HEAD (LIFO reuse), in ascending order (unique sorts)",
    )
    free(f, i64(r * ps, r * ps + 1))
    expect_equal(
        f.free_pages,
        i64(r, *sorted((p, q)), *rest),
        f"after freeing page {r} too: the latest free comes first",
    )


@points(1, requires="test_free_dedups_pages")
def test_free_empty_noop(rng):
    ps = rng.choice((2, 3, 4, 5, 8))
    n = rng.randint(4, 40)
    taken = rng.randint(1, n - 1)
    f = free_list(n, ps)
    f.alloc_pages(taken)
    rest = i64(*range(taken + 1, n + 1))
    free(f, i64(), "free of an empty tensor")
    expect_equal(f.free_pages, rest, "free of an empty tensor must change nothing")
    aligned = ps * rng.randint(0, 9)
    free_segment(f, i64(), aligned)
    expect_equal(
        f.free_pages,
        rest,
        f"free_segment of an empty tensor at start_pos {aligned} must change nothing",
    )
    unaligned = aligned + rng.randint(1, ps - 1)
    free_segment(f, i64(), unaligned)
    expect_equal(
        f.free_pages,
        rest,
        f"free_segment of an empty tensor at start_pos {unaligned} changes nothing (the "
        "empty check comes first, as in SGLang)",
    )


@points(1)
def test_free_segment_aligned(rng):
    f, ps, n = in_use(rng)
    # Positions from a page-aligned start, on three pages (the last one partly).
    pages = rng.sample(range(1, n + 1), 5)
    first, second = pages[:3], pages[3:]
    start = ps * rng.randint(0, 9)
    count = 2 * ps + rng.randint(1, ps - 1)
    free_segment(f, i64(*slots_of(first, ps, count)), start_pos=start)
    expect_equal(
        f.free_pages,
        i64(*first),
        f"free_segment of positions {start}..{start + count - 1} on pages {first}: one "
        "page per page_size slots, in run order, at the head",
    )
    free_segment(f, i64(*slots_of(second, ps)), start_pos=0)
    expect_equal(
        f.free_pages,
        i64(*second, *first),
        f"free_segment of positions 0..{2 * ps - 1} on pages {second} (two whole pages), "
        "at the head",
    )
    g = free_list(n, 1)
    g.alloc_pages(n)
    run = rng.sample(range(1, n + 1), 3)
    free_segment(g, i64(*run), start_pos=rng.randint(1, 99))
    expect_equal(
        g.free_pages,
        i64(*run),
        "page size 1: every slot is a page, every start is aligned",
    )


@points(1, requires="test_free_segment_aligned")
def test_free_segment_rejects_unaligned(rng):
    f, ps, n = in_use(rng)
    a, b, c = rng.sample(range(1, n + 1), 3)
    skip = rng.randint(1, ps - 1)  # the run starts that far into page a
    start = ps * rng.randint(0, 9) + skip
    run = slots_of([a], ps)[skip:] + slots_of([b], ps) + slots_of([c], ps)[:skip]
    expect_raises(
        ValueError,
        lambda: f.free_segment(i64(*run), start_pos=start),
        f"free_segment(start_pos={start}) with page size {ps} (taking every "
        f"{ps}th slot would give pages {a} and {b} and miss page {c})",
        naming=str(start),
    )
    expect_equal(f.free_pages, i64(), "a refused free_segment must free nothing")


@points(1)
def test_free_group_batches_once(rng):
    f, ps, n = in_use(rng)
    a, b, c = rng.sample(range(1, n + 1), 3)
    f.free_group_begin()
    expect_equal(f.free_group, [], "free_group right after free_group_begin()")
    first = i64(*slots_of([a], ps), b * ps)  # page a and the first slot of page b
    f.free(first)
    first[:] = 0  # the caller reuses its tensor: the group must have kept a copy
    free(f, i64(*slots_of([b], ps)[1:]))  # the rest of page b: shared with the first
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
    both = sorted((a, b))
    expect_equal(
        f.free_pages,
        i64(*both),
        f"free_group_end() must free pages {a} and {b} once each (one free of everything "
        "queued; the first tensor was changed by its owner after queuing)",
    )
    expect_raises(RuntimeError, f.free_group_end, "free_group_end() with no group open")
    f.free_group_begin()
    expect_raises(
        RuntimeError,
        f.free_group_begin,
        "free_group_begin() while an EMPTY group is open (an open group is free_group is "
        "not None, even when nothing is queued yet)",
    )
    f.free_group_end()  # an empty group: nothing to free
    expect(f.free_group is None, "free_group after closing an empty group must be None")
    expect_equal(f.free_pages, i64(*both), "an empty free group must change nothing")
    free(f, i64(c * ps))  # outside a group: released at once again
    expect_equal(
        f.free_pages,
        i64(c, *both),
        "a free after the group closed is released at once",
    )


# -- the learner's frees against the engine's rules, over random sequences -------------------------


class Engine:
    """SGLang's paged free as the docstrings state it (memlab's allocator checks page ranges
    against a real pool, which this test does not build): pages deduplicated and sorted, released
    at the head;
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
    # page ids in random order: small (1 and 8 sort apart in a set) and large
    ids = d.ids(d.size(1, 10), INT31 // ps)
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
                # the last page may be partly filled
                length = len(pages) * ps - d.int(0, ps - 1)
                reqs.append([pages[p // ps] * ps + p % ps for p in range(length)])
            what = "alloc_pages"
        elif op in ("free", "free part") and reqs:
            slots = reqs.pop(d.int(0, len(reqs) - 1))
            # a request freed in two pieces: they share a page
            if op == "free part" and len(slots) > 1:
                cut = d.int(1, len(slots) - 1)
                slots, rest = slots[:cut], slots[cut:]
                reqs.append(rest)
            if d.chance(0.4):
                slots = d.shuffled(slots)  # any order
            d.step(f"free({slots})")
            d.code(f"f.free({tensor_code(slots)})")
            buf = tensor(slots)
            d.returns("free", d.call("free", f.free, buf), engine.free(slots))
            # the caller reuses its buffer (a free group must have kept a copy)
            scribble(buf)
            what = "free"
        # outside groups only (the docstring)
        elif op == "segment" and reqs and engine.free_group is None:
            i = d.int(0, len(reqs) - 1)
            start = d.int(0, len(reqs[i]) - 1)
            if d.chance(0.7):
                # mostly aligned; else the ValueError (and nothing freed)
                start = start // ps * ps
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

    check(random_case, trials=150, name="ch05_paged_free")
