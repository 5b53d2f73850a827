"""Graded: chapter 05, freeing pages (exercises/ch05_paged_free.py)."""

import pytest
import torch

from memlab.grading.checks import as_list, expect, expect_equal, expect_no_sharing, expect_raises
from memlab.grading.loader import load


def points(n):
    return pytest.mark.points(n, exercise="ch05.paged_free")


def free_list(num_pages=8, page_size=4):
    return load("ch05_paged_free").PagedFreeList(num_pages, page_size)


def t(values):
    return torch.tensor(values, dtype=torch.int64)


def slots_of(pages, ps, n=None):
    out = [p * ps + o for p in pages for o in range(ps)]
    return out[:n] if n is not None else out


@points(2)
def test_free_dedups_pages():
    f = free_list(8, 4)
    f.alloc_pages(8)  # everything in use: request 1 holds pages 7 and 3, request 2 page 5
    f.free(t(slots_of([7, 3], 4, 6)))  # request 1's 6 tokens: 4 slots on page 7, 2 on page 3
    got = as_list(f.free_pages)
    expect(len(got) == len(set(got)), f"freeing the 6 slots of pages 7 and 3 put {got} in free_pages: each page "
                                      "must be freed ONCE (unique of slot // page_size)")
    expect_equal(sorted(got), [3, 7], "pages freed by a request holding 6 tokens on pages 7 and 3")
    # Hand the pages out again: with duplicates, two requests would share a page.
    owners = {}
    for req in (10, 11, 12):
        pages = f.alloc_pages(1)
        if pages is not None:
            owners[req] = as_list(pages)
    expect_no_sharing(owners, "page")


@points(1)
def test_free_prepends_lifo():
    f = free_list(8, 4)
    f.alloc_pages(4)  # pages 1..4 in use, 5..8 free
    f.free(t([13, 12, 5]))  # pages 3 and 1
    expect_equal(f.free_pages, [1, 3, 5, 6, 7, 8], "free_pages after freeing pages 3 and 1: freed pages go to "
                                                  "the HEAD (LIFO reuse), in ascending order (unique sorts)")


@points(1)
def test_free_empty_noop():
    f = free_list(8, 4)
    f.alloc_pages(3)
    f.free(t([]))
    expect_equal(f.free_pages, [4, 5, 6, 7, 8], "free of an empty tensor must change nothing")
    f.free_segment(t([]), 8)
    expect_equal(f.free_pages, [4, 5, 6, 7, 8], "free_segment of an empty tensor must change nothing")


@points(1)
def test_free_segment_aligned():
    f = free_list(8, 4)
    f.alloc_pages(8)
    # Positions 8..17 of a request (page-aligned start), on pages 6, 2 and 8 (the last one partly).
    f.free_segment(t(slots_of([6, 2, 8], 4, 10)), start_pos=8)
    expect_equal(f.free_pages, [6, 2, 8], "free_segment of positions 8..17 on pages 6, 2, 8: one page per "
                                          "page_size slots, in run order, at the head")


@points(1)
def test_free_segment_rejects_unaligned():
    f = free_list(8, 4)
    f.alloc_pages(8)
    # Positions 2..9 of a request: slots 26, 27 on page 6, then page 2, then 32, 33 on page 8.
    run = [26, 27] + slots_of([2], 4) + [32, 33]
    expect_raises(ValueError, lambda: f.free_segment(t(run), start_pos=2),
                  "free_segment(start_pos=2) with page size 4 (taking every 4th slot would give pages 6 and 2 "
                  "and miss page 8)")
    expect_equal(f.free_pages, [], "a refused free_segment must free nothing")


@points(1)
def test_free_group_batches_once():
    f = free_list(8, 4)
    f.alloc_pages(8)
    f.free_group_begin()
    a = t(slots_of([5], 4) + [8])  # page 5 and slot 8 of page 2
    f.free(a)
    a[:] = 0  # the caller reuses its tensor: the group must have kept a copy
    f.free(t([9, 10]))  # the rest of page 2: shared with the first call
    expect_equal(f.free_pages, [], "inside a free group nothing may be released yet")
    expect_raises(RuntimeError, f.free_group_begin, "free_group_begin() while a group is open (groups do not nest)")
    f.free_group_end()
    expect_equal(f.free_pages, [2, 5], "free_group_end() must free pages 2 and 5 once each (one free of "
                                       "everything queued; the first tensor was changed by its owner after queuing)")
    expect_raises(RuntimeError, f.free_group_end, "free_group_end() with no group open")
