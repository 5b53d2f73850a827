"""Allocation benchmarks, measured side by side in one run.

  python bench/bench_alloc.py                 # alloc_extend for a 256-request batch
  python bench/bench_alloc.py --sweep         # batch sizes 1..1024, alloc_extend and alloc_decode
Prints microseconds per call for the torch reference and the Python reference (and the Triton
kernel on a GPU, timed with triton.testing.do_bench), plus free() with page dedup against
free_segment(). On CPU the kernel runs in the interpreter, which says nothing about speed, so it
is left out there.
"""

import argparse
import random
import sys
import time

import torch

from memlab.common.env import ensure_kernel_mode, kernel_device
from memlab.sglang.allocator import PagedTokenToKVPoolAllocator
from memlab.sglang.allocator import reference as ref


def timeit(fn, min_time=0.2):
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_time:
        fn()
        n += 1
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def batch(bs, ps, dev, seed=0):
    rng = random.Random(seed)
    pre = [rng.choice([0, rng.randint(1, 512)]) for _ in range(bs)]
    seq = [p + rng.randint(1, 512) for p in pre]
    last = [
        -1 if p == 0 else (10**6 + i) * ps + (p - 1) % ps for i, p in enumerate(pre)
    ]
    need = ref.num_new_pages(torch.tensor(pre), torch.tensor(seq), ps)
    free = list(range(1, need + 1))
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
    return pre, seq, last, free, t(pre), t(seq), t(last), t(free), sum(seq) - sum(pre)


def extend_row(bs, ps, gpu):
    dev = kernel_device()
    pre, seq, last, free, P, S, L, F, n = batch(bs, ps, dev)
    row = {
        "torch": timeit(lambda: ref.alloc_extend_torch(P, S, L, F, ps, n)),
        "python": timeit(lambda: ref.alloc_extend_python(pre, seq, last, free, ps)),
    }
    if gpu:
        import triton.testing

        from memlab.kernels import alloc_extend

        row["triton"] = (
            triton.testing.do_bench(
                lambda: alloc_extend.alloc_extend(P, S, L, F, ps, n)
            )
            * 1e3
        )
    return row


def decode_row(bs, ps, gpu):
    dev = kernel_device()
    rng = random.Random(bs)
    seq = [rng.randint(1, 4096) for _ in range(bs)]
    last = [
        -1 if s == 1 else (10**6 + i) * ps + (s - 2) % ps for i, s in enumerate(seq)
    ]
    free = list(range(1, bs + 1))
    S, L, F = (
        torch.tensor(x, dtype=torch.int64, device=dev) for x in (seq, last, free)
    )
    row = {
        "torch": timeit(lambda: ref.alloc_decode_torch(S, L, F, ps)),
        "python": timeit(lambda: ref.alloc_decode_python(seq, last, free, ps)),
    }
    if gpu:
        import triton.testing

        from memlab.kernels import alloc_decode

        row["triton"] = (
            triton.testing.do_bench(lambda: alloc_decode.alloc_decode(S, L, F, ps))
            * 1e3
        )
    return row


def free_row(tokens, ps):
    dev = kernel_device()
    pag = PagedTokenToKVPoolAllocator(tokens * 2, ps, device=dev)
    slots = pag.alloc(tokens)

    def with_dedup():
        pag.free(slots)
        pag.free_pages = pag.free_pages[tokens // ps :]

    def segment():
        pag.free_segment(slots, start_pos=0)
        pag.free_pages = pag.free_pages[tokens // ps :]

    return {"free (unique)": timeit(with_dedup), "free_segment": timeit(segment)}


def show(title, rows):
    cols = list(next(iter(rows.values())))
    print(f"\n{title}")
    print(
        f"{'':>14}"
        + "".join(f"{c:>16}" for c in cols)
        + "   ratio "
        + cols[-1]
        + " / "
        + cols[0]
    )
    for key, row in rows.items():
        print(
            f"{key:>14}"
            + "".join(f"{row[c]:>13.1f} us" for c in cols)
            + f"{row[cols[-1]] / row[cols[0]]:>10.2f}x"
        )


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true", help="batch sizes 1..1024")
    ap.add_argument("--page-size", type=int, default=16)
    args = ap.parse_args(argv)
    gpu = ensure_kernel_mode() == "gpu"
    ps = args.page_size
    print(
        f"device: {kernel_device()}, kernel mode: {ensure_kernel_mode()}, page_size {ps}, torch {torch.__version__}"
    )
    sizes = [1, 4, 16, 64, 256, 1024] if args.sweep else [256]
    show(
        "alloc_extend, microseconds per call",
        {f"bs={bs}": extend_row(bs, ps, gpu) for bs in sizes},
    )
    if args.sweep:
        show(
            "alloc_decode, microseconds per call",
            {f"bs={bs}": decode_row(bs, ps, gpu) for bs in sizes},
        )
    show(
        "freeing a request's slots",
        {f"{t} tokens": free_row(t, ps) for t in (1024, 65536)},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
