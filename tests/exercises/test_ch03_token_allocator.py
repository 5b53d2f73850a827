"""Graded: chapter 03, the token allocator (exercises/ch03_token_allocator.py)."""

import pytest
import torch

from memlab.course.grading.checks import (
    call_keeping_inputs,
    expect,
    expect_equal,
    expect_no_sharing,
    expect_tensor,
    plural,
)
from memlab.course.grading.loader import load
from memlab_tests.exercises.exercise_refs import i64


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch03.token_allocator", requires=requires)


def allocator(size=8, need_sort=False):
    return load("ch03_token_allocator").TokenToKVPoolAllocator(
        size, need_sort=need_sort
    )


def books(a):
    return a.free_pages, a.release_pages


def free(a, slots, what="free"):
    return call_keeping_inputs(a.free, what, slots)


@points(1)
def test_fresh_allocation_from_head(rng):
    size = rng.randint(4, 64)
    k = rng.randint(1, size - 1)
    a = allocator(size)
    expect_equal(
        a.alloc(k),
        i64(*range(1, k + 1)),
        f"alloc({k}) on a fresh allocator of {plural(size, 'slot')} (slot 0 is padding): an int64 "
        "tensor",
    )
    expect_equal(a.alloc(0), i64(), "alloc(0): an EMPTY int64 tensor")
    expect_equal(
        a.available_size(),
        size - k,
        f"available_size() after taking {k} of {plural(size, 'slot')} (an int)",
    )
    expect_equal(
        a.alloc(size - k),
        i64(*range(k + 1, size + 1)),
        f"alloc({size - k}) with exactly {plural(size - k, 'slot')} free takes them all",
    )
    got = a.alloc(1)
    expect(got is None, f"alloc(1) with no slot free must return None, got {got!r}")
    expect_equal(a.alloc(0), i64(), "alloc(0) with no slot free")
    expect_equal(a.available_size(), 0, "available_size() of an empty allocator")


@points(1)
def test_free_appends_fifo(rng):
    size = rng.randint(6, 64)
    held = rng.randint(3, size - 2)
    a = allocator(size)
    a.alloc(held)  # 1..held taken
    back = rng.sample(range(1, held + 1), rng.randint(2, 3))
    free(a, i64(*back))
    want = [*range(held + 1, size + 1), *back]
    expect_equal(
        a.free_pages,
        i64(*want),
        f"free_pages after freeing {back}: freed slots go to the TAIL (FIFO reuse)",
    )
    for empty in (i64(), torch.tensor([])):
        free(a, empty, "free of an empty tensor")
        expect_equal(a.free_pages, i64(*want), f"free({empty!r}) must change nothing")
    expect_equal(a.release_pages, i64(), "without need_sort nothing is staged")
    expect_equal(
        a.alloc(len(want)),
        i64(*want),
        "the next allocation takes the older free slots first",
    )


@points(1, requires="test_fresh_allocation_from_head")
def test_refusal(rng):
    size = rng.randint(4, 64)
    a = allocator(size)
    a.alloc(size - 1)
    back = rng.randint(1, size - 1)
    free(a, i64(back))
    got = a.alloc(3)
    expect(got is None, f"alloc(3) with 2 slots free must return None, got {got!r}")
    expect_equal(
        books(a),
        (i64(size, back), i64()),
        "(free_pages, release_pages) after a refused alloc: unchanged",
    )
    expect_equal(a.available_size(), 2, "available_size() after a refused alloc")
    # need_sort: the merge happens before the refusal and stays done (as in SGLang).
    size = rng.randint(6, 64)
    a = allocator(size, need_sort=True)
    a.alloc(size - 1)
    back = rng.sample(range(1, size), rng.randint(2, 4))
    free(a, i64(*back))
    need = len(back) + 2
    got = a.alloc(need)
    expect(
        got is None,
        f"alloc({need}) with 1 free and {plural(len(back), 'staged slot')} (need_sort) must return "
        f"None, got {got!r}",
    )
    expect_equal(
        books(a),
        (i64(*sorted([size, *back])), i64()),
        f"(free_pages, release_pages) after a refused alloc({need}) with need_sort: "
        "free_pages was short, so the staged slots were merged and sorted first; the "
        "merge stays done",
    )
    expect_equal(
        a.available_size(),
        len(back) + 1,
        "available_size() after a refused alloc (need_sort)",
    )


@points(1)
def test_staged_frees_counted(rng):
    size = rng.randint(8, 64)
    taken = rng.randint(6, size - 1)
    a = allocator(size, need_sort=True)
    a.alloc(taken)
    picked = rng.sample(range(1, taken + 1), 3)
    first, second = picked[:2], picked[2:]
    free(a, i64(*first))
    free(a, i64(*second))
    free(a, i64(), "free of an empty tensor")
    expect_equal(
        a.free_pages,
        i64(*range(taken + 1, size + 1)),
        "with need_sort a free must not touch free_pages",
    )
    expect_equal(
        a.release_pages,
        i64(*first, *second),
        "with need_sort freed slots are appended to release_pages",
    )
    staged = len(first) + len(second)
    expect_equal(
        a.available_size(),
        size - taken + staged,
        f"available_size() must count the {size - taken} free AND the {staged} staged "
        "slots",
    )
    b = allocator(size, need_sort=True)
    b.alloc(taken)
    slots = rng.sample(range(1, taken + 1), 2)
    buf = i64(*slots)
    free(b, buf)
    buf[:] = (
        0  # the caller reuses its buffer: the allocator must have kept no reference
    )
    expect_equal(
        b.release_pages,
        i64(*slots),
        f"release_pages after free({slots}) into an empty stage, the caller then "
        "overwriting its tensor: keep a copy (torch.cat makes one), not the caller's "
        "tensor",
    )


@points(2)
def test_merge_when_short(rng):
    size = rng.randint(6, 64)
    a = allocator(size, need_sort=True)
    a.alloc(size)
    staged = rng.sample(range(1, size + 1), rng.randint(3, 5))
    free(a, i64(*staged[:-1]))
    free(a, i64(staged[-1]))
    n = rng.randint(1, len(staged) - 1)
    order = sorted(staged)
    expect_equal(
        a.alloc(n),
        i64(*order[:n]),
        f"alloc({n}) with nothing in free_pages must merge and sort the staged slots "
        f"{staged} first",
    )
    expect_equal(
        books(a),
        (i64(*order[n:]), i64()),
        f"(free_pages, release_pages) after merging {staged} and taking {n}",
    )
    # Called directly: with nothing staged nothing changes, not even the order (no sort).
    unsorted = rng.sample(range(1, size + 1), 3)
    a.free_pages = i64(*unsorted)
    a.merge_and_sort_free()
    expect_equal(
        books(a),
        (i64(*unsorted), i64()),
        "merge_and_sort_free() with nothing staged must change nothing",
    )
    more = rng.sample([x for x in range(1, size + 1) if x not in unsorted], 2)
    free(a, i64(*more))
    a.merge_and_sort_free()
    expect_equal(
        books(a),
        (i64(*sorted(unsorted + more)), i64()),
        f"merge_and_sort_free() with {more} staged: one sorted free list, release_pages "
        "emptied (an empty int64 tensor)",
    )


@points(1, requires="test_merge_when_short")
def test_no_merge_when_enough(rng):
    size = rng.randint(10, 64)
    taken = rng.randint(4, size - 5)
    a = allocator(size, need_sort=True)
    a.alloc(taken)
    staged = rng.sample(range(1, taken + 1), 2)
    free(a, i64(*staged))
    left = size - taken
    first = rng.randint(1, left - 2)
    expect_equal(
        a.alloc(first),
        i64(*range(taken + 1, taken + 1 + first)),
        f"alloc({first}) with {plural(left, 'slot')} in free_pages takes them: merging (a sort) is "
        "for when it runs short",
    )
    expect_equal(
        a.release_pages,
        i64(*staged),
        "staged slots must stay staged while free_pages suffices",
    )
    rest = left - first
    expect_equal(
        a.alloc(rest),
        i64(*range(taken + 1 + first, size + 1)),
        f"alloc({rest}) with EXACTLY {plural(rest, 'slot')} in free_pages takes them: free_pages "
        f"does not hold fewer than {rest}, so there is nothing to merge",
    )
    expect_equal(
        a.release_pages,
        i64(*staged),
        "staged slots after an exact-fit alloc: still staged",
    )


class Model:
    """The docstrings, in plain Python."""

    def __init__(self, size, need_sort):
        self.need_sort, self.free, self.staged = need_sort, list(range(1, size + 1)), []

    def alloc(self, n):
        if self.need_sort and n > len(self.free) and self.staged:
            self.free, self.staged = sorted(self.free + self.staged), []
        if n > len(self.free):
            return None
        out, self.free = self.free[:n], self.free[n:]
        return out

    def release(self, slots):
        (self.staged if self.need_sort else self.free).extend(slots)


@points(1)
def test_random_stream_invariants(rng):
    for need_sort in (False, True):
        size = rng.randint(8, 48)
        a, model = allocator(size, need_sort), Model(size, need_sort)
        held: dict[int, list[int]] = {}
        for req in range(200):
            if held and rng.random() < 0.4:
                slots = held.pop(rng.choice(list(held)))
                free(a, i64(*slots))
                model.release(slots)
            else:
                n = rng.randint(0, 9)
                got, want = a.alloc(n), model.alloc(n)
                what = f"alloc({n}) on step {req} (need_sort={need_sort})"
                if want is None:
                    expect(got is None, f"{what} must return None, got {got!r}")
                else:
                    expect_equal(got, i64(*want), what)
                    held[req] = want
                    expect_no_sharing(held, "slot")
            expect_equal(
                books(a),
                (i64(*model.free), i64(*model.staged)),
                f"(free_pages, release_pages) after step {req} (need_sort={need_sort})",
            )
            expect_equal(
                a.available_size(),
                len(model.free) + len(model.staged),
                "available_size()",
            )
        expect_tensor(a.free_pages, "free_pages", torch.int64)


# -- the learner's allocator against the engine's (memlab's TokenToKVPoolAllocator), step by step -


def random_case(d):
    from memlab.course.grading.fuzz import tensor_code
    from memlab.sglang.allocator import TokenToKVPoolAllocator
    from memlab_tests.exercises.exercise_refs import scribble, tensor

    size, need_sort = d.size(1, 40), d.chance(0.5)
    mine, engine = (
        allocator(size, need_sort),
        TokenToKVPoolAllocator(size, need_sort=need_sort),
    )
    d.given(size=size, need_sort=need_sort)
    d.code(f"a = ex.TokenToKVPoolAllocator({size}, need_sort={need_sort})")
    held: list[int] = []
    for _ in d.count(1, 16, 0.85):
        op = d.pick(("alloc", "free", "merge"))
        if op == "alloc":
            n = d.int(0, size // 2 + 2)
            d.step(f"alloc({n})")
            d.code(f"print(a.alloc({n}))")
            want = engine.alloc(n)
            d.returns("alloc", d.call("alloc", mine.alloc, n), want)
            held += [] if want is None else want.tolist()
            what = "alloc"
        elif op == "free":
            # any order
            slots = [
                held.pop(d.int(0, len(held) - 1)) for _ in range(d.int(0, len(held)))
            ]
            d.step(f"free({slots})")
            d.code(f"a.free({tensor_code(slots)})")
            buf = tensor(slots)
            d.returns(
                "free", d.call("free", mine.free, buf), engine.free(tensor(slots))
            )
            # the caller reuses its buffer: the allocator must not have kept it
            scribble(buf)
            what = "free"
        else:
            d.step("merge_and_sort_free()")
            d.code("a.merge_and_sort_free()")
            d.returns(
                "merge_and_sort_free",
                d.call("merge_and_sort_free", mine.merge_and_sort_free),
                engine.merge_and_sort_free(),
            )
            what = "merge_and_sort_free"
        d.code("print(a.free_pages, a.release_pages, a.available_size())")
        d.books(what, "free_pages", mine.free_pages, engine.free_pages)
        d.books(what, "release_pages", mine.release_pages, engine.release_pages)
        d.books(
            what,
            "available_size()",
            d.call("available_size", mine.available_size),
            engine.available_size(),
        )


@points(2)
def test_random_streams_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, trials=120, name="ch03_token_allocator")
