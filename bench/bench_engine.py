"""Engine throughput with page size 1 and 16, next to transformers' generate on the same prompts,
measured side by side in one run.

  python bench/bench_engine.py [--requests 16] [--new 32] [--attention torch|triton]
  [--checkpoint DIR]

Without --checkpoint it serves memlab's random TinyLlama (saved as a LlamaForCausalLM folder so
that transformers runs the very same weights); with it, a Hugging Face Llama checkpoint folder
(config.json + *.safetensors, e.g. SmolLM2-135M-Instruct's snapshot). Prompts are random token
ids of 16 to 96 tokens; every request generates exactly --new tokens (end-of-sequence ignored on
both sides). transformers runs greedy generate one prompt at a time (how the tests use it) and
once for the whole batch, left-padded (its own batching). float32. On CPU the torch attention
path is the meaningful one (the Triton interpreter is a simulator); on a GPU both run compiled.
"""

import argparse
import random
import sys
import tempfile
import time

import torch

from memlab.capstone import checkpoint
from memlab.capstone.engine import Engine, TinyConfig, TinyLlama, throughput
from memlab.common.env import kernel_device


def hf_generate(hf, prompts, new, batched: bool):
    """transformers' greedy generate; returns (new tokens per prompt, seconds)."""
    dev = hf.device
    kw = dict(
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        num_beams=1,
        pad_token_id=0,
    )
    t0 = time.perf_counter()
    with torch.no_grad():
        if not batched:
            outs = []
            for p in prompts:
                ids = torch.tensor([p], device=dev)
                outs.append(
                    hf.generate(ids, attention_mask=torch.ones_like(ids), **kw)[
                        0, len(p) :
                    ].tolist()
                )
        else:  # left padding: every row's last prompt token sits in the last column
            width = max(map(len, prompts))
            ids = torch.tensor(
                [[0] * (width - len(p)) + p for p in prompts], device=dev
            )
            mask = torch.tensor(
                [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=dev
            )
            outs = hf.generate(ids, attention_mask=mask, **kw)[:, width:].tolist()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return outs, time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--attention", default="torch", choices=["torch", "triton"])
    ap.add_argument(
        "--checkpoint",
        help="a Hugging Face Llama checkpoint folder (default: the random TinyLlama)",
    )
    ap.add_argument(
        "--no-transformers", action="store_true", help="skip the transformers side"
    )
    ap.add_argument(
        "--threads", type=int, help="torch CPU threads (default: torch's choice)"
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = kernel_device()
    tmp = None
    if args.checkpoint:
        model, folder, name = (
            checkpoint.load(args.checkpoint, device=dev),
            args.checkpoint,
            args.checkpoint,
        )
    else:
        model, name = TinyLlama(TinyConfig(), device=dev), "random TinyLlama"
        tmp = tempfile.TemporaryDirectory()
        folder = tmp.name
        if not args.no_transformers:
            checkpoint.save(model, folder)
    c = model.cfg
    rng = random.Random(0)
    prompts = [
        [rng.randrange(c.vocab_size) for _ in range(rng.randint(16, 96))]
        for _ in range(args.requests)
    ]
    print(
        f"{name}: {checkpoint.num_params(c) / 1e6:.1f} M parameters, {c.num_layers} layers, float32; device {dev}, "
        f"attention {args.attention}, torch threads {torch.get_num_threads()}"
    )
    print(
        f"{args.requests} requests of {sum(map(len, prompts))} prompt tokens in all, {args.new} new tokens each"
    )
    # Warm-ups, untimed: the first pass touches every weight and sets up torch's kernels.
    Engine(
        model, page_size=16, num_tokens=256, attention=args.attention, ignore_eos=True
    ).generate([prompts[0]], 2)
    rows, outs = {}, {}
    for ps in (1, 16):
        e = Engine(
            model,
            page_size=ps,
            num_tokens=max(
                8192, 2 * sum(map(len, prompts)) + 2 * args.requests * args.new
            ),
            max_running=args.requests,
            chunk_size=256,
            attention=args.attention,
            ignore_eos=True,
            alloc_backend="triton" if dev == "cuda" else "torch",
        )
        rows[ps] = throughput(e, prompts, args.new)
        outs[ps] = [r.output for r in sorted(e.finished, key=lambda r: r.rid)]
        r = rows[ps]
        print(
            f"memlab engine, page_size {ps:>2}: {r['seconds']:6.2f} s, {r['generated_per_s']:7.1f} generated tokens/s "
            f"({r['tokens_per_s']:.0f} tokens/s with {r['prefill']} prefill tokens)"
        )
    print(
        f"ratio page 16 / page 1 (tokens/s): {rows[16]['tokens_per_s'] / rows[1]['tokens_per_s']:.2f}x"
    )
    if args.no_transformers:
        return 0
    try:
        from memlab.course.chat import load_reference
    except ImportError as exc:
        print(f"transformers side skipped: {exc}")
        return 0
    hf = load_reference(folder, dev)
    hf_generate(hf, prompts[:1], 2, batched=False)
    gen = args.requests * args.new
    for batched in (False, True):
        hf_outs, secs = hf_generate(hf, prompts, args.new, batched)
        how = "whole batch, left-padded" if batched else "one prompt at a time"
        same = sum(a == b for a, b in zip(hf_outs, outs[16]))
        print(
            f"transformers generate ({how}): {secs:6.2f} s, {gen / secs:7.1f} generated tokens/s; "
            f"memlab page 16 is {rows[16]['generated_per_s'] / (gen / secs):.2f}x that; "
            f"{same} of {len(prompts)} outputs identical"
        )
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
