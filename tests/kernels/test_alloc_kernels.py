"""alloc_extend / alloc_decode: kernel == torch reference == Python reference, with guard bands."""

import random

import pytest
import torch

from memlab.common.env import kernel_device
from memlab.sglang.allocator import reference as ref

pytestmark = pytest.mark.kernel
GUARD, SENTINEL = 64, -7777


def guarded(values, dev):
    """A tensor view with SENTINEL-filled bands on both sides; returns (view, whole buffer)."""
    buf = torch.full(
        (len(values) + 2 * GUARD,), SENTINEL, dtype=torch.int64, device=dev
    )
    view = buf[GUARD : GUARD + len(values)]
    view.copy_(torch.tensor(values, dtype=torch.int64))
    return view, buf


def check_guards(buf, n, what):
    bands = torch.cat((buf[:GUARD], buf[GUARD + n :])).cpu()
    assert (bands == SENTINEL).all(), (
        f"{what} wrote outside its output: {bands[bands != SENTINEL].tolist()}"
    )


def random_batch(rng, bs, ps, kind):
    pre, seq, last = [], [], []
    for i in range(bs):
        p = {
            "empty": 0,
            "aligned": ps * rng.randint(0, 8),
            "unaligned": rng.randint(0, 8 * ps),
        }[kind]
        p = rng.choice([p, 0]) if kind != "empty" else p
        e = rng.choice([0, 1, rng.randint(0, 3 * ps + 3)])
        pre.append(p)
        seq.append(p + e)
        # the prefix's last token sits at offset (p - 1) % ps of some held page (ids far
        # above the free list)
        last.append(-1 if p == 0 else (100_000 + i) * ps + (p - 1) % ps)
    return pre, seq, last


def run_extend(pre, seq, last, free, ps):
    from memlab.kernels import alloc_extend

    dev = kernel_device()
    n = sum(seq) - sum(pre)
    P, S, L = (torch.tensor(x, dtype=torch.int64, device=dev) for x in (pre, seq, last))
    F, fbuf = guarded(free, dev)
    out, obuf = guarded([SENTINEL] * n, dev)
    want = ref.alloc_extend_python(pre, seq, last, free, ps)
    torch_out = ref.alloc_extend_torch(P, S, L, F, ps, n).tolist()
    alloc_extend.alloc_extend(P, S, L, F, ps, n, out=out)
    check_guards(obuf, n, "alloc_extend")
    assert torch_out == want, "torch reference != Python reference"
    wrong = [i for i, (a, b) in enumerate(zip(out.tolist(), want)) if a != b]
    assert out.tolist() == want, f"kernel != reference at {wrong[:5]}"
    return want


@pytest.mark.parametrize("ps", [1, 2, 16, 64])
@pytest.mark.parametrize(
    "bs,kind",
    [
        (1, "empty"),
        (1, "unaligned"),
        (5, "aligned"),
        (33, "unaligned"),
        (130, "unaligned"),
    ],
)
def test_alloc_extend_matches_references(ps, bs, kind):
    rng = random.Random(f"{ps}-{bs}-{kind}")
    pre, seq, last = random_batch(rng, bs, ps, kind)
    need = ref.num_new_pages(torch.tensor(pre), torch.tensor(seq), ps)
    # a shuffled, longer free list
    free = rng.sample(range(1, need + 50), need + rng.randint(0, 10))
    out = run_extend(pre, seq, last, free, ps)
    assert len(set(out)) == len(out)


@pytest.mark.parametrize("ps", [1, 16])
def test_alloc_extend_batch_of_512_exhausting_the_pool(ps):
    rng = random.Random(ps)
    pre, seq, last = random_batch(rng, 512, ps, "unaligned")
    need = ref.num_new_pages(torch.tensor(pre), torch.tensor(seq), ps)
    # exactly as many pages as the batch needs
    free = rng.sample(range(1, need + 1), need)
    out = run_extend(pre, seq, last, free, ps)
    new = {s // ps for s in out if s // ps < 100_000}
    assert new == set(free), "an exhausting batch must use every free page exactly"


def test_long_extend_crosses_many_tok_blocks():
    run_extend([3], [3 + 2000], [100_000 * 16 + 2], list(range(1, 200)), 16)


def not_a_power_of_two_batch(ps):
    """Nine random requests and a 700-token extend, which crosses 256-token blocks mid-page."""
    rng = random.Random(f"np2-{ps}")
    pre, seq, last = random_batch(rng, 9, ps, "unaligned")
    pre, seq, last = pre + [1], seq + [1 + 700], last + [100_100 * ps]
    need = ref.num_new_pages(torch.tensor(pre), torch.tensor(seq), ps)
    return pre, seq, last, rng.sample(range(1, need + 20), need + 3)


@pytest.mark.parametrize("ps", [3, 5, 6, 7])
def test_alloc_extend_page_sizes_that_are_not_powers_of_two(ps):
    """The page size is a constexpr (// and % by it compile to a multiply, not a shift); parts 1
    and 3 use a block of its next power of two, masked."""
    out = run_extend(*not_a_power_of_two_batch(ps), ps)
    assert len(set(out)) == len(out)


def test_not_a_power_of_two_check_catches_a_short_page_block(monkeypatch):
    """A launcher rounding the page block down (4 lanes for page size 6) loses the end of a page."""
    from memlab.kernels import alloc_extend

    monkeypatch.setattr(
        alloc_extend.triton, "next_power_of_2", lambda n: 1 << (n.bit_length() - 1)
    )
    with pytest.raises(AssertionError, match="kernel != reference"):
        run_extend(*not_a_power_of_two_batch(6), 6)


@pytest.mark.parametrize(
    "ps,bs",
    [(ps, bs) for ps in (1, 2, 16, 64) for bs in (1, 7, 300)]
    + [(ps, bs) for ps in (3, 5, 6, 7) for bs in (1, 7)]
    + [(3, 300)],
)
def test_alloc_decode_matches_references(ps, bs):
    from memlab.kernels import alloc_decode

    rng = random.Random(f"d{ps}-{bs}")
    dev = kernel_device()
    seq = [rng.choice([1, ps + 1, rng.randint(1, 5 * ps + 1)]) for _ in range(bs)]
    last = [
        -1 if s == 1 else (100_000 + i) * ps + (s - 2) % ps for i, s in enumerate(seq)
    ]
    need = sum((s - 1) % ps == 0 for s in seq)
    free = rng.sample(range(1, need + 1), need)
    want = ref.alloc_decode_python(seq, last, free, ps)
    S, L = (torch.tensor(x, dtype=torch.int64, device=dev) for x in (seq, last))
    F, _ = guarded(free, dev)
    out, obuf = guarded([SENTINEL] * bs, dev)
    assert ref.alloc_decode_torch(S, L, F, ps).tolist() == want
    alloc_decode.alloc_decode(S, L, F, ps, out=out)
    check_guards(obuf, bs, "alloc_decode")
    assert out.tolist() == want


def test_guard_check_catches_an_out_of_bounds_write():
    _, buf = guarded([0, 0], "cpu")
    buf[GUARD + 2] = 5  # one past the end
    with pytest.raises(AssertionError, match="outside"):
        check_guards(buf, 2, "a buggy kernel")


def test_reference_forgetting_last_loc_continuation_is_caught():
    pre, seq, last, free, ps = [6], [9], [13], [5], 4

    # opens a new page instead of continuing the old one
    def buggy(pre, seq, last, free, ps):
        return [free[0] * ps + i for i in range(seq[0] - pre[0])]

    assert ref.alloc_extend_python(pre, seq, last, free, ps) == [14, 15, 20]
    assert buggy(pre, seq, last, free, ps) != ref.alloc_extend_python(
        pre, seq, last, free, ps
    )


@pytest.mark.parametrize("backend", ["triton", "python"])
def test_allocator_backends_agree_with_torch(backend):
    from memlab.sglang.allocator import PagedTokenToKVPoolAllocator
    from memlab_tests.tools.alloc import check_books, decode, extend

    runs = {}
    for b in ("torch", backend):
        alloc = PagedTokenToKVPoolAllocator(
            256, 4, backend=b, debug_mode=True, device=kernel_device()
        )
        held = {}
        extend(alloc, held, "a", 5)
        extend(alloc, held, "b", 8)
        decode(alloc, held, ["a", "b"])
        alloc.free(torch.tensor(held.pop("a"), device=alloc.device))
        extend(alloc, held, "b", 9)
        decode(alloc, held, ["b"])
        check_books(alloc, held)
        runs[b] = held
    assert runs["torch"] == runs[backend]
