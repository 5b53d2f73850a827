"""Graded: chapter 05, alloc_decode (exercises/ch05_alloc_decode.py)."""

import random

import pytest
import torch

from exercise_refs import alloc_decode_python
from memlab.grading.checks import as_list, expect, expect_equal, expect_no_sharing
from memlab.grading.loader import load


def points(n):
    return pytest.mark.points(n, exercise="ch05.alloc_decode")


def allocator(size, page_size):
    return load("ch05_alloc_decode").PagedAllocator(size, page_size)


def t(values):
    return torch.tensor(values, dtype=torch.int64)


@points(1)
def test_within_page_continues():
    a = allocator(64, 4)
    out = a.alloc_decode(t([3, 6]), t([41, 50]))
    expect_equal(out, [42, 51], "seq_lens [3, 6] (after the step, page size 4): both tokens stay on their "
                                "pages, at last_loc + 1")
    expect_equal(a.free_pages, list(range(1, 17)), "no page may be taken when no token opens a page")


@points(2)
def test_crossing_boundary_takes_new_page():
    a = allocator(64, 4)
    out = a.alloc_decode(t([5]), t([19]))
    expect_equal(out, [4], "seq_len 5 with page size 4: the new token (position 4) opens a page, so it takes "
                           "the first slot of page 1 (seq_len % page_size == 1)")
    out = a.alloc_decode(t([8]), t([42]))
    expect_equal(out, [43], "seq_len 8 with page size 4: the new token (position 7) is the LAST slot of its page, "
                            "not the first of a new one")
    expect_equal(a.free_pages, list(range(2, 17)), "exactly one page taken over both steps")


@points(1)
def test_page_size_one():
    a = allocator(16, 1)
    out = a.alloc_decode(t([1, 7, 3]), t([-1, 9, 2]))
    expect_equal(out, [1, 2, 3], "with page size 1 every token opens a page: pages 1, 2, 3 in batch order")


@points(1)
def test_pages_in_batch_order():
    rng = random.Random(11)
    for _ in range(40):
        ps = rng.choice([1, 2, 4, 16])
        bs = rng.randint(1, 8)
        a = allocator(1024 * ps, ps)
        a.free_pages = t(rng.sample(range(1, 1025), 1024))
        seq = [rng.randint(1, 40) for _ in range(bs)]
        last = [(2000 + i) * ps + (s - 2) % ps if s > 1 else -1 for i, s in enumerate(seq)]
        before = as_list(a.free_pages)
        out = as_list(a.alloc_decode(t(seq), t(last)))
        expect_equal(out, alloc_decode_python(seq, last, before, ps),
                     f"seq_lens {seq}, last_loc {last}, page size {ps}")
        expect_no_sharing({i: [s] for i, s in enumerate(out)}, "slot")
        opened = sum((s - 1) % ps == 0 for s in seq)
        expect_equal(a.free_pages, before[opened:], f"free_pages after {opened} requests opened a page")


@points(1)
def test_refusal():
    a = allocator(8, 4)  # 2 pages
    before = as_list(a.free_pages)
    out = a.alloc_decode(t([1, 5, 9]), t([-1, 3, 7]))
    expect(out is None, f"3 requests open a page, 2 pages free: alloc_decode must return None, got {as_list(out)}")
    expect_equal(a.free_pages, before, "a refused alloc_decode must leave free_pages as it was")
