"""The workload simulator: a pool of N token slots serving a request stream, one iteration at a
time.

Each iteration:
1. admit waiting requests, first come first served, while the policy's need fits (a reservation
   policy: its reservation, placed by its placement; paged: the blocks for prompt + one token);
   admission stops at the first request that does not fit (Orca's scheduler breaks there too).
   Prefill happens on admission (the prompt's KV is written).
2. every running request decodes one token (paged: taking a new block when the token starts
   one; if the step's blocks do not fit, the youngest running requests are preempted first);
3. the books are read (the snapshot below);
4. finished requests free their slots.

The snapshot splits the pool's N slots into five shares that add up to N. For a running request
with ``cur`` tokens of KV, ``final`` = input + output tokens when it finishes, ``reserve`` slots
asked for (a reservation policy's reservation; paged: B * blocks held) and ``alloc`` slots the
placement took for it (the buddy allocator's power-of-two block; otherwise ``reserve``):

- used:     ``cur``, slots holding real token state (the vLLM paper's "token states");
- reserved: ``min(reserve, final) - cur``, held and not yet written, but the request will write
  them before it finishes (the paper's "reservation");
- internal: ``max(0, reserve - final)``, asked for and never to be written: the reservation
  beyond the final length, or the unused tail of the request's last block (the paper's
  "internal fragmentation": over-provisioning for a length the request never reaches);
- rounding: ``alloc - reserve``, what the buddy allocator adds when it rounds a reservation up to
  a power-of-two block; held, never asked for;
- free:     ``N - sum(alloc)``, held by no request. The part of it counted as ``external`` is
  the free slots of iterations where the next request was refused although that many slots
  were free, because no contiguous run (first fit) or block (buddy) was large enough.

The paper's fourth category, "external fragmentation and others", is rounding + free:
the paper files the buddy allocator's waste under external fragmentation ("external
fragmentation from the memory allocator like the buddy allocator", §3), so its Orca
(Oracle), which never over-reserves, shows no internal fragmentation at all
(``memlab.capstone.sim.figure2`` maps the shares).

Reported shares are these slot counts summed over all iterations, divided by iterations * N.

Implementation: between two events (a request finishing, a preemption) nothing is
decided, so the simulator jumps over those iterations at once and sums them with numpy
(work proportional to the tokens generated, not to iterations x requests in Python).
``memlab.capstone.sim.reference`` runs the same rules one iteration at a time in plain
Python; the tests check the two agree exactly.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from memlab.capstone.sim.policies import Paged, make_policy
from memlab.capstone.sim.workload import Workload

SHARES = ("used", "reserved", "internal", "rounding", "free")
DEFAULT_POOL_SIZE = 15_728


@dataclass
class SimResult:
    """Totals of one replay. ``slot_iterations[s]`` = share s's slots summed over iterations."""

    workload: str
    policy: str
    pool_size: int
    n_requests: int
    iterations: int
    slot_iterations: dict
    external_slot_iterations: int
    generated_tokens: int
    prefill_tokens: int
    recomputed_tokens: int
    preemptions: int
    peak_running: int
    max_request_internal: (
        int  # the most internal fragmentation one request held at one snapshot
    )
    wall_seconds: float = 0.0
    # per stretch: TIMELINE_COLUMNS
    timeline: np.ndarray | None = field(default=None, repr=False)

    @property
    def shares(self) -> dict:
        """used / reserved / internal / rounding / free as fractions of the pool, averaged over
        iterations."""
        total = self.iterations * self.pool_size
        return {k: self.slot_iterations[k] / total for k in SHARES}

    @property
    def external_share(self) -> float:
        return self.external_slot_iterations / (self.iterations * self.pool_size)

    @property
    def avg_batch(self) -> float:
        """Running requests per iteration = tokens decoded per iteration."""
        return self.generated_tokens / self.iterations

    @property
    def requests_per_kiter(self) -> float:
        return 1000 * self.n_requests / self.iterations

    def row(self) -> dict:
        s = self.shares
        return {
            "policy": self.policy,
            **{k: 100 * v for k, v in s.items()},
            "external": 100 * self.external_share,
            "avg_batch": self.avg_batch,
            "iterations": self.iterations,
            "req/1k it": self.requests_per_kiter,
            "preemptions": self.preemptions,
            "recomputed": self.recomputed_tokens,
        }


# shares: slots per iteration
TIMELINE_COLUMNS = ("start", "length", "running", "preempted") + SHARES


def _check_fits(policy, wl, pool_size, reserve):
    """Every request must fit an empty pool, and a reservation must cover the final length."""
    final = wl.final_lens
    if policy.paged:
        need = policy.blocks_for(final)
        total = pool_size // policy.block_size
        have = total - policy.watermark_blocks(total)  # what an empty pool admits
        bad = np.flatnonzero(need > have)
        what = f"blocks of {policy.block_size} slots"
    else:
        low = np.flatnonzero(reserve < final)
        if low.size:
            i = int(low[0])
            raise ValueError(
                f"{policy.name}: request {i} reserves {int(reserve[i])} slots but ends at "
                f"{int(final[i])} tokens (a reservation must cover the final length)"
            )
        need, what = policy.held(reserve), "slots"
        # a buddy block comes out of one top block: the largest is 2^floor(log2 N)
        have = (
            1 << (pool_size.bit_length() - 1)
            if policy.placement == "buddy"
            else pool_size
        )
        bad = np.flatnonzero(need > have)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"request {i} needs {int(need[i])} {what}, more than an empty pool admits ({have}): "
            f"it could never run"
        )


def simulate(
    workload: Workload,
    pool_size: int = DEFAULT_POOL_SIZE,
    policy="paged",
    block_size: int = 16,
    *,
    placement: str = "buddy",
    max_running: int | None = None,
    progress: bool = True,
    timeline: bool = True,
) -> SimResult:
    """Replay ``workload`` on a pool of ``pool_size`` slots under ``policy`` (a name or a Policy).

    A policy given by name is placed by ``placement`` ('buddy', 'first_fit', 'any'; a
    Policy keeps its own); ``max_running`` caps the batch (vLLM's max_num_seqs); None:
    memory is the only limit.
    """
    from tqdm.auto import tqdm

    policy = make_policy(policy, block_size, placement)
    if int(pool_size) < 1:
        raise ValueError(f"pool_size must be >= 1, got {pool_size}")
    t0 = time.perf_counter()
    inp, out = workload.input_lens, workload.output_lens
    final = inp + out
    n, N = len(workload), int(pool_size)
    paged = policy.paged
    reserve = (
        None
        if paged
        else np.asarray(
            policy.reservation(inp, out, workload.max_context), dtype=np.int64
        )
    )
    _check_fits(policy, workload, N, reserve)
    B = policy.block_size if paged else 1
    blocks_for = policy.blocks_for if paged else None
    # slots the placement takes per request
    held = None if paged else policy.held(reserve)

    # A request's only moving part is how many tokens it has left to generate (kept across a
    # preemption); while it runs it holds final - left tokens of KV.
    left = out.copy()
    # admitted before (a readmission re-prefills: recompute)
    admitted = np.zeros(n, bool)
    blocks = np.zeros(n, np.int64)  # paged: blocks held
    start = np.zeros(n, np.int64)  # reservation: where the placement put it
    free_blocks = N // B if paged else 0
    keep_free = policy.watermark_blocks(free_blocks) if paged else 0
    space = None if paged else policy.make_space(N)
    steps = np.arange(1, int(out.max(initial=1)) + 1, dtype=np.int64)

    # running in admission order: the youngest is last
    waiting, running = (deque(range(n)), [])
    sums = dict.fromkeys(SHARES, 0)
    external = t = preemptions = prefill = recomputed = peak = max_internal = 0
    rows = []
    bar = tqdm(
        total=n,
        disable=not progress,
        desc=f"{workload.name} | {policy.name}",
        unit="req",
        mininterval=0.5,
        leave=False,
    )
    while running or waiting:
        # 1. admission: FCFS, stop at the first request that does not fit
        blocked_by_fragmentation = False
        while waiting and (max_running is None or len(running) < max_running):
            rid = waiting[0]
            # a preempted request re-prefills what it generated
            tokens = int(final[rid] - left[rid])
            if paged:
                need = int(blocks_for(tokens + 1))
                if need > free_blocks - keep_free:
                    break
                free_blocks -= need
                blocks[rid] = need
            else:
                s = space.alloc(int(reserve[rid]))
                if s < 0:
                    blocked_by_fragmentation = space.free >= held[rid]
                    break
                start[rid] = s
            waiting.popleft()
            running.append(rid)
            prefill += tokens
            # a readmission after a preemption
            recomputed += tokens if admitted[rid] else 0
            admitted[rid] = True
        peak = max(peak, len(running))

        # 2. decode the next k iterations at once: no request finishes before the last of them,
        #    no admission can succeed (nothing is freed), and (paged) their new blocks fit.
        idx = np.array(running, dtype=np.int64)
        preempted = 0
        if paged:
            while True:
                lf, m = left[idx], idx.size
                c = final[idx] - lf
                # A request takes at least one block every B steps, so no more than this many fit:
                k = min(int(lf.min()), B * (free_blocks // m + 1))
                # blocks held at each of the k steps
                hold = blocks_for(c[:, None] + steps[:k])
                had = blocks[idx]
                # new blocks taken by steps 1..s, cumulative
                taken = hold.sum(0) - int(had.sum())
                if taken[0] <= free_blocks:
                    break
                # The next step does not fit: preempt the youngest until it does (one request alone
                # always fits, so `running` never empties).
                first, need = hold[:, 0] - had, int(taken[0])
                while need > free_blocks:
                    victim = running.pop()
                    need -= int(first[len(running)])
                    free_blocks += int(blocks[victim])
                    blocks[victim] = 0
                    waiting.appendleft(victim)
                    preempted += 1
                idx = idx[: len(running)]
            k = int(taken.searchsorted(free_blocks, side="right"))
            hold = hold[:, :k]
            f = final[idx]
            waste = np.maximum(hold * B - f[:, None], 0)
            used = k * int(c.sum()) + m * k * (k + 1) // 2
            internal, rounding, allocated = int(waste.sum()), 0, B * int(hold.sum())
            max_internal = max(max_internal, int(waste.max()))
            free_blocks -= int(taken[k - 1])
            blocks[idx] = hold[:, -1]
        else:
            lf, m, r = left[idx], idx.size, reserve[idx]
            c = final[idx] - lf
            k = int(lf.min())  # iterations until the first request finishes
            used = k * int(c.sum()) + m * k * (k + 1) // 2
            over = r - final[idx]
            internal, allocated = k * int(over.sum()), k * int(held[idx].sum())
            rounding = allocated - k * int(r.sum())
            max_internal = max(max_internal, int(over.max()))
        # 3. the books of these k iterations
        preemptions += preempted
        free = N * k - allocated
        reserved = allocated - rounding - internal - used
        sums["used"] += used
        sums["reserved"] += reserved
        sums["internal"] += internal
        sums["rounding"] += rounding
        sums["free"] += free
        external += free if blocked_by_fragmentation else 0
        if timeline:
            rows.append(
                (
                    t,
                    k,
                    m,
                    preempted,
                    used / k,
                    reserved / k,
                    internal / k,
                    rounding / k,
                    free / k,
                )
            )
        lf -= k
        left[idx] = lf
        t += k

        # 4. finished requests free their slots
        done = idx[lf == 0]
        if done.size:
            if paged:
                free_blocks += int(blocks[done].sum())
                blocks[done] = 0
            else:
                for rid in done.tolist():
                    space.release(int(start[rid]), int(reserve[rid]))
            finished = set(done.tolist())
            running = [rid for rid in running if rid not in finished]
            bar.update(done.size)
    bar.close()
    return SimResult(
        workload=workload.name,
        policy=policy.name,
        pool_size=N,
        n_requests=n,
        iterations=t,
        slot_iterations=sums,
        external_slot_iterations=external,
        generated_tokens=int(out.sum()),
        prefill_tokens=prefill,
        recomputed_tokens=recomputed,
        preemptions=preemptions,
        peak_running=peak,
        max_request_internal=max_internal,
        wall_seconds=time.perf_counter() - t0,
        timeline=np.array(rows, dtype=np.float64).reshape(-1, len(TIMELINE_COLUMNS))
        if timeline
        else None,
    )


def compare_policies(
    workload: Workload,
    pool_size: int = DEFAULT_POOL_SIZE,
    block_size: int = 16,
    policies=("max", "pow2", "oracle", "paged"),
    placement: str = "buddy",
    progress: bool = True,
    **kw,
) -> list:
    """One replay per policy on the same stream and pool (reservations placed by ``placement``)."""
    return [
        simulate(
            workload,
            pool_size,
            p,
            block_size,
            placement=placement,
            progress=progress,
            **kw,
        )
        for p in policies
    ]


def block_size_sweep(
    workload: Workload,
    pool_size: int = DEFAULT_POOL_SIZE,
    block_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    progress: bool = True,
    **kw,
) -> list:
    """Paged allocation at each block size: bigger blocks, bigger tails of last blocks."""
    return [
        simulate(workload, pool_size, Paged(b), progress=progress, **kw)
        for b in block_sizes
    ]


def breakdown_table(results) -> str:
    """The shares (% of the pool) and throughput-ish numbers of some results, as a markdown
    table."""
    head = (
        "| policy | used % | reserved % | internal % | rounding % | free % (external) | avg batch "
        "| iterations | req / 1k it | preemptions |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in results:
        s = r.row()
        lines.append(
            f"| {s['policy']} | {s['used']:.1f} | {s['reserved']:.1f} | {s['internal']:.1f} | "
            f"{s['rounding']:.1f} | {s['free']:.1f} ({s['external']:.1f}) | {s['avg_batch']:.1f} | "
            f"{s['iterations']:,} | {s['req/1k it']:.2f} | {s['preemptions']:,} |"
        )
    return "\n".join(lines)


def bin_timeline(result: SimResult, bins: int = 300) -> dict:
    """The timeline averaged over at most ``bins`` equal stretches of iterations.

    Returns ``edges`` (bins + 1 iteration numbers), the mean of ``running`` and of every share
    (slots) over each bin, weighted by iterations (so bin means times bin widths add up to the
    result's totals), ``running_min`` / ``running_max`` over the stretches that touch each bin,
    and ``preempted``: preemptions in stretches starting in each bin.
    """
    if result.timeline is None or not len(result.timeline):
        raise ValueError(
            "this result has no timeline (simulate(..., timeline=True) records one)"
        )
    tl = {c: result.timeline[:, i] for i, c in enumerate(TIMELINE_COLUMNS)}
    total = result.iterations
    edges = np.linspace(0, total, min(int(bins), total) + 1)
    # stretch i covers [bounds[i], bounds[i + 1])
    bounds = np.append(tl["start"], total)
    width = np.diff(edges)
    out = {"edges": edges}
    for c in ("running",) + SHARES:
        integral = np.concatenate([[0.0], np.cumsum(tl["length"] * tl[c])])
        # exact: the values are flat per stretch
        out[c] = np.diff(np.interp(edges, bounds, integral)) / width
    first = np.searchsorted(bounds, edges[:-1], side="right") - 1
    last = np.searchsorted(bounds, edges[1:], side="left") - 1
    out["running_min"] = np.array(
        [tl["running"][a : b + 1].min() for a, b in zip(first, last)]
    )
    out["running_max"] = np.array(
        [tl["running"][a : b + 1].max() for a, b in zip(first, last)]
    )
    out["preempted"] = np.histogram(tl["start"], edges, weights=tl["preempted"])[0]
    return out
