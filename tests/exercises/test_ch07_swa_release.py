"""Graded: chapter 07, sliding-window release and the SWA side of a free
(exercises/ch07_swa_release.py)."""

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


def release_reference(seq, evicted, window, ps, protected):
    start = max(evicted, -(-protected // ps) * ps)
    end = (seq - window) // ps * ps
    return (start, end) if end > start else (evicted, evicted)


def expect_release(rng_case, what):
    """swa_release_range on one case, against the docstring's rule."""
    seq, evicted, window, ps, protected = rng_case
    expect_equal(
        ex().swa_release_range(seq, evicted, window, ps, cache_protected_len=protected),
        release_reference(seq, evicted, window, ps, protected),
        f"swa_release_range({seq}, {evicted}, sliding_window={window}, page_size={ps}, "
        f"cache_protected_len={protected}): {what}",
    )


@points(2)
def test_release_whole_pages_out_of_window(rng):
    f = ex().swa_release_range
    expect_equal(
        f(30, 0, 8, 4),
        (0, 20),
        "seq_len 30, window 8, page size 4, nothing released yet: positions below 22 are "
        "out of the window, whole pages of them end at 20 (a tuple of two ints)",
    )
    expect_equal(f(30, 0, 8, 1), (0, 22), "the same with page size 1")
    expect_equal(
        f(32, 20, 8, 4),
        (20, 24),
        "seq_len 32 with 20 already released: page 20..23 is now out",
    )
    for _ in range(4):
        ps, window = rng.choice((1, 2, 3, 4, 5, 16)), rng.randint(1, 64)
        k, evicted = rng.randint(2, 20), ps * rng.randint(0, 1)
        for r in (0, rng.randint(0, ps - 1), ps - 1):  # on a page boundary, and past it
            expect_release(
                (window + k * ps + r, evicted, window, ps, 0),
                f"positions below {k * ps + r} are out of the window: whole pages end at "
                f"{k * ps}",
            )


@points(1, requires="test_release_whole_pages_out_of_window")
def test_nothing_while_inside_window(rng):
    f = ex().swa_release_range
    expect_equal(
        f(8, 0, 8, 4), (0, 0), "seq_len 8 with window 8: every token is in the window"
    )
    expect_equal(
        f(12, 4, 8, 4),
        (4, 4),
        "seq_len 12 with 4 already released: page 4..7 is still in the window",
    )
    for _ in range(4):
        ps, window = rng.choice((2, 3, 4, 5, 16)), rng.randint(1, 64)
        evicted = ps * rng.randint(0, 3)
        expect_release(
            (rng.randint(0, window), 0, window, ps, 0),
            "every token is in the window: (0, 0)",
        )
        expect_release(
            (window + evicted + rng.randint(0, ps - 1), evicted, window, ps, 0),
            f"{evicted} released, the next whole page is not out of the window yet: "
            f"({evicted}, {evicted})",
        )


@points(1)
def test_prefix_cache_keeps_its_part(rng):
    f = ex().swa_release_range
    expect_equal(
        f(40, 0, 8, 4, cache_protected_len=10),
        (12, 32),
        "seq_len 40, window 8, page size 4, the prefix cache owning the first 10 tokens: "
        "start at 10 rounded UP to a page",
    )
    expect_equal(
        f(40, 0, 8, 4, cache_protected_len=32),
        (0, 0),
        "protected up to exactly the end: nothing",
    )
    for _ in range(4):
        ps, window = rng.choice((2, 3, 4, 5, 16)), rng.randint(1, 64)
        end = ps * rng.randint(4, 20)
        seq = window + end + rng.randint(0, ps - 1)
        evicted = ps * rng.randint(0, 2)
        for protected in (
            rng.randint(1, end - 1),  # some pages left to release
            ps * rng.randint(1, end // ps - 1),  # exactly whole pages protected
            end,  # up to exactly the end
            end + rng.randint(1, 9),  # past it
        ):
            expect_release(
                (seq, evicted, window, ps, protected),
                "the prefix cache's part (rounded UP to a page) is never released",
            )
        bad = evicted + rng.randint(1, ps - 1)
        expect_raises(
            ValueError,
            lambda: f(seq, bad, window, ps),
            f"swa_release_range with swa_evicted_len {bad}, not a multiple of page size "
            f"{ps}",
            naming=str(bad),
        )
        expect_raises(
            ValueError,
            lambda: f(rng.randint(0, window), bad, window, ps),
            f"swa_release_range with swa_evicted_len {bad} (page size {ps}): not "
            "page-aligned, and that is checked first, even when nothing would be released",
            naming=str(bad),
        )


@points(1)
def test_random_release_invariants(rng):
    for _ in range(300):
        ps = rng.choice([1, 2, 3, 4, 16])
        window = rng.randint(1, 64)
        case = (
            rng.randint(0, 300),
            rng.randint(0, 20) * ps,
            window,
            ps,
            rng.randint(0, 100),
        )
        expect_release(case, "the docstring's rule")


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


def swa_slots(rng, n):
    return rng.sample(range(1, 10_000), n)


@points(2)
def test_take_swa_slots_skips_padding(rng):
    ps = rng.choice((2, 3, 4, 5, 8))
    m = mapping(16 * ps, ps)
    # Full pages a and b map to SWA slots; page a's were released out of the window
    # before (map 0).
    a, b = rng.sample(range(1, 16), 2)
    held = swa_slots(rng, ps)
    m[b * ps : (b + 1) * ps] = i64(*held)
    full = list(range(a * ps, (a + 1) * ps)) + list(range(b * ps, (b + 1) * ps))
    got = take(m, i64(*full), ps)
    values = expect_tensor(got, "take_swa_slots's result", torch.int64)
    expect(
        0 not in values,
        f"take_swa_slots returned {values}: 0 means 'no SWA slot' and is the SWA pool's "
        "padding slot; it must never be freed",
    )
    expect_equal(
        got,
        i64(*held),
        f"the SWA slots under full slots {full} (page size {ps}), in their order (an "
        "int64 tensor)",
    )
    expect_equal(m[full], i64(*[0] * len(full)), "the map must forget the freed slots")
    m = mapping(16 * ps, ps)
    got = take(m, i64(*full[:ps]), ps)
    expect_equal(
        got,
        i64(),
        "full slots whose map is all 0: nothing to free (an EMPTY int64 tensor)",
    )


@points(1)
def test_take_swa_slots_clears_whole_pages(rng):
    ps = rng.choice((2, 3, 4, 5, 8))
    m = mapping(16 * ps, ps)
    a, b, kept = rng.sample(range(1, 16), 3)
    two = swa_slots(rng, 3 * ps)
    m[a * ps : (a + 1) * ps] = i64(*two[:ps])
    m[b * ps : (b + 1) * ps] = i64(*two[ps : 2 * ps])
    m[kept * ps : (kept + 1) * ps] = i64(*two[2 * ps :])
    slots = [b * ps + rng.randint(0, ps - 1), a * ps, a * ps + ps - 1]
    m_before = m.clone()
    wide = i64(*[v for x in slots for v in (x, -5)])
    got = take(m, wide[::2], ps)  # a strided view
    expect_equal(
        got,
        i64(*[int(m_before[s]) for s in slots]),
        f"the SWA slots under full slots {slots} (given as a strided view)",
    )
    for page in (a, b):
        expect_equal(
            m[page * ps : (page + 1) * ps],
            i64(*[0] * ps),
            f"the map entries of every slot of full page {page} must be cleared (a paged "
            "free gives back whole pages)",
        )
    expect_equal(
        m[kept * ps : (kept + 1) * ps],
        i64(*two[2 * ps :]),
        f"the map of page {kept}, untouched by the free, must stay",
    )
    expect_equal(
        int(m[-1]), -1, "the map's last entry (-1, read for last_loc = -1) must stay"
    )
    expect_equal(take(m, i64(), ps), i64(), "take_swa_slots of no slot")
    expect_equal(
        m[kept * ps : (kept + 1) * ps],
        i64(*two[2 * ps :]),
        "take_swa_slots of no slot must change nothing",
    )
    m1 = mapping(8, 1)
    x, y = rng.sample(range(2, 999), 2)
    m1[3], m1[5], m1[6] = 1, x, y  # SWA slot 1 is a real slot (only 0 is padding)
    expect_equal(
        take(m1, i64(5, 4, 3), 1),
        i64(x, 1),
        "page size 1: the SWA slots under full slots 5, 4, 3",
    )
    expect_equal(
        m1,
        i64(0, 0, 0, 0, 0, 0, y, 0, 0, -1),
        "page size 1: only the freed slots are cleared",
    )


# -- the learner's answers against the engine's rules, on random windows and maps -----------------


def engine_take(m, full, ps):
    """SGLang's free_swa on the map (memlab.sglang.swa: read the map, forget whole pages), as
    lists."""
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
            f"print(ex.swa_release_range({seq}, {evicted}, {window}, {ps}, "
            f"cache_protected_len={protected}))"
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
    # full slots 0 .. size - 1 (page 0 is padding), then the -1 entry
    size = (pages + 1) * ps
    m = [0] * size + [-1]
    for s in range(ps, size):
        if d.chance(0.7):
            m[s] = d.big(1, INT31)  # the SWA slot paired with full slot s (0: none)
    mine = tensor(m)
    d.given(page_size=ps, full_to_swa=m)
    d.code(f"m = {tensor_code(m)}")
    for _ in d.count(1, 3, 0.5):
        # pages in any order, not consecutive
        touched = d.sample(range(1, pages + 1), d.int(0, pages))
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

    check(random_case, trials=150, name="ch07_swa_release")
