"""Graded: chapter 08, sizing (exercises/ch08_sizing.py)."""

import pytest

from memlab.course.grading.checks import expect, expect_equal, plural
from memlab.course.grading.loader import load


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch08.sizing", requires=requires)


def ex():
    return load("ch08_sizing")


def ceil_to(x, ps):
    return -(-x // ps) * ps


def room(inp, cap, ps):
    """The docstring's formula: capacity - the prompt in whole pages - one page - 1."""
    return cap - ceil_to(inp, ps) - ps - 1


@points(1)
def test_pool_size_floored_to_pages(rng):
    f = ex().pool_size_tokens
    gib = 1 << 30
    expect_equal(
        f(10 * gib, 131072, 1),
        81920,
        "10 GiB at 128 KiB per token (Llama-3-8B), page size 1",
    )
    for _ in range(3):
        per_token = rng.choice((rng.randint(1, 2**20), 131072, 576 * 61 * 2))
        ps = rng.choice((1, 2, 3, 5, 16, 64))
        k = rng.randint(1, 2**20)
        exact = per_token * ps * k
        expect_equal(
            f(exact, per_token, ps),
            k * ps,
            f"{plural(exact, 'byte')} at {per_token} per token: exactly {plural(k, 'page')} of "
            f"{ps}",
        )
        expect_equal(
            f(exact - 1, per_token, ps),
            (k - 1) * ps,
            f"{plural(exact - 1, 'byte')} at {per_token} per token "
            f"({plural(k * ps - 1, 'token')}): floored "
            f"to whole pages of {ps}",
        )
        spare = (
            exact + rng.randint(1, per_token * ps - 1) if per_token * ps > 1 else exact
        )
        expect_equal(
            f(spare, per_token, ps),
            k * ps,
            f"{plural(spare, 'byte')} at {per_token} per token, page size {ps}: floored to whole "
            "pages",
        )
        small = rng.randint(0, per_token * ps - 1)
        expect_equal(
            f(small, per_token, ps),
            0,
            f"{plural(small, 'byte')} at {per_token} per token: not one whole page of {ps}",
        )


@points(2)
def test_max_new_tokens_formula(rng):
    f = ex().max_new_tokens_for_memory
    expect_equal(
        f(100, 2000, 1000, 16),
        871,
        "input 100 (112 in pages of 16), capacity 1000: 1000 - 112 - 16 - 1",
    )
    for _ in range(4):
        ps = rng.choice((1, 2, 3, 16, 64))
        cap = rng.randint(10 * ps + 10, 2**24)
        inp = rng.choice((ps * rng.randint(0, 9), rng.randint(0, cap // 2)))
        left = room(inp, cap, ps)
        expect_equal(
            f(inp, left + rng.randint(1, 999), cap, ps),
            left,
            f"input {inp} ({ceil_to(inp, ps)} in pages of {ps}), capacity {cap}: {cap} - "
            f"{ceil_to(inp, ps)} - {ps} - 1",
        )
        asked = rng.randint(0, left - 1)
        expect_equal(
            f(inp, asked, cap, ps),
            asked,
            f"a request asking for {asked}, less than the room ({left}), keeps it",
        )
        expect_equal(
            f(inp, left, cap, ps),
            left,
            f"page size {ps}, asking for exactly the room ({left})",
        )
        expect_equal(f(inp, 0, cap, ps), 0, "max_new_tokens 0 stays 0")


@points(1, requires="test_max_new_tokens_formula")
def test_max_new_tokens_never_negative(rng):
    f = ex().max_new_tokens_for_memory
    got = f(5000, 100, 1000, 16)
    expect(
        got == 0,
        "a prompt longer than the pool leaves no room: max_new_tokens_for_memory must "
        f"return 0, got {got}",
    )
    for _ in range(4):
        ps = rng.choice((1, 2, 3, 16, 64))
        cap = rng.randint(4 * ps + 4, 2**24)
        # the largest prompt that leaves room, then prompts that leave exactly 0 and less
        inp = (cap - ps - 2) // ps * ps if ps > 1 else cap - 3
        for prompt in (
            inp,
            cap - ps - 1 - ceil_to(1, ps),
            cap,
            cap + rng.randint(1, 99),
        ):
            want = max(0, room(prompt, cap, ps))
            expect_equal(
                f(prompt, 100, cap, ps),
                min(100, want),
                f"input {prompt} ({ceil_to(prompt, ps)} in pages of {ps}), capacity "
                f"{cap}: {cap} - {ceil_to(prompt, ps)} - {ps} - 1 = "
                f"{room(prompt, cap, ps)}, never below 0 (an int)",
            )


@points(1)
def test_decode_len_chain_and_page_one(rng):
    f = ex().alloc_len_per_decode
    expect_equal(
        f(1, num_steps=3, topk=4, num_draft_tokens=8),
        12,
        "page size 1, 3 steps x topk 4, 8 draft tokens",
    )
    for _ in range(3):
        steps, topk = rng.randint(1, 9), rng.randint(1, 8)
        draft = rng.randint(1, 80)
        expect_equal(
            f(1, num_steps=steps, topk=topk, num_draft_tokens=draft),
            max(steps * topk, draft),
            f"page size 1, {plural(steps, 'step')} x topk {topk}, {plural(draft, 'draft token')}",
        )
        ps = rng.choice((2, 3, 16, 64))
        expect_equal(
            f(ps, num_steps=steps, topk=1, num_draft_tokens=draft),
            max(steps, draft),
            f"a chain (topk 1) of {plural(steps, 'step')} on pages of {ps}, "
            f"{plural(draft, 'draft token')}",
        )
        expect_equal(
            f(ps, num_steps=steps),
            steps,
            f"a chain of {plural(steps, 'step')} with topk and draft tokens unset",
        )
        expect_equal(
            f(1, num_steps=steps, topk=topk),
            steps * topk,
            f"page size 1, {plural(steps, 'step')} x topk {topk}, draft tokens unset",
        )


@points(1, requires="test_decode_len_chain_and_page_one")
def test_decode_len_without_speculation(rng):
    f = ex().alloc_len_per_decode
    for ps in (1, rng.choice((2, 3, 16)), 64):
        expect_equal(
            f(ps),
            1,
            f"KV slots per decode step without speculative decoding (page size {ps})",
        )


@points(1)
def test_decode_len_tree_on_pages(rng):
    f = ex().alloc_len_per_decode
    expect_equal(
        f(16, num_steps=3, topk=4, num_draft_tokens=8),
        128,
        "a tree (topk 4, 3 steps) on pages of 16: each branch may need "
        "ceil((16 - 1 + 3) / 16) = 2 pages of its own: 2 * 16 * 4",
    )
    for _ in range(3):
        ps, steps, topk = (
            rng.choice((2, 3, 4, 16)),
            rng.randint(1, 9),
            rng.randint(2, 8),
        )
        pages = -(-(ps - 1 + steps) // ps)
        tree = pages * ps * topk
        draft = rng.choice((rng.randint(1, tree), tree + rng.randint(1, 64)))
        expect_equal(
            f(ps, num_steps=steps, topk=topk, num_draft_tokens=draft),
            max(tree, draft),
            f"a tree (topk {topk}, {plural(steps, 'step')}) on pages of {ps}, "
            f"{plural(draft, 'draft token')}: "
            f"each branch may need ceil(({ps} - 1 + {steps}) / {ps}) = {plural(pages, 'page')} of "
            f"its own, {plural(tree, 'slot')}; the larger of that and the verify block wins",
        )
        expect_equal(
            f(ps, num_steps=steps, topk=topk),
            tree,
            f"a tree on pages of {ps} (topk {topk}, {plural(steps, 'step')}, draft tokens unset)",
        )


@points(2)
def test_reserve_doubled(rng):
    f = ex().alloc_reserve_per_decode
    for ps in (1, rng.choice((2, 16)), 64):
        expect_equal(
            f(ps),
            2,
            f"reserve per decode step without speculation on pages of {ps}: twice 1 slot",
        )
    for _ in range(3):
        ps, steps, topk = (
            rng.choice((2, 3, 4, 16)),
            rng.randint(1, 9),
            rng.randint(2, 8),
        )
        draft = rng.randint(1, 80)
        tree = max(-(-(ps - 1 + steps) // ps) * ps * topk, draft)
        expect_equal(
            f(ps, num_steps=steps, topk=topk, num_draft_tokens=draft),
            2 * tree,
            f"reserve for a tree on pages of {ps} ({plural(tree, 'slot')} a step): doubled",
        )
        expect_equal(
            f(ps, steps, 1, draft),
            2 * max(steps, draft),
            f"reserve for a chain of {plural(steps, 'step')} with {plural(draft, 'draft token')} "
            "(arguments "
            "by position)",
        )


# -- the learner's numbers against the engine's (memlab.sglang.sizing), on random configurations ---


def random_case(d):
    from memlab.sglang import sizing
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
        # speculative decoding: a chain or a tree; the keywords or None
        if d.chance(0.7):
            spec = {
                "num_steps": d.int(1, 9),
                "topk": d.pick((None, 1, 2, 3, 4, 8)),
                "num_draft_tokens": d.pick((None, d.int(1, 80))),
            }
        args = (ps, *spec.values()) if d.chance(0.3) else (ps,)
        kwargs = {} if len(args) > 1 else spec
        config = sizing.SpeculativeConfig()
        if spec:
            # unset draft tokens: never the max
            config = sizing.SpeculativeConfig(
                "EAGLE",
                spec["num_steps"],
                spec["topk"] or 1,
                spec["num_draft_tokens"] or 1,
            )
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

    check(random_case, trials=300, name="ch08_sizing")
