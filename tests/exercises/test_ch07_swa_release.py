"""Graded: chapter 07, sliding-window release and the SWA side of a free (exercises/ch07_swa_release.py)."""

import random

import pytest
import torch

from memlab.grading.checks import as_list, expect, expect_equal, expect_raises
from memlab.grading.loader import load


def points(n):
    return pytest.mark.points(n, exercise="ch07.swa_release")


def ex():
    return load("ch07_swa_release")


@points(2)
def test_release_whole_pages_out_of_window():
    f = ex().swa_release_range
    expect_equal(f(30, 0, 8, 4), (0, 20), "seq_len 30, window 8, page size 4, nothing released yet: positions "
                 "below 22 are out of the window, whole pages of them end at 20")
    expect_equal(f(30, 0, 8, 1), (0, 22), "the same with page size 1")
    expect_equal(f(31, 20, 8, 4), (20, 20), "seq_len 31 with 20 already released: the next whole page (20..23) "
                 "is not yet out of the window, so nothing (returned as (20, 20))")
    expect_equal(f(32, 20, 8, 4), (20, 24), "seq_len 32 with 20 already released: page 20..23 is now out")


@points(1)
def test_nothing_while_inside_window():
    f = ex().swa_release_range
    expect_equal(f(5, 0, 8, 4), (0, 0), "seq_len 5 with window 8: every token is in the window")
    expect_equal(f(8, 0, 8, 4), (0, 0), "seq_len 8 with window 8: every token is in the window")


@points(1)
def test_prefix_cache_keeps_its_part():
    f = ex().swa_release_range
    expect_equal(f(40, 0, 8, 4, cache_protected_len=10), (12, 32), "seq_len 40, window 8, page size 4, the "
                 "prefix cache owning the first 10 tokens: start at 10 rounded UP to a page")
    expect_equal(f(40, 0, 8, 4, cache_protected_len=36), (0, 0), "when the prefix cache owns everything out of "
                 "the window nothing is released")
    expect_raises(ValueError, lambda: f(40, 6, 8, 4), "swa_release_range with swa_evicted_len 6, not page-aligned")


@points(1)
def test_random_release_invariants():
    f = ex().swa_release_range
    rng = random.Random(14)
    for _ in range(300):
        ps = rng.choice([1, 2, 4, 16])
        window = rng.randint(1, 64)
        evicted = rng.randint(0, 20) * ps
        protected = rng.randint(0, 100)
        seq = rng.randint(0, 300)
        start, end = f(seq, evicted, window, ps, cache_protected_len=protected)
        what = (f"swa_release_range({seq}, {evicted}, window={window}, page_size={ps}, "
                f"protected={protected}) = {(start, end)}")
        expect(start % ps == 0 and end % ps == 0, f"{what}: both ends must be page-aligned")
        expect(end <= seq - window or start == end, f"{what}: releases positions inside the window")
        expect(start >= evicted, f"{what}: starts below what was already released")
        expect(start == end or start >= protected, f"{what}: releases positions the prefix cache owns")


def mapping(size, ps):
    m = torch.zeros(size + ps + 1, dtype=torch.int64)
    m[-1] = -1
    return m


@points(2)
def test_take_swa_slots_skips_padding():
    ps = 4
    m = mapping(32, ps)
    # Full pages 2 and 3 (slots 8..15) map to SWA slots 20..27; slots 8..11 were released out of
    # the window before (map 0).
    m[12:16] = torch.arange(24, 28)
    got = as_list(ex().take_swa_slots(m, torch.arange(8, 16), ps))
    expect(0 not in got, f"take_swa_slots returned {got}: 0 means 'no SWA slot' and is the SWA pool's padding "
                         "slot; it must never be freed")
    expect_equal(sorted(got), [24, 25, 26, 27], "the SWA slots under full slots 8..15")
    expect_equal(m[8:16], [0] * 8, "the map must forget the freed slots")


@points(1)
def test_take_swa_slots_clears_whole_pages():
    ps = 4
    m = mapping(32, ps)
    m[16:24] = torch.arange(40, 48)
    got = as_list(ex().take_swa_slots(m, torch.tensor([17, 18, 21]), ps))
    expect_equal(sorted(got), [41, 42, 45], "the SWA slots under full slots 17, 18, 21")
    expect_equal(m[16:24], [0] * 8, "the map entries of every slot of full pages 4 and 5 must be cleared (a paged "
                                    "free gives back whole pages)")
    expect_equal(int(m[-1]), -1, "the map's last entry (-1, read for last_loc = -1) must stay")
