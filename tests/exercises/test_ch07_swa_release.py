"""Graded: chapter 07, sliding-window release and the SWA side of a free (exercises/ch07_swa_release.py)."""

import random

import pytest
import torch

from memlab.course.grading.checks import (
    call_keeping_inputs,
    expect,
    expect_equal,
    expect_raises,
    expect_tensor,
)
from memlab.course.grading.loader import load
from memlab_tests.exercises.exercise_refs import i64


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch07.swa_release", requires=requires)


def ex():
    return load("ch07_swa_release")


@points(2)
def test_release_whole_pages_out_of_window():
    f = ex().swa_release_range
    expect_equal(
        f(30, 0, 8, 4),
        (0, 20),
        "seq_len 30, window 8, page size 4, nothing released yet: positions "
        "below 22 are out of the window, whole pages of them end at 20 (a tuple of two ints)",
    )
    expect_equal(f(30, 0, 8, 1), (0, 22), "the same with page size 1")
    expect_equal(
        f(31, 20, 8, 4),
        (20, 20),
        "seq_len 31 with 20 already released: the next whole page (20..23) "
        "is not yet out of the window, so nothing (returned as (20, 20))",
    )
    expect_equal(
        f(32, 20, 8, 4),
        (20, 24),
        "seq_len 32 with 20 already released: page 20..23 is now out",
    )
    expect_equal(
        f(24, 0, 8, 4),
        (0, 16),
        "seq_len 24, window 8: positions below 16 are out, 16 is a page "
        "boundary: release 0..15",
    )


@points(1)
def test_nothing_while_inside_window():
    f = ex().swa_release_range
    expect_equal(
        f(5, 0, 8, 4), (0, 0), "seq_len 5 with window 8: every token is in the window"
    )
    expect_equal(
        f(8, 0, 8, 4), (0, 0), "seq_len 8 with window 8: every token is in the window"
    )
    expect_equal(
        f(11, 0, 8, 4),
        (0, 0),
        "seq_len 11 with window 8: positions 0..2 are out, but no WHOLE page",
    )
    expect_equal(
        f(12, 4, 8, 4),
        (4, 4),
        "seq_len 12 with 4 already released: page 4..7 is still in the window",
    )


@points(1)
def test_prefix_cache_keeps_its_part():
    f = ex().swa_release_range
    expect_equal(
        f(40, 0, 8, 4, cache_protected_len=10),
        (12, 32),
        "seq_len 40, window 8, page size 4, the "
        "prefix cache owning the first 10 tokens: start at 10 rounded UP to a page",
    )
    expect_equal(
        f(40, 0, 8, 4, cache_protected_len=12),
        (12, 32),
        "the prefix cache owning exactly 3 pages (12)",
    )
    expect_equal(
        f(40, 16, 8, 4, cache_protected_len=12),
        (16, 32),
        "16 already released, 12 protected: start at 16",
    )
    expect_equal(
        f(40, 0, 8, 4, cache_protected_len=36),
        (0, 0),
        "when the prefix cache owns everything out of the window nothing is released",
    )
    expect_equal(
        f(40, 0, 8, 4, cache_protected_len=32),
        (0, 0),
        "protected up to exactly the end: nothing",
    )
    expect_raises(
        ValueError,
        lambda: f(40, 6, 8, 4),
        "swa_release_range with swa_evicted_len 6, not page-aligned",
        naming="6",
    )
    expect_raises(
        ValueError,
        lambda: f(9, 6, 8, 4),
        "swa_release_range(9, 6, 8, 4): swa_evicted_len 6 is not "
        "page-aligned, and that is checked first, even when nothing would be released",
        naming="6",
    )


def release_reference(seq, evicted, window, ps, protected):
    start = max(evicted, -(-protected // ps) * ps)
    end = (seq - window) // ps * ps
    return (start, end) if end > start else (evicted, evicted)


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
        got = f(seq, evicted, window, ps, cache_protected_len=protected)
        what = f"swa_release_range({seq}, {evicted}, window={window}, page_size={ps}, cache_protected_len={protected})"
        expect_equal(got, release_reference(seq, evicted, window, ps, protected), what)


def mapping(size, ps):
    m = torch.zeros(size + ps + 1, dtype=torch.int64)
    m[-1] = -1
    return m


def take(m, full_indices, ps):
    """take_swa_slots, which may change the map but not full_indices."""
    return call_keeping_inputs(
        ex().take_swa_slots,
        "take_swa_slots",
        m,
        full_indices,
        ps,
        mutable=("argument 1",),
    )


@points(2)
def test_take_swa_slots_skips_padding():
    ps = 4
    m = mapping(32, ps)
    # Full pages 2 and 3 (slots 8..15) map to SWA slots 20..27; slots 8..11 were released out of
    # the window before (map 0).
    m[12:16] = torch.tensor([26, 24, 27, 25])
    got = take(m, torch.arange(8, 16), ps)
    values = expect_tensor(got, "take_swa_slots's result", torch.int64)
    expect(
        0 not in values,
        f"take_swa_slots returned {values}: 0 means 'no SWA slot' and is the SWA "
        "pool's padding slot; it must never be freed",
    )
    expect_equal(
        got,
        i64(26, 24, 27, 25),
        "the SWA slots under full slots 8..15, in their order (an int64 tensor)",
    )
    expect_equal(m[8:16], i64(*[0] * 8), "the map must forget the freed slots")
    m = mapping(32, ps)
    got = take(m, torch.tensor([9, 10, 11]), ps)
    expect_equal(
        got,
        i64(),
        "full slots whose map is all 0: nothing to free (an EMPTY int64 tensor)",
    )


@points(1)
def test_take_swa_slots_clears_whole_pages():
    ps = 4
    m = mapping(32, ps)
    m[16:24] = torch.arange(40, 48)
    m[28:32] = torch.arange(60, 64)
    wide = torch.tensor([21, -5, 17, -5, 18, -5])
    got = take(m, wide[::2], ps)  # a strided view: slots 21, 17, 18
    expect_equal(
        got,
        i64(45, 41, 42),
        "the SWA slots under full slots 21, 17, 18 (given as a strided view)",
    )
    expect_equal(
        m[16:24],
        i64(*[0] * 8),
        "the map entries of every slot of full pages 4 and 5 must be cleared (a "
        "paged free gives back whole pages)",
    )
    expect_equal(
        m[28:32],
        i64(60, 61, 62, 63),
        "the map of page 7, untouched by the free, must stay",
    )
    expect_equal(
        int(m[-1]), -1, "the map's last entry (-1, read for last_loc = -1) must stay"
    )
    expect_equal(take(m, i64(), ps), i64(), "take_swa_slots of no slot")
    expect_equal(
        m[28:32], i64(60, 61, 62, 63), "take_swa_slots of no slot must change nothing"
    )
    m1 = mapping(8, 1)
    m1[3], m1[5] = 1, 9  # SWA slot 1 is a real slot (only 0 is padding)
    expect_equal(
        take(m1, i64(5, 4, 3), 1),
        i64(9, 1),
        "page size 1: the SWA slots under full slots 5, 4, 3",
    )
    expect_equal(
        m1,
        i64(0, 0, 0, 0, 0, 0, 0, 0, 0, -1),
        "page size 1: only the freed slots are cleared",
    )


# -- the learner's answers against the engine's rules, on random windows and maps -----------------


def engine_take(m, full, ps):
    """SGLang's free_swa on the map (memlab.sglang.swa: read the map, forget whole pages), as lists."""
    swa = [m[s] for s in full]
    for s in full:
        for o in range(ps):
            m[s // ps * ps + o] = 0
    return [v for v in swa if v > 0]


def random_case(d):
    from memlab.course.grading.fuzz import Raised, tensor_code
    from memlab_tests.exercises.exercise_refs import INT31, SIZES, scribble, tensor

    e = ex()
    ps = d.pick(SIZES)
    if d.chance(0.5):  # swa_release_range, with lengths up to 2**31 (pure arithmetic)
        big = d.chance(0.3)
        window = d.big(1, INT31 // 2) if big else d.int(1, 3 * ps + 8)
        seq = d.big(0, INT31) if big else d.int(0, window + 6 * ps + 8)
        evicted = (d.big(0, INT31) if big else d.int(0, seq + ps)) // ps * ps
        if d.chance(0.1) and ps > 1:
            evicted += d.int(1, ps - 1)  # not page-aligned: the ValueError
        protected = d.pick((0, d.big(0, INT31) if big else d.int(0, seq + ps)))
        d.given(
            seq_len=seq,
            swa_evicted_len=evicted,
            sliding_window=window,
            page_size=ps,
            cache_protected_len=protected,
        )
        d.code(
            f"print(ex.swa_release_range({seq}, {evicted}, {window}, {ps}, cache_protected_len={protected}))"
        )
        got = d.call(
            "swa_release_range",
            e.swa_release_range,
            seq,
            evicted,
            window,
            ps,
            cache_protected_len=protected,
        )
        want = (
            Raised(ValueError())
            if evicted % ps
            else release_reference(seq, evicted, window, ps, protected)
        )
        d.returns("swa_release_range", got, want)
        return
    pages = d.int(1, 8)
    size = (
        pages + 1
    ) * ps  # full slots 0 .. size - 1 (page 0 is padding), then the -1 entry
    m = [0] * size + [-1]
    for s in range(ps, size):
        if d.chance(0.7):
            m[s] = d.big(1, INT31)  # the SWA slot paired with full slot s (0: none)
    mine = tensor(m)
    d.given(page_size=ps, full_to_swa=m)
    d.code(f"m = {tensor_code(m)}")
    for _ in d.count(1, 3, 0.5):
        touched = d.sample(
            range(1, pages + 1), d.int(0, pages)
        )  # pages in any order, not consecutive
        full = [
            p * ps + o for p in touched for o in range(ps) if o == 0 or d.chance(0.7)
        ]
        full = d.shuffled(full) if d.chance(0.3) else full
        strided = d.chance(0.3)
        d.step(f"take_swa_slots(m, {full}, {ps})")
        d.code(f"print(ex.take_swa_slots(m, {tensor_code(full)}, {ps}), m)")
        arg = tensor(full, strided)
        got = d.call("take_swa_slots", e.take_swa_slots, mine, arg, ps, keep=False)
        d.same(
            "take_swa_slots's input full_indices",
            arg,
            tensor(full),
            "only the map may change",
        )
        d.returns("take_swa_slots", got, tensor(engine_take(m, full, ps)))
        scribble(arg)
        d.books("take_swa_slots", "full_to_swa", mine, tensor(m))


@points(2)
def test_random_windows_and_maps_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, seed=707, trials=150, name="ch07_swa_release")
