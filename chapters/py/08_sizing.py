# %% [markdown]
# # 08 · Sizing: from GPU memory to pool sizes
#
# [Open in Colab](https://colab.research.google.com/github/memlab-course/memlab/blob/v0.1.0/chapters/08_sizing.ipynb)
#
# Before serving, an engine turns its GPU's memory into numbers: how many tokens the KV pool
# holds, how many pages, how wide a request-table row is, how much each decode step must keep in
# reserve. `memlab.sglang.sizing` derives them the way SGLang does
# ([`KVCacheConfigurator`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/kv_cache_configurator.py), [`get_alloc_reserve_per_decode`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocation_sizing.py)), from configuration objects: change one
# knob and every derived number moves.
#
# **After this chapter you can**
# - size a KV pool from a memory budget and a model's bytes per token, floored to whole pages;
# - clip a request's generation to what the pool could ever hold;
# - compute the KV a decode step may take, with and without speculative decoding, and why SGLang
#   0.5.23 reserves twice that when it decodes speculatively
#   (`tests/engines/sglang/test_sizing.py` compares the rules with SGLang's own);
# - decide which requests to retract when the next decode step does not fit;
# - write the scheduler's planning numbers yourself (exercise `ch08_sizing`).

# %%
# @title Setup: run this cell first (Colab: tick DRIVE to keep your exercises on Google Drive) { display-mode: "form" }
# fmt: off
DRIVE = False  # @param {type:"boolean"}
HOME, REF = "memlab-course/memlab", "v0.1.0"  # the course's home and version (scripts/set_home.py)
import os, pathlib, re, subprocess, sys; here, url = pathlib.Path.cwd().resolve(), os.environ.get("MEMLAB_REPO_URL", f"https://github.com/{HOME}")
root = next((p for p in (here, *here.parents) if (p / "memlab/course/notebook.py").is_file()), here / f"memlab-{REF}")
if not root.is_dir() and (git := subprocess.run(["sh", "-c", 'rm -rf "$0.partial" && git clone -q --depth 1 -b "$1" "$2" "$0.partial" && mv "$0.partial" "$0"', root, REF, url], capture_output=True, text=True, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})).returncode:
    raise RuntimeError(f"could not clone the course from {url} at version {REF}: " + ("no network (check the connection, then re-run this cell)" if re.search("resolve host|connect to|timed out|unreachable", git.stderr) else f"no such repository or version ({HOME} does not exist, is private, or has no tag {REF})") + f"\ngit said: {git.stderr.strip()[-400:]}")
sys.path += [str(root)] if str(root) not in sys.path else []  # appended: no course folder hides an installed package
from memlab.course.notebook import exercise, start; FAST = start("08", REF, drive=DRIVE)
# fmt: on

# %% [markdown]
# ## See it
#
# Pick a model, a GPU, a page size, a KV dtype, a tensor-parallel size, a speculative-decoding
# setup and the static memory fraction. Left: where the GPU's bytes go (per rank). Right: how many
# requests of each length fit at once, decided by the tightest ledger (for hybrid models there are
# several). The line under the controls gives the derived numbers.

# %% [markdown]
# ![The picture shows Gemma-3-27B on an 80 GB GPU; the widget opens on Llama-3.1-8B](img/08_sizing.png)

# %%
import ipywidgets as W

from memlab.common.models import MODELS
from memlab.course import viz
from memlab.course.viz.draw_sizing import GPUS, SPECS, draw_sizing, sizing_text

controls = dict(
    model=W.Dropdown(options=list(MODELS), value="Llama-3.1-8B"),
    gpu=W.Dropdown(options=list(GPUS), value="A100 / H100 80GB", description="GPU"),
    page_size=W.Dropdown(options=[1, 16, 64], value=16, description="page size"),
    kv_dtype_bytes=W.Dropdown(
        options=[("bf16", 2), ("fp8", 1)], value=2, description="KV dtype"
    ),
    tp_size=W.Dropdown(options=[1, 2, 4, 8], value=1, description="TP size"),
    spec=W.Dropdown(options=list(SPECS), value="none", description="speculative"),
    mem_fraction=W.FloatSlider(
        value=0.88,
        min=0.5,
        max=0.95,
        step=0.01,
        description="mem fraction",
        continuous_update=False,
    ),
    in_use_gib=W.FloatSlider(
        value=0.5,
        min=0.0,
        max=8.0,
        step=0.5,
        description="in use GiB",
        continuous_update=False,
    ),
    seq_len=W.IntSlider(
        value=8192,
        min=1024,
        max=131072,
        step=1024,
        description="seq len",
        continuous_update=False,
    ),
)
viz.Explorer(controls, draw_sizing, text=sizing_text, columns=3)

# %% [markdown]
# ## From memory to tokens
#
# SGLang measures the GPU's free memory twice ([`KVCacheConfigurator._profile_available_bytes`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/kv_cache_configurator.py)):
# $F_\text{before}$, before it loads the weights, and $F_\text{after}$, after. `mem_fraction_static` ($f$) is the share of $F_\text{before}$ that the
# weights and the KV pool may use together; the remaining $(1 - f) \cdot F_\text{before}$ stays
# free for activations and CUDA graphs. The KV pool gets what is left, divided by the bytes one
# token costs:
#
# $$\text{tokens} = \left\lfloor \frac{F_\text{after} - (1 - f) \cdot F_\text{before}}{\text{bytes per token}} \right\rfloor_{P}$$
#
# floored to whole pages of $P$ tokens. With nothing but the weights $W$ loaded, the numerator is
# $f \cdot F_\text{before} - W$: the activations have no term of their own, they live in the
# $1 - f$ share. memlab simplifies: it starts from the GPU's total memory $M$ and takes an
# explicit activation reserve $A$ (the widget's "act. GiB") off it,
# $\lfloor (M \cdot f - W - A) / \text{bytes per token} \rfloor_P$, so that you can see each part
# move. The page size used for allocation is `page_size` times
# the decode-context-parallel size. Hybrid models first split the budget between their ledgers
# (sliding-window tokens per full token; a share for the Mamba state).

# %%
from memlab.sglang.sizing import (
    GPUConfig,
    ScheduleConfig,
    report,
)

# 0.5 GiB in use before the weights load (the CUDA context)
gpu = GPUConfig.gib(80, in_use=0.5)
r = report(
    MODELS["Llama-3.1-8B"], gpu, seq_len=8192, schedule=ScheduleConfig(page_size=16)
)
print(r.format())
z = r.sizes
free_before, f = gpu.free_before_load_bytes, r.config.schedule.mem_fraction_static
print(
    f"\ncheck: {free_before - z.weight_bytes:,} free after the load - {1 - f:.2f} * {free_before:,} free before "
    f"= {z.usable_bytes:,}"
)
print(
    f"({z.usable_bytes:,} // {r.bytes_per_token['full_attention']:,}) floored to 16 =",
    z.usable_bytes // r.bytes_per_token["full_attention"] // 16 * 16,
)

# %% [markdown]
# ## max_new_tokens_for_memory
#
# A request's generation is clipped so that even alone in an empty pool it could finish: its
# prompt rounded up to pages, one more page for the page a decode step may open, one slot more.
#
# $$\text{max\_new} = \max\left(0, \min\left(\text{max\_new}, C - \lceil \text{input} \rceil_P - P - 1\right)\right)$$

# %%
from memlab.sglang.sizing import max_new_tokens_for_memory

for inp, want in ((1000, 512), (z.full_tokens - 100, 512), (z.full_tokens, 512)):
    print(
        f"input {inp:>7,}, asks {want}: gets {max_new_tokens_for_memory(inp, want, z.full_tokens, 16)}"
    )

# %% [markdown]
# ## KV per decode step
#
# Without speculative decoding a decode step adds one token per request. With it, the draft
# model proposes `steps * topk` tokens (a chain when `topk` is 1, a tree otherwise) and the
# target verifies `num_draft_tokens`; the step may take the larger. With pages and a tree, each
# branch copies the request's partly filled last page, so each branch may need
# $\lceil (P - 1 + \text{steps}) / P \rceil$ whole pages of its own.

# %%
from memlab.sglang.sizing import alloc_len_per_decode, alloc_reserve_per_decode

for name, spec in SPECS.items():
    print(
        f"{name:<30} page 1: {alloc_len_per_decode(spec, 1):>3}   page 16: {alloc_len_per_decode(spec, 16):>3} slots a step"
    )

# %% [markdown]
# ## The doubled reserve
#
# With speculative decoding, SGLang 0.5.23 keeps each running request's allocation ahead of its
# committed length by **twice** the step's footprint ([`get_alloc_reserve_per_decode`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocation_sizing.py)). The code
# says the 2x absorbs the overlap scheduler's one-step lag (the CPU prepares step $t+1$ while the
# GPU runs step $t$, so the host's view of each length lags by one step), but the same reserve is
# used with overlap off. With speculative decoding and pages, the request-table row gets a
# matching headroom past the context length (`reserve + page_size - 1`), so the over-allocation
# never runs off the end of a row; otherwise the headroom is a few slots.
#
# Without speculative decoding there is no reserve at all: each decode step allocates exactly one
# slot per request, and a request needs a new page only when its committed length sits on a page
# boundary. The 1x column below is only a *what if* (`what_if_reserve_without_overlap_lag`): what the speculative reserve would be if no
# lag had to be absorbed, which memlab computes for comparison only.

# %%
from memlab.sglang.sizing import (
    req_to_token_row_width,
    what_if_reserve_without_overlap_lag,
)

for name, spec in SPECS.items():
    width = f"row width {req_to_token_row_width(8192, spec, 16):,}"
    if spec.algorithm is None:  # SGLang reads the reserve on its speculative paths only
        print(
            f"{name:<30} no reserve: 1 token a request, a new page only on a page boundary;  {width}"
        )
        continue
    print(
        f"{name:<30} reserve {alloc_reserve_per_decode(spec, 16):>3} (SGLang, when speculative)  "
        f"what if no lag: {what_if_reserve_without_overlap_lag(spec, 16):>3};  {width}"
    )

# %% [markdown]
# ## When the next step does not fit
#
# Before each decode step the scheduler checks that the next step fits
# ([`ScheduleBatch.new_tokens_required_next_decode`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_batch.py), [`ScheduleBatch.check_decode_mem`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_batch.py)): without speculative decoding, a page for each request whose
# next token opens one; with it, each request must be able to grow to its committed length plus the
# reserve, in whole pages past what it holds. If not, it **retracts** requests (frees their KV,
# puts them back in the queue) until the rest fit: fewest decoded tokens first (least work lost),
# ties broken by the longest prompt (most memory back), the same order with or without
# speculative decoding. The check has already failed when retraction starts, so the first request
# goes without a second check. It always keeps at least one request, or nothing would make
# progress (SGLang aborts that last one if it still does not fit:
# [`ScheduleBatch.retract_decode`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_batch.py)).

# %%
from memlab.sglang.sizing import (
    RunningReq,
    new_tokens_required_next_decode,
    retract_decode,
)

# Every length sits on a page boundary, so each request needs a new page for its next step.
running = [
    RunningReq("A", 900, 60),
    RunningReq("B", 300, 20),
    RunningReq("C", 2000, 48),
    RunningReq("D", 100, 12),
]
print("the next step needs", new_tokens_required_next_decode(running, 16), "free slots")
kept, retracted, fits = retract_decode(running, available_tokens=16, page_size=16)
print(
    "one free page, four need one: retract",
    [q.rid for q in retracted],
    "keep",
    [q.rid for q in kept],
    "fits:",
    fits,
)
kept, retracted, fits = retract_decode(running[:1], available_tokens=0, page_size=16)
print(
    "no free page, one request   : retract",
    [q.rid for q in retracted],
    "keep",
    [q.rid for q in kept],
    "fits:",
    fits,
)

# %% [markdown]
# ## Where memlab differs from the engine
#
# `./course engines` (`tests/engines/sglang/test_sizing.py`) compares these rules with SGLang 0.5.23's own functions over hundreds of
# configurations and random batches (chapter 05 tells how): KV per decode step, the reserve, the
# row headroom, the next step's demand and the retraction order. What memlab leaves out:
#
# | | memlab | SGLang 0.5.23 | why |
# |---|---|---|---|
# | configuration | frozen dataclasses passed in | process-wide configuration "bags" read by each function ([`get_alloc_len_per_decode`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocation_sizing.py)) | one knob, every number moves, no globals |
# | pool size | `(M * f - W - A) // bytes per token`, floored to pages: the GPU's total memory, a computed weight size and an explicit activation reserve | `F_after - (1 - f) * F_before` from two measurements of free memory (activations live in the `1 - f` share), caps by `--max-total-tokens`, and sizes draft and hybrid pools by more rules ([`KVCacheConfigurator._profile_available_bytes`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/kv_cache_configurator.py)) | each part of the budget can be seen and moved |
# | the last request that does not fit | `retract_decode` returns `fits=False` | aborts it ([`ScheduleBatch.retract_decode`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_batch.py)) | the caller decides |
# | retraction policies | length order only | also a priority order (`--retraction-policy priority`) and beam groups ([`ScheduleBatch.retract_decode`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_batch.py)) | the default policy |

# %% [markdown]
# ## What the engines do differently
#
# vLLM measures instead of computing ([`Worker.determine_available_memory`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/worker/gpu_worker.py)):
# its `gpu_memory_utilization` is a share of the GPU's **total** memory. It runs a dummy forward pass at the largest batch, records the weights, the
# peak activation memory and (by default) an estimate of the CUDA graphs, and gives the rest of
# that share to the KV cache as a number of blocks (`available bytes // bytes per block`). SGLang
# computes its budget from `mem_fraction_static`, a share of the free memory before loading, and
# two measurements of free memory ([`KVCacheConfigurator._profile_available_bytes`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/kv_cache_configurator.py)). Both floor to whole blocks or pages; both keep the numbers in
# configuration objects.
#
# ## Exercise: `exercises/ch08_sizing.py`
#
# Write `pool_size_tokens`, `max_new_tokens_for_memory`, `alloc_len_per_decode` and
# `alloc_reserve_per_decode` (11 points). The cell compares yours with `memlab.sglang.sizing`.

# %%
with exercise("ch08_sizing") as ex:
    assert (
        ex.pool_size_tokens(z.usable_bytes, r.bytes_per_token["full_attention"], 16)
        == z.full_tokens
    )
    args = (1000, 512, z.full_tokens, 16)
    assert ex.max_new_tokens_for_memory(*args) == max_new_tokens_for_memory(*args)
    for spec in SPECS.values():
        args = (
            ()
            if spec.algorithm is None
            else (spec.num_steps, spec.eagle_topk, spec.num_draft_tokens)
        )
        for ps in (1, 16):
            assert ex.alloc_len_per_decode(ps, *args) == alloc_len_per_decode(
                spec, ps
            ), (spec, ps)
            assert ex.alloc_reserve_per_decode(ps, *args) == alloc_reserve_per_decode(
                spec, ps
            ), (spec, ps)
    print("same numbers as memlab.sglang.sizing")

# %% [markdown]
# ## Grade

# %%
from memlab.grade import main as grade

grade(["08"])
