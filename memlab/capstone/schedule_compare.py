"""Cache-aware scheduling against first come first served on the conversation trace (chapter 12).

The Mooncake FAST'25 conversation trace (``memlab.vllm.trace_replay.load_trace``) gives each
request one id per 512-token block of its prompt; equal ids mean an equal prefix. Scaled down for
the tiny model: each block becomes ``block`` token ids drawn from its id, prompts longer than
``max_blocks`` blocks are left out, every request asks for 4 new tokens (``ignore_eos``). All
requests wait from the start; the engine (page size 1, a radix prefix cache of ``pool`` slots,
8 rows, 64-token chunks, torch attention) serves them once with ``schedule_policy="fcfs"`` and
once with ``"lpm"`` (SGLang's longest prefix match first). ``measure`` returns, per policy, the
prefix hit rate (prompt tokens found cached, over all prompt tokens), the tokens computed, the
finishing order and how far it strays from the arrival order, and every request's output.
``python bench/bench_schedule.py`` prints them side by side; chapter 12 quotes them.

    from memlab.capstone.schedule_compare import measure
    res = measure(requests=32)
    res["lpm"]["hit_rate"], res["fcfs"]["hit_rate"]
"""

from __future__ import annotations

import random

from memlab.capstone.engine import Engine, TinyConfig, TinyLlama
from memlab.vllm.trace_replay import load_trace

POLICIES = ("fcfs", "lpm")


def trace_prompts(
    requests: int, block: int, max_blocks: int, vocab: int
) -> list[list[int]]:
    """The first ``requests`` prompts of the conversation trace of at most ``max_blocks``
    blocks, each block ``block`` token ids drawn from its id (equal ids, equal tokens)."""
    prompts = []
    for r in load_trace("conversation"):
        if len(prompts) == requests:
            break
        if len(r.block_hashes) > max_blocks:
            continue
        prompts.append(
            [
                t
                for h in r.block_hashes
                for t in random.Random(h).choices(range(1, vocab), k=block)
            ]
        )
    return prompts


def serve(prompts, policy: str, pool: int, model) -> dict:
    """Every prompt waiting from the start, served to the end under ``policy``."""
    e = Engine(
        model,
        page_size=1,
        num_tokens=pool,
        max_running=8,
        max_context=512,
        chunk_size=64,
        attention="torch",
        prefix_cache="radix",
        ignore_eos=True,
        schedule_policy=policy,
    )
    reqs = [e.add_request(p, 4) for p in prompts]
    while e.step():
        pass
    st = e.stats
    order = [r.rid for r in e.finished]
    return dict(
        policy=policy,
        hit_rate=st["cached_tokens"] / st["prompt_tokens"],
        cached=st["cached_tokens"],
        prompt=st["prompt_tokens"],
        computed=st["prefill_tokens"] + st["decode_tokens"],
        prefill=st["prefill_tokens"],
        retracted=st["retracted"],
        order=order,
        displacement=sum(abs(i - rid) for i, rid in enumerate(order)) / len(order),
        outputs=[r.output for r in reqs],
    )


def measure(
    requests: int = 96, block: int = 2, max_blocks: int = 64, pool: int = 768
) -> dict:
    """``serve`` under each policy on the same prompts: policy -> its figures."""
    model = TinyLlama(TinyConfig())
    prompts = trace_prompts(requests, block, max_blocks, model.cfg.vocab_size)
    return {p: serve(prompts, p, pool, model) for p in POLICIES}
