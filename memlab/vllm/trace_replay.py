"""A real trace through vLLM's prefix cache, vllm/v1/core/kv_cache_manager.py: hits by capacity.

The Mooncake FAST'25 traces (data/mooncake/, Apache-2.0; Qin et al., FAST 2025) give, per
request, its prompt length and one id per 512-token block of the prompt, remapped from a
chained content hash: equal ids mean an equal prefix. Those ids serve directly as block hashes,
with 512-token blocks, through memlab's KVCacheManager and BlockPool, following vLLM's rules:
only full blocks are cached, the last prompt token is always recomputed, a lookup stops at the
first miss, and eviction is lazy, in free-queue (LRU) order.

Requests run one after another and finish before the next arrives, so capacity is spent on
cached prefixes only. ``blocks_needed`` is the peak a cache that never evicts would reach; it
and the "unlimited" hit rate come from the trace itself (a set, no pool), and the replay at
100% of that capacity must reproduce them exactly.

    from memlab.vllm.trace_replay import run
    curve = run("conversation")     # progress bar; about 15 s for the full trace here
    curve.plot()
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path

from memlab.vllm.kv_cache_manager import KVCacheManager

TRACE_BLOCK_SIZE = 512
TRACES = ("conversation", "synthetic")
DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "mooncake"
DEFAULT_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)


class TraceRequest:
    """What the KV cache manager reads of a request; the hashes come from the trace."""

    __slots__ = ("request_id", "num_tokens", "block_hashes", "num_computed_tokens")

    def __init__(self, request_id: str, num_tokens: int, block_hashes: list[int]):
        self.request_id = request_id
        self.num_tokens = num_tokens
        self.block_hashes = block_hashes
        self.num_computed_tokens = 0


def load_trace(
    name: str = "conversation",
    limit: int | None = None,
    data_dir: Path | str = DATA_DIR,
) -> list[TraceRequest]:
    """The first ``limit`` requests (all when None) of a Mooncake trace, in arrival order."""
    if name not in TRACES:
        raise ValueError(f"unknown trace {name!r}; choose one of {TRACES}")
    if limit is not None and (not isinstance(limit, int) or limit <= 0):
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")
    path = Path(data_dir) / f"mooncake_fast25_{name}.jsonl.gz"
    requests = []
    with gzip.open(path, "rt") as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                break
            row = json.loads(line)
            n, ids = row["input_length"], row["hash_ids"]
            if n <= 0 or len(ids) != math.ceil(n / TRACE_BLOCK_SIZE):
                raise ValueError(
                    f"{path.name} line {i + 1}: {len(ids)} hash_ids for {n} input tokens "
                    f"(want ceil({n} / {TRACE_BLOCK_SIZE}))"
                )
            requests.append(TraceRequest(f"{name}-{i}", n, ids))
    return requests


@dataclass
class UnlimitedBound:
    """What a cache that never evicts achieves on a trace, computed from the trace alone."""

    hit_tokens: int
    prompt_tokens: int
    blocks_needed: (
        int  # peak blocks held: cached full blocks plus the running request's blocks
    )
    max_request_blocks: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens


def unlimited_bound(
    requests: list[TraceRequest], block_size: int = TRACE_BLOCK_SIZE
) -> UnlimitedBound:
    cached: set = set()
    num_cached = peak = hit_tokens = prompt_tokens = max_blocks = 0
    for r in requests:
        ids = r.block_hashes
        k = 0
        max_hit = (r.num_tokens - 1) // block_size
        while k < max_hit and ids[k] in cached:
            k += 1
        num_full = r.num_tokens // block_size
        # the new blocks sit beside everything cached
        peak = max(peak, num_cached + len(ids) - k)
        # recomputed full blocks are cached again (duplicates)
        num_cached += num_full - k
        cached.update(ids[:num_full])
        hit_tokens += k * block_size
        prompt_tokens += r.num_tokens
        max_blocks = max(max_blocks, len(ids))
    return UnlimitedBound(hit_tokens, prompt_tokens, peak, max_blocks)


@dataclass
class ReplayStats:
    num_blocks: int  # usable blocks (the pool holds one more: the null block)
    hit_tokens: int
    prompt_tokens: int
    evictions: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens


def replay(
    requests: list[TraceRequest],
    num_blocks: int,
    block_size: int = TRACE_BLOCK_SIZE,
    progress=None,
) -> ReplayStats:
    """Run every request (look up, allocate, free) through a pool of ``num_blocks`` usable
    blocks."""
    longest = max(len(r.block_hashes) for r in requests)
    if num_blocks < longest:
        raise ValueError(
            f"num_blocks={num_blocks} cannot hold the trace's longest request ({longest} blocks)"
        )
    mgr = KVCacheManager(num_blocks + 1, block_size=block_size)
    for i, r in enumerate(requests):
        r.num_computed_tokens = 0
        hits, n = mgr.get_computed_blocks(r)
        if mgr.allocate_slots(r, r.num_tokens - n, n, hits) is None:
            # cannot happen: checked above
            raise RuntimeError(
                f"request {r.request_id} did not fit {num_blocks} blocks"
            )
        mgr.free(r)
        if progress is not None and i % 512 == 511:
            progress.update(512)
    if progress is not None:
        progress.update(len(requests) % 512)
    return ReplayStats(
        num_blocks,
        mgr.prefix_cache_hits,
        mgr.prefix_cache_queries,
        mgr.block_pool.num_evictions,
    )


@dataclass
class HitRateCurve:
    trace: str
    fractions: list[float]
    stats: list[ReplayStats]
    bound: UnlimitedBound
    num_requests: int = 0

    @property
    def hit_rates(self) -> list[float]:
        return [s.hit_rate for s in self.stats]

    def table(self) -> str:
        lines = [
            f"{self.trace}: {self.num_requests} requests, {self.bound.blocks_needed} blocks of "
            f"{TRACE_BLOCK_SIZE} tokens needed without eviction, unlimited-cache hit rate "
            f"{self.bound.hit_rate:.4f}",
            f"{'capacity':>9} {'blocks':>8} {'hit rate':>9} {'evictions':>10}",
        ]
        for f, s in zip(self.fractions, self.stats):
            lines.append(
                f"{f:>9.0%} {s.num_blocks:>8} {s.hit_rate:>9.4f} {s.evictions:>10}"
            )
        return "\n".join(lines)

    def plot(self, ax=None):
        return plot_hit_rate_curve(self, ax)

    def __repr__(self) -> str:
        return self.table()


def hit_rate_curve(
    requests: list[TraceRequest],
    fractions=DEFAULT_FRACTIONS,
    trace: str = "trace",
    progress: bool = True,
) -> HitRateCurve:
    """Hit rate at each fraction of ``blocks_needed`` (never below the longest request)."""
    fractions = list(fractions)
    if not fractions or any(not 0 < f <= 1 for f in fractions):
        raise ValueError(f"fractions must lie in (0, 1], got {fractions}")
    bound = unlimited_bound(requests)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        # One tick per request replayed, over all capacities: say so, or 7 x 12,031 = 84,217
        # reads like a different trace.
        bar = tqdm(
            total=len(fractions) * len(requests),
            unit="req",
            desc=f"replay {trace}: {len(requests):,} requests x {len(fractions)} capacities",
        )
    stats = []
    try:
        for f in fractions:
            num_blocks = max(
                math.ceil(f * bound.blocks_needed), bound.max_request_blocks
            )
            if bar is not None:
                bar.set_postfix(capacity=f"{f:.0%}")
            stats.append(replay(requests, num_blocks, progress=bar))
    finally:
        if bar is not None:
            bar.close()
    return HitRateCurve(trace, fractions, stats, bound, len(requests))


def plot_hit_rate_curve(curve: HitRateCurve, ax=None):
    """Hit rate against capacity, with the unlimited-cache bound as a dashed line."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(
        [100 * f for f in curve.fractions],
        curve.hit_rates,
        "o-",
        label="vLLM block pool (LRU)",
    )
    ax.axhline(
        curve.bound.hit_rate,
        linestyle="--",
        color="gray",
        label=f"unlimited cache: {curve.bound.hit_rate:.1%}",
    )
    ax.set_xscale("log")
    ticks = [
        t
        for t in (1, 2, 5, 10, 20, 50, 100)
        if 100 * min(curve.fractions) <= t <= 100 * max(curve.fractions)
    ]
    ax.set_xticks(ticks, [f"{t}%" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel(
        f"capacity, % of the {curve.bound.blocks_needed:,} blocks a never-evicting cache needs"
    )
    ax.set_ylabel("prefix-cache hit rate (tokens)")
    ax.set_ylim(0, max(0.05, curve.bound.hit_rate * 1.15))
    ax.set_title(
        f"Mooncake {curve.trace} trace, {curve.num_requests:,} requests, "
        f"{TRACE_BLOCK_SIZE}-token blocks"
    )
    ax.legend(loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    return ax.figure


def run(
    trace: str = "conversation",
    fractions=DEFAULT_FRACTIONS,
    limit: int | None = None,
    progress: bool = True,
    plot: bool = True,
) -> HitRateCurve:
    """Chapter 06's one call: load a trace, replay it at each capacity, plot the curve."""
    curve = hit_rate_curve(load_trace(trace, limit), fractions, trace, progress)
    if plot:
        curve.plot()
    return curve


if __name__ == "__main__":
    for name in TRACES:
        print(run(name, plot=False).table())
