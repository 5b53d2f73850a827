"""Cache-aware scheduling (SGLang's longest-prefix-match order) against first come first served,
on the Mooncake conversation trace, in one run.

  python bench/bench_schedule.py [--requests 96] [--block 2] [--max-blocks 64] [--pool 768]

The trace gives each request one id per 512-token block of its prompt (equal ids: an equal
prefix). Scaled down for the tiny model: each block becomes ``--block`` token ids drawn from its
id, prompts longer than ``--max-blocks`` blocks are left out, every request asks for 4 new tokens
(``ignore_eos``). All requests wait from the start; the engine (page size 1, a radix prefix cache
of ``--pool`` slots, 8 rows, 64-token chunks, torch attention) serves them once with
``schedule_policy="fcfs"`` and once with ``"lpm"``. Printed for each: the prefix hit rate (prompt
tokens found cached, over all prompt tokens), the tokens computed (prefill and decode), the
finishing order (request ids, and how far each finished from its arrival place), and whether
every request's output is the same under both.
"""

import argparse
import random

from memlab.capstone.engine import Engine, TinyConfig, TinyLlama
from memlab.capstone.trace_replay import load_trace


def trace_prompts(
    requests: int, block: int, max_blocks: int, vocab: int
) -> list[list[int]]:
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
    model = TinyLlama(TinyConfig())
    prompts = trace_prompts(requests, block, max_blocks, model.cfg.vocab_size)
    return {p: serve(prompts, p, pool, model) for p in ("fcfs", "lpm")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--block", type=int, default=2)
    ap.add_argument("--max-blocks", type=int, default=64)
    ap.add_argument("--pool", type=int, default=768)
    a = ap.parse_args(argv)
    res = measure(a.requests, a.block, a.max_blocks, a.pool)
    f, l = res["fcfs"], res["lpm"]
    print(
        f"{a.requests} requests of the conversation trace, {a.block} tokens a block, pool {a.pool} slots"
    )
    print(f"{'':22}{'FCFS':>12}{'LPM':>12}")
    print(f"{'prefix hit rate':22}{f['hit_rate']:>12.1%}{l['hit_rate']:>12.1%}")
    print(f"{'cached prompt tokens':22}{f['cached']:>12}{l['cached']:>12}")
    print(f"{'tokens computed':22}{f['computed']:>12}{l['computed']:>12}")
    print(f"{'  of them prefill':22}{f['prefill']:>12}{l['prefill']:>12}")
    print(f"{'retractions':22}{f['retracted']:>12}{l['retracted']:>12}")
    print(
        f"{'mean displacement':22}{f['displacement']:>12.1f}{l['displacement']:>12.1f}"
    )
    print(f"FCFS finishing order (first 24): {f['order'][:24]}")
    print(f"LPM  finishing order (first 24): {l['order'][:24]}")
    print(f"same output for every request: {f['outputs'] == l['outputs']}")


if __name__ == "__main__":
    main()
