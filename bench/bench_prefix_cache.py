"""SGLang's radix tree against vLLM's block hashes on one stream of shared-prefix conversations.

  python bench/bench_prefix_cache.py [--conversations 120] [--turns 4] [--page 16]
                                     [--sizes 2048 4096 8192 16384] [--host 32768]

For each cache size (tokens of KV in the pool): the prefix hit rate (prompt tokens whose KV was
reused, over all prompt tokens) and the tokens of cached KV evicted, for vLLM's block pool
(blocks of --page tokens), the radix tree with pages of --page tokens and of 1 token, and (with
--host) the radix tree with a HiCache host tier of that many tokens (its "evicted" tokens were
demoted to the host, not lost). For the radix rows without a host tier, the share of the
evicted tokens beyond what its ``evict`` calls asked for (it frees whole leaves). Then the replay
time of each, side by side, as a ratio to vLLM's.
"""

import argparse
import sys
import time

from memlab.capstone.prefix_compare import (
    compare,
    replay_radix,
    replay_vllm,
    shared_prefix_conversations,
)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=120)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--host", type=int, default=32768)
    args = ap.parse_args(argv)
    stream = shared_prefix_conversations(args.conversations, args.turns)
    unlimited = replay_radix(stream, 1 << 22, 1)
    print(
        f"stream: {len(stream)} requests of {args.conversations} conversations x "
        f"{args.turns} turns; "
        f"a cache that never evicts would hit {unlimited.hit_rate:.1%}"
    )
    t0 = time.perf_counter()
    print(compare(stream, args.sizes, args.page, args.host).table())
    print(f"(all replays: {time.perf_counter() - t0:.1f} s)")
    size = args.sizes[len(args.sizes) // 2]
    timings = {}
    for name, run in (
        (
            f"vLLM hashes, block {args.page}",
            lambda: replay_vllm(stream, size, args.page),
        ),
        (f"radix, page {args.page}", lambda: replay_radix(stream, size, args.page)),
        ("radix, page 1", lambda: replay_radix(stream, size, 1)),
    ):
        t = time.perf_counter()
        run()
        timings[name] = time.perf_counter() - t
    base = next(iter(timings.values()))
    print(f"replay time at {size:,} tokens, side by side (ratio to vLLM's):")
    for name, t in timings.items():
        print(f"  {name:24} {t * 1e3 / len(stream):7.2f} ms/request  {t / base:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
