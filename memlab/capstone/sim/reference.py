"""The simulator's rules, one iteration at a time, one request at a time, in plain Python.

Slow on purpose: it is the specification ``memlab.capstone.sim.replay.simulate`` is tested against
(same totals, exactly). Use it for toy streams of a few dozen requests.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from memlab.capstone.sim.policies import make_policy
from memlab.capstone.sim.replay import SHARES, SimResult, _check_fits
from memlab.capstone.sim.workload import Workload


def simulate_reference(
    workload: Workload,
    pool_size: int,
    policy="paged",
    block_size: int = 16,
    *,
    placement: str = "buddy",
    max_running: int | None = None,
) -> SimResult:
    policy = make_policy(policy, block_size, placement)
    inp = [int(x) for x in workload.input_lens]
    out = [int(x) for x in workload.output_lens]
    n, N = len(inp), pool_size
    reserve = None
    if not policy.paged:
        reserve = [
            int(x)
            for x in policy.reservation(
                workload.input_lens, workload.output_lens, workload.max_context
            )
        ]
    _check_fits(policy, workload, N, None if reserve is None else np.asarray(reserve))
    B = policy.block_size if policy.paged else 1
    gen, cur, blocks, start, admitted = [0] * n, [0] * n, [0] * n, [0] * n, [False] * n
    free_blocks = N // B
    keep_free = policy.watermark_blocks(free_blocks) if policy.paged else 0
    space = None if policy.paged else policy.make_space(N, debug_mode=True)
    waiting, running = deque(range(n)), []
    sums = dict.fromkeys(SHARES, 0)
    external = t = preemptions = prefill = recomputed = peak = max_internal = 0

    while running or waiting:
        blocked_by_fragmentation = False
        while waiting and (max_running is None or len(running) < max_running):
            rid = waiting[0]
            tokens = inp[rid] + gen[rid]
            if policy.paged:
                need = int(policy.blocks_for(tokens + 1))
                if need > free_blocks - keep_free:
                    break
                free_blocks -= need
                blocks[rid] = need
            else:
                s = space.alloc(reserve[rid])
                if s < 0:
                    blocked_by_fragmentation = space.free >= space.held(reserve[rid])
                    break
                start[rid] = s
            waiting.popleft()
            running.append(rid)
            cur[rid] = tokens
            prefill += tokens
            if admitted[rid]:
                recomputed += tokens
            admitted[rid] = True
        peak = max(peak, len(running))

        if policy.paged:

            def step_need():
                return sum(
                    int(policy.blocks_for(cur[r] + 1)) - blocks[r] for r in running
                )

            while step_need() > free_blocks:
                victim = running.pop()
                free_blocks += blocks[victim]
                blocks[victim] = cur[victim] = 0
                waiting.appendleft(victim)
                preemptions += 1
        held_total = 0
        for rid in running:
            cur[rid] += 1
            gen[rid] += 1
            if policy.paged:
                now = int(policy.blocks_for(cur[rid]))
                free_blocks -= now - blocks[rid]
                blocks[rid] = now
                asked = alloc = now * B
            else:
                asked, alloc = reserve[rid], space.held(reserve[rid])
            final = inp[rid] + out[rid]
            sums["used"] += cur[rid]
            sums["reserved"] += min(asked, final) - cur[rid]
            sums["internal"] += max(0, asked - final)
            sums["rounding"] += alloc - asked
            max_internal = max(max_internal, asked - final)
            held_total += alloc
        sums["free"] += N - held_total
        if blocked_by_fragmentation:
            external += N - held_total
        t += 1

        for rid in [r for r in running if gen[r] == out[r]]:
            running.remove(rid)
            if policy.paged:
                free_blocks += blocks[rid]
                blocks[rid] = 0
            else:
                space.release(start[rid], reserve[rid])

    return SimResult(
        workload=workload.name,
        policy=policy.name,
        pool_size=N,
        n_requests=n,
        iterations=t,
        slot_iterations=sums,
        external_slot_iterations=external,
        generated_tokens=sum(out),
        prefill_tokens=prefill,
        recomputed_tokens=recomputed,
        preemptions=preemptions,
        peak_running=peak,
        max_request_internal=max(max_internal, 0),
    )
