"""Graded: chapter 03, the token allocator (exercises/ch03_token_allocator.py)."""

import random

import pytest
import torch

from memlab.course.grading.checks import (
    call_keeping_inputs,
    expect,
    expect_equal,
    expect_no_sharing,
    expect_tensor,
)
from memlab.course.grading.loader import load
from memlab_tests.exercises.exercise_refs import i64


def points(n):
    return pytest.mark.points(n, exercise="ch03.token_allocator")


def allocator(size=8, need_sort=False):
    return load("ch03_token_allocator").TokenToKVPoolAllocator(
        size, need_sort=need_sort
    )


def books(a):
    return a.free_pages, a.release_pages


def free(a, slots, what="free"):
    return call_keeping_inputs(a.free, what, slots)


@points(1)
def test_fresh_allocation_from_head():
    a = allocator(8)
    expect_equal(
        a.alloc(3),
        i64(1, 2, 3),
        "alloc(3) on a fresh allocator (slot 0 is padding): an int64 tensor",
    )
    expect_equal(a.alloc(0), i64(), "alloc(0): an EMPTY int64 tensor")
    expect_equal(
        a.available_size(), 5, "available_size() after taking 3 of 8 slots (an int)"
    )
    expect_equal(
        a.alloc(5),
        i64(4, 5, 6, 7, 8),
        "alloc(5) with exactly 5 slots free takes them all",
    )
    got = a.alloc(1)
    expect(got is None, f"alloc(1) with no slot free must return None, got {got!r}")
    expect_equal(a.alloc(0), i64(), "alloc(0) with no slot free")
    expect_equal(a.available_size(), 0, "available_size() of an empty allocator")


@points(1)
def test_free_appends_fifo():
    a = allocator(8)
    a.alloc(4)  # 1..4 held, 5..8 free
    free(a, i64(2, 1))
    expect_equal(
        a.free_pages,
        i64(5, 6, 7, 8, 2, 1),
        "free_pages after freeing [2, 1]: freed slots go to the TAIL (FIFO reuse)",
    )
    for empty in (i64(), torch.tensor([])):
        free(a, empty, "free of an empty tensor")
        expect_equal(
            a.free_pages, i64(5, 6, 7, 8, 2, 1), f"free({empty!r}) must change nothing"
        )
    expect_equal(a.release_pages, i64(), "without need_sort nothing is staged")
    expect_equal(
        a.alloc(6),
        i64(5, 6, 7, 8, 2, 1),
        "the next allocation takes the older free slots first",
    )


@points(1)
def test_refusal():
    a = allocator(4)
    a.alloc(3)
    free(a, i64(2))
    got = a.alloc(3)
    expect(got is None, f"alloc(3) with 2 slots free must return None, got {got!r}")
    expect_equal(
        books(a),
        (i64(4, 2), i64()),
        "(free_pages, release_pages) after a refused alloc: unchanged",
    )
    expect_equal(a.available_size(), 2, "available_size() after a refused alloc")
    # need_sort: the merge happens before the refusal and stays done (as in SGLang).
    a = allocator(6, need_sort=True)
    a.alloc(5)
    free(a, i64(4, 2))
    got = a.alloc(4)
    expect(
        got is None,
        f"alloc(4) with 1 free and 2 staged slots (need_sort) must return None, got {got!r}",
    )
    expect_equal(
        books(a),
        (i64(2, 4, 6), i64()),
        "(free_pages, release_pages) after a refused alloc(4) with "
        "need_sort: free_pages was short, so the staged slots were merged and sorted first; the merge "
        "stays done",
    )
    expect_equal(
        a.available_size(), 3, "available_size() after a refused alloc (need_sort)"
    )


@points(1)
def test_staged_frees_counted():
    a = allocator(8, need_sort=True)
    a.alloc(6)
    free(a, i64(3, 1))
    free(a, i64(5))
    free(a, i64(), "free of an empty tensor")
    expect_equal(
        a.free_pages, i64(7, 8), "with need_sort a free must not touch free_pages"
    )
    expect_equal(
        a.release_pages,
        i64(3, 1, 5),
        "with need_sort freed slots are appended to release_pages",
    )
    expect_equal(
        a.available_size(),
        5,
        "available_size() must count the 2 free AND the 3 staged slots",
    )
    b = allocator(8, need_sort=True)
    b.alloc(4)
    buf = i64(2, 4)
    free(b, buf)
    buf[:] = (
        0  # the caller reuses its buffer: the allocator must have kept no reference to it
    )
    expect_equal(
        b.release_pages,
        i64(2, 4),
        "release_pages after free([2, 4]) into an empty stage, the caller "
        "then overwriting its tensor: keep a copy (torch.cat makes one), not the caller's tensor",
    )


@points(2)
def test_merge_when_short():
    a = allocator(10, need_sort=True)
    a.alloc(10)
    free(a, i64(9, 3))
    free(a, i64(5))
    got = a.alloc(2)
    expect_equal(
        got,
        i64(3, 5),
        "alloc(2) with nothing in free_pages must merge and sort the staged slots [9, 3, 5] first",
    )
    expect_equal(
        books(a),
        (i64(9), i64()),
        "(free_pages, release_pages) after merging [9, 3, 5] and taking 2",
    )
    # Called directly: with nothing staged nothing changes, not even the order (no sort).
    a.free_pages = i64(8, 2, 6)
    a.merge_and_sort_free()
    expect_equal(
        books(a),
        (i64(8, 2, 6), i64()),
        "merge_and_sort_free() with nothing staged must change nothing",
    )
    free(a, i64(7, 1))
    a.merge_and_sort_free()
    expect_equal(
        books(a),
        (i64(1, 2, 6, 7, 8), i64()),
        "merge_and_sort_free() with [7, 1] staged: one sorted "
        "free list, release_pages emptied (an empty int64 tensor)",
    )


@points(1)
def test_no_merge_when_enough():
    a = allocator(10, need_sort=True)
    a.alloc(5)
    free(a, i64(4, 2))
    expect_equal(
        a.alloc(2),
        i64(6, 7),
        "alloc(2) with 5 slots in free_pages takes them: merging (a sort) is for when it runs short",
    )
    expect_equal(
        a.release_pages,
        i64(4, 2),
        "staged slots must stay staged while free_pages suffices",
    )
    expect_equal(
        a.alloc(3),
        i64(8, 9, 10),
        "alloc(3) with EXACTLY 3 slots in free_pages takes them: free_pages "
        "does not hold fewer than 3, so there is nothing to merge",
    )
    expect_equal(
        a.release_pages,
        i64(4, 2),
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
def test_random_stream_invariants():
    rng = random.Random(3)
    for need_sort in (False, True):
        a, model = allocator(32, need_sort), Model(32, need_sort)
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

    size, need_sort = d.int(1, 40), d.chance(0.5)
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
            slots = [
                held.pop(d.int(0, len(held) - 1)) for _ in range(d.int(0, len(held)))
            ]  # any order
            d.step(f"free({slots})")
            d.code(f"a.free({tensor_code(slots)})")
            buf = tensor(slots)
            d.returns(
                "free", d.call("free", mine.free, buf), engine.free(tensor(slots))
            )
            scribble(
                buf
            )  # the caller reuses its buffer: the allocator must not have kept it
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

    check(random_case, seed=303, trials=120, name="ch03_token_allocator")
