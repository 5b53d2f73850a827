"""memlab's BlockPool against vLLM 0.33's own BlockPool, side by side in one run.

  python bench/bench_block_pool.py            # 100,000 blocks, 8 hits + 24 new per request
  python bench/bench_block_pool.py --smoke    # a small pool and one short round: that it runs
  python bench/bench_block_pool.py --deque    # also the free queue against a deque
  python bench/bench_block_pool.py --ops      # also where a request's time goes, call by call

A request of the cycle makes the calls vLLM's manager makes, the same on both pools:
  lookup    get_cached_block for the 8 block hashes of a shared prefix (one of 64 prefixes)
  touch     the 8 hit blocks (a free one leaves the middle of the free queue)
  allocate  get_new_blocks(24)
  cache     cache_full_blocks for the 24 new blocks (new hashes: sha256-sized bytes)
  free      free_blocks, last block first (the hashed blocks go to the queue's tail)

Two phases. ``fill``: a fresh pool, whose new blocks come from never-used space, so nothing is
evicted (about 4,100 requests for 100,000 blocks). ``steady``: the pool is full of cached
blocks, so every new block evicts one (a hash leaves the map for each block handed out).

vLLM's classes come from its published wheel (tests/tools/engines/vllm_loader.py: the wheel is
downloaded once into ~/.cache/memlab/engines). Before anything is timed, both pools run the same
requests with every block id they hand out recorded: the ids, the evictions and the books at the
end must be equal. Then the pools take turns in short rounds, each on fresh request objects
of its own (shared ones would be brought into the cache by whichever pool came first), debug
mode off; each phase is run ``--repeats`` times from fresh pools and every round keeps its best
time (CPU time of this process, so waiting for a busy machine's cores counts for neither). The
collector is off in the rounds and the pools' blocks are frozen out of its sight between them.
Each round begins with the other pools' data in the CPU caches, a cost of the interleaving that
weighs more on the faster pool: longer rounds give higher ratios (measured on a 2-core machine,
fill and steady: 2.63-2.88x and 2.10-2.24x with 40 rounds in four runs, 2.87-2.97x and
2.25-2.30x with 10 in two, 2.78x and 2.28x with 4). memlab with debug mode on runs in the
same rounds of the first run, apart: its cost is printed as a factor and is in no ratio (its
scans walk the free queue from each hit to the tail, so it grows with the pool).

The last line reads: ``block pool vs vLLM 0.33: fill N.NNx, steady N.NNx``.
"""

from __future__ import annotations

import argparse
import gc
import runpy
import sys
import time
from collections import deque
from pathlib import Path

from memlab.vllm.block_pool import BlockPool

ROOT = Path(__file__).resolve().parents[1]
HITS, NEW, PREFIXES = 8, 24, 64


class Request:
    """What both pools read of a request: its block hashes."""

    __slots__ = ("request_id", "block_hashes")

    def __init__(self, request_id: str, block_hashes: list[bytes]):
        self.request_id = request_id
        self.block_hashes = block_hashes


def key(i: int) -> bytes:
    return i.to_bytes(32, "little")  # the size of a sha256 digest


PREFIX_HASHES = [[key(p * HITS + i) for i in range(HITS)] for p in range(PREFIXES)]


def make_requests(first: int, n: int) -> list[Request]:
    """Requests first..first+n: one of the shared prefixes, then NEW blocks of new content."""
    out = []
    for r in range(first, first + n):
        new = [key(10**9 + r * NEW + i) for i in range(NEW)]
        out.append(Request(str(r), PREFIX_HASHES[r % PREFIXES] + new))
    return out


# ---- the cycle, as each engine's manager calls its pool ------------------------------------------


def memlab_cycle(pool, requests, record=None) -> None:
    get_cached_block = pool.get_cached_block
    for req in requests:
        hits = [get_cached_block(h) for h in req.block_hashes[:HITS]]
        pool.touch(hits)
        blocks = hits + pool.get_new_blocks(NEW)
        pool.cache_full_blocks(req, blocks, HITS, HITS + NEW)
        pool.free_blocks(blocks[::-1])
        if record is not None:
            record.append([b.block_id for b in blocks])


def vllm_cycle(pool, requests, record=None) -> None:
    get_cached_block = pool.get_cached_block
    for req in requests:
        hits = [get_cached_block(h, [0])[0] for h in req.block_hashes[:HITS]]
        pool.touch(hits)
        blocks = hits + pool.get_new_blocks(NEW)
        pool.cache_full_blocks(req, blocks, HITS, HITS + NEW, 1, 0)
        pool.free_blocks(reversed(blocks))
        if record is not None:
            record.append([b.block_id for b in blocks])


def cache_prefixes(pool, is_vllm: bool) -> None:
    """The shared prefixes, computed once and freed: cached, in the free queue's tail."""
    for p, hashes in enumerate(PREFIX_HASHES):
        blocks = pool.get_new_blocks(HITS)
        req = Request(f"prefix {p}", hashes)
        if is_vllm:
            pool.cache_full_blocks(req, blocks, 0, HITS, 1, 0)
        else:
            pool.cache_full_blocks(req, blocks, 0, HITS)
        pool.free_blocks(blocks[::-1])


def fill_requests(num_blocks: int) -> int:
    """Requests a fresh pool serves before its head reaches a cached block."""
    return (num_blocks - 1 - PREFIXES * HITS) // NEW


# ---- the engines' pools ------------------------------------------------------------------


def load_vllm():
    """vLLM's block_pool and kv_cache_utils modules from the wheel, or None and why not."""
    import pytest

    runpy.run_path(str(ROOT / "tests" / "tools" / "loading.py"))["register"]()
    from memlab_tests.tools.engines.vllm_loader import load

    try:
        return load(), ""
    except pytest.skip.Exception as exc:  # no wheel and no network: the loader's words
        return None, str(exc.msg)


def contenders(V, num_blocks: int) -> dict:
    """name -> (pool, cycle), each pool with the shared prefixes cached."""
    out = {
        "memlab": (BlockPool(num_blocks), memlab_cycle),
        "vLLM": (
            V.block_pool.BlockPool(num_blocks, enable_caching=True, hash_block_size=1),
            vllm_cycle,
        ),
        "memlab debug": (BlockPool(num_blocks, debug_mode=True), memlab_cycle),
    }
    for name, (pool, _) in out.items():
        cache_prefixes(pool, name == "vLLM")
    return out


def books(V, pool, evictions: int) -> dict:
    from memlab_tests.tools.engines.vllm_loader import pool_books

    if type(pool) is BlockPool:
        out = pool_books(pool)
    else:  # vLLM's map keys: the hash and a 4-byte KV cache group id
        out = pool_books(pool, V.kv_cache_utils.get_block_hash)
    out["evictions"] = evictions
    return out


def evictions_of(pool, num_requests: int) -> int:
    """Hashes given minus hashes still held: the blocks whose cached content was evicted."""
    cached = PREFIXES * HITS + num_requests * NEW
    return cached - sum(b.block_hash is not None for b in pool.blocks)


def check_same(V, num_blocks: int, num_requests: int) -> str:
    """Every pool runs the same requests, recording the blocks it hands out; all must agree."""
    runs = {}
    for name, (pool, cycle) in contenders(V, num_blocks).items():
        record = []
        cycle(pool, make_requests(0, num_requests), record)
        runs[name] = (record, books(V, pool, evictions_of(pool, num_requests)))
        if type(pool) is BlockPool:
            assert pool.num_evictions == evictions_of(pool, num_requests)
            pool.check_invariants()
    ref_record, ref_books = runs["vLLM"]
    for name, (record, pool_books) in runs.items():
        assert record == ref_record, f"{name} handed out other blocks than vLLM"
        for part, value in pool_books.items():
            assert value == ref_books[part], f"{name}: {part} differs from vLLM's"
    return (
        f"same blocks handed out by every pool ({num_requests:,} requests), "
        f"same evictions ({ref_books['evictions']:,}), same books at the end"
    )


# ---- timing ----------------------------------------------------------------------------------


def timed_phases(V, num_blocks: int, rounds: int, repeats: int) -> dict:
    """{(phase, name): seconds}: each round's best time over ``repeats`` runs from fresh pools,
    summed over the rounds."""
    fill = fill_requests(num_blocks)
    per_round = max(1, fill // rounds)
    best: dict[tuple, list[float]] = {}
    for repeat in range(repeats):
        pools = contenders(V, num_blocks)
        # debug mode's scans make it slow: its cost is read from the first run
        if repeat:
            del pools["memlab debug"]
        # The pools' blocks out of the collector's sight: a collection between rounds would
        # otherwise walk all of them and push the next pool's books out of the CPU caches.
        gc.collect()
        gc.freeze()
        first = 0
        for phase in ("fill", "steady"):
            # finish the fill untimed: from here every block evicts
            if phase == "steady":
                for pool, cycle in pools.values():
                    cycle(pool, make_requests(first, fill - first + 1))
                first = fill + 1
            for r in range(rounds):
                for name, (pool, cycle) in pools.items():
                    # Requests of its own for each pool: the first pool to touch shared ones
                    # would pay for bringing them into the cache and hashing their keys.
                    requests = make_requests(first, per_round)
                    gc.disable()  # as timeit: a collection lands in no one's round
                    t0 = time.process_time()
                    cycle(pool, requests)
                    dt = time.process_time() - t0
                    gc.enable()
                    times = best.setdefault((phase, name), [float("inf")] * rounds)
                    times[r] = min(times[r], dt)
                first += per_round
        del pools
        gc.unfreeze()
    return {k: (sum(v), per_round * rounds) for k, v in best.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=40, help="rounds per phase")
    ap.add_argument("--repeats", type=int, default=3, help="runs from fresh pools")
    ap.add_argument("--smoke", action="store_true", help="4,000 blocks, one short run")
    ap.add_argument("--deque", action="store_true", help="also the deque comparison")
    ap.add_argument("--ops", action="store_true", help="also the time of each call")
    args = ap.parse_args(argv)
    if args.smoke:
        args.blocks, args.rounds, args.repeats = 4_000, 4, 1
    least = (PREFIXES + 2) * (HITS + NEW)  # fewer, and the shared prefixes get evicted
    if args.blocks < least:
        ap.error(f"--blocks must be at least {least}")
    V, why = load_vllm()
    if V is None:
        print(f"vLLM's BlockPool is out of reach: {why}")
        return 2
    print(
        f"pool of {args.blocks:,} blocks; a request: {HITS} hits (get_cached_block, touch), "
        f"{NEW} new blocks (get_new_blocks, cache_full_blocks), free_blocks"
    )
    print(check_same(V, args.blocks, fill_requests(args.blocks) * 2))
    t = timed_phases(V, args.blocks, args.rounds, args.repeats)
    print(
        f"best of {args.repeats} runs per round, {args.rounds} rounds a phase; "
        "debug mode off in memlab and vLLM, on in 'memlab debug' (in no ratio)"
    )
    print(
        f"{'phase':>7} {'requests':>9} | {'memlab req/s':>12} {'vLLM req/s':>11} "
        f"{'ratio':>6} | {'memlab debug req/s':>18} {'debug cost':>10}"
    )
    ratios = {}
    for phase in ("fill", "steady"):
        (ours, n), (theirs, _), (dbg, _) = (
            t[(phase, name)] for name in ("memlab", "vLLM", "memlab debug")
        )
        ratios[phase] = theirs / ours
        print(
            f"{phase:>7} {n:>9,} | {n / ours:>12,.0f} {n / theirs:>11,.0f} "
            f"{ratios[phase]:>5.2f}x | {n / dbg:>18,.0f} {dbg / ours:>9.2f}x"
        )
    if args.deque:
        deque_table(args.blocks)
    if args.ops:
        ops_table(V, args.blocks)
    print(
        f"block pool vs vLLM 0.33: fill {ratios['fill']:.2f}x, "
        f"steady {ratios['steady']:.2f}x"
    )
    return 0


# ---- where a request's time goes (--ops) ------------------------------------------------------

OPS = ("lookup", "touch", "allocate", "cache", "free")


def timed_ops(pool, is_vllm: bool, first: int, n: int) -> list[float]:
    """The cycle of ``memlab_cycle`` / ``vllm_cycle`` with a clock between the calls: seconds
    per op, summed over n requests (made in rounds of 200, as fresh as the timed rounds')."""
    clock, total = time.perf_counter, [0.0] * len(OPS)
    get_cached_block = pool.get_cached_block
    for start in range(first, first + n, 200):
        for req in make_requests(start, min(200, first + n - start)):
            t0 = clock()
            if is_vllm:
                hits = [get_cached_block(h, [0])[0] for h in req.block_hashes[:HITS]]
            else:
                hits = [get_cached_block(h) for h in req.block_hashes[:HITS]]
            t1 = clock()
            pool.touch(hits)
            t2 = clock()
            blocks = hits + pool.get_new_blocks(NEW)
            t3 = clock()
            if is_vllm:
                pool.cache_full_blocks(req, blocks, HITS, HITS + NEW, 1, 0)
            else:
                pool.cache_full_blocks(req, blocks, HITS, HITS + NEW)
            t4 = clock()
            pool.free_blocks(blocks[::-1])
            t5 = clock()
            for i, dt in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                total[i] += dt
    return total


def ops_table(V, num_blocks: int) -> None:
    """Microseconds per request in each call, both phases: an eviction and an insertion are a
    dict operation on a map of num_blocks entries in both pools, and cost about the same."""
    fill = fill_requests(num_blocks)
    print(
        f"microseconds per request, by call ({', '.join(OPS)}; the clock's cost included)"
    )
    for name, (pool, _) in contenders(V, num_blocks).items():
        if name == "memlab debug":
            continue
        gc.collect()
        gc.disable()
        phases = {
            "fill": timed_ops(pool, name == "vLLM", 0, fill),
            "steady": timed_ops(pool, name == "vLLM", fill, fill),
        }
        gc.enable()
        for phase, total in phases.items():
            cells = " ".join(f"{op} {t / fill * 1e6:5.2f}" for op, t in zip(OPS, total))
            print(
                f"  {name:>6} {phase:>6}: {cells} | all {sum(total) / fill * 1e6:5.2f}"
            )


# ---- the free queue against a deque (--deque) ---------------------------------------------------


class DequeBlockPool:
    """The same books with collections.deque as the free list (of ids)."""

    def __init__(self, num_gpu_blocks):
        self.free = deque(range(1, num_gpu_blocks))  # block 0: the null block
        self.ref_cnt = [0] * num_gpu_blocks
        self.block_hash = [None] * num_gpu_blocks
        self.cached = {}

    def get_new_blocks(self, n):
        ret = [self.free.popleft() for _ in range(n)]
        for b in ret:
            if self.block_hash[b] is not None:  # lazy eviction, as in BlockPool
                del self.cached[self.block_hash[b]]
                self.block_hash[b] = None
            self.ref_cnt[b] = 1
        return ret

    def touch(self, blocks):
        for b in blocks:
            if self.ref_cnt[b] == 0:
                self.free.remove(b)  # a scan from the head: O(pool size)
            self.ref_cnt[b] += 1

    def free_blocks(self, blocks):
        first, last = [], []
        for b in blocks:
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                (last if self.block_hash[b] is not None else first).append(b)
        self.free.extendleft(reversed(first))
        self.free.extend(last)


def deque_cycle(pool, requests) -> None:
    for req in requests:
        hits = [pool.cached[h] for h in req.block_hashes[:HITS]]
        pool.touch(hits)
        blocks = hits + pool.get_new_blocks(NEW)
        for b, h in zip(blocks[HITS:], req.block_hashes[HITS:]):
            pool.block_hash[b] = h
            pool.cached[h] = b
        pool.free_blocks(blocks[::-1])


def deque_table(num_blocks: int) -> None:
    """Why vLLM wrote its own list: a hit on a free block leaves the queue's middle in O(1)."""
    ours, dq = BlockPool(num_blocks), DequeBlockPool(num_blocks)
    cache_prefixes(ours, False)
    for hashes in PREFIX_HASHES:
        blocks = dq.get_new_blocks(HITS)
        for b, h in zip(blocks, hashes):
            dq.block_hash[b] = h
            dq.cached[h] = b
        dq.free_blocks(blocks[::-1])
    requests = make_requests(0, 200)
    t = {}
    for name, pool, cycle in (
        ("BlockPool", ours, memlab_cycle),
        ("deque", dq, deque_cycle),
    ):
        t0 = time.process_time()
        cycle(pool, requests)
        t[name] = time.process_time() - t0
    print(
        f"free queue: BlockPool {len(requests) / t['BlockPool']:,.0f} req/s, a deque "
        f"{len(requests) / t['deque']:,.0f} req/s (each hit scans the deque from its head)"
    )


if __name__ == "__main__":
    sys.exit(main())
