"""Graded: chapter 04, paged alloc_extend in torch (exercises/ch04_alloc_extend.py)."""

import random

import pytest
import torch

from memlab.grading.checks import as_list, expect, expect_equal, expect_no_sharing, expect_raises
from memlab.grading.loader import load
from exercise_refs import alloc_extend_python, split_by_request


def points(n):
    return pytest.mark.points(n, exercise="ch04.alloc_extend")


def allocator(size, page_size):
    return load("ch04_alloc_extend").PagedAllocator(size, page_size)


def t(values):
    return torch.tensor(values, dtype=torch.int64)


def run(a, pre, seq, last):
    free_before = as_list(a.free_pages)
    out = a.alloc_extend(t(pre), t(seq), t(last))
    return out, free_before


@points(2)
def test_fresh_requests_whole_and_partial():
    a = allocator(64, 4)
    out, _ = run(a, [0, 0, 0], [5, 8, 3], [-1, -1, -1])
    got = split_by_request(out, [0, 0, 0], [5, 8, 3])
    expect_equal(got[0], [4, 5, 6, 7, 8], "request 0 (0 -> 5 tokens, page size 4) takes pages 1 and 2")
    expect_equal(got[1], [12, 13, 14, 15, 16, 17, 18, 19], "request 1 (0 -> 8 tokens) takes the next pages, 3 and 4")
    expect_equal(got[2], [20, 21, 22], "request 2 (0 -> 3 tokens) takes page 5")
    expect_equal(a.free_pages, list(range(6, 17)), "free_pages after taking 5 pages")


@points(2)
def test_continues_from_last_loc():
    a = allocator(64, 4)
    # Request 0 holds 6 tokens; its last one is in slot 29 (page 7, offset 1).
    out, _ = run(a, [6], [13], [29])
    got = as_list(out)
    expect(len(got) == 7, f"7 new tokens (6 -> 13), got {len(got)} slots: {got}")
    expect_equal(got[:2], [30, 31], "the first new tokens must fill the old page from last_loc + 1 = 30 (part 1)")
    expect_equal(got[2:], [4, 5, 6, 7, 8], "then whole page 1 and the start of page 2 (parts 2 and 3)")
    expect_equal(a.free_pages, list(range(3, 17)), "exactly 2 new pages: ceil(13/4) - ceil(6/4)")


@points(1)
def test_no_new_page_when_old_page_has_room():
    a = allocator(64, 8)
    out, free_before = run(a, [3, 8], [6, 8], [42, 77])
    expect_equal(out, [43, 44, 45], "request 0 (3 -> 6, page size 8) stays on its page: slots 43, 44, 45; "
                                    "request 1 (8 -> 8) gets nothing")
    expect_equal(a.free_pages, free_before, "no page may be taken when every token fits in an old page")


@points(2)
def test_refusal_takes_nothing():
    a = allocator(32, 4)  # 8 pages
    out, free_before = run(a, [0, 0], [16, 20], [-1, -1])  # needs 4 + 5 pages
    expect(out is None, f"9 pages needed, 8 free: alloc_extend must return None, got {as_list(out)}")
    expect_equal(a.free_pages, free_before, "a refused alloc_extend must leave free_pages as it was "
                                            "(decide capacity BEFORE taking pages)")
    out, _ = run(a, [0, 0], [16, 16], [-1, -1])
    expect(out is not None, "8 pages needed, 8 free: alloc_extend must succeed")
    expect_equal(a.free_pages, [], "every page taken")
    expect_raises(ValueError, lambda: a.alloc_extend(t([5]), t([4]), t([3])),
                  "alloc_extend with seq_len 4 < prefix_len 5")


@points(2)
def test_matches_reference_on_random_batches():
    rng = random.Random(4)
    for trial in range(60):
        ps = rng.choice([1, 2, 4, 16])
        bs = rng.randint(1, 6)
        a = allocator(4096 * ps, ps)
        a.free_pages = t(rng.sample(range(1, 4097), 4096))  # a well-used pool: pages in any order
        pre = [rng.choice([0, rng.randint(0, 40)]) for _ in range(bs)]
        seq = [p + rng.randint(0, 40) for p in pre]
        # each request's old page lies far away from the new pages
        last = [-1 if p == 0 else (5000 + i) * ps + (p - 1) % ps for i, p in enumerate(pre)]
        out, free_before = run(a, pre, seq, last)
        want = alloc_extend_python(pre, seq, last, free_before, ps)
        got = split_by_request(out, pre, seq)
        for i, (g, w) in enumerate(zip(got, split_by_request(want, pre, seq))):
            expect_equal(g, w, f"request {i} (prefix {pre[i]} -> {seq[i]} tokens, last_loc {last[i]}, page size {ps})")
        expect_no_sharing({i: g for i, g in enumerate(got)}, "slot")
        used = sum(-(-s // ps) - -(-p // ps) for p, s in zip(pre, seq))
        expect_equal(a.free_pages, free_before[used:], f"free_pages after taking {used} pages from its head")
