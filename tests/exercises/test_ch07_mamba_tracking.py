"""Graded: chapter 07, Mamba state slots and ping-pong tracking
(exercises/ch07_mamba_tracking.py)."""

import itertools

import pytest
import torch

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
    return pytest.mark.points(n, exercise="ch07.mamba_tracking", requires=requires)


def rows(num_rows=4, num_slots=8, tracking=2, rng=None):
    """A MambaRows; with ``rng``, its free slots in a random order (a well-used pool)."""
    m = load("ch07_mamba_tracking").MambaRows(num_rows, num_slots, 3, tracking)
    if rng is not None:
        m.free_slots = i64(*rng.sample(range(1, num_slots + 1), num_slots))
    return m


def fields(m, row):
    return {
        "state_slot": m.state_slot[row].clone(),
        "track_slots": m.track_slots[row].clone(),
        "next_track_idx": m.next_track_idx[row].clone(),
        "last_track_seqlen": m.last_track_seqlen[row].clone(),
    }


def expect_fresh(m, row, what):
    fresh = {
        "state_slot": i64(0)[0],
        "track_slots": i64(*[0] * m.tracking),
        "next_track_idx": i64(0)[0],
        "last_track_seqlen": i64(-1)[0],
    }
    for name, got in fields(m, row).items():
        expect_equal(
            got,
            fresh[name],
            f"{what}: {name}[{row}] (a reused row would start from a stale value; "
            "every tracking field must be reset)",
        )


@points(2)
def test_tracking_slot_counts():
    f = load("ch07_mamba_tracking").get_mamba_tracking_slots
    for extra, overlap, lazy in itertools.product((False, True), repeat=3):
        want = 0 if not extra else 1 if lazy else 2 if overlap else 1
        expect_equal(
            f(extra, overlap, lazy),
            want,
            f"get_mamba_tracking_slots(extra_buffer={extra}, overlap={overlap}, "
            f"lazy={lazy}) (an int)",
        )
    expect_equal(
        f(True, True),
        2,
        "get_mamba_tracking_slots(True, True) with lazy left at its default",
    )


@points(1)
def test_alloc_gives_state_and_tracking(rng):
    n = rng.randint(8, 30)
    m = rows(num_rows=6, num_slots=n, tracking=2, rng=rng)
    free = m.free_slots.tolist()
    r1, r2, r3 = rng.sample(range(1, 7), 3)
    expect_equal(
        m.alloc_row(r1), True, f"alloc_row({r1}) with {plural(n, 'free slot')}"
    )
    expect_equal(
        m.state_slot[r1],
        i64(free[0])[0],
        f"row {r1}'s state slot (the first slot from the head of free_slots {free[:6]}...)",
    )
    expect_equal(
        m.track_slots[r1],
        i64(*free[1:3]),
        f"row {r1}'s two tracking slots (the next ones, in column order)",
    )
    expect_equal(m.free_slots, i64(*free[3:]), "free_slots after handing out 3 slots")
    expect_equal(
        (m.next_track_idx, m.last_track_seqlen),
        (i64(*[0] * 7), i64(*[-1] * 7)),
        "alloc_row leaves next_track_idx and last_track_seqlen alone (fresh: 0 and -1)",
    )
    expect_equal(
        m.alloc_row(r2), True, f"alloc_row({r2}) with {plural(n - 3, 'free slot')}"
    )
    expect_no_sharing(
        {r: [int(m.state_slot[r])] + m.track_slots[r].tolist() for r in (r1, r2)},
        "mamba slot",
        "row",
    )
    m.free_slots = m.free_slots[: rng.randint(0, 2)]  # fewer than the 3 a row needs
    left = len(m.free_slots)
    expect_equal(
        m.alloc_row(r3),
        False,
        f"alloc_row({r3}) with {plural(left, 'free slot')} (it needs 3)",
    )
    none = rows(num_slots=2, tracking=0, rng=rng)  # no extra buffer: a state slot only
    two = none.free_slots.tolist()
    r1, r2 = rng.sample(range(1, 5), 2)
    expect_equal(none.alloc_row(r1), True, f"alloc_row({r1}) without tracking slots")
    expect_equal(
        none.alloc_row(r2),
        True,
        f"alloc_row({r2}) with exactly 1 free slot and no tracking slots",
    )
    want = [0] * 5
    want[r1], want[r2] = two
    expect_equal(
        none.state_slot,
        i64(*want),
        f"state_slot after rows {r1} and {r2} took slots {two[0]} and {two[1]}",
    )
    expect_equal(none.free_slots, i64(), "free_slots after handing out every slot")


@points(1, requires="test_alloc_gives_state_and_tracking")
def test_alloc_all_or_nothing(rng):
    m = rows(num_slots=4, tracking=2, rng=rng)
    r1, r2 = rng.sample(range(1, 5), 2)
    m.alloc_row(r1)
    left = m.free_slots.tolist()
    mine = [int(m.state_slot[r1])] + m.track_slots[r1].tolist()
    m.state[mine] = 5.0  # row r1's recurrent state, which later allocations must keep
    got = m.alloc_row(r2)
    expect(
        got is False,
        f"alloc_row({r2}) needs 3 slots with 1 free: must return False, got {got!r}",
    )
    expect_equal(
        m.free_slots, i64(*left), "a refused alloc_row must leave free_slots alone"
    )
    expect_fresh(m, r2, f"a refused alloc_row({r2})")
    m = rows(num_slots=6, tracking=2, rng=rng)
    free = m.free_slots.tolist()
    m.alloc_row(r1)
    m.state[free[:3]] = 5.0
    expect_equal(
        m.alloc_row(r2),
        True,
        f"alloc_row({r2}) with exactly 3 free slots (it needs 3)",
    )
    expect_equal(
        m.track_slots[r2],
        i64(*free[4:]),
        f"row {r2}'s tracking slots: the last two slots",
    )
    expect_equal(m.free_slots, i64(), "free_slots after an exact fit")
    expect_equal(
        m.state[free[:3]],
        torch.full((3, 3), 5.0),
        f"row {r1}'s state after row {r2} was allocated: only the slots handed out may "
        "be zeroed",
    )


@points(2)
def test_free_resets_every_field(rng):
    m = rows(num_rows=6, num_slots=10, tracking=2, rng=rng)
    free = m.free_slots.tolist()
    a, b, c, idle = rng.sample(range(1, 7), 4)
    for r in (a, b, c):  # b and c: neighbours that keep their slots
        m.alloc_row(r)
    m.next_track_slot(a)
    seqlen = rng.randint(1, 500)
    m.last_track_seqlen[a] = seqlen  # a snapshot was taken at that length
    neighbours = {r: fields(m, r) for r in (b, c)}
    m.free_row(a)
    expect_fresh(m, a, f"after free_row({a})")
    expect_equal(
        m.free_slots,
        i64(*free[9:], *free[:3]),
        f"after free_row({a}) the row's slots go to the tail of free_slots: state slot "
        f"first, then the tracking slots (and nothing of rows {b} and {c})",
    )
    for r, before in neighbours.items():
        for name, value in before.items():
            expect_equal(
                fields(m, r)[name], value, f"row {r}'s {name} after free_row({a})"
            )
    m.free_row(b)
    expect_equal(
        m.free_slots,
        i64(*free[9:], *free[:6]),
        f"free_slots after free_row({b}) too",
    )
    # A row that holds nothing (never allocated, or freed already): nothing to give back. Its
    # zeros are "no slot", and slot 0 is the padding slot: it must never reach the free list.
    m.free_row(a)
    m.free_row(idle)
    expect_equal(
        m.free_slots,
        i64(*free[9:], *free[:6]),
        "free_row of rows that hold no slot must free nothing",
    )
    expect_fresh(m, idle, f"after free_row({idle}) of an empty row")


@points(1)
def test_slots_zeroed_before_reuse(rng):
    m = rows(num_slots=3, tracking=2, rng=rng)
    r1, r2 = rng.sample(range(1, 5), 2)
    m.alloc_row(r1)
    m.state[1:4] = 7.0  # the request's recurrent state and snapshots
    m.free_row(r1)
    m.alloc_row(r2)
    expect_equal(
        m.state[1:4],
        torch.zeros(3, 3),
        "slots handed to a new request must be zeroed: the old owner's state would be "
        "read as its history",
    )
    m = rows(num_slots=4, tracking=2)
    m.alloc_row(r1)  # slots 1, 2, 3
    state = m.state.clone()
    state[1:4] = 7.0
    m.state = state
    m.free_row(r1)  # free_slots: 4, 1, 2, 3
    m.alloc_row(r2)  # slots 4, 1, 2: not consecutive, not ascending
    expect_equal(
        m.state[:, 0],
        torch.tensor([0.0, 0.0, 0.0, 7.0, 0.0]),
        f"row {r2} took slots 4, 1, 2 (not consecutive): exactly their state rows must "
        "be zeroed (state[slots] = 0, not a span from the first to the last), and free "
        "slot 3 keeps its old state",
    )


@points(1)
def test_next_track_slot_ping_pong(rng):
    r1, r2 = rng.sample(range(1, 5), 2)
    m = rows(tracking=2, rng=rng)
    m.alloc_row(r1)
    a, b = m.track_slots[r1].tolist()
    got = [m.next_track_slot(r1) for _ in range(4)]
    expect_equal(
        got,
        [a, b, a, b],
        "four snapshots with two tracking slots alternate (ping-pong), as ints",
    )
    single = rows(tracking=1, rng=rng)
    single.alloc_row(r1)
    (only,) = single.track_slots[r1].tolist()
    expect_equal(
        [single.next_track_slot(r1) for _ in range(3)],
        [only] * 3,
        "one tracking slot is reused every time",
    )
    three = rows(tracking=3, rng=rng)
    three.alloc_row(r2)
    a, b, c = three.track_slots[r2].tolist()
    expect_equal(
        [three.next_track_slot(r2) for _ in range(4)],
        [a, b, c, a],
        "with three tracking slots the snapshots go round them in column order",
    )
    expect_raises(
        ValueError,
        lambda: m.next_track_slot(r2),
        f"next_track_slot({r2}) for a row that holds no slot",
    )
    expect_equal(
        m.next_track_idx[r2],
        i64(0)[0],
        "a refused next_track_slot must not advance next_track_idx",
    )
    none = rows(tracking=0, rng=rng)
    none.alloc_row(r1)
    expect_raises(
        ValueError,
        lambda: none.next_track_slot(r1),
        "next_track_slot without tracking slots",
    )


# -- the learner's rows against the engine's rules, over random sequences --------------------------


class Engine:
    """SGLang's HybridReqToTokenPool books for one model, as the docstrings state them (memlab's
    pool allocates rows and slots together; the exercise gives the row): slots from the head,
    freed to the tail, state rows zeroed when handed out, every field of a freed row reset."""

    def __init__(self, rows, num_slots, state_dim, tracking):
        self.tracking = tracking
        self.state = torch.zeros(num_slots + 1, state_dim)
        self.free_slots = list(range(1, num_slots + 1))
        self.state_slot, self.track = (
            [0] * (rows + 1),
            [[0] * tracking for _ in range(rows + 1)],
        )
        self.next_idx, self.last_len = [0] * (rows + 1), [-1] * (rows + 1)

    def alloc_row(self, row):
        if 1 + self.tracking > len(self.free_slots):
            return False
        slots, self.free_slots = (
            self.free_slots[: 1 + self.tracking],
            self.free_slots[1 + self.tracking :],
        )
        self.state[slots] = 0
        self.state_slot[row], self.track[row] = slots[0], slots[1:]
        return True

    def free_row(self, row):
        self.free_slots += [
            s for s in [self.state_slot[row]] + self.track[row] if s > 0
        ]
        self.state_slot[row], self.track[row] = 0, [0] * self.tracking
        self.next_idx[row], self.last_len[row] = 0, -1

    def next_track_slot(self, row):
        from memlab.course.grading.fuzz import Raised

        if self.tracking == 0 or self.track[row][self.next_idx[row]] == 0:
            return Raised(ValueError())
        slot = self.track[row][self.next_idx[row]]
        self.next_idx[row] = (self.next_idx[row] + 1) % self.tracking
        return slot


def random_case(d):
    from memlab.sglang.mamba import mamba_tracking_slots
    from memlab_tests.exercises.exercise_refs import tensor

    m = load("ch07_mamba_tracking")
    if d.chance(0.15):
        flags = dict(
            extra_buffer=d.chance(0.5), overlap=d.chance(0.5), lazy=d.chance(0.5)
        )
        d.given(**flags)
        d.code(f"print(ex.get_mamba_tracking_slots(**{flags}))")
        d.returns(
            "get_mamba_tracking_slots",
            d.call("get_mamba_tracking_slots", m.get_mamba_tracking_slots, **flags),
            mamba_tracking_slots(**flags),
        )
        return
    n_rows, n_slots = d.size(1, 5), d.size(1, 10)
    dim, tracking = d.int(1, 3), d.int(0, 2)
    mine, engine = (
        m.MambaRows(n_rows, n_slots, dim, tracking),
        Engine(n_rows, n_slots, dim, tracking),
    )
    d.given(rows=n_rows, num_slots=n_slots, state_dim=dim, tracking=tracking)
    d.code(f"r = ex.MambaRows({n_rows}, {n_slots}, {dim}, {tracking})")
    held = set()
    for _ in d.count(1, 16, 0.9):
        op = d.pick(("alloc", "write", "free", "track"))
        every = list(range(1, n_rows + 1))
        # free_row of a row holding nothing too
        pool = (
            sorted(set(every) - held)
            if op == "alloc"
            else sorted(held)
            if op == "write"
            else (sorted(held) if op == "free" and d.chance(0.8) else every)
        )
        if not pool:
            continue
        row = d.pick(pool)
        if op == "alloc":
            d.step(f"alloc_row({row})")
            d.code(f"print(r.alloc_row({row}))")
            want = engine.alloc_row(row)
            d.returns("alloc_row", d.call("alloc_row", mine.alloc_row, row), want)
            held |= {row} if want else set()
            what = "alloc_row"
        elif op == "free":
            d.step(f"free_row({row})")
            d.code(f"r.free_row({row})")
            d.returns(
                "free_row", d.call("free_row", mine.free_row, row), engine.free_row(row)
            )
            held.discard(row)
            what = "free_row"
        elif op == "write":  # the model runs: the row's slots get a state
            value = float(d.int(1, 9))
            slots = [engine.state_slot[row]] + engine.track[row]
            d.step(
                f"(the forward pass writes {value} into the state rows of slots {slots})"
            )
            d.code(f"s = r.state.clone(); s[{slots}] = {value}; r.state = s")
            engine.state[slots] = value
            state = mine.state.clone()
            state[slots] = value
            mine.state = state
            continue
        else:
            d.step(f"next_track_slot({row})")
            d.code(f"print(r.next_track_slot({row}))")
            d.returns(
                "next_track_slot",
                d.call("next_track_slot", mine.next_track_slot, row),
                engine.next_track_slot(row),
            )
            what = "next_track_slot"
        d.code(
            "print(r.free_slots, r.state_slot, r.track_slots, r.next_track_idx, "
            "r.last_track_seqlen, r.state)"
        )
        d.books(what, "free_slots", mine.free_slots, tensor(engine.free_slots))
        d.books(what, "state_slot", mine.state_slot, tensor(engine.state_slot))
        d.books(
            what,
            "track_slots",
            mine.track_slots,
            torch.tensor(engine.track, dtype=torch.int64).reshape(n_rows + 1, tracking),
        )
        d.books(what, "next_track_idx", mine.next_track_idx, tensor(engine.next_idx))
        d.books(
            what, "last_track_seqlen", mine.last_track_seqlen, tensor(engine.last_len)
        )
        d.books(
            what,
            "state",
            mine.state,
            engine.state,
            "a slot's state row is zeroed when the slot is handed out, and only then",
        )


@points(2)
def test_random_sequences_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, trials=120, name="ch07_mamba_tracking")
