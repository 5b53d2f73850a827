"""Allocation benchmarks, measured side by side in one run.

  python bench/bench_alloc.py            # alloc_extend, a 256-request batch on pages of 16
  python bench/bench_alloc.py --sweep    # batch sizes 1..1024, alloc_extend and alloc_decode
  python bench/bench_alloc.py --smoke    # small sizes, quick (what the test runs)

alloc_extend: memlab's torch reference beside SGLang 0.5.23's ``alloc_extend_naive`` (its
fallback without Triton, ``sglang/srt/mem_cache/allocator/paged.py``, executed from the wheel's
own file, fetched once by tests/tools/engines/wheels.py) and the plain-Python reference. Each row
first checks that the outputs are identical, then times the implementations in interleaved
rounds and keeps each one's fastest round (the machine's other load only ever adds time). Then
the allocator's whole call (checks, capacity, the reference, the free list's cut) with debug
mode off, as measured, and on, its cost printed apart. On a GPU the Triton kernel too, timed
with triton.testing.do_bench; in the interpreter a kernel's time says nothing about speed, so it
is left out there. torch runs on ``--threads`` threads (1 by default: both sides alike, and
steady on a shared machine). The last line reads
``torch alloc_extend vs SGLang's alloc_extend_naive (bs 256, page 16): N.NNx``.
"""

from __future__ import annotations

import argparse
import random
import runpy
import sys
import time
from pathlib import Path

import torch

from memlab.common.env import ensure_kernel_mode, kernel_device
from memlab.sglang.allocator import PagedTokenToKVPoolAllocator
from memlab.sglang.allocator import reference as ref

ROOT = Path(__file__).resolve().parents[1]


def sglang_naive():
    """SGLang's ``alloc_extend_naive`` from the wheel and "", or None and why not."""
    import pytest

    runpy.run_path(str(ROOT / "tests" / "tools" / "loading.py"))["register"]()
    from memlab_tests.tools.engines.sglang_loader import _Loader
    from memlab_tests.tools.engines.wheels import unpacked

    try:
        root = unpacked("sglang")
    except pytest.skip.Exception as exc:  # no wheel and no network: the loader's words
        return None, str(exc.msg)
    paged = _Loader(root).pick(
        "sglang.srt.mem_cache.allocator.paged", ["alloc_extend_naive"]
    )
    return paged.alloc_extend_naive, ""


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def side_by_side(fns: dict, rounds: int, min_time: float) -> dict:
    """Microseconds per call of each function: interleaved rounds, each one's fastest round."""
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        fn()  # warm up
    for _ in range(rounds):
        for name, fn in fns.items():
            n, t0 = 0, time.perf_counter()
            while True:
                fn()
                n += 1
                sync()
                if time.perf_counter() - t0 >= min_time:
                    break
            best[name] = min(best[name], (time.perf_counter() - t0) / n * 1e6)
    return best


def batch(bs, ps, dev, max_len=512, seed=0):
    """Half the requests with a prefix (their last page partly filled), every one extending by up
    to ``max_len`` tokens; the free list holds exactly the pages the batch needs."""
    rng = random.Random(seed)
    pre = [rng.choice([0, rng.randint(1, max_len)]) for _ in range(bs)]
    seq = [p + rng.randint(1, max_len) for p in pre]
    last = [
        -1 if p == 0 else (10**6 + i) * ps + (p - 1) % ps for i, p in enumerate(pre)
    ]
    need = ref.num_new_pages(torch.tensor(pre), torch.tensor(seq), ps)
    free = list(range(1, need + 1))
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
    return pre, seq, last, free, t(pre), t(seq), t(last), t(free), sum(seq) - sum(pre)


def extend_row(bs, ps, gpu, naive, rounds, min_time, python=True):
    dev = kernel_device()
    pre, seq, last, free, P, S, L, F, n = batch(bs, ps, dev)
    pages = ref.num_new_pages(torch.tensor(pre), torch.tensor(seq), ps)

    def sglang_naive_call():  # SGLang's allocator: an output buffer, then the fallback
        out = torch.empty(n, dtype=torch.int64, device=dev)
        naive(P, S, L, F, out, ps, dev)
        return out

    fns = {"torch": lambda: ref.alloc_extend_torch(P, S, L, F, ps, n, pages)}
    if naive is not None:
        fns["sglang naive"] = sglang_naive_call
    if python:
        fns["python"] = lambda: ref.alloc_extend_python(pre, seq, last, free, ps)
    want = fns["torch"]().cpu().tolist()
    for name, fn in fns.items():
        got = fn()
        got = got if isinstance(got, list) else got.cpu().tolist()
        assert got == want, f"{name} disagrees with the torch reference (bs={bs})"
    row = side_by_side(fns, rounds, min_time)
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


def allocator_row(bs, ps, rounds, min_time):
    """The allocator's whole alloc_extend call on a real state (the prefixes held), debug mode
    off and on: each call starts from the same free list (and ledger)."""
    dev = kernel_device()
    pre, seq, *_ = batch(bs, ps, "cpu")
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    size = (
        ref.num_new_pages(t([0] * bs), t(pre), ps)
        + ref.num_new_pages(t(pre), t(seq), ps)
        + 1
    ) * ps

    def build(debug):
        alloc = PagedTokenToKVPoolAllocator(
            size, ps, device=dev, debug_mode=debug, backend="torch"
        )
        zero, P = t([0] * bs), t(pre)
        first = alloc.alloc_extend(
            zero.to(dev), zero, P.to(dev), P, t([-1] * bs).to(dev), sum(pre)
        )
        ends = torch.cumsum(P, 0) - 1
        last = torch.where(P > 0, first.cpu()[ends.clamp(min=0)], -1)
        S = t(seq)
        args = (P.to(dev), P, S.to(dev), S, last.to(dev), sum(seq) - sum(pre))
        free, held = alloc.free_pages, alloc._held

        def call():
            alloc.free_pages = free
            if debug:
                alloc._held = held.clone()
            return alloc.alloc_extend(*args)

        return call

    off, on = build(False), build(True)
    assert torch.equal(off(), on()), "debug mode changed the slots"
    return side_by_side({"debug off": off, "debug on": on}, rounds, min_time)


def decode_row(bs, ps, gpu, rounds, min_time):
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
    fns = {
        "torch": lambda: ref.alloc_decode_torch(S, L, F, ps),
        "python": lambda: ref.alloc_decode_python(seq, last, free, ps),
    }
    assert fns["torch"]().tolist() == fns["python"]()
    row = side_by_side(fns, rounds, min_time)
    if gpu:
        import triton.testing

        from memlab.kernels import alloc_decode

        row["triton"] = (
            triton.testing.do_bench(lambda: alloc_decode.alloc_decode(S, L, F, ps))
            * 1e3
        )
    return row


def free_row(tokens, ps, rounds, min_time):
    dev = kernel_device()
    pag = PagedTokenToKVPoolAllocator(tokens * 2, ps, device=dev)
    slots = pag.alloc(tokens)

    def with_dedup():
        pag.free(slots)
        pag.free_pages = pag.free_pages[tokens // ps :]

    def segment():
        pag.free_segment(slots, start_pos=0)
        pag.free_pages = pag.free_pages[tokens // ps :]

    return side_by_side(
        {"free (unique)": with_dedup, "free_segment": segment}, rounds, min_time
    )


def show(title, rows, ratio=None):
    """A table of microseconds per call; ``ratio`` (slower, faster) adds that column."""
    cols = list(next(iter(rows.values())))
    head = f"{'':>14}" + "".join(f"{c:>16}" for c in cols)
    print(f"\n{title}\n" + head + (f"   {ratio[0]} / {ratio[1]}" if ratio else ""))
    for key, row in rows.items():
        line = f"{key:>14}" + "".join(f"{row[c]:>13.1f} us" for c in cols)
        if ratio and all(c in row for c in ratio):
            line += f"{row[ratio[0]] / row[ratio[1]]:>12.2f}x"
        print(line)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="batch sizes 1..1024")
    ap.add_argument("--smoke", action="store_true", help="small sizes, quick")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    gpu = ensure_kernel_mode() == "gpu"
    ps, rounds = args.page_size, 2 if args.smoke else args.rounds
    min_time = 0.01 if args.smoke else 0.1
    naive, why = sglang_naive()
    print(
        f"device: {kernel_device()}, kernel mode: {ensure_kernel_mode()}, page_size {ps}, "
        f"torch {torch.__version__} on {torch.get_num_threads()} thread(s)"
        + ("" if naive else f"; SGLang's alloc_extend_naive: not loaded ({why})")
    )
    bs_main = 16 if args.smoke else 256
    sizes = [1, 4, 16, 64, 256, 1024] if args.sweep else [bs_main]
    rows = {
        f"bs={bs}": extend_row(bs, ps, gpu, naive, rounds, min_time, not args.sweep)
        for bs in sizes
    }
    show(
        "alloc_extend, microseconds per call (outputs identical)",
        rows,
        ("sglang naive", "torch") if naive else None,
    )
    show(
        "the allocator's alloc_extend (torch backend): debug mode's cost, apart",
        {f"bs={bs_main}": allocator_row(bs_main, ps, rounds, min_time)},
        ("debug on", "debug off"),
    )
    if args.sweep:
        show(
            "alloc_decode, microseconds per call",
            {f"bs={bs}": decode_row(bs, ps, gpu, rounds, min_time) for bs in sizes},
        )
    show(
        "freeing a request's slots",
        {
            f"{t} tokens": free_row(t, ps, rounds, min_time)
            for t in ((1024,) if args.smoke else (1024, 65536))
        },
    )
    if naive:
        row = rows[f"bs={bs_main}"]
        print(
            f"\ntorch alloc_extend vs SGLang's alloc_extend_naive (bs {bs_main}, page {ps}): "
            f"{row['sglang naive'] / row['torch']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
