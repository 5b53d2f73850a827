"""Every Triton kernel beside its torch reference, and SGLang 0.5.23's own allocator kernels
(from its wheel) beside memlab's, measured side by side in one run.

  python bench/bench_kernels.py            # on a GPU: compiled kernels, triton.testing.do_bench
  python bench/bench_kernels.py --smoke    # tiny sizes (without a GPU these are the only sizes)

Each row first checks that every implementation gives the same result on the same
inputs, then times them. The first line names the mode: on a GPU the kernels are
compiled and timed with do_bench; without one they run in Triton's interpreter (NumPy,
one program after another), so the kernel times and ratios there compare interpreted
programs, not GPU code. SGLang's kernels are executed from the wheel's own file
(sglang/kernels/ops/memory/allocator.py, which imports only torch and triton), fetched
once by tests/tools/engines/wheels.py into its cache (MEMLAB_ENGINES_CACHE); without the
wheel their column says why.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import runpy
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from memlab.common.env import ensure_kernel_mode, kernel_device

ROOT = Path(__file__).resolve().parents[1]
SGLANG_KERNELS = "sglang/kernels/ops/memory/allocator.py"


class Row(NamedTuple):
    name: str
    kernel: Callable
    torch_ref: Callable
    same: Callable
    sglang: Callable | None = (
        None  # SGLang's kernel on the same inputs, where SGLang has one
    )


def sglang_kernels():
    """SGLang's allocator kernels module and "", or None and why not (call after the kernel mode is
    set: triton.jit reads TRITON_INTERPRET when the file runs)."""
    import pytest

    runpy.run_path(str(ROOT / "tests" / "tools" / "loading.py"))["register"]()
    from memlab_tests.tools.engines.wheels import extracted

    try:
        path = extracted("sglang", [SGLANG_KERNELS]) / SGLANG_KERNELS
    # no wheel and no network: the loader's own message
    except pytest.skip.Exception as exc:
        return None, str(exc.msg)
    spec = importlib.util.spec_from_file_location("sglang_allocator_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, ""


def side_by_side(fns: dict, gpu: bool, rounds: int = 3, min_time: float = 0.05) -> dict:
    """Microseconds per call of each function. GPU: do_bench each. CPU: the best of ``rounds``
    rounds, the functions taking turns within each round, in CPU time of this process (one
    thread), so waiting for a busy machine's cores counts for none of them."""
    if gpu:
        import triton.testing

        # ms -> us
        return {k: triton.testing.do_bench(fn) * 1e3 for k, fn in fns.items()}
    best = dict.fromkeys(fns, math.inf)
    for fn in fns.values():
        fn()  # warm up
    for _ in range(rounds):
        for k, fn in fns.items():
            n, t0 = 0, time.process_time()
            while n == 0 or time.process_time() - t0 < min_time:
                fn()
                n += 1
            best[k] = min(best[k], (time.process_time() - t0) / n * 1e6)
    return best


def _pages(bs, ps, dev, gen, max_len):
    pre = torch.randint(0, max_len, (bs,), generator=gen) * torch.randint(
        0, 2, (bs,), generator=gen
    )
    seq = pre + torch.randint(1, max_len, (bs,), generator=gen)
    need = int(((seq + ps - 1) // ps - (pre + ps - 1) // ps).sum())
    last = torch.where(pre > 0, (10**6 + torch.arange(bs)) * ps + (pre - 1) % ps, -1)
    free = torch.arange(1, need + 1)
    return [x.to(dev) for x in (pre, seq, last, free)], int((seq - pre).sum())


def _sglang_extend(sg, pre, seq, last, free, ps, n):
    """SGLang's launch (PagedTokenToKVPoolAllocator.alloc_extend): bs_upper and page_size
    constexpr."""
    import triton

    out = torch.empty(n, dtype=torch.int64, device=seq.device)
    sg.alloc_extend_kernel[(len(seq),)](
        pre, seq, last, free, out, triton.next_power_of_2(len(seq)), ps
    )
    return out


def _extend_row(name, bs, ps, max_len, gen, dev, sg):
    from memlab.kernels import alloc_extend
    from memlab.sglang.allocator import reference as ref

    (pre, seq, last, free), n = _pages(bs, ps, dev, gen, max_len)
    return Row(
        f"{name} bs={bs} ps={ps} ({n} tokens)",
        lambda: alloc_extend.alloc_extend(pre, seq, last, free, ps, n),
        lambda: ref.alloc_extend_torch(pre, seq, last, free, ps, n),
        torch.equal,
        sg and (lambda: _sglang_extend(sg, pre, seq, last, free, ps, n)),
    )


def alloc_extend_row(gen, dev, smoke, sg):
    return _extend_row(
        "alloc_extend", *((8, 4, 32) if smoke else (256, 16, 512)), gen, dev, sg
    )


def long_prefill_row(gen, dev, smoke, sg):
    """Few requests, long extends: the whole-page loop (memlab: 256 tokens a trip, SGLang: 4096)."""
    return _extend_row(
        "alloc_extend long", *((2, 16, 600) if smoke else (8, 16, 8192)), gen, dev, sg
    )


def alloc_decode_row(gen, dev, smoke, sg):
    import triton

    from memlab.kernels import alloc_decode
    from memlab.sglang.allocator import reference as ref

    bs, ps = (8, 4) if smoke else (256, 16)
    seq = torch.randint(1, 2048, (bs,), generator=gen)
    # SGLang's dtypes for both kernels: int64 lengths, last_loc read from req_to_token (int32).
    last = ((10**4 + torch.arange(bs)) * ps + (seq - 2) % ps).to(torch.int32)
    free = torch.arange(1, bs + 1)
    seq, last, free = seq.to(dev), last.to(dev), free.to(dev)

    def sglang():  # SGLang's launch (PagedTokenToKVPoolAllocator.alloc_decode)
        out = torch.empty(bs, dtype=torch.int64, device=dev)
        sg.alloc_decode_kernel[(bs,)](
            seq, last, free, out, triton.next_power_of_2(bs), ps
        )
        return out

    return Row(
        f"alloc_decode bs={bs} ps={ps}",
        lambda: alloc_decode.alloc_decode(seq, last, free, ps),
        lambda: ref.alloc_decode_torch(seq, last.long(), free, ps),
        torch.equal,
        sg and sglang,
    )


def slot_mapping_row(gen, dev, smoke, sg):
    from memlab.kernels import slot_mapping
    from memlab.vllm.block_table import slot_mapping_torch

    reqs, blocks, bsz, tokens = (4, 8, 4, 24) if smoke else (256, 128, 16, 8192)
    table = torch.randint(
        0, 10**5, (reqs, blocks), generator=gen, dtype=torch.int32
    ).to(dev)
    # vLLM's dtypes
    req = torch.randint(0, reqs, (tokens,), generator=gen, dtype=torch.int32).to(dev)
    pos = torch.randint(0, blocks * bsz, (tokens,), generator=gen).to(dev)
    real = tokens - tokens // 8  # the rest is padding (-1)
    kernel = lambda: slot_mapping.compute_slot_mapping(table, req, pos, bsz, real)  # noqa: E731
    torch_ref = lambda: slot_mapping_torch(table, req, pos, bsz, real)  # noqa: E731
    return Row(f"slot_mapping {tokens} tokens bs={bsz}", kernel, torch_ref, torch.equal)


def store_kv_row(gen, dev, smoke, sg):
    from memlab.kernels import store_kv
    from memlab.vllm.block_table import store_kv_torch

    tokens, heads, dim, nblocks, bsz = (
        (12, 2, 8, 8, 4) if smoke else (8192, 8, 128, 1024, 16)
    )
    dtype = torch.float32 if smoke else torch.float16
    key = torch.randn(tokens, heads, dim, generator=gen).to(dev, dtype)
    value = torch.randn(tokens, heads, dim, generator=gen).to(dev, dtype)
    slots = torch.randperm(nblocks * bsz, generator=gen)[:tokens].to(dev)
    slots[-1] = -1  # a padded token
    caches = [
        torch.zeros(nblocks, bsz, heads, dim, dtype=dtype, device=dev) for _ in range(4)
    ]

    def kernel():
        return (
            store_kv.store_kv(key, value, caches[0], caches[1], slots),
            caches[0],
        )[1]

    def torch_ref():
        return (
            store_kv_torch(key, value, caches[2], caches[3], slots),
            caches[2],
        )[1]

    return Row(
        f"store_kv {tokens} tokens {heads}x{dim} {str(dtype)[6:]}",
        kernel,
        torch_ref,
        torch.equal,
    )


def paged_attention_row(gen, dev, smoke, sg):
    from memlab.common import attention as A

    bs, heads, kv_heads, dim, seq_len, bsz = (
        (2, 4, 2, 16, 9, 4) if smoke else (64, 32, 8, 128, 1024, 16)
    )
    dtype = torch.float32 if smoke else torch.float16
    per_req = math.ceil(seq_len / bsz)
    nblocks = bs * per_req + 1
    q = torch.randn(bs, heads, dim, generator=gen).to(dev, dtype)
    k = torch.randn(nblocks, bsz, kv_heads, dim, generator=gen).to(dev, dtype)
    v = torch.randn(nblocks, bsz, kv_heads, dim, generator=gen).to(dev, dtype)
    table = (
        (torch.randperm(nblocks - 1, generator=gen)[: bs * per_req] + 1)
        .view(bs, per_req)
        .to(dev, torch.int32)
    )
    lens = torch.full((bs,), seq_len, dtype=torch.int32, device=dev)
    scale = dim**-0.5
    kernel = lambda: A.paged_attention(q, k, v, table, lens, scale)  # noqa: E731

    def torch_ref():
        slots, mask = A.slots_from_block_table(table, lens, bsz)
        return A.attention_over_slots(
            q, k.flatten(0, 1), v.flatten(0, 1), slots, mask, scale
        )

    # memlab.common.attention's tolerances
    atol = 2e-3 if dtype == torch.float16 else 1e-5
    close = lambda a, b: torch.allclose(a.float(), b.float(), atol=atol)  # noqa: E731
    return Row(
        f"paged_attention bs={bs} {heads}/{kv_heads} heads d={dim} len={seq_len} {str(dtype)[6:]}",
        kernel,
        torch_ref,
        close,
    )


ROWS = (
    alloc_extend_row,
    long_prefill_row,
    alloc_decode_row,
    slot_mapping_row,
    store_kv_row,
    paged_attention_row,
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes (a quick check that every row runs)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="CPU: timing rounds, the best one counts (default 3)",
    )
    a = ap.parse_args(argv)
    gpu = ensure_kernel_mode() == "gpu"
    if not gpu:
        # the interpreter runs one program at a time: the references too
        torch.set_num_threads(1)
        if not a.smoke:
            print(
                "no GPU: the interpreter runs the smoke sizes only "
                "(the full sizes would take hours)"
            )
            a.smoke = True
    dev = kernel_device()
    sg, why = sglang_kernels()
    if gpu:
        print(
            f"mode: compiled kernels on {torch.cuda.get_device_name()} (triton.testing.do_bench), "
            "microseconds per call"
        )
    else:
        print(
            "mode: Triton interpreter on the CPU (TRITON_INTERPRET=1), microseconds per call: the "
            "kernel columns time interpreted programs, not GPU code"
        )
    print(
        "SGLang 0.5.23's kernels: "
        + (f"from {SGLANG_KERNELS} in its wheel" if sg else f"not loaded ({why})")
    )
    print(
        f"{'case':<50} {'memlab us':>10} {'SGLang us':>10} {'torch us':>10} {'SGLang/memlab':>14} "
        f"{'torch/memlab':>13}"
    )
    failed = 0
    for make in ROWS:
        row = make(torch.Generator().manual_seed(0), dev, a.smoke, sg)
        fns = {"memlab": row.kernel, "torch": row.torch_ref} | (
            {"sglang": row.sglang} if row.sglang else {}
        )
        want = row.torch_ref()
        bad = [k for k, fn in fns.items() if not row.same(fn(), want)]
        if bad:
            failed += 1
            print(
                f"{row.name:<50} MISMATCH: {', '.join(bad)} disagree with the torch reference"
            )
            continue
        t = side_by_side(fns, gpu, rounds=a.rounds)
        sg_us, sg_ratio = (
            (f"{t['sglang']:.1f}", f"{t['sglang'] / t['memlab']:.3g}x")
            if row.sglang
            else ("-", "-")
        )
        print(
            f"{row.name:<50} {t['memlab']:>10.1f} {sg_us:>10} {t['torch']:>10.1f} {sg_ratio:>14} "
            f"{t['torch'] / t['memlab']:>12.3g}x"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
