"""Graded: chapter 01, request-table rows (exercises/ch01_alloc_rows.py)."""

import pytest

from memlab.course.grading.checks import (
    expect,
    expect_equal,
    expect_no_sharing,
    expect_raises,
    plural,
)
from memlab.course.grading.loader import load
from memlab_tests.exercises.exercise_refs import i64


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch01.alloc_rows", requires=requires)


def table(size=8):
    return load("ch01_alloc_rows").RowTable(size)


@points(1)
def test_alloc_takes_from_tail(rng):
    size = rng.randint(4, 64)
    n = rng.randint(2, size - 2)
    t = table(size)
    rows = t.alloc_rows(n)
    expect_equal(
        rows,
        list(range(size - n + 1, size + 1)),
        f"alloc_rows({n}) on a fresh table of {plural(size, 'row')} must take the last {n} free "
        "rows, as a list of ints",
    )
    left = list(range(1, size - n + 1))
    expect_equal(t.free_slots, left, f"free_slots after alloc_rows({n})")
    back = rng.choice(rows)
    t.free(back)
    expect_equal(
        t.alloc_rows(2),
        [left[-1], back],
        f"alloc_rows(2) after free({back}): the last 2 entries of free_slots, in list "
        "order",
    )
    gen = [0] + [0] * (size - n - 1) + [1] * (n + 1)
    gen[back] = 2
    expect_equal(
        t.req_generation,
        i64(*gen),
        f"req_generation after taking rows {rows[0]}..{rows[-1]}, then {left[-1]} and "
        f"{back} again (one bump per row taken; an int64 tensor)",
    )


@points(1, requires="test_alloc_takes_from_tail")
def test_alloc_zero_returns_empty(rng):
    size = rng.randint(1, 64)
    t = table(size)
    rows = t.alloc_rows(0)
    expect_equal(rows, [], "alloc_rows(0) (free_slots[-0:] is the WHOLE list)")
    expect_equal(
        t.free_slots,
        list(range(1, size + 1)),
        f"alloc_rows(0) on a fresh table of {plural(size, 'row')} must leave free_slots alone",
    )
    expect_equal(
        t.req_generation,
        i64(*[0] * (size + 1)),
        "alloc_rows(0) must bump no generation",
    )
    taken = rng.randint(1, size)
    t.alloc_rows(taken)
    expect_equal(
        t.alloc_rows(0),
        [],
        f"alloc_rows(0) with {size - taken} of {plural(size, 'row')} free",
    )
    expect_equal(
        t.free_slots,
        list(range(1, size - taken + 1)),
        f"alloc_rows(0) after alloc_rows({taken}) must leave free_slots alone",
    )


@points(1, requires="test_alloc_takes_from_tail")
def test_all_or_nothing(rng):
    size = rng.randint(3, 64)
    held = rng.randint(1, size - 2)
    free = size - held
    t = table(size)
    t.alloc_rows(held)
    got = t.alloc_rows(free + 1)
    expect(
        got is None,
        f"alloc_rows({free + 1}) with {plural(free, 'free row')} must return None, got {got!r}",
    )
    expect_equal(
        t.free_slots,
        list(range(1, free + 1)),
        "a refused alloc_rows must leave free_slots alone",
    )
    expect_equal(
        t.req_generation,
        i64(*[0] * (free + 1), *[1] * held),
        "a refused alloc_rows must bump no generation",
    )
    expect_equal(
        t.alloc_rows(free),
        list(range(1, free + 1)),
        f"alloc_rows({free}) with exactly {plural(free, 'free row')} must succeed (all of them)",
    )
    expect_equal(t.free_slots, [], "free_slots after taking the last rows")
    got = t.alloc_rows(1)
    expect(got is None, f"alloc_rows(1) with no free row must return None, got {got!r}")


@points(2)
def test_generation_survives_clear(rng):
    size = rng.randint(2, 48)
    t = table(size)
    (row,) = t.alloc_rows(1)
    expect_equal(
        int(t.req_generation[row]),
        1,
        f"row {row}'s generation after its first allocation",
    )
    t.free(row)
    expect_equal(
        t.alloc_rows(1), [row], "a freed row goes back to the tail, so it is taken next"
    )
    expect_equal(
        int(t.req_generation[row]),
        2,
        f"row {row}'s generation after its second allocation",
    )
    t.clear()
    expect_equal(
        t.free_slots, list(range(1, size + 1)), "free_slots after clear() (a list)"
    )
    expect(
        int(t.req_generation[row]) == 2,
        f"clear() changed row {row}'s generation from 2 to {int(t.req_generation[row])}: "
        "it must never be reset, or a reader that stored (row, generation) would mistake "
        "the next owner for the old one",
    )
    t.alloc_rows(size)
    expect_equal(
        int(t.req_generation[row]),
        3,
        f"row {row}'s generation after an allocation following clear()",
    )
    expect_equal(
        t.req_generation,
        i64(0, *[1] * (size - 1), 3),
        "req_generation after clear() and taking every row",
    )


@points(1, requires="test_alloc_takes_from_tail")
def test_free_checks_the_row(rng):
    size = rng.randint(2, 64)
    t = table(size)
    t.alloc_rows(size)
    past = size + rng.randint(1, 3)
    below = -rng.randint(1, 3)
    expect_raises(
        ValueError, lambda: t.free(0), "free(0) (row 0 is the padding row)", naming="0"
    )
    for bad in (past, below):
        expect_raises(
            ValueError,
            lambda bad=bad: t.free(bad),
            f"free({bad}) on a table of rows 1..{size}",
            naming=str(bad),
        )
    expect_equal(t.free_slots, [], "refused frees must leave free_slots alone")
    rows = [size, 1, *rng.sample(range(2, size), min(size - 2, 3))]
    for row in rows:  # the first and the last row are rows too
        t.free(row)
    expect_equal(t.free_slots, rows, "free() appends to free_slots")


@points(1)
def test_random_stream_never_shares_a_row(rng):
    size = rng.randint(4, 24)
    t = table(size)
    held: dict[int, list[int]] = {}
    gen = [0] * (size + 1)
    for req in range(300):
        if held and rng.random() < 0.45:
            victim = rng.choice(list(held))
            for row in held.pop(victim):
                t.free(row)
            continue
        n = rng.randint(0, 4)
        before = list(t.free_slots)
        rows = t.alloc_rows(n)
        if rows is None:
            expect(
                n > len(before),
                f"alloc_rows({n}) returned None with {plural(len(before), 'row')} free",
            )
            continue
        expect_equal(
            rows,
            before[len(before) - n :],
            f"alloc_rows({n}) with free_slots {before}: the last {plural(n, 'entry')}",
        )
        held[req] = rows
        expect_no_sharing(held, "row")
        for row in rows:
            gen[row] += 1
        expect_equal(
            t.req_generation, i64(*gen), "req_generation: one bump per row taken"
        )
        in_use = sum(map(len, held.values()))
        expect(
            len(t.free_slots) + in_use == size,
            f"free ({len(t.free_slots)}) + held ({in_use}) rows must be {size}",
        )


# -- the learner's row table against the engine's (memlab's ReqToTokenPool), step by step --------


def random_case(d):
    from memlab.course.grading.fuzz import raised
    from memlab.sglang.req_to_token import ReqToTokenPool

    size = d.size(1, 12)
    mine, engine = table(size), ReqToTokenPool(size, 1)
    d.given(size=size)
    d.code(f"t = ex.RowTable({size})")
    held: list[int] = []
    for _ in d.count(1, 14, 0.85):
        op = d.pick(("alloc", "free", "bad free", "clear"))
        if op == "alloc":
            n = d.int(0, size + 1)
            d.step(f"alloc_rows({n})")
            d.code(f"print(t.alloc_rows({n}))")
            got, want = d.call("alloc_rows", mine.alloc_rows, n), engine.alloc_rows(n)
            d.returns("alloc_rows", got, want)
            held += want or []
            what = "alloc_rows"
        elif op == "free" and held:
            row = held.pop(d.int(0, len(held) - 1))  # any held row, in any order
            d.step(f"free({row})")
            d.code(f"t.free({row})")
            d.returns("free", d.call("free", mine.free, row), engine.free(row))
            what = "free"
        elif op == "bad free":
            row = d.pick((0, size + 1, -1, size + 7))
            d.step(f"free({row})")
            d.code(f"t.free({row})")
            d.returns("free", d.call("free", mine.free, row), raised(engine.free, row))
            what = "free"
        else:
            d.step("clear()")
            d.code("t.clear()")
            d.returns("clear", d.call("clear", mine.clear), engine.clear())
            held, what = [], "clear"
        d.code("print(t.free_slots, t.req_generation)")
        d.books(what, "free_slots", mine.free_slots, engine.free_slots)
        d.books(what, "req_generation", mine.req_generation, engine.req_generation)


@points(2)
def test_random_streams_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, trials=150, name="ch01_alloc_rows")
