"""Engine throughput with page size 1 and 16, measured side by side in one run.

  python bench/bench_engine.py [--requests 16] [--new 32] [--attention torch|triton]
On CPU the torch attention path is the meaningful one (the Triton interpreter is a simulator);
on a GPU both run compiled.
"""

import argparse
import random
import sys

from memlab.engine import Engine, TinyConfig, TinyLlama, throughput
from memlab.env import kernel_device


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--attention", default="torch", choices=["torch", "triton"])
    args = ap.parse_args(argv)
    dev = kernel_device()
    model = TinyLlama(TinyConfig(), device=dev)
    rng = random.Random(0)
    prompts = [[rng.randrange(128) for _ in range(rng.randint(16, 96))] for _ in range(args.requests)]
    print(f"device {dev}, attention {args.attention}, {args.requests} requests, {args.new} new tokens each")
    rows = {}
    for ps in (1, 16):
        e = Engine(model, page_size=ps, num_tokens=8192, max_running=args.requests, chunk_size=256,
                   attention=args.attention, alloc_backend="triton" if dev == "cuda" else "torch")
        rows[ps] = throughput(e, prompts, args.new)
        r = rows[ps]
        print(f"page_size {ps:>2}: {r['seconds']:.2f} s, {r['tokens_per_s']:.0f} tokens/s "
              f"({r['generated_per_s']:.0f} generated/s, {r['prefill']} prefill tokens)")
    print(f"ratio page 16 / page 1 (tokens/s): {rows[16]['tokens_per_s'] / rows[1]['tokens_per_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
