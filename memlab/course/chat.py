"""A real instruct model served through memlab's books, next to transformers (chapter 10).

``download`` fetches a checkpoint when the runtime can reach the Hugging Face Hub, and
otherwise says why in one line and returns None. ``serve_chat`` puts questions after one
shared system prompt with the model's chat template, serves them through
``memlab.capstone.engine.Engine`` (paged pool, prefix cache, the Triton attention kernel
on a GPU, torch on a CPU), generates the same prompts with transformers (greedy, one
prompt at a time) and keeps the engine's books step by step for the chapter's widget.
The tests drive ``serve_chat`` with a small checkpoint built locally, so everything but
the download runs in CI.

Needs ``transformers`` (tokenizer, reference) and ``safetensors``; both are imported only here.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch

from memlab.capstone import checkpoint
from memlab.capstone.engine import Engine
from memlab.common.utils import ceil_div

# SmolLM2-135M-Instruct: LlamaForCausalLM exactly (GQA 9/3 heads, tied embeddings, no rope
# scaling, no biases), Apache-2.0, no login, 134.5 M parameters: about 270 MB of bfloat16.
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
FILES = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
]
T4_GIB = 15  # a T4 has 16 GB, 15 GiB of which CUDA reports as usable


def download(
    repo_id: str = SMOLLM2, offline: bool = False, timeout: float = 3.0
) -> Path | None:
    """The checkpoint's folder in the local Hugging Face cache (weights, config, tokenizer only),
    or None after one line saying why it cannot be fetched here."""

    def skip(why):
        print(f"real model skipped: {why}")

    if offline or os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        skip("offline mode")
        return None
    try:
        import huggingface_hub
        import safetensors  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        skip(f"{exc.name} is not installed (pip install transformers safetensors)")
        return None
    host = urlparse(huggingface_hub.constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        skip(f"{host} cannot be reached from this runtime")
        return None
    try:
        return Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=FILES))
    # The Hub answered but would not serve it: say so, do not stop the chapter.
    except Exception as exc:
        skip(
            f"{repo_id} could not be downloaded ({type(exc).__name__}: {str(exc)[:120]})"
        )
        return None


def chat_prompts(tokenizer, system: str, questions) -> list[list[int]]:
    """Token ids of each question after the same system prompt, in the model's chat template,
    ending where the assistant's answer starts."""
    out = []
    for q in questions:
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": q}],
            tokenize=False,
            add_generation_prompt=True,
        )
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def load_reference(folder, device="cpu", dtype=torch.float32):
    """transformers' own LlamaForCausalLM on the same folder, plain eager attention."""
    import transformers

    dtype_kw = (
        "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", **{dtype_kw: dtype}
    )
    return model.to(device).eval()


@torch.no_grad()
def reference_generate(hf_model, prompts, max_new_tokens: int):
    """transformers' greedy ``generate``, one prompt at a time (no padding); returns the new tokens
    (up to and including an end-of-sequence token) and, per prompt, the gap between the best and
    the second-best logit at each step (a small gap is a near tie that rounding may flip)."""
    outs, gaps = [], []
    dev = hf_model.device
    for p in prompts:
        ids = torch.tensor([p], device=dev)
        g = hf_model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        outs.append(g.sequences[0, len(p) :].tolist())
        top2 = torch.stack([lg[0].float().topk(2).values for lg in g.logits])
        gaps.append((top2[:, 0] - top2[:, 1]).tolist())
    return outs, gaps


@dataclass
class ChatRun:
    name: str
    questions: list
    prompts: list  # token ids
    outputs: list  # the engine's new tokens per question
    answers: list  # decoded
    engine: Engine
    frames: list  # the engine's books per step (memlab.course.viz.draw_engine.engine_frames)
    seconds: float
    reference: list | None = None  # transformers' new tokens
    gaps: list | None = None  # transformers' best-minus-second logit per step
    reference_seconds: float | None = None
    max_position_embeddings: int = 4096

    @property
    def generated(self) -> int:
        return sum(map(len, self.outputs))

    def agreement(self) -> list[str]:
        """Per question: identical to transformers, or where they part and how close that step
        was."""
        lines = []
        for i, (ours, ref) in enumerate(zip(self.outputs, self.reference or [])):
            if ours == ref:
                lines.append(f"  {i}: identical ({len(ours)} tokens)")
                continue
            k = next(
                (j for j, (a, b) in enumerate(zip(ours, ref)) if a != b),
                min(len(ours), len(ref)),
            )
            gap = self.gaps[i][k] if k < len(self.gaps[i]) else float("nan")
            lines.append(
                f"  {i}: same first {k} tokens, then differs; "
                f"transformers' top-2 logit gap there: {gap:.3g}"
            )
        return lines

    def format(self) -> str:
        lines = []
        for q, a in zip(self.questions, self.answers):
            lines += [f"Q: {q}", f"A: {a.strip()}", ""]
        s = self.engine.stats
        lines.append(
            f"engine: {self.generated} tokens in {self.seconds:.1f} s "
            f"({self.generated / self.seconds:.1f} tokens/s); "
            f"{s['prompt_tokens']} prompt tokens, "
            f"{s['cached_tokens']} of them prefix-cache hits, "
            f"{s['prefill_tokens']} computed; {s['retracted']} retractions"
        )
        if self.reference is not None:
            same = sum(a == b for a, b in zip(self.outputs, self.reference))
            gen = sum(map(len, self.reference))
            lines.append(
                "transformers (greedy, one prompt at a time): "
                f"{gen} tokens in {self.reference_seconds:.1f} s "
                f"({gen / self.reference_seconds:.1f} tokens/s); "
                f"{same} of {len(self.outputs)} answers token for token the same"
            )
            lines += self.agreement()
        return "\n".join(lines)

    # -- the books ---------------------------------------------------------------------------
    def pages_per_request(self) -> list[int]:
        """Pages each request ended with: its prompt and answer rounded up to whole pages."""
        ps = self.engine.page_size
        return [
            ceil_div(len(p) + len(o), ps) for p, o in zip(self.prompts, self.outputs)
        ]

    def sizing(self, gpu_gib: float = T4_GIB) -> str:
        """KV bytes per token, what ``memlab.sglang.sizing`` says a T4 holds, and what the engine
        used."""
        from memlab.sglang import sizing

        e, cfg = self.engine, self.engine.model.cfg
        served = e.model.dtype.itemsize
        per_tok = checkpoint.sizing_model(cfg, self.name).kv_bytes_per_token(
            dtype_bytes=served
        )
        bf16 = checkpoint.sizing_model(cfg, self.name).kv_bytes_per_token(dtype_bytes=2)
        longest = max(len(p) + len(o) for p, o in zip(self.prompts, self.outputs))
        peak = max(owned + cached for _, _, owned, cached, _ in self.frames[-1].history)
        ps = e.page_size
        lines = [
            f"KV per token: {per_tok:,} B as served ({e.model.dtype}), {bf16:,} B in bfloat16 "
            f"(2 x {cfg.num_layers} layers x {cfg.num_kv_heads} KV heads x {cfg.head_dim} x bytes)",
            f"engine: pool of {e.allocator.size:,} slots "
            f"= {e.allocator.size * per_tok / 2**20:.1f} MiB; "
            f"at most {peak} pages ({peak * ps * per_tok / 2**20:.2f} MiB) "
            "held at once (owned + cached); "
            f"pages per request at the end: {self.pages_per_request()}",
        ]
        for kvb, what in (
            (2, "bfloat16 weights and KV"),
            (served, f"{e.model.dtype} weights and KV"),
        ):
            model = checkpoint.sizing_model(
                cfg, self.name, self.max_position_embeddings, weight_dtype_bytes=kvb
            )
            sched = sizing.ScheduleConfig(page_size=ps, kv_dtype_bytes=kvb)
            gpu = sizing.GPUConfig.gib(gpu_gib, f"T4 ({gpu_gib} GiB)")
            here = sizing.report(model, gpu, seq_len=longest, schedule=sched)
            full = sizing.report(
                model, gpu, seq_len=self.max_position_embeddings, schedule=sched
            )
            lines.append(
                f"T4 by memlab.sglang.sizing ({what}, "
                f"mem_fraction_static {sched.mem_fraction_static}): "
                f"{here.sizes.full_tokens:,} KV tokens = {here.requests:,} requests "
                f"of {longest} tokens (this run's longest), "
                f"{full.requests:,} at the full {self.max_position_embeddings:,}"
            )
        return "\n".join(lines)


def serve_chat(
    folder,
    system: str,
    questions,
    max_new_tokens: int = 48,
    *,
    page_size: int = 16,
    num_tokens: int = 1024,
    max_running: int = 2,
    device="cpu",
    reference: bool = True,
    name: str | None = None,
) -> ChatRun:
    """Serve ``questions`` (sharing ``system``) through the engine; compare with transformers."""
    from transformers import AutoTokenizer

    from memlab.course.viz.draw_engine import engine_frames

    folder = Path(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = chat_prompts(tokenizer, system, questions)
    model = checkpoint.load(folder, device=device)
    # the device the model resolved (memlab.common.env.resolve_device)
    cuda = model.device.type == "cuda"
    engine = Engine(
        model,
        page_size=page_size,
        num_tokens=num_tokens,
        max_running=max_running,
        max_context=max(map(len, prompts)) + max_new_tokens + page_size,
        chunk_size=256,
        attention="triton" if cuda else "torch",
        alloc_backend="triton" if cuda else "torch",
    )
    t0 = time.perf_counter()
    frames = engine_frames(engine, prompts, max_new_tokens)
    seconds = time.perf_counter() - t0
    outputs = [r.output for r in sorted(engine.finished, key=lambda r: r.rid)]
    config = json.loads((folder / "config.json").read_text())
    run = ChatRun(
        name or folder.name,
        list(questions),
        prompts,
        outputs,
        [tokenizer.decode(o, skip_special_tokens=True) for o in outputs],
        engine,
        frames,
        seconds,
        max_position_embeddings=config.get("max_position_embeddings", 4096),
    )
    if reference:
        hf = load_reference(folder, device)
        t0 = time.perf_counter()
        run.reference, run.gaps = reference_generate(hf, prompts, max_new_tokens)
        run.reference_seconds = time.perf_counter() - t0
    return run
