"""Graded: chapter 06, the slot_mapping kernel (exercises/ch06_slot_mapping.py).

The kernel is compared with a plain-Python reference, with guard bands (sentinels) around the
output: the Triton interpreter does not catch stores out of bounds.
"""

import pytest
import torch

from memlab.course.grading.checks import expect_equal
from memlab_tests.exercises.exercise_refs import fenced, i64

GUARD = 16
SENTINEL = -555


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch06.slot_mapping", requires=requires)


def reference(block_table, query_start_loc, positions, block_size, num_tokens_padded):
    out = [-1] * num_tokens_padded
    for r in range(len(query_start_loc) - 1):
        for i in range(query_start_loc[r], query_start_loc[r + 1]):
            p = positions[i]
            out[i] = block_table[r][p // block_size] * block_size + p % block_size
    return out


def compare(block_table, qsl, positions, bs, padded, device=None, wide=0):
    """Run the kernel on a fenced batch (a load past positions or past the block table crashes) and
    compare it with the reference. ``wide``: the block table is a view of a table ``wide`` columns
    wider, so its row stride is not its width."""
    from memlab.common.env import kernel_device
    from memlab.course.grading.loader import load

    dev = device or kernel_device()
    buf = torch.full((padded + 2 * GUARD,), SENTINEL, dtype=torch.int64, device=dev)
    cols = len(block_table[0])
    full = fenced([r + [-7] * wide for r in block_table], torch.int32, dev)
    bt = full[:, :cols] if wide else full
    inputs = (
        bt,
        torch.tensor(qsl, dtype=torch.int32, device=dev),
        fenced(positions, torch.int64, dev),
    )
    before = [x.clone() for x in (full, *inputs[1:])]
    load("ch06_slot_mapping").compute_slot_mapping(
        *inputs, bs, padded, out=buf[GUARD : GUARD + padded]
    )
    buf = buf.cpu()
    expect_equal(
        buf[:GUARD],
        torch.full((GUARD,), SENTINEL),
        "the guard band BEFORE slot_mapping was written to",
    )
    expect_equal(
        buf[GUARD + padded :],
        torch.full((GUARD,), SENTINEL),
        "the guard band AFTER slot_mapping was "
        "written to (a store past the last token: is the mask i < end?)",
    )
    for name, x, b in zip(
        ("block_table", "query_start_loc", "positions"), (full, *inputs[1:]), before
    ):
        expect_equal(x, b, f"the kernel must only read {name}")
    want = reference(block_table, qsl, positions, bs, padded)
    got = buf[GUARD : GUARD + padded].tolist()
    for r in range(len(qsl) - 1):
        a, b = qsl[r], qsl[r + 1]
        expect_equal(
            got[a:b],
            want[a:b],
            f"slots of request {r} (tokens {a}..{b - 1} at positions "
            f"{positions[a:b]}, block table row {block_table[r]}, block size {bs}"
            f"{', a table view with row stride ' + str(cols + wide) if wide else ''})",
        )
    expect_equal(got[qsl[-1] :], want[qsl[-1] :], "padding tokens must get slot -1")


def random_batch(rng, num_reqs, bs, max_blocks, max_tokens, pool_blocks):
    table, qsl, positions = [], [0], []
    for _ in range(num_reqs):
        table.append(rng.sample(range(1, pool_blocks), max_blocks))
        ctx = rng.randint(1, max_blocks * bs)  # tokens in the request after this step
        new = rng.randint(1, min(ctx, max_tokens))  # this step computes the last `new`
        positions += list(range(ctx - new, ctx))
        qsl.append(qsl[-1] + new)
    return table, qsl, positions


def blocks(rng, n, pool=5000):
    return rng.sample(range(1, pool), n)


@pytest.mark.kernel
@points(2)
def test_small_batch_by_hand(rng):
    # Request 0 at positions 2..4 (its first two blocks), request 1 at positions 8, 9 (its
    # third block); block size 4; two padding tokens.
    b = blocks(rng, 5)
    table = [[b[0], b[1], 0], [b[2], b[3], b[4]]]
    compare(table, [0, 3, 5], [2, 3, 4, 8, 9, 0, 0], 4, 7)
    # The same batch with the block table a view of a wider one: row r starts at r *
    # stride, not r * width.
    compare(table, [0, 3, 5], [2, 3, 4, 8, 9, 0, 0], 4, 7, wide=rng.randint(1, 9))


@pytest.mark.kernel
@points(2)
def test_random_batches(rng):
    for bs, pad, wide in ((1, 3, 0), (4, 0, 3), (16, 9, 1), (16, 0, 0)):
        table, qsl, positions = random_batch(rng, rng.randint(1, 5), bs, 6, 70, 500)
        padded = qsl[-1] + pad
        compare(table, qsl, positions + [0] * pad, bs, padded, wide=wide)
    # Block ids of a big pool: block * block_size passes 2^31, so the slot must be
    # computed in int64.
    big = [rng.randint(2**27, 2**31 - 1) for _ in range(3)]
    table = [[big[0], big[1]], [big[2], rng.randint(1, 99)]]
    compare(table, [0, 2, 4], [3, 17, 16, 31], 16, 4)


@pytest.mark.kernel
@points(1, requires="test_small_batch_by_hand")
def test_padding_only_after_requests(rng):
    # A long padded tail (more than one block of 64) after a single decode token.
    pad = rng.randint(65, 140)
    compare([blocks(rng, 2)], [0, 1], [5] + [0] * pad, 4, pad + 1)
    # No padding at all: the last request's tokens end the batch (and the positions tensor).
    compare([blocks(rng, 2), blocks(rng, 2)], [0, 1, 3], [5, 6, 7], 4, 3)


@pytest.mark.kernel
@pytest.mark.gpu
@points(2)
def test_compiled_on_gpu(rng):
    for bs in (16, 64):
        table, qsl, positions = random_batch(rng, 64, bs, 32, 300, 5000)
        padded = qsl[-1] + 37
        compare(table, qsl, positions + [0] * 37, bs, padded, device="cuda")


# -- the learner's kernel against vLLM's slot_mapping (memlab.vllm.block_table), random batches --


def random_case(d):
    from memlab.common.env import kernel_device
    from memlab.course.grading.fuzz import tensor_code
    from memlab.course.grading.loader import load
    from memlab.vllm.block_table import slot_mapping_python as engine
    from memlab_tests.exercises.exercise_refs import INT31, SIZES

    bs = d.pick(SIZES)
    reqs, cols = [], 0
    for _ in d.count(1, 4, 0.5):  # (tokens before this step, tokens this step computes)
        # past a 64-token block too
        new = d.int(64, 2 * 64 + bs) if d.chance(0.3) else d.int(1, 2 * bs + 2)
        ctx = new + (d.int(0, 3 * bs) if d.chance(0.5) else 0)
        reqs.append((ctx - new, new))
        cols = max(cols, -(-ctx // bs))
    pad, wide = (
        d.int(0, 70) if d.chance(0.3) else d.int(0, 3),
        d.int(0, 3) if d.chance(0.3) else 0,
    )
    # block ids of a big pool in random order: slots past 2**31
    table = [d.ids(cols, INT31) for _ in reqs]
    qsl, positions = [0], []
    for done, new in reqs:
        positions += list(range(done, done + new))
        qsl.append(qsl[-1] + new)
    padded = qsl[-1] + pad
    positions += [0] * pad
    d.given(
        block_size=bs,
        block_table=table,
        query_start_loc=qsl,
        positions=positions,
        num_tokens_padded=padded,
        **({"row_stride": cols + wide} if wide else {}),
    )
    d.code(
        f"print(ex.compute_slot_mapping(torch.tensor({table}, dtype=torch.int32), "
        f"torch.tensor({qsl}, dtype=torch.int32), {tensor_code(positions)}, {bs}, {padded}))"
    )
    dev = kernel_device()
    buf = torch.full((padded + 2 * GUARD,), SENTINEL, dtype=torch.int64, device=dev)
    # a load past the table crashes
    full = fenced([r + [-7] * wide for r in table], torch.int32, dev)
    bt = full[:, :cols] if wide else full
    q, pos = (
        torch.tensor(qsl, dtype=torch.int32, device=dev),
        fenced(positions, torch.int64, dev),
    )
    got = d.call(
        "compute_slot_mapping",
        load("ch06_slot_mapping").compute_slot_mapping,
        bt,
        q,
        pos,
        bs,
        padded,
        out=buf[GUARD : GUARD + padded],
        keep=False,
    )
    buf = buf.cpu()
    req_of = [r for r, (_, new) in enumerate(reqs) for _ in range(new)]
    want = torch.tensor(
        engine(table, req_of, positions[: qsl[-1]], bs, padded), dtype=torch.int64
    )
    d.returns(
        "compute_slot_mapping",
        buf[GUARD : GUARD + padded] if torch.is_tensor(got) else got,
        want,
    )
    sentinels = torch.full((GUARD,), SENTINEL)
    d.same(
        "the guard band before slot_mapping",
        buf[:GUARD],
        sentinels,
        "a store before the first token",
    )
    d.same(
        "the guard band after slot_mapping",
        buf[GUARD + padded :],
        sentinels,
        "a store past the last token: is the mask i < end?",
    )
    d.same(
        "the block table after the launch",
        full.cpu(),
        torch.tensor([r + [-7] * wide for r in table], dtype=torch.int32),
        "the kernel must only read it",
    )
    d.same(
        "positions after the launch",
        pos.cpu(),
        i64(*positions),
        "the kernel must only read it",
    )


@pytest.mark.kernel
@points(2)
def test_random_batches_match_the_engine():
    from memlab.course.grading.fuzz import check

    check(random_case, trials=24, name="ch06_slot_mapping")
