"""Graded: chapter 08, sizing (exercises/ch08_sizing.py)."""

import pytest

from memlab.course.grading.checks import expect, expect_equal
from memlab.course.grading.loader import load


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch08.sizing", requires=requires)


def ex():
    return load("ch08_sizing")


@points(1)
def test_pool_size_floored_to_pages():
    f = ex().pool_size_tokens
    gib = 1 << 30
    expect_equal(
        f(10 * gib, 131072, 1),
        81920,
        "10 GiB at 128 KiB per token (Llama-3-8B), page size 1",
    )
    expect_equal(
        f(10 * gib + 5 * 131072, 131072, 16),
        81920,
        "81925 tokens' worth of bytes, page size 16: floored to whole pages",
    )
    expect_equal(
        f(1000, 64, 4), 12, "1000 bytes at 64 per token (15 tokens), page size 4"
    )
    expect_equal(
        f(1024, 64, 16), 16, "1024 bytes at 64 per token: exactly one page of 16"
    )
    expect_equal(
        f(1023, 64, 16),
        0,
        "1023 bytes at 64 per token (15 tokens): not one whole page of 16",
    )


@points(2)
def test_max_new_tokens_formula():
    f = ex().max_new_tokens_for_memory
    expect_equal(
        f(100, 2000, 1000, 16),
        871,
        "input 100 (112 in pages of 16), capacity 1000: 1000 - 112 - 16 - 1",
    )
    expect_equal(
        f(100, 500, 1000, 16),
        500,
        "a request asking for less than the room keeps its max_new_tokens",
    )
    expect_equal(
        f(96, 2000, 1000, 16),
        887,
        "input 96 is 6 whole pages of 16: 1000 - 96 - 16 - 1",
    )
    expect_equal(f(7, 100, 50, 1), 41, "page size 1: 50 - 7 - 1 - 1")
    expect_equal(f(7, 41, 50, 1), 41, "page size 1, asking for exactly the room (41)")
    expect_equal(f(0, 10, 50, 16), 10, "an empty prompt (0 pages)")
    expect_equal(f(16, 0, 50, 16), 0, "max_new_tokens 0 stays 0")


@points(1)
def test_max_new_tokens_never_negative():
    f = ex().max_new_tokens_for_memory
    got = f(5000, 100, 1000, 16)
    expect(
        got == 0,
        f"a prompt longer than the pool leaves no room: max_new_tokens_for_memory must return 0, got {got}",
    )
    expect_equal(f(5000, 100, 1000, 16), 0, "a prompt longer than the pool (an int)")
    expect_equal(
        f(967, 100, 1000, 16),
        7,
        "input 967 (976 in pages of 16), capacity 1000: 1000 - 976 - 16 - 1 = 7",
    )
    expect_equal(
        f(983, 100, 1000, 16),
        0,
        "input 983 (992 in pages of 16), capacity 1000: 1000 - 992 - 17 < 0",
    )
    expect_equal(
        f(998, 100, 1000, 1),
        0,
        "page size 1, capacity 1000, input 998: 1000 - 998 - 1 - 1 = 0",
    )
    expect_equal(
        f(997, 100, 1000, 1),
        1,
        "page size 1, capacity 1000, input 997: 1000 - 997 - 1 - 1 = 1",
    )


@points(1)
def test_decode_len_without_speculation():
    f = ex().alloc_len_per_decode
    for ps in (1, 16, 64):
        expect_equal(
            f(ps),
            1,
            f"KV slots per decode step without speculative decoding (page size {ps})",
        )


@points(1)
def test_decode_len_chain_and_page_one():
    f = ex().alloc_len_per_decode
    expect_equal(
        f(1, num_steps=3, topk=4, num_draft_tokens=8),
        12,
        "page size 1, 3 steps x topk 4, 8 draft tokens",
    )
    expect_equal(
        f(16, num_steps=5, topk=1, num_draft_tokens=6),
        6,
        "a chain (topk 1) of 5 steps, 6 draft tokens",
    )
    expect_equal(
        f(16, num_steps=3), 3, "a chain of 3 steps with topk and draft tokens unset"
    )
    expect_equal(
        f(1, num_steps=2, topk=3),
        6,
        "page size 1, 2 steps x topk 3, draft tokens unset",
    )
    expect_equal(
        f(1, num_steps=1, topk=1, num_draft_tokens=1),
        1,
        "the smallest speculative step: 1 step, topk 1",
    )


@points(1)
def test_decode_len_tree_on_pages():
    f = ex().alloc_len_per_decode
    expect_equal(
        f(16, num_steps=3, topk=4, num_draft_tokens=8),
        128,
        "a tree (topk 4, 3 steps) on pages of 16: "
        "each branch may need ceil((16 - 1 + 3) / 16) = 2 pages of its own: 2 * 16 * 4",
    )
    expect_equal(
        f(4, num_steps=8, topk=2, num_draft_tokens=64),
        64,
        "when the verify block (64 draft tokens) is "
        "larger than the tree's pages (ceil(11/4) * 4 * 2 = 24) it wins",
    )
    expect_equal(
        f(2, num_steps=2, topk=2),
        8,
        "a tree on pages of 2 (topk 2, 2 steps, draft tokens unset): "
        "ceil((2 - 1 + 2) / 2) = 2 pages per branch: 2 * 2 * 2",
    )
    expect_equal(
        f(4, num_steps=1, topk=3, num_draft_tokens=12),
        12,
        "topk 3, 1 step on pages of 4: 1 page per "
        "branch (12 slots), equal to the 12 draft tokens",
    )


@points(2)
def test_reserve_doubled():
    f = ex().alloc_reserve_per_decode
    expect_equal(f(1), 2, "reserve per decode step without speculation: twice 1")
    expect_equal(
        f(64),
        2,
        "reserve per decode step without speculation on pages of 64: still twice 1 slot",
    )
    expect_equal(
        f(16, num_steps=3, topk=4, num_draft_tokens=8),
        256,
        "reserve for a tree on pages of 16 (128 slots a step): doubled",
    )
    expect_equal(
        f(16, 5, 1, 6),
        12,
        "reserve for a chain of 5 steps with 6 draft tokens (arguments by position)",
    )


# -- the learner's numbers against the engine's (memlab.common.sizing), on random configurations ---


def random_case(d):
    from memlab.common import sizing
    from memlab_tests.exercises.exercise_refs import INT31, SIZES

    e = ex()
    ps = d.pick(SIZES + (128, 256))
    fn = d.pick(
        (
            "pool_size_tokens",
            "max_new_tokens_for_memory",
            "alloc_len_per_decode",
            "alloc_reserve_per_decode",
        )
    )
    if fn == "pool_size_tokens":  # budgets up to 2**50 bytes: exact only in integers
        per_token = d.big(1, 2**22)
        budget = (
            d.big(0, 2**50)
            if d.chance(0.5)
            else per_token * d.big(0, INT31) + d.int(0, per_token - 1)
        )
        args = (budget, per_token, ps)
        want = sizing.floor_ps(budget // per_token, ps)
    elif fn == "max_new_tokens_for_memory":
        capacity = d.big(1, INT31)
        args = (
            d.big(0, capacity + 2 * ps) if d.chance(0.8) else d.big(0, INT31),
            d.big(0, INT31),
            capacity,
            ps,
        )
        want = sizing.max_new_tokens_for_memory(*args)
    else:
        spec = {}
        if d.chance(
            0.7
        ):  # speculative decoding: a chain or a tree; the keywords or None
            spec = {
                "num_steps": d.int(1, 9),
                "topk": d.pick((None, 1, 2, 3, 4, 8)),
                "num_draft_tokens": d.pick((None, d.int(1, 80))),
            }
        args = (ps, *spec.values()) if d.chance(0.3) else (ps,)
        kwargs = {} if len(args) > 1 else spec
        config = sizing.SpeculativeConfig()
        if spec:
            config = sizing.SpeculativeConfig(
                "EAGLE",
                spec["num_steps"],
                spec["topk"] or 1,
                spec["num_draft_tokens"] or 1,
            )  # unset draft tokens: never the max
        rule = (
            sizing.alloc_len_per_decode
            if fn == "alloc_len_per_decode"
            else sizing.alloc_reserve_per_decode
        )
        want = rule(config, ps)
        d.given(page_size=ps, **spec)
        shown = ", ".join(
            [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
        )
        d.code(f"print(ex.{fn}({shown}))")
        d.returns(fn, d.call(fn, getattr(e, fn), *args, **kwargs), want)
        return
    names = (
        ("budget_bytes", "bytes_per_token", "page_size")
        if fn == "pool_size_tokens"
        else ("input_tokens", "max_new_tokens", "token_capacity", "page_size")
    )
    d.given(**dict(zip(names, args)))
    d.code(f"print(ex.{fn}{args})")
    d.returns(fn, d.call(fn, getattr(e, fn), *args), want)


@points(2)
def test_random_configurations_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, seed=808, trials=300, name="ch08_sizing")
