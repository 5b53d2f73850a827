"""Graded: chapter 08, sizing (exercises/ch08_sizing.py)."""

import pytest

from memlab.grading.checks import expect, expect_equal
from memlab.grading.loader import load


def points(n):
    return pytest.mark.points(n, exercise="ch08.sizing")


def ex():
    return load("ch08_sizing")


@points(1)
def test_pool_size_floored_to_pages():
    f = ex().pool_size_tokens
    gib = 1 << 30
    expect_equal(f(10 * gib, 131072, 1), 81920, "10 GiB at 128 KiB per token (Llama-3-8B), page size 1")
    expect_equal(f(10 * gib + 5 * 131072, 131072, 16), 81920, "81925 tokens' worth of bytes, page size 16: "
                 "floored to whole pages")
    expect_equal(f(1000, 64, 4), 12, "1000 bytes at 64 per token (15 tokens), page size 4")


@points(2)
def test_max_new_tokens_formula():
    f = ex().max_new_tokens_for_memory
    expect_equal(f(100, 2000, 1000, 16), 871, "input 100 (112 in pages of 16), capacity 1000: 1000 - 112 - 16 - 1")
    expect_equal(f(100, 500, 1000, 16), 500, "a request asking for less than the room keeps its max_new_tokens")
    expect_equal(f(96, 2000, 1000, 16), 887, "input 96 is 6 whole pages of 16: 1000 - 96 - 16 - 1")
    expect_equal(f(7, 100, 50, 1), 41, "page size 1: 50 - 7 - 1 - 1")


@points(1)
def test_max_new_tokens_never_negative():
    f = ex().max_new_tokens_for_memory
    got = f(5000, 100, 1000, 16)
    expect(got == 0,
           f"a prompt longer than the pool leaves no room: max_new_tokens_for_memory must return 0, got {got}")


@points(1)
def test_decode_len_without_speculation():
    f = ex().alloc_len_per_decode
    for ps in (1, 16, 64):
        expect_equal(f(ps), 1, f"KV slots per decode step without speculative decoding (page size {ps})")


@points(1)
def test_decode_len_chain_and_page_one():
    f = ex().alloc_len_per_decode
    expect_equal(f(1, num_steps=3, topk=4, num_draft_tokens=8), 12, "page size 1, 3 steps x topk 4, 8 draft tokens")
    expect_equal(f(16, num_steps=5, topk=1, num_draft_tokens=6), 6, "a chain (topk 1) of 5 steps, 6 draft tokens")
    expect_equal(f(16, num_steps=3), 3, "a chain of 3 steps with topk and draft tokens unset")


@points(1)
def test_decode_len_tree_on_pages():
    f = ex().alloc_len_per_decode
    expect_equal(f(16, num_steps=3, topk=4, num_draft_tokens=8), 128, "a tree (topk 4, 3 steps) on pages of 16: "
                 "each branch may need ceil((16 - 1 + 3) / 16) = 2 pages of its own: 2 * 16 * 4")
    expect_equal(f(4, num_steps=8, topk=2, num_draft_tokens=64), 64, "when the verify block (64 draft tokens) is "
                 "larger than the tree's pages (ceil(11/4) * 4 * 2 = 24) it wins")


@points(2)
def test_reserve_doubled():
    f = ex().alloc_reserve_per_decode
    expect_equal(f(1), 2, "reserve per decode step without speculation under the overlap scheduler: twice 1")
    expect_equal(f(16, num_steps=3, topk=4, num_draft_tokens=8), 256, "reserve for a tree on pages of 16 "
                 "(128 slots a step) under the overlap scheduler: doubled")
    expect_equal(f(16, num_steps=3, topk=4, num_draft_tokens=8, enable_overlap=False), 128,
                 "without the overlap scheduler the host does not lag: reserve one step's slots")
