"""The engine against transformers' batched generate, side by side in one run, on two workloads.

  python bench/bench_engine.py [--requests 64] [--spread 1.0 | --speedup X] [--scale-in 16]
      [--scale-out 8] [--batch 16] [--equal-requests 16] [--equal-new 32] [--repeat 3]
      [--threads 1] [--attention torch|triton] [--checkpoint DIR]

The trace: the first --requests of the Azure LLM inference trace 2023, conversation service
(data/azure/, CC-BY 4.0), each request with its own prompt length (ContextTokens / --scale-in)
and output length (GeneratedTokens / --scale-out; it stops there), arriving at its own time
(TIMESTAMP, replayed faster: by default so that the arrivals span --spread times what
transformers needs to generate all the outputs at its best pace, the equal-length case's, measured
first in the same run: the requests come about as fast as it could ever serve them, on any
machine; --speedup sets the factor instead). Prompts
are random token ids of those lengths. The engine (page size 16, a prefix cache, at most --batch
requests running) takes each request when it arrives: once with SGLang's --enable-mixed-chunk
(the running requests decode in the pass that prefills a newcomer), once with prefill passes
apart (SGLang's default). transformers serves the same requests in static batches: whenever its
model is free it takes the requests that have arrived (up to --batch), left-pads their prompts
and runs greedy ``generate`` until the longest output of the batch is done; each request keeps
its own first tokens. Generated tokens per second = the outputs' tokens over the time from the
first arrival to the last token. Each side runs --repeat times, taking turns; its fastest run
counts (the machine's other work slows a run, never speeds it up).

The equal-length case: --equal-requests prompts of 16 to 96 tokens, all there at the start, each
generating exactly --equal-new tokens, one left-padded batch for transformers: static batching's
best case (no request waits for another's longer output, no arrival waits for a batch).

Both sides run the very same weights: memlab's random TinyLlama saved as a LlamaForCausalLM
folder (or --checkpoint, a Hugging Face Llama folder), float32, greedy, end-of-sequence ignored,
transformers with its default attention (SDPA); the outputs are compared token for token.
Printed: tokens per second of both and their ratio for each workload, where the engine's step
time goes (scheduling, allocation, model, the requests' books), and the engine's per-step cost
with the model stubbed out (a forward that computes nothing: the overhead a bigger model would
hide). On CPU the torch attention path is the meaningful one (the Triton interpreter is a
simulator); on a GPU both run compiled. The last line is the trace's ratio (mixed chunks).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import deque

import torch

from memlab.capstone import checkpoint, sim
from memlab.capstone.engine import Engine, TinyConfig, TinyLlama
from memlab.common.env import kernel_device

MAX_CONTEXT = 1024


class Arrival:
    __slots__ = ("at", "prompt", "new")

    def __init__(self, at: float, prompt: list[int], new: int):
        self.at, self.prompt, self.new = at, prompt, new


def trace_lengths(n: int, scale_in: float, scale_out: float) -> list[tuple[int, int]]:
    """(prompt, output) lengths of Azure 2023 conv's first ``n`` requests, scaled down."""
    wl = sim.load_azure("conv", n=n)
    out = []
    for i, o in zip(wl.input_lens.tolist(), wl.output_lens.tolist()):
        new = max(1, round(o / scale_out))
        out.append((min(max(1, round(i / scale_in)), MAX_CONTEXT - new), new))
    return out


def trace_workload(lengths, speedup: float, vocab: int, seed: int = 0) -> list[Arrival]:
    """The requests at their trace times (``speedup`` times faster), random prompts."""
    at = sim.load_azure_arrivals("conv", len(lengths)) / speedup
    rng = random.Random(seed)
    return [
        Arrival(t, [rng.randrange(vocab) for _ in range(p)], new)
        for t, (p, new) in zip(at.tolist(), lengths)
    ]


def make_engine(model, batch: int, attention: str, dev, mixed: bool) -> Engine:
    return Engine(
        model,
        page_size=16,
        num_tokens=batch * MAX_CONTEXT,
        max_running=batch,
        max_context=MAX_CONTEXT,
        chunk_size=512,
        attention=attention,
        ignore_eos=True,
        alloc_backend="triton" if dev == "cuda" else "torch",
        enable_mixed_chunk=mixed,
    )


def serve_engine(engine: Engine, arrivals) -> tuple:
    """Each request joins the engine's queue once its time has come: (outputs, seconds, steps,
    the engine's step times)."""
    pending, reqs, steps = deque(arrivals), [], 0
    start = time.perf_counter()
    while True:
        now = time.perf_counter() - start
        while pending and pending[0].at <= now:
            a = pending.popleft()
            reqs.append(engine.add_request(a.prompt, a.new))
        if engine.step():
            steps += 1
        elif pending:  # idle until the next arrival
            time.sleep(max(0.0, pending[0].at - (time.perf_counter() - start)))
        else:
            break
    sync()
    seconds = time.perf_counter() - start
    return [r.output for r in reqs], seconds, steps, dict(engine.step_times)


def hf_batch(hf, prompts: list[list[int]], new: int) -> list[list[int]]:
    """transformers' greedy generate on one left-padded batch: ``new`` tokens for every row."""
    dev = hf.device
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=dev)
    mask = torch.tensor(
        [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=dev
    )
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            num_beams=1,
            pad_token_id=0,
        )
    return out[:, width:].tolist()


def serve_hf(hf, arrivals, batch: int) -> tuple:
    """Static batches: whenever the model is free, the arrived requests (up to ``batch``) run
    together until the longest output is done; each keeps its own first tokens."""
    pending, outs = deque(arrivals), []
    start = time.perf_counter()
    while pending:
        now = time.perf_counter() - start
        if pending[0].at > now:
            time.sleep(pending[0].at - now)
            continue
        group = []
        while pending and pending[0].at <= now and len(group) < batch:
            group.append(pending.popleft())
        rows = hf_batch(hf, [a.prompt for a in group], max(a.new for a in group))
        outs += [row[: a.new] for row, a in zip(rows, group)]
    sync()
    return outs, time.perf_counter() - start


def load_transformers(folder, dev):
    """transformers' own LlamaForCausalLM on the folder, with its default attention (SDPA)."""
    import transformers

    major = int(transformers.__version__.split(".")[0])
    dtype_kw = "dtype" if major >= 5 else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, **{dtype_kw: torch.float32}
    )
    return model.to(dev).eval()


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StubModel(TinyLlama):
    """The model's forward stubbed out: logits of zeros (token 0 next), no layer, no attention,
    no KV written. The engine's step around it is all that is left to time."""

    def forward(self, input_ids, positions, attend, logits_rows=None):
        n = len(input_ids) if logits_rows is None else len(logits_rows)
        return torch.zeros(n, self.cfg.vocab_size, device=self.device)


def stub_overhead(cfg, arrivals, batch, attention, dev) -> dict:
    """The engine's per-step cost without the model, on the trace's requests all at once."""
    e = make_engine(StubModel(cfg, device=dev), batch, attention, dev, mixed=True)
    _, seconds, steps, times = serve_engine(
        e, [Arrival(0.0, a.prompt, a.new) for a in arrivals]
    )
    request_steps = e.stats["decode_tokens"] + e.stats["requests"]
    return dict(
        steps=steps,
        ms_per_step=1e3 * seconds / steps,
        us_per_request_step=1e6 * seconds / request_steps,
        times=times,
    )


def breakdown(times: dict, steps: int) -> str:
    total = sum(times.values())
    return ", ".join(
        f"{k} {1e3 * v / steps:.2f} ms ({v / total:.0%})" for k, v in times.items()
    )


def fastest(runs):
    return min(runs, key=lambda r: r[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--spread", type=float, default=1.0)
    ap.add_argument("--speedup", type=float, help="replay the trace this much faster")
    ap.add_argument("--scale-in", type=float, default=16.0)
    ap.add_argument("--scale-out", type=float, default=8.0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--equal-requests", type=int, default=16)
    ap.add_argument("--equal-new", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--attention", default="torch", choices=["torch", "triton"])
    ap.add_argument(
        "--checkpoint",
        help="a Hugging Face Llama checkpoint folder (default: the random TinyLlama)",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dev = kernel_device()
    tmp = tempfile.TemporaryDirectory()
    if args.checkpoint:
        model, folder = checkpoint.load(args.checkpoint, device=dev), args.checkpoint
        name = args.checkpoint
    else:
        model, folder = TinyLlama(TinyConfig(), device=dev), tmp.name
        name = "random TinyLlama"
        checkpoint.save(model, folder)
    hf = load_transformers(folder, dev)
    c = model.cfg
    print(
        f"{name}: {checkpoint.num_params(c) / 1e6:.1f} M parameters, {c.num_layers} layers, "
        f"float32; device {dev}, attention {args.attention}, torch threads "
        f"{torch.get_num_threads()}"
    )

    def engine_run(arrivals, batch, mixed=True):
        return serve_engine(
            make_engine(model, batch, args.attention, dev, mixed), arrivals
        )

    # Warm-ups, untimed: the first pass touches every weight and sets up torch's kernels.
    engine_run([Arrival(0.0, [1, 2, 3], 2)], 2)
    hf_batch(hf, [[1, 2, 3]], 2)

    # -- the equal-length case ------------------------------------------------------------
    rng = random.Random(0)
    equal = [
        Arrival(
            0.0, [rng.randrange(c.vocab_size) for _ in range(rng.randint(16, 96))], n
        )
        for n in [args.equal_new] * args.equal_requests
    ]
    runs = [
        (engine_run(equal, len(equal)), serve_hf(hf, equal, len(equal)))
        for _ in range(args.repeat)
    ]
    mine, secs = fastest(r[0] for r in runs)[:2]
    theirs, hf_secs = fastest(r[1] for r in runs)
    gen = args.equal_requests * args.equal_new
    print(
        f"\nequal lengths: {len(equal)} requests, {sum(len(a.prompt) for a in equal)} prompt "
        f"tokens, {args.equal_new} new tokens each, all there at the start"
    )
    print(
        f"  memlab engine: {secs:6.2f} s, {gen / secs:7.1f} generated tokens/s; "
        f"transformers (one left-padded batch): {hf_secs:6.2f} s, {gen / hf_secs:7.1f}; "
        f"{sum(a == b for a, b in zip(mine, theirs))} of {len(equal)} outputs identical"
    )
    print(
        f"  engine vs transformers batched, equal lengths: {hf_secs / secs:.2f}x (static "
        "batching's best case: every row is useful until the last step and nobody arrives "
        "late, so this is one step's cost against the other's: the engine pays for its books, "
        "paged attention and scheduling, transformers for padding and its generate loop)"
    )

    # -- the trace ------------------------------------------------------------------------
    lengths = trace_lengths(args.requests, args.scale_in, args.scale_out)
    speedup = args.speedup
    if speedup is None:  # the arrivals span --spread of transformers' equal-length pace
        span = float(sim.load_azure_arrivals("conv", args.requests)[-1])
        speedup = span * (gen / hf_secs) / (args.spread * sum(n for _, n in lengths))
    arrivals = trace_workload(lengths, speedup, c.vocab_size)
    ins, news = [p for p, _ in lengths], [n for _, n in lengths]
    print(
        f"\nthe conversation trace (Azure LLM inference 2023, conv): {len(arrivals)} requests, "
        f"prompts {sum(ins) / len(ins):.0f} tokens on average (at most {max(ins)}), outputs "
        f"{sum(news) / len(news):.1f} (at most {max(news)}), arriving over "
        f"{arrivals[-1].at:.2f} s (the trace's pace x {speedup:.0f}); at most {args.batch} "
        "at once on both sides"
    )
    runs = [  # the sides take turns, so a busy moment of the machine hits each of them
        (
            engine_run(arrivals, args.batch),
            engine_run(arrivals, args.batch, mixed=False),
            serve_hf(hf, arrivals, args.batch),
        )
        for _ in range(args.repeat)
    ]
    mine, secs, steps, times = fastest(r[0] for r in runs)
    apart, apart_secs, apart_steps, _ = fastest(r[1] for r in runs)
    theirs, hf_secs = fastest(r[2] for r in runs)
    gen = sum(news)
    same = sum(a == b == c for a, b, c in zip(mine, apart, theirs))
    print(
        f"  memlab engine, mixed chunks: {secs:6.2f} s, {gen / secs:7.1f} generated tokens/s "
        f"({steps} steps); prefill passes apart: {apart_secs:6.2f} s, "
        f"{gen / apart_secs:7.1f} ({apart_steps} steps, {hf_secs / apart_secs:.2f}x "
        f"transformers); transformers (static batches): {hf_secs:6.2f} s, "
        f"{gen / hf_secs:7.1f}; {same} of {len(arrivals)} outputs identical on all three"
    )
    print(f"  where the engine's steps go (mixed chunks): {breakdown(times, steps)}")
    stub = min(
        (
            stub_overhead(c, arrivals, args.batch, args.attention, dev)
            for _ in range(args.repeat)
        ),
        key=lambda r: r["ms_per_step"],
    )
    print(
        f"  with the model stubbed out: {stub['ms_per_step']:.2f} ms per step, "
        f"{stub['us_per_request_step']:.0f} us per request and step ({stub['steps']} steps: "
        f"{breakdown(stub['times'], stub['steps'])})"
    )
    tmp.cleanup()
    print(f"engine vs transformers batched on the trace: {hf_secs / secs:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
