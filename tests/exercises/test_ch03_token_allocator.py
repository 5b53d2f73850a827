"""Graded: chapter 03, the token allocator (exercises/ch03_token_allocator.py)."""

import random

import pytest
import torch

from memlab.grading.checks import as_list, expect, expect_equal, expect_no_sharing
from memlab.grading.loader import load


def points(n):
    return pytest.mark.points(n, exercise="ch03.token_allocator")


def allocator(size=8, need_sort=False):
    return load("ch03_token_allocator").TokenToKVPoolAllocator(size, need_sort=need_sort)


def t(*values):
    return torch.tensor(values, dtype=torch.int64)


@points(1)
def test_fresh_allocation_from_head():
    a = allocator(8)
    expect_equal(a.alloc(3), [1, 2, 3], "alloc(3) on a fresh allocator (slot 0 is padding)")
    expect_equal(a.alloc(0), [], "alloc(0)")
    expect_equal(a.available_size(), 5, "available_size() after taking 3 of 8 slots")


@points(1)
def test_free_appends_fifo():
    a = allocator(8)
    a.alloc(4)  # 1..4 held, 5..8 free
    a.free(t(2, 1))
    expect_equal(a.free_pages, [5, 6, 7, 8, 2, 1],
                 "free_pages after freeing [2, 1]: freed slots go to the TAIL (FIFO reuse)")
    expect_equal(a.alloc(6), [5, 6, 7, 8, 2, 1], "the next allocation takes the older free slots first")


@points(1)
def test_refusal_changes_nothing():
    for need_sort in (False, True):
        a = allocator(4, need_sort)
        a.alloc(3)
        a.free(t(2))
        before = as_list(a.free_pages), as_list(a.release_pages)
        got = a.alloc(3)
        expect(got is None,
               f"alloc(3) with 2 slots available (need_sort={need_sort}) must return None, got {as_list(got)}")
        expect_equal(a.available_size(), 2, f"available_size() after a refused alloc (need_sort={need_sort})")
        if not need_sort:
            expect_equal((as_list(a.free_pages), as_list(a.release_pages)), before, "a refused alloc changed the lists")


@points(1)
def test_staged_frees_counted():
    a = allocator(8, need_sort=True)
    a.alloc(6)
    a.free(t(3, 1))
    expect_equal(a.free_pages, [7, 8], "with need_sort a free must not touch free_pages")
    expect_equal(sorted(as_list(a.release_pages)), [1, 3], "with need_sort freed slots wait in release_pages")
    expect_equal(a.available_size(), 4, "available_size() must count the 2 free AND the 2 staged slots")


@points(2)
def test_merge_when_short():
    a = allocator(10, need_sort=True)
    a.alloc(10)
    a.free(t(9, 3))
    a.free(t(5))
    got = a.alloc(2)
    expect_equal(got, [3, 5],
                 "alloc(2) with nothing in free_pages must merge and sort the staged slots [9, 3, 5] first")
    expect_equal(a.free_pages, [9], "free_pages after merging [9, 3, 5] and taking 2")
    expect_equal(a.release_pages, [], "release_pages after a merge")


@points(1)
def test_no_merge_when_enough():
    a = allocator(10, need_sort=True)
    a.alloc(5)
    a.free(t(4, 2))
    expect_equal(a.alloc(2), [6, 7],
                 "alloc(2) with 5 slots in free_pages takes them: merging (a sort) is for when it runs short")
    expect_equal(sorted(as_list(a.release_pages)), [2, 4], "staged slots must stay staged while free_pages suffices")


@points(1)
def test_random_stream_invariants():
    rng = random.Random(3)
    for need_sort in (False, True):
        a = allocator(32, need_sort)
        held: dict[int, list[int]] = {}
        for req in range(200):
            if held and rng.random() < 0.4:
                a.free(torch.tensor(held.pop(rng.choice(list(held))), dtype=torch.int64))
                continue
            n = rng.randint(0, 6)
            got = a.alloc(n)
            in_use = sum(map(len, held.values()))
            if got is None:
                expect(n > 32 - in_use,
                       f"alloc({n}) returned None with {32 - in_use} slots free (need_sort={need_sort})")
                continue
            got = as_list(got)
            expect(0 not in got, f"alloc({n}) handed out the padding slot 0: {got}")
            held[req] = got
            expect_no_sharing(held, "slot")
            expect_equal(a.available_size() + in_use + n, 32, f"free + held slots (need_sort={need_sort})")
