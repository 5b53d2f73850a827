"""vLLM's block pool against a deque-based free list, and against itself in debug mode, measured
side by side in one run.

  python bench/bench_block_pool.py            # 100,000 blocks; 10, 100, 1,000 blocks per call
  python bench/bench_block_pool.py --blocks 20000 --min-time 0.2   # a quicker run

One cycle of n blocks, the same work for both:
  allocate  take n blocks from the head (evicting any that still carry a hash), cache them
            (give each a hash), free them in reverse (hashed -> tail);
  hit       look the n hashes up, take a reference on each (a free block leaves the queue
            wherever it is), free them again.
BlockPool unlinks a hit block in O(1); a deque must find it first (deque.remove scans), which
is why vLLM wrote its own intrusive list. The deque is the faster list for plain pops and
appends, since its loop runs in C: the table shows both sides of that trade.

BlockPool runs twice: with debug mode off (vLLM's hot path: no per-block check) and on (memlab's
per-block scans: each block this pool's, none freed twice, none hashed twice, none queued twice).
"debug cost" is how many times slower a whole cycle is with the scans on. The pools take turns,
``--rounds`` times, and each keeps its best round, so that a noisy neighbour slows all of them.
"""

import argparse
import sys
import time
from collections import deque

from memlab.vllm.block_pool import BlockPool


class DequeBlockPool:
    """The same books with collections.deque as the free list (ids), lists for ref counts/hashes."""

    def __init__(self, num_gpu_blocks):
        self.free = deque(
            range(1, num_gpu_blocks)
        )  # block 0: the null block, as in BlockPool
        self.ref_cnt = [0] * num_gpu_blocks
        self.block_hash = [None] * num_gpu_blocks
        self.cached = {}

    def get_new_blocks(self, n):
        if n > len(self.free):
            raise ValueError(f"Cannot get {n} free blocks")
        popleft, ret = self.free.popleft, []
        for _ in range(n):
            b = popleft()
            if self.block_hash[b] is not None:  # lazy eviction, as in BlockPool
                del self.cached[self.block_hash[b]]
                self.block_hash[b] = None
            self.ref_cnt[b] = 1
            ret.append(b)
        return ret

    def cache(self, blocks, hashes):
        for b, h in zip(blocks, hashes):
            self.block_hash[b] = h
            self.cached[h] = b

    def touch(self, blocks):
        for b in blocks:
            if self.ref_cnt[b] == 0:
                self.free.remove(b)  # O(n): a scan from the head
            self.ref_cnt[b] += 1

    def free_blocks(self, blocks):
        first, last = [], []
        for b in blocks:
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                (last if self.block_hash[b] is not None else first).append(b)
        self.free.extendleft(reversed(first))
        self.free.extend(last)


class _Req:
    __slots__ = ("block_hashes",)


def cycle_block_pool(pool, n, counter):
    hashes = list(range(counter, counter + n))
    blocks = pool.get_new_blocks(n)
    req = _Req()
    req.block_hashes = hashes
    pool.cache_full_blocks(req, blocks, 0, n)
    pool.free_blocks(blocks[::-1])
    return hashes


def hit_block_pool(pool, hashes):
    get = pool.get_cached_block
    hits = [get(h) for h in hashes]
    pool.touch(hits)
    pool.free_blocks(hits[::-1])


def cycle_deque(pool, n, counter):
    hashes = list(range(counter, counter + n))
    blocks = pool.get_new_blocks(n)
    pool.cache(blocks, hashes)
    pool.free_blocks(blocks[::-1])
    return hashes


def hit_deque(pool, hashes):
    hits = [pool.cached[h] for h in hashes]
    pool.touch(hits)
    pool.free_blocks(hits[::-1])


def measure(pool, cycle, hit, n, min_time):
    """Microseconds per call of the allocate phase and of the hit phase (steady state)."""
    counter = 0
    t_alloc = t_hit = 0.0
    calls = 0
    start = time.perf_counter()
    while calls < 1 or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        hashes = cycle(pool, n, counter)
        t1 = time.perf_counter()
        hit(pool, hashes)
        t2 = time.perf_counter()
        t_alloc += t1 - t0
        t_hit += t2 - t1
        counter += n
        calls += 1
    return t_alloc / calls * 1e6, t_hit / calls * 1e6


def best_of(rounds, contenders, n, min_time):
    """Each contender (pool, cycle, hit) measured in turn, ``rounds`` times; the best (alloc, hit) of each."""
    best = [(float("inf"), float("inf"))] * len(contenders)
    for _ in range(rounds):
        for i, (pool, cycle, hit) in enumerate(contenders):
            a, h = measure(pool, cycle, hit, n, min_time / rounds)
            if a + h < sum(best[i]):
                best[i] = (a, h)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument(
        "--min-time",
        type=float,
        default=0.5,
        help="seconds per contender and size, all rounds",
    )
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    print(
        f"pool of {args.blocks:,} blocks; us per call (alloc, hit); throughput = blocks through a whole cycle "
        f"per second; best of {args.rounds} rounds"
    )
    print(
        f"{'n/call':>7} | {'BlockPool alloc':>15} {'hit':>8} {'blocks/s':>11} | {'debug on alloc':>14} {'hit':>8} "
        f"{'blocks/s':>11} | {'deque alloc':>11} {'hit':>10} {'blocks/s':>11} | {'debug cost':>10} | {'vs deque':>8}"
    )
    per_call = {}
    for n in args.sizes:
        # Fresh pools per size, warmed until allocation evicts (the head reaches hashed blocks).
        pool, dbg, dq = (
            BlockPool(args.blocks),
            BlockPool(args.blocks, debug_mode=True),
            DequeBlockPool(args.blocks),
        )
        warm = args.blocks // n + 2
        for i in range(warm):
            for p in (pool, dbg):
                hit_block_pool(p, cycle_block_pool(p, n, -(i + 1) * n - 10**9))
            cycle_deque(
                dq, n, -(i + 1) * n - 10**9
            )  # no hits in the warm-up: they are slow
        (pa, ph), (ga, gh), (da, dh) = best_of(
            args.rounds,
            [
                (pool, cycle_block_pool, hit_block_pool),
                (dbg, cycle_block_pool, hit_block_pool),
                (dq, cycle_deque, hit_deque),
            ],
            n,
            args.min_time,
        )
        bp_rate, dbg_rate, dq_rate = (
            n / (a + h) * 1e6 for a, h in ((pa, ph), (ga, gh), (da, dh))
        )
        print(
            f"{n:>7} | {pa:>15.1f} {ph:>8.1f} {bp_rate:>11,.0f} | {ga:>14.1f} {gh:>8.1f} {dbg_rate:>11,.0f} | "
            f"{da:>11.1f} {dh:>10.1f} {dq_rate:>11,.0f} | {bp_rate / dbg_rate:>9.2f}x | {bp_rate / dq_rate:>7.0f}x"
        )
        assert pool.num_evictions > 0 and dbg.num_evictions > 0, (
            "the warm-up should have reached eviction"
        )
        pool.check_invariants(), dbg.check_invariants()
        per_call[n] = (pa + ph, da + dh)
    lo, hi = min(per_call), max(per_call)
    print(
        f"time per call from {lo} to {hi} blocks ({hi // lo}x the work): BlockPool x{per_call[hi][0] / per_call[lo][0]:.0f}, "
        f"deque x{per_call[hi][1] / per_call[lo][1]:.0f} (each hit scans the deque: O(pool size) per block)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
