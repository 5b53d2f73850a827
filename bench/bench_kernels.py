"""Every Triton kernel beside its torch reference, measured side by side in one run.

  python bench/bench_kernels.py            # on a GPU: triton.testing.do_bench, microseconds per call
  python bench/bench_kernels.py --smoke    # tiny sizes; on a CPU the kernels run in the interpreter

Each row first checks that the kernel and the torch reference agree on the same inputs, then
times both. On a CPU the interpreter says nothing about speed: kernels are checked, not timed,
and the torch references are timed with a plain clock.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from memlab.common.env import ensure_kernel_mode, kernel_device


def _clock_us(fn, min_time=0.1) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_time:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n * 1e6


def timer(gpu: bool):
    if gpu:
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn) * 1e3  # ms -> us
    return _clock_us


def _pages(bs, ps, dev, gen, max_len):
    pre = torch.randint(0, max_len, (bs,), generator=gen) * torch.randint(0, 2, (bs,), generator=gen)
    seq = pre + torch.randint(1, max_len, (bs,), generator=gen)
    need = int(((seq + ps - 1) // ps - (pre + ps - 1) // ps).sum())
    last = torch.where(pre > 0, (10**6 + torch.arange(bs)) * ps + (pre - 1) % ps, -1)
    free = torch.arange(1, need + 1)
    return [x.to(dev) for x in (pre, seq, last, free)], int((seq - pre).sum())


def alloc_extend_row(gen, dev, smoke):
    from memlab.sglang.allocator import reference as ref
    from memlab.kernels import alloc_extend

    bs, ps = (8, 4) if smoke else (256, 16)
    (pre, seq, last, free), n = _pages(bs, ps, dev, gen, 32 if smoke else 512)
    kernel = lambda: alloc_extend.alloc_extend(pre, seq, last, free, ps, n)  # noqa: E731
    torch_ref = lambda: ref.alloc_extend_torch(pre, seq, last, free, ps, n)  # noqa: E731
    return f"alloc_extend bs={bs} ps={ps} ({n} tokens)", kernel, torch_ref, torch.equal


def alloc_decode_row(gen, dev, smoke):
    from memlab.sglang.allocator import reference as ref
    from memlab.kernels import alloc_decode

    bs, ps = (8, 4) if smoke else (256, 16)
    seq = torch.randint(1, 2048, (bs,), generator=gen)
    last = (10**6 + torch.arange(bs)) * ps + (seq - 2) % ps
    free = torch.arange(1, bs + 1)
    seq, last, free = seq.to(dev), last.to(dev), free.to(dev)
    kernel = lambda: alloc_decode.alloc_decode(seq, last, free, ps)  # noqa: E731
    torch_ref = lambda: ref.alloc_decode_torch(seq, last, free, ps)  # noqa: E731
    return f"alloc_decode bs={bs} ps={ps}", kernel, torch_ref, torch.equal


def slot_mapping_row(gen, dev, smoke):
    from memlab.kernels import slot_mapping
    from memlab.vllm.block_table import slot_mapping_torch

    reqs, blocks, bsz, tokens = (4, 8, 4, 24) if smoke else (256, 128, 16, 8192)
    table = torch.randint(0, 10**5, (reqs, blocks), generator=gen, dtype=torch.int32).to(dev)
    req = torch.randint(0, reqs, (tokens,), generator=gen).to(dev)
    pos = torch.randint(0, blocks * bsz, (tokens,), generator=gen).to(dev)
    real = tokens - tokens // 8  # the rest is padding (-1)
    kernel = lambda: slot_mapping.compute_slot_mapping(table, req, pos, bsz, real)  # noqa: E731
    torch_ref = lambda: slot_mapping_torch(table, req, pos, bsz, real)  # noqa: E731
    return f"slot_mapping {tokens} tokens bs={bsz}", kernel, torch_ref, torch.equal


def store_kv_row(gen, dev, smoke):
    from memlab.kernels import store_kv
    from memlab.vllm.block_table import store_kv_torch

    tokens, heads, dim, nblocks, bsz = (12, 2, 8, 8, 4) if smoke else (8192, 8, 128, 1024, 16)
    dtype = torch.float32 if smoke else torch.float16
    key = torch.randn(tokens, heads, dim, generator=gen).to(dev, dtype)
    value = torch.randn(tokens, heads, dim, generator=gen).to(dev, dtype)
    slots = torch.randperm(nblocks * bsz, generator=gen)[:tokens].to(dev)
    slots[-1] = -1  # a padded token
    caches = [torch.zeros(nblocks, bsz, heads, dim, dtype=dtype, device=dev) for _ in range(4)]
    kernel = lambda: (store_kv.store_kv(key, value, caches[0], caches[1], slots), caches[0])[1]  # noqa: E731
    torch_ref = lambda: (store_kv_torch(key, value, caches[2], caches[3], slots), caches[2])[1]  # noqa: E731
    return f"store_kv {tokens} tokens {heads}x{dim} {str(dtype)[6:]}", kernel, torch_ref, torch.equal


def paged_attention_row(gen, dev, smoke):
    from memlab.common import attention as A

    bs, heads, kv_heads, dim, seq_len, bsz = (2, 4, 2, 16, 9, 4) if smoke else (64, 32, 8, 128, 1024, 16)
    dtype = torch.float32 if smoke else torch.float16
    per_req = math.ceil(seq_len / bsz)
    nblocks = bs * per_req + 1
    q = torch.randn(bs, heads, dim, generator=gen).to(dev, dtype)
    k = torch.randn(nblocks, bsz, kv_heads, dim, generator=gen).to(dev, dtype)
    v = torch.randn(nblocks, bsz, kv_heads, dim, generator=gen).to(dev, dtype)
    table = (torch.randperm(nblocks - 1, generator=gen)[: bs * per_req] + 1).view(bs, per_req).to(dev, torch.int32)
    lens = torch.full((bs,), seq_len, dtype=torch.int32, device=dev)
    scale = dim ** -0.5
    kernel = lambda: A.paged_attention(q, k, v, table, lens, scale)  # noqa: E731

    def torch_ref():
        slots, mask = A.slots_from_block_table(table, lens, bsz)
        return A.attention_over_slots(q, k.flatten(0, 1), v.flatten(0, 1), slots, mask, scale)

    atol = 2e-3 if dtype == torch.float16 else 1e-5  # memlab.common.attention's tolerances
    close = lambda a, b: torch.allclose(a.float(), b.float(), atol=atol)  # noqa: E731
    return f"paged_attention bs={bs} {heads}/{kv_heads} heads d={dim} len={seq_len} {str(dtype)[6:]}", \
        kernel, torch_ref, close


ROWS = (alloc_extend_row, alloc_decode_row, slot_mapping_row, store_kv_row, paged_attention_row)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (a quick check that every row runs)")
    a = ap.parse_args(argv)
    gpu = ensure_kernel_mode() == "gpu"
    if not gpu and not a.smoke:
        print("no GPU: the interpreter runs the smoke sizes only (the full sizes would take hours)")
        a.smoke = True
    dev, time_us = kernel_device(), timer(gpu)
    where = f"GPU ({torch.cuda.get_device_name()}), do_bench" if gpu else "CPU (kernels in the interpreter: not timed)"
    print(f"kernels vs torch references, microseconds per call, on {where}")
    print(f"{'case':<58} {'triton us':>10} {'torch us':>10} {'torch/triton':>12}")
    failed = 0
    for row in ROWS:
        gen = torch.Generator().manual_seed(0)
        name, kernel, torch_ref, same = row(gen, dev, a.smoke)
        if not same(kernel(), torch_ref()):
            failed += 1
            print(f"{name:<58} MISMATCH: the kernel and the torch reference disagree")
            continue
        t_ref = time_us(torch_ref)
        if gpu:
            t_k = time_us(kernel)
            print(f"{name:<58} {t_k:>10.1f} {t_ref:>10.1f} {t_ref / t_k:>11.2f}x")
        else:
            print(f"{name:<58} {'(checked)':>10} {t_ref:>10.1f} {'-':>12}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
