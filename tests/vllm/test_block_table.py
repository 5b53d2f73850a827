"""slot_mapping and store_kv: kernel == torch reference == Python reference, with guard bands;
the BlockTable that feeds them; bad inputs."""

import random

import pytest
import torch

from memlab.common.env import kernel_device
from memlab.vllm.block_table import (
    BACKENDS,
    BlockTable,
    compute_slot_mapping,
    slot_mapping_python,
    slot_mapping_torch,
    store_kv,
    store_kv_python,
    store_kv_torch,
)

GUARD, SENTINEL = 16, -7777


def guarded_table(rows, width, dev):
    """A random block table as a view inside a SENTINEL-filled buffer: a read past a row's end
    or past the table returns SENTINEL and shows up as a wrong slot."""
    buf = torch.full((rows + 2, width + GUARD), SENTINEL, dtype=torch.int32, device=dev)
    table = buf[1 : rows + 1, :width]
    table.copy_(torch.randint(0, 1000, (rows, width), dtype=torch.int32))
    return table


def random_batch(rng, rows, width, bs, n):
    req = [rng.randrange(rows) for _ in range(n)]
    pos = [rng.randrange(width * bs) for _ in range(n)]
    return req, pos


@pytest.mark.kernel
@pytest.mark.parametrize("bs", [1, 16])
@pytest.mark.parametrize(
    "rows,width,n,pad", [(1, 1, 1, 0), (3, 5, 40, 7), (8, 33, 300, 100)]
)
def test_slot_mapping_kernel_equals_references(bs, rows, width, n, pad):
    from memlab.kernels import slot_mapping

    rng = random.Random(rows * 1000 + n + bs)
    torch.manual_seed(rows + n)
    dev = kernel_device()
    table = guarded_table(rows, width, dev)
    req, pos = random_batch(rng, rows, width, bs, n)
    want = slot_mapping_python(table.cpu().tolist(), req, pos, bs, n + pad)
    R = torch.tensor(req + [0] * pad, dtype=torch.int32, device=dev)
    P = torch.tensor(pos + [0] * pad, dtype=torch.int64, device=dev)
    assert slot_mapping_torch(table, R, P, bs, n).tolist() == want
    out_buf = torch.full(
        (n + pad + 2 * GUARD,), SENTINEL, dtype=torch.int64, device=dev
    )
    out = out_buf[GUARD : GUARD + n + pad]
    slot_mapping.compute_slot_mapping(table, R, P, bs, n, out=out)
    assert out.tolist() == want
    bands = torch.cat((out_buf[:GUARD], out_buf[GUARD + n + pad :]))
    assert (bands == SENTINEL).all(), "slot_mapping wrote outside its output"
    assert want[n:] == [-1] * pad


@pytest.mark.kernel
def test_slot_mapping_kernel_masks_reads_it_cannot_make():
    """The host refuses bad tokens; the kernel, called directly, still reads nothing outside the
    table (it writes -1) - the interpreter would not catch such a read."""
    from memlab.kernels import slot_mapping

    dev = kernel_device()
    table = guarded_table(2, 3, dev)
    R = torch.tensor([0, 5, -1, 1], dtype=torch.int32, device=dev)
    # row 5, row -1, block 3 of 3
    P = torch.tensor([3, 0, 0, 3 * 4], dtype=torch.int64, device=dev)
    out = slot_mapping.compute_slot_mapping(table, R, P, 4)
    assert out.tolist() == [int(table[0, 0]) * 4 + 3, -1, -1, -1]


def guarded_cache(shape, dtype, dev):
    buf = torch.full((shape[0] + 2,) + shape[1:], SENTINEL, dtype=dtype, device=dev)
    return buf[1:-1], buf


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(
    "T,H,D,Dv,bs,nb", [(1, 1, 4, 4, 1, 2), (13, 2, 8, 8, 4, 6), (40, 4, 16, 12, 16, 5)]
)
def test_store_kv_kernel_equals_references(dtype, T, H, D, Dv, bs, nb):
    from memlab.kernels import store_kv as kernel

    dev = kernel_device()
    torch.manual_seed(T * 7 + bs)
    num_slots = nb * bs
    slots = torch.randperm(num_slots)[:T].tolist()
    # some padding
    slots = [s if random.Random(s).random() > 0.2 else -1 for s in slots]
    slots += [-1] * (T - len(slots))
    S = torch.tensor(slots, dtype=torch.int64, device=dev)
    key = torch.randn(T, H, D, dtype=dtype, device=dev)
    value = torch.randn(T, H, Dv, dtype=dtype, device=dev)
    results = []
    for fn in (store_kv_python, store_kv_torch, kernel.store_kv):
        kc, kbuf = guarded_cache((nb, bs, H, D), dtype, dev)
        vc, vbuf = guarded_cache((nb, bs, H, Dv), dtype, dev)
        kc.zero_(), vc.zero_()
        fn(key, value, kc, vc, S)
        for buf, name in ((kbuf, "key"), (vbuf, "value")):
            assert (buf[0] == SENTINEL).all() and (buf[-1] == SENTINEL).all(), (
                f"{fn.__name__} wrote past the {name} cache"
            )
        results.append((kc.cpu(), vc.cpu()))
    for kc, vc in results[1:]:
        assert torch.equal(kc, results[0][0]) and torch.equal(vc, results[0][1])
    kc = results[0][0].reshape(num_slots, H, D)
    for t, s in enumerate(slots):  # and each stored row is the token's K
        if s >= 0:
            assert torch.equal(kc[s], key[t].cpu())
    untouched = [s for s in range(num_slots) if s not in slots]
    assert (kc[untouched] == 0).all()


@pytest.mark.kernel
def test_store_kv_kernel_masks_slots_the_host_did_not_check():
    """The wrapper refuses a slot past the cache only for a CPU slot_mapping; called directly (as
    with a GPU slot_mapping), the kernel's mask still keeps such slots inside the cache."""
    from memlab.kernels import store_kv as kernel

    dev = kernel_device()
    kc, kbuf = guarded_cache((2, 4, 1, 2), torch.float32, dev)
    vc, vbuf = guarded_cache((2, 4, 1, 2), torch.float32, dev)
    kc.zero_(), vc.zero_()
    key = torch.ones(4, 1, 2, device=dev)
    kernel.store_kv(
        key, key, kc, vc, torch.tensor([8, 11, -5, 3], dtype=torch.int64, device=dev)
    )
    for buf in (kbuf, vbuf):
        assert (buf[0] == SENTINEL).all() and (buf[-1] == SENTINEL).all()
    assert kc.reshape(8, 2).any(-1).nonzero().reshape(-1).tolist() == [3]


@pytest.mark.kernel
@pytest.mark.parametrize("backend", BACKENDS)
def test_block_table_to_slot_mapping_to_store(backend):
    """The worker's path: rows appended as blocks arrive, slot_mapping for a padded batch, KV
    stored."""
    dev = kernel_device()
    bt = BlockTable(
        block_size=4,
        max_num_reqs=3,
        max_num_blocks_per_req=4,
        max_num_batched_tokens=16,
        device=dev,
    )
    bt.add_row([7, 2], 0)
    bt.add_row([3], 1)
    bt.append_row([9], 1)  # request 1 grew a block
    assert bt.get_row(0) == [7, 2] and bt.get_row(1) == [3, 9]
    R = torch.tensor([0, 0, 0, 1, 1, 1], dtype=torch.int32, device=dev)
    P = torch.tensor([0, 5, 7, 0, 3, 4], dtype=torch.int64, device=dev)
    slots = bt.compute_slot_mapping(R, P, num_padded=8, backend=backend)
    assert slots.tolist() == [28, 9, 11, 12, 15, 36, -1, -1]
    key = torch.arange(8 * 2, dtype=torch.float32, device=dev).reshape(8, 1, 2)
    kc = torch.zeros(10, 4, 1, 2, device=dev)
    vc = torch.zeros(10, 4, 1, 2, device=dev)
    store_kv(key, key, kc, vc, slots, backend=backend)
    assert kc[7, 0].tolist() == [[0.0, 1.0]] and kc[9, 0].tolist() == [[10.0, 11.0]]
    # the two padded tokens wrote nothing
    assert int((kc.reshape(-1, 2) != 0).any(-1).sum()) == 6


def test_block_table_rows_are_append_only_and_refusals_change_nothing():
    bt = BlockTable(
        block_size=4, max_num_reqs=2, max_num_blocks_per_req=3, max_num_batched_tokens=8
    )
    bt.add_row([1, 2], 0)
    with pytest.raises(
        ValueError, match="row 0 holds 2 blocks; 2 more exceed max_num_blocks_per_req=3"
    ):
        bt.append_row([3, 4], 0)
    with pytest.raises(ValueError, match="exceed"):
        bt.add_row([5, 6, 7, 8], 0)
    assert bt.get_row(0) == [1, 2]
    with pytest.raises(ValueError, match="row_idx must be an int >= 0 and <= 1, got 2"):
        bt.append_row([1], 2)
    with pytest.raises(ValueError, match=r"block_ids must hold ints >= 0 .*, got -3"):
        bt.append_row([-3], 1)
    bt.move_row(0, 1)
    assert bt.get_row(1) == [1, 2]
    bt.clear()
    assert bt.get_row(0) == [] and bt.block_table.dtype == torch.int32


def test_block_table_keeps_row_lengths_in_one_tensor_updated_in_place():
    bt = BlockTable(
        block_size=4, max_num_reqs=3, max_num_blocks_per_req=4, max_num_batched_tokens=8
    )
    counts = bt.num_blocks_per_row
    assert (
        isinstance(counts, torch.Tensor)
        and counts.device.type == "cpu"
        and counts.dtype == torch.int64
    )
    bt.add_row([1, 2], 0)
    bt.append_row([3], 0)
    bt.move_row(0, 2)
    assert bt.num_blocks_per_row is counts and counts.tolist() == [3, 0, 3]
    with pytest.raises(ValueError, match="exceed"):
        bt.add_row([4, 5, 6, 7, 8], 2)
    assert counts.tolist() == [3, 0, 3]
    bt.clear()
    assert bt.num_blocks_per_row is counts and counts.tolist() == [0, 0, 0]


def test_slot_mapping_bad_inputs_name_the_token():
    bt = BlockTable(
        block_size=4, max_num_reqs=2, max_num_blocks_per_req=3, max_num_batched_tokens=8
    )
    bt.add_row([5], 0)
    R = torch.tensor([0, 0], dtype=torch.int32)
    with pytest.raises(
        ValueError, match=r"\(the block a position needs\)\[1\] = 1 is outside 0..0"
    ):
        bt.compute_slot_mapping(R, torch.tensor([3, 4]), backend="torch")
    with pytest.raises(ValueError, match=r"req_indices\[0\] = 7 is outside 0..1"):
        bt.compute_slot_mapping(
            torch.tensor([7, 0]), torch.tensor([0, 1]), backend="torch"
        )
    with pytest.raises(
        ValueError, match="num_padded must be an int >= 2 and <= 8, got 9"
    ):
        bt.compute_slot_mapping(R, torch.tensor([0, 1]), num_padded=9, backend="torch")
    with pytest.raises(ValueError, match="backend must be one of"):
        bt.compute_slot_mapping(R, torch.tensor([0, 1]), backend="cuda")
    with pytest.raises(TypeError, match="block_table must be int32"):
        compute_slot_mapping(
            bt.block_table.long(), R, torch.tensor([0, 1]), 4, backend="torch"
        )


def test_store_kv_bad_inputs():
    k = torch.zeros(2, 1, 4)
    kc = torch.zeros(3, 4, 1, 4)
    with pytest.raises(ValueError, match=r"slot_mapping\[1\] = 12 is outside -1..11"):
        store_kv(k, k, kc, kc.clone(), torch.tensor([0, 12]), backend="torch")
    with pytest.raises(ValueError, match="shapes disagree"):
        store_kv(
            k,
            k,
            torch.zeros(3, 4, 2, 4),
            torch.zeros(3, 4, 2, 4),
            torch.tensor([0, 1]),
            backend="torch",
        )
    with pytest.raises(TypeError, match="dtypes differ"):
        store_kv(k.half(), k, kc, kc.clone(), torch.tensor([0, 1]), backend="torch")
    with pytest.raises(TypeError, match="int32/int64"):
        store_kv(k, k, kc, kc.clone(), torch.tensor([0.0, 1.0]), backend="torch")
