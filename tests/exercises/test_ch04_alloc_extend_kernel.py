"""Graded: chapter 04, the whole-page part of the alloc_extend kernel
(exercises/ch04_alloc_extend_kernel.py).

Each check compares the kernel with a plain-Python reference, with guard bands (sentinel values)
around the output, which the Triton interpreter's missing bounds checks would not catch.
"""

import pytest
import torch

from memlab.course.grading.checks import expect_equal, plural
from memlab_tests.exercises.exercise_refs import (
    alloc_extend_python,
    fenced,
    i64,
    split_by_request,
)

GUARD = 16
SENTINEL = -777


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch04.alloc_extend_kernel", requires=requires)


def launch(pre, seq, last, free_pages, ps, device=None):
    from memlab.common.env import kernel_device
    from memlab.course.grading.loader import load

    dev = device or kernel_device()
    n = sum(seq) - sum(pre)
    buf = torch.full((n + 2 * GUARD,), SENTINEL, dtype=torch.int64, device=dev)

    def t(v):
        return torch.tensor(v, dtype=torch.int64, device=dev)

    # free_pages ends right before memory that may not be read: a load past it crashes.
    pages = fenced(free_pages, torch.int64, dev)
    inputs = (t(pre), t(seq), t(last))
    before = [x.clone() for x in inputs]
    load("ch04_alloc_extend_kernel").alloc_extend(
        *inputs, pages, ps, n, out=buf[GUARD : GUARD + n]
    )
    buf = buf.cpu()
    expect_equal(
        buf[:GUARD],
        torch.full((GUARD,), SENTINEL),
        "the guard band BEFORE the output was written to",
    )
    expect_equal(
        buf[GUARD + n :],
        torch.full((GUARD,), SENTINEL),
        "the guard band AFTER the output was written to "
        "(a store past the batch's last token: is part 2's store masked?)",
    )
    expect_equal(
        pages.cpu(),
        i64(*free_pages),
        "the kernel must only read free_pages",
    )
    for name, x, b in zip(("prefix_lens", "seq_lens", "last_loc"), inputs, before):
        expect_equal(x, b, f"the kernel must only read {name}")
    return buf[GUARD : GUARD + n]


def compare(pre, seq, last, free_pages, ps, device=None):
    got = split_by_request(launch(pre, seq, last, free_pages, ps, device), pre, seq)
    want = split_by_request(
        alloc_extend_python(pre, seq, last, free_pages, ps), pre, seq
    )
    for i, (g, w) in enumerate(zip(got, want)):
        expect_equal(
            g,
            w,
            f"request {i} (prefix {pre[i]} -> {plural(seq[i], 'token')}, last_loc {last[i]}, page "
            f"size {ps}; "
            "its part 1 is its first "
            f"{plural(min(seq[i], -(-pre[i] // ps) * ps) - pre[i], 'token')})",
        )


def pages_needed(pre, seq, ps):
    return sum(-(-s // ps) - -(-p // ps) for p, s in zip(pre, seq))


def shuffled_pages(n, rng):
    return rng.sample(range(1, 10 * n + 2), n)


@pytest.mark.kernel
@points(2)
def test_whole_pages_only(rng):
    # Page-aligned prefixes and lengths: every new token is in part 2; exactly the pages needed.
    compare([0, 8, 0], [8, 16, 4], [-1, 31, -1], shuffled_pages(5, rng), 4)
    compare([0, 0], [32, 16], [-1, -1], shuffled_pages(3, rng), 16)
    compare([0, 2, 0], [3, 5, 1], [-1, 90, -1], shuffled_pages(7, rng), 1)
    compare([16], [80], [63], shuffled_pages(4, rng), 16)


@pytest.mark.kernel
@points(1)
def test_long_extend_loops_over_blocks(rng):
    # 300 and 200 tokens of whole pages: several TOK_BLOCK (64) rounds per request.
    compare([0, 4], [300, 204], [-1, 83], shuffled_pages(125, rng), 4)
    compare([0], [128], [-1], shuffled_pages(32, rng), 4)  # exactly two rounds of 64


@pytest.mark.kernel
@points(2)
def test_mixed_random_batches(rng):
    # All three parts in one request: 3 -> 20 tokens on pages of 4 (1 + 12 + 4 tokens).
    compare([3, 0, 10], [20, 9, 41], [42, -1, 89], shuffled_pages(15, rng), 4)
    for _ in range(5):
        ps = rng.choice([4, 16])
        bs = rng.randint(1, 5)
        pre = [rng.choice([0, rng.randint(1, 50)]) for _ in range(bs)]
        seq = [p + rng.randint(0, 3 * ps + 9) for p in pre]
        last = [
            -1 if p == 0 else (9000 + i) * ps + (p - 1) % ps for i, p in enumerate(pre)
        ]
        compare(
            pre,
            seq,
            last,
            shuffled_pages(pages_needed(pre, seq, ps) + rng.choice([0, 3]), rng),
            ps,
        )


@pytest.mark.kernel
@points(1, requires="test_whole_pages_only")
def test_empty_and_tiny_requests(rng):
    # A request with nothing new between others, and one that only fills its old page.
    compare([5, 7, 0], [5, 8, 9], [-1 + 5, 29, -1], shuffled_pages(2, rng), 8)


@pytest.mark.kernel
@pytest.mark.gpu
@points(2)
def test_compiled_on_gpu_large_batch(rng):
    for ps in (1, 16, 64):
        bs = 200
        pre = [rng.choice([0, rng.randint(0, 300)]) for _ in range(bs)]
        seq = [p + rng.randint(0, 600) for p in pre]
        last = [
            -1 if p == 0 else (200000 + i) * ps + (p - 1) % ps
            for i, p in enumerate(pre)
        ]
        compare(
            pre,
            seq,
            last,
            shuffled_pages(pages_needed(pre, seq, ps), rng),
            ps,
            device="cuda",
        )


# -- the learner's kernel against the engine's alloc_extend, on random batches --------------------


def random_case(d):
    from memlab.common.env import kernel_device
    from memlab.course.grading.fuzz import tensor_code
    from memlab.course.grading.loader import load
    from memlab.sglang.allocator.reference import alloc_extend_python as engine
    from memlab_tests.exercises.exercise_refs import INT31, SIZES

    ps = d.pick(SIZES)
    big = d.chance(0.2)
    pre, seq = [], []
    for _ in d.count(1, 3, 0.5):
        p = (
            d.big(0, INT31 - 300)
            if big
            else (0 if d.chance(0.3) else d.int(0, 2 * ps + 40))
        )
        pre.append(p)
        seq.append(
            p
            + (
                d.int(64, 2 * 64 + 3 * ps + 8)
                if d.chance(0.4)
                else d.int(0, 3 * ps + 4)
            )
        )
    last = [
        -1 if p == 0 else (1000 + 2 * i) * ps + (p - 1) % ps for i, p in enumerate(pre)
    ]
    # page ids in random order, small and large (slots past 2**31: the output is int64)
    free = d.ids(pages_needed(pre, seq, ps) + d.int(0, 2), INT31)
    n = sum(seq) - sum(pre)
    d.given(page_size=ps, prefix_lens=pre, seq_lens=seq, last_loc=last, free_pages=free)
    d.code(
        f"print(ex.alloc_extend({tensor_code(pre)}, {tensor_code(seq)}, {tensor_code(last)}, "
        f"{tensor_code(free)}, {ps}, {n}))"
    )
    dev = kernel_device()
    buf = torch.full((n + 2 * GUARD,), SENTINEL, dtype=torch.int64, device=dev)
    pages = fenced(free, torch.int64, dev)  # a load past the free list's end crashes
    inputs = [torch.tensor(v, dtype=torch.int64, device=dev) for v in (pre, seq, last)]
    got = d.call(
        "alloc_extend",
        load("ch04_alloc_extend_kernel").alloc_extend,
        *inputs,
        pages,
        ps,
        n,
        out=buf[GUARD : GUARD + n],
        keep=False,
    )
    buf = buf.cpu()
    d.returns(
        "alloc_extend",
        buf[GUARD : GUARD + n] if torch.is_tensor(got) else got,
        i64(*engine(pre, seq, last, free, ps)),
    )
    sentinels = torch.full((GUARD,), SENTINEL)
    d.same(
        "the guard band before the output",
        buf[:GUARD],
        sentinels,
        "a store before the batch's first token",
    )
    d.same(
        "the guard band after the output",
        buf[GUARD + n :],
        sentinels,
        "a store past the batch's last token: is part 2's store masked?",
    )
    d.same(
        "free_pages after the launch",
        pages.cpu(),
        i64(*free),
        "the kernel must only read it",
    )
    for name, x, v in zip(
        ("prefix_lens", "seq_lens", "last_loc"), inputs, (pre, seq, last)
    ):
        d.same(
            f"{name} after the launch", x.cpu(), i64(*v), "the kernel must only read it"
        )


@pytest.mark.kernel
@points(2)
def test_random_batches_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, trials=40, name="ch04_alloc_extend_kernel")
