"""Cache-aware scheduling (SGLang's longest-prefix-match order) against first come first served,
on the Mooncake conversation trace, in one run.

  python bench/bench_schedule.py [--requests 96] [--block 2] [--max-blocks 64] [--pool 768]

What is served and measured is ``memlab.capstone.schedule_compare`` (its docstring says how the
trace is scaled down for the tiny model); this prints, for FCFS and LPM side by side, the prefix
hit rate, the tokens computed (prefill and decode), the retractions, the finishing order (request
ids, and how far each finished from its arrival place), and whether every request's output is
the same under both. The last line is LPM's hit rate over FCFS's.
"""

import argparse

from memlab.capstone.schedule_compare import measure


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--block", type=int, default=2)
    ap.add_argument("--max-blocks", type=int, default=64)
    ap.add_argument("--pool", type=int, default=768)
    a = ap.parse_args(argv)
    res = measure(a.requests, a.block, a.max_blocks, a.pool)
    f, lpm = res["fcfs"], res["lpm"]
    print(
        f"{a.requests} requests of the conversation trace, {a.block} tokens a block, pool "
        f"{a.pool} slots"
    )
    print(f"{'':22}{'FCFS':>12}{'LPM':>12}")
    print(f"{'prefix hit rate':22}{f['hit_rate']:>12.1%}{lpm['hit_rate']:>12.1%}")
    print(f"{'cached prompt tokens':22}{f['cached']:>12}{lpm['cached']:>12}")
    print(f"{'tokens computed':22}{f['computed']:>12}{lpm['computed']:>12}")
    print(f"{'  of them prefill':22}{f['prefill']:>12}{lpm['prefill']:>12}")
    print(f"{'retractions':22}{f['retracted']:>12}{lpm['retracted']:>12}")
    print(
        f"{'mean displacement':22}{f['displacement']:>12.1f}{lpm['displacement']:>12.1f}"
    )
    print(f"FCFS finishing order (first 24): {f['order'][:24]}")
    print(f"LPM  finishing order (first 24): {lpm['order'][:24]}")
    print(f"same output for every request: {f['outputs'] == lpm['outputs']}")
    ratio = lpm["hit_rate"] / f["hit_rate"] if f["hit_rate"] else float("inf")
    print(f"LPM vs FCFS prefix hit rate: {ratio:.2f}x")


if __name__ == "__main__":
    main()
