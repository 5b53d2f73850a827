"""Graded: chapter 07, Mamba state slots and ping-pong tracking (exercises/ch07_mamba_tracking.py)."""

import itertools

import pytest

from memlab.grading.checks import as_list, expect, expect_equal, expect_no_sharing, expect_raises
from memlab.grading.loader import load


def points(n):
    return pytest.mark.points(n, exercise="ch07.mamba_tracking")


def rows(num_rows=4, num_slots=8, tracking=2):
    return load("ch07_mamba_tracking").MambaRows(num_rows, num_slots, 3, tracking)


@points(2)
def test_tracking_slot_counts():
    f = load("ch07_mamba_tracking").get_mamba_tracking_slots
    for extra, overlap, lazy in itertools.product((False, True), repeat=3):
        want = 0 if not extra else 1 if lazy else 2 if overlap else 1
        got = f(extra, overlap, lazy)
        expect(got == want, f"get_mamba_tracking_slots(extra_buffer={extra}, overlap={overlap}, lazy={lazy}) "
                            f"returned {got}, expected {want}")


@points(1)
def test_alloc_gives_state_and_tracking():
    m = rows(tracking=2)
    expect(m.alloc_row(3) is True, "alloc_row(3) with 8 free slots must return True")
    expect_equal(int(m.state_slot[3]), 1, "row 3's state slot (the first slot from the head)")
    expect_equal(m.track_slots[3], [2, 3], "row 3's two tracking slots (the next ones, in column order)")
    expect_equal(m.free_slots, [4, 5, 6, 7, 8], "free_slots after handing out 3 slots")
    expect(m.alloc_row(1) is True, "alloc_row(1) with 5 free slots must return True")
    expect_no_sharing({3: [int(m.state_slot[3])] + as_list(m.track_slots[3]),
                       1: [int(m.state_slot[1])] + as_list(m.track_slots[1])}, "mamba slot", "row")


@points(1)
def test_alloc_all_or_nothing():
    m = rows(num_slots=4, tracking=2)
    m.alloc_row(1)
    got = m.alloc_row(2)
    expect(got is False, f"alloc_row(2) needs 3 slots with 1 free: must return False, got {got!r}")
    expect_equal(m.free_slots, [4], "a refused alloc_row must leave free_slots alone")
    expect_equal(int(m.state_slot[2]), 0, "a refused alloc_row must not give row 2 a state slot")


@points(2)
def test_free_resets_every_field():
    m = rows(tracking=2)
    m.alloc_row(2)
    m.next_track_slot(2)
    m.last_track_seqlen[2] = 17  # a snapshot was taken at length 17
    m.free_row(2)
    fields = {"state_slot": (int(m.state_slot[2]), 0), "track_slots": (as_list(m.track_slots[2]), [0, 0]),
              "next_track_idx": (int(m.next_track_idx[2]), 0), "last_track_seqlen": (int(m.last_track_seqlen[2]), -1)}
    for name, (got, fresh) in fields.items():
        expect(got == fresh, f"after free_row(2), {name}[2] is {got!r}, expected {fresh!r}: a reused row would "
                             "start from a stale value (every tracking field must be reset)")
    expect_equal(sorted(as_list(m.free_slots)), list(range(1, 9)), "after free_row every slot must be free again")
    expect_equal(as_list(m.free_slots)[-3:], [1, 2, 3], "freed slots go to the tail of free_slots")


@points(1)
def test_slots_zeroed_before_reuse():
    m = rows(num_slots=3, tracking=2)
    m.alloc_row(1)
    m.state[1:4] = 7.0  # the request's recurrent state and snapshots
    m.free_row(1)
    m.alloc_row(2)
    expect_equal(m.state[1:4].flatten(), [0.0] * 9, "slots handed to a new request must be zeroed: the old "
                 "owner's state would be read as its history")


@points(1)
def test_next_track_slot_ping_pong():
    m = rows(tracking=2)
    m.alloc_row(1)
    a, b = as_list(m.track_slots[1])
    got = [m.next_track_slot(1) for _ in range(4)]
    expect_equal(got, [a, b, a, b], "four snapshots with two tracking slots alternate (ping-pong)")
    single = rows(tracking=1)
    single.alloc_row(1)
    (only,) = as_list(single.track_slots[1])
    expect_equal([single.next_track_slot(1) for _ in range(3)], [only] * 3, "one tracking slot is reused every time")
    none = rows(tracking=0)
    none.alloc_row(1)
    expect_raises(ValueError, lambda: none.next_track_slot(1), "next_track_slot without tracking slots")
