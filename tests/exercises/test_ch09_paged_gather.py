"""Graded: chapter 09, the gather of paged decode attention (exercises/ch09_paged_gather.py).

The kernel's output is compared with dense attention over each request's KV gathered in torch.
"""

import math

import pytest
import torch

from memlab.grading.checks import expect


def points(n):
    return pytest.mark.points(n, exercise="ch09.paged_gather")


def layout(lens, rows, num_slots, kv_heads, head_dim, seed, dtype=torch.float32, device="cpu", poison=False):
    """KV scattered over a pool: each request's tokens on random distinct slots of its row."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_slots, kv_heads, head_dim, generator=g)
    v = torch.randn(num_slots, kv_heads, head_dim, generator=g)
    r2t = torch.zeros(max(rows) + 2, max(lens) + 8, dtype=torch.int32)
    perm = torch.randperm(num_slots - 1, generator=g) + 1
    used, i = [], 0
    for row, n in zip(rows, lens):
        r2t[row, :n] = perm[i:i + n].to(torch.int32)
        used.append(perm[i:i + n])
        i += n
    if poison:  # every slot no request owns holds garbage: reading one shows
        owned = torch.zeros(num_slots, dtype=torch.bool)
        owned[torch.cat(used)] = True
        k[~owned] = 1e4
        v[~owned] = float("nan")
        r2t[r2t == 0] = int(perm[-1])  # past each request's length: an unowned slot
    return k.to(dtype).to(device), v.to(dtype).to(device), r2t.to(device)


def reference(q, k, v, r2t, rows, lens):
    out = []
    group = q.shape[1] // k.shape[1]
    for b, (row, n) in enumerate(zip(rows, lens)):
        s = r2t[row, :n].long()
        kk = k[s].float().repeat_interleave(group, 1)
        vv = v[s].float().repeat_interleave(group, 1)
        p = (torch.einsum("hd,thd->ht", q[b].float(), kk) / math.sqrt(q.shape[-1])).softmax(-1)
        out.append(torch.einsum("ht,thd->hd", p, vv))
    return torch.stack(out)


def run(lens, rows, heads=4, kv_heads=2, head_dim=16, seed=0, dtype=torch.float32, device=None, poison=False,
        atol=1e-4):
    from memlab.env import kernel_device
    from memlab.grading.loader import load

    dev = device or kernel_device()
    k, v, r2t = layout(lens, rows, 256 if device is None else 8192, kv_heads, head_dim, seed, dtype, dev, poison)
    q = torch.randn(len(lens), heads, head_dim, generator=torch.Generator().manual_seed(seed + 1)).to(dtype).to(dev)
    got = load("ch09_paged_gather").decode_attention(
        q, k, v, r2t, torch.tensor(rows, device=dev), torch.tensor(lens, device=dev)).float().cpu()
    want = reference(q.cpu(), k.cpu(), v.cpu(), r2t.cpu(), rows, lens)
    for b in range(len(lens)):
        err = (got[b] - want[b]).abs().max().item()
        expect(err <= atol, f"request {b} (row {rows[b]}, {lens[b]} tokens): output differs from attention over "
                            f"its own KV by {err:.3g} (tolerance {atol:g}); does the gather read row "
                            "req_pool_indices[b] and the right KV head?")


@pytest.mark.kernel
@points(2)
def test_matches_dense_attention():
    # Batch entry b is NOT row b: rows come from req_pool_indices.
    run([1, 7, 33], [4, 1, 2], heads=4, kv_heads=2, seed=1)


@pytest.mark.kernel
@points(1)
def test_grouped_query_heads():
    run([9, 20], [2, 3], heads=8, kv_heads=2, seed=2)
    run([5], [1], heads=2, kv_heads=2, seed=3)


@pytest.mark.kernel
@points(1)
def test_one_token_requests():
    run([1, 1, 1], [3, 1, 2], seed=4)


@pytest.mark.kernel
@points(1)
def test_reads_only_its_own_slots():
    # Slots no request owns hold 1e4 (K) and NaN (V): a gather past seq_len or from the wrong row shows.
    run([3, 17, 40], [5, 2, 1], seed=5, poison=True)


@pytest.mark.kernel
@pytest.mark.gpu
@points(2)
def test_compiled_on_gpu_fp16():
    import random

    rng = random.Random(6)
    lens = [rng.randint(1, 300) for _ in range(24)]
    rows = rng.sample(range(1, 60), 24)
    run(lens, rows, heads=8, kv_heads=2, head_dim=64, seed=7, dtype=torch.float16, device="cuda", atol=2e-2)
