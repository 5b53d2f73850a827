# %% [markdown]
# # 10 · Capstone: serve a tiny model, replay real traces
#
# [Open in Colab](https://colab.research.google.com/github/memlab-course/memlab/blob/v0.1.0/chapters/10_capstone.ipynb)
#
# Time to run the books for real. `memlab.capstone.engine` serves a small Llama-style transformer (random
# weights, fixed seed) through everything the course built: the request table, a KV pool, a paged
# allocator, a prefix cache and a scheduler with chunked prefill, decode batches, admission and
# retraction. Then `memlab.capstone.sim` replays request streams from production traces to measure how much
# of a pool each allocation policy wastes.
#
# **After this chapter you can**
# - follow a serving engine step by step: which requests run, which wait, which pages they own
#   or share through the prefix cache, and when one is retracted;
# - check that serving through paged books gives the same tokens as contiguous KV;
# - compare allocation policies (reserve the maximum, round to a power of two, an oracle, paging)
#   on real traces, and read the fragmentation they cause;
# - replay the vLLM paper's Figure 2 (Orca's reservations in a buddy allocator against paging) and
#   say where each share of the waste comes from;
# - write the scheduler's admission step (exercise `ch10_admission`).

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
from memlab.course.notebook import exercise, start; FAST = start("10", REF, drive=DRIVE)
# fmt: on

# %% [markdown]
# ## See it: the engine, step by step
#
# Eight requests share a 16-token system prompt; the pool has 40 pages of 4 slots and at most 4
# requests run at once. Left: every page, in its owner's colour; beige pages are cached (kept for
# prefix hits); hatched ones are cached pages that running requests map (xN: how many). Right: the
# pool over the steps so far (owned, cached, free) and the running and waiting requests.

# %% [markdown]
# ![The engine mid-run: the shared system prompt is mapped by four requests](img/10_engine.png)

# %%
import torch

from memlab.capstone.engine import Engine, TinyLlama, generate_reference
from memlab.course import viz
from memlab.course.viz.draw_engine import draw_engine, engine_frames

model = TinyLlama()
g = torch.Generator().manual_seed(0)
system = torch.randint(0, 128, (16,), generator=g).tolist()
prompts = [
    system + torch.randint(0, 128, (int(n),), generator=g).tolist()
    for n in torch.randint(4, 24, (8,), generator=g)
]
engine = Engine(
    model,
    page_size=4,
    num_tokens=160,
    max_running=4,
    max_context=96,
    chunk_size=32,
    attention="torch",
)
frames = engine_frames(engine, prompts, max_new_tokens=16)
viz.Stepper(frames, draw_engine, interval_ms=700)

# %% [markdown]
# ## What one step does
#
# `Engine.step()` is one forward pass:
#
# 1. **Schedule a prefill batch**: unfinished chunked prefills first, then waiting requests in
#    order, each only if its pages fit next to the reserve the running requests need for their
#    next decode step; a new request first looks its prompt up in the prefix cache and locks the
#    hit pages. Nobody overtakes the first request that does not fit.
# 2. Otherwise **decode**: every running request adds one token. If the pages for this step are
#    short (chapter 08's `check_decode_mem`), requests still prefilling are retracted first (they
#    hold pages but take no part in this step), then chapter 08's `retract_decode` picks victims
#    among the decoding ones (fewest decoded tokens first), always keeping one.
# 3. Allocate: `memlab.sglang.allocation.alloc_for_extend` / `alloc_for_decode` (SGLang's
#    [`alloc_for_extend`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocation.py) / [`alloc_for_decode`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocation.py)) give new
#    requests a row, take slots with `alloc_extend` / `alloc_decode` (evicting from the prefix
#    cache first when the pool is short) and write them into the request table; then write K/V
#    at those slots (`set_kv_buffer`) and attend through `req_to_token`.
# 4. A finished request hands its pages to the prefix cache (SGLang 0.5.23:
#    [`release_kv_cache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/common.py)`(req, tree_cache, checkpoint=True)`, which calls
#    the tree's `checkpoint`),
#    which keeps the full pages it did not have and frees the rest; a retracted one frees its own
#    pages.
#
# The books stay balanced at every step: each page is free, owned by one running request, or cached.

# %%
print(dict(engine.stats))
engine.check_books()
print("books balanced: every page is free, owned or cached")

# %% [markdown]
# ## Equal to the reference
#
# `generate_reference` runs the same model keeping each request's K/V in one contiguous tensor:
# no pages, no cache, no scheduler. Greedy decoding must give the same tokens, request by request.
# Here the engine's attention is the real Triton kernel of chapter 09 (compiled on a GPU, in the
# interpreter on a CPU), on a short run.

# %%
from memlab.common.env import kernel_device

few = [p[:20] for p in prompts[: 2 if FAST else 4]]
new_tokens = 4 if FAST else 8
# the same weights (one seed), where the kernels run
kmodel = TinyLlama(device=kernel_device())
kernel_engine = Engine(
    kmodel,
    page_size=4,
    num_tokens=160,
    max_running=4,
    max_context=96,
    chunk_size=32,
    attention="triton",
    alloc_backend="triton",
)
served = kernel_engine.generate(few, new_tokens)
reference = generate_reference(kmodel, few, new_tokens)
for s, r in zip(served, reference):
    print("engine", s, " reference", r)
assert served == reference

# %% [markdown]
# ## A real model through your books
#
# The same engine serves a real instruct model: `memlab.capstone.checkpoint` reads a Hugging Face Llama
# checkpoint (`config.json`, `*.safetensors`) into the model above, and refuses by name what it
# does not compute (biases, other rope scalings, other architectures). We take
# [SmolLM2-135M-Instruct](https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct): exactly
# `LlamaForCausalLM` (9 query heads sharing 3 KV heads, tied embeddings, no rope scaling),
# Apache-2.0, no login, and small: 134.5 M parameters, about 270 MB to download (bfloat16), served
# here in float32 (540 MB: the attention kernel takes fp16 or fp32, and float32 keeps the comparison
# with `transformers` exact), quick on a T4 and bearable on a CPU. Four questions share one system
# prompt; at most two run at a time, so the later ones find the system prompt's pages in the
# prefix cache. The engine uses the Triton attention kernel on a GPU and torch's on a CPU, and
# `transformers` answers the same prompts (greedy) for comparison. Without a network (and in the
# headless test run) the cell says so in one line and the chapter moves on.

# %%
from memlab.common.env import kernel_device
from memlab.course import chat

SYSTEM = (
    "You are a patient teacher of computer systems. Answer in one or two short sentences, "
    "with a concrete example when it helps, and explain any technical term you use."
)
QUESTIONS = [
    "What is a cache?",
    "Why does a GPU have its own memory?",
    "What does a page table do?",
    "Name one way to save memory when serving many users.",
]
# None after one line when nothing can be downloaded
path = chat.download(chat.SMOLLM2, offline=FAST)
run = (
    None
    if path is None
    else chat.serve_chat(
        path,
        SYSTEM,
        QUESTIONS,
        max_new_tokens=48,
        device=kernel_device(),
        name="SmolLM2-135M-Instruct",
    )
)
if run is not None:
    print(run.format())

# %% [markdown]
# The books of that run, step by step: each request's pages in its colour, the system prompt's
# pages shared (hatched) once they are cached. Then the sizing of chapter 08 for this model: its KV
# bytes per token, how many such requests a T4 would hold by `memlab.sglang.sizing`, and what the
# engine actually held. When an answer differs from `transformers`, the line says where and how
# close the two best tokens were there: float32 sums in another order can flip a near tie.

# %%
from IPython.display import display

if run is not None:
    display(viz.Stepper(run.frames, draw_engine, interval_ms=300))
    print(run.sizing())

# %% [markdown]
# ## Replaying traces: how much does each policy waste?
#
# `memlab.capstone.sim` replays a request stream on a pool of slots under four policies: reserve the model's
# maximum length per request (`max`, what systems did before paging), reserve the prompt plus the
# output rounded up to a power of two (`pow2`), know the exact final length (`oracle`,
# unattainable), and allocate blocks on demand (`paged`, as the engines of chapters 04-06 do). A reservation must sit
# in one contiguous run of slots; its *placement* finds the run: a **buddy allocator** (the
# default, what the vLLM paper assumes its Orca baselines use) or **first fit**. Every iteration
# the pool's slots split into five shares: **used** (real KV), **reserved** (held, to be written
# later), **internal** fragmentation (reserved beyond the final length, or the unused tail of a
# last block), **rounding** (what the buddy allocator adds to round a reservation up to a power
# of two) and **free** (including *external* fragmentation: free but in pieces too small for the
# next request). Pick a workload, a block size and a placement.

# %% [markdown]
# ![The pool split per policy on the ShareGPT-like workload](img/10_policies.png)

# %%
import ipywidgets as W

from memlab.capstone.sim import WORKLOADS
from memlab.course.viz.draw_sim import draw_policies

n_requests = 400 if FAST else 4000
controls = dict(
    workload_name=W.Dropdown(options=WORKLOADS, description="workload"),
    block_size=W.Dropdown(
        options=[1, 4, 16, 64, 256], value=16, description="block size"
    ),
    n=W.Dropdown(options=[n_requests], description="requests"),
    placement=W.Dropdown(
        options=[("buddy", "buddy"), ("first fit", "first_fit")],
        description="placement",
    ),
)
viz.Explorer(controls, draw_policies, columns=4)

# %% [markdown]
# Paging leaves almost no internal fragmentation (at most a block's tail per request) and no
# external fragmentation (any free block serves any request), so the batch grows and throughput
# with it. The price is preemption: paging admits requests on what they need *now*, so when they
# grow together some must be preempted and recomputed (the count is on the right of each bar).
# Larger blocks waste more in each last block (the axis starts at 70 or 80 %, not 0: the band
# where block sizes differ):

# %%
from memlab.capstone import sim
from memlab.course.viz.draw_sim import plot_figure2, plot_sweep
from memlab.course.viz.style import new_figure

sweep = sim.block_size_sweep(
    sim.sharegpt_like(n_requests), block_sizes=(1, 4, 16, 64, 256), progress=False
)
fig, ax = new_figure(8, 3.6)
plot_sweep(sweep, ax=ax)
viz.show(fig)

# %% [markdown]
# ## The buddy allocator
#
# A binary buddy allocator (`memlab.capstone.sim.Buddy`) hands out blocks of 2^k slots that start at a
# multiple of 2^k. A request for n slots takes the lowest free block of the smallest order k with
# 2^k >= n, **splitting** a larger block in halves (buddies) as often as needed and listing the
# upper halves as free; a released block **coalesces** with its buddy (its start XOR 2^k)
# while that buddy is free at the same order. A pool whose size is not a power of two is cut
# into its binary digits, largest first: 15,728 = 8,192 + 4,096 + 2,048 + 1,024 + 256 + 64 + 32
# + 16. These top blocks never merge, so no request can have more than 8,192 slots, and only
# seven reservations of 2,048 fit (1,392 slots serve none of them).
#
# Two costs that first fit does not have: every reservation is rounded up to a power of two
# (161 + 338 = 499 slots take a block of 512; 161 + 512 = 673 take 1,024), and the small top
# blocks serve only small requests. One saving: blocks sit at aligned places, so two
# neighbouring requests that finish coalesce into one block (first fit can leave two runs side
# by side that no request uses, `test_external_fragmentation_by_hand` in `tests/capstone/test_sim.py`).

# %%
space = sim.Buddy(12)  # 8 + 4
print("free blocks (start, size):", space.blocks())
a = space.alloc(3)  # 4 slots: the top block of 4
b = space.alloc(1)  # 1 slot: splits [0,8) into 0 | 1 | [2,4) | [4,8)
print(f"alloc(3) -> {a}, alloc(1) -> {b}; free blocks:", space.blocks())
# its buddy, slot 1, is free: 0 + 1 -> [0,2), then [0,4), then [0,8)
space.release(b, 1)
print("after release(0, 1):", space.blocks())

# %% [markdown]
# ## The vLLM paper's Figure 2, replayed
#
# The vLLM paper opens with a measurement (its Figure 2): while OPT-13B serves ShareGPT requests
# on one A100-40GB, how much of the KV cache memory holds token states? `sim.figure2()` replays
# that setup in one call: a pool of 15,728 slots (the paper's Table 1), 7,200 ShareGPT-like
# requests (a 1-hour trace at 2 requests/s; mean input 161, mean output 338, at most 2,048
# tokens), a saturated first-come-first-served queue, Orca's three reservations placed by a
# buddy allocator, and vLLM's paging with blocks of 16. The paper's categories map onto the
# shares: token states = used, reservation = reserved, internal fragmentation = internal, and
# "external fragmentation and others" = rounding + free: the paper files the buddy allocator's
# rounding under external fragmentation, which is why its Orca (Oracle) has no internal
# fragmentation at all. The second run places the same reservations by first fit.

# %%
fig2_requests = 1_200 if FAST else sim.FIG2_REQUESTS  # the text's numbers are for 7,200
buddy = sim.figure2(n=fig2_requests)
first_fit = sim.figure2("first_fit", n=fig2_requests)
print(sim.figure2_table(buddy, first_fit))
viz.show(plot_figure2(buddy, first_fit))

# %% [markdown]
# | % of KV memory holding token states | Orca (Max) | Orca (Pow2) | Orca (Oracle) | paging (the paper's vLLM) |
# |---|---|---|---|---|
# | the paper (Fig. 2) | 20.4 | 26.8 | 38.2 | 96.3 |
# | memlab, buddy allocator | 22.7 | 31.6 | 40.1 | 96.2 |
# | memlab, first fit | 22.7 | 39.4 | 49.2 | 96.2 |
#
# **With the buddy allocator** Orca (Max), Orca (Oracle) and vLLM land within 2.3 points of the
# paper, and the batches are Fig. 13's (7.0, 9.7, 12.3, 29.6 against 7.00, 9.81, 13.62, 30.42).
# **Orca (Pow2) stays 4.8 points above.** Divide the used share by the batch: that is the token
# states one running request holds, averaged over its life. For a stream replayed to the end it
# depends on the stream alone, not on the policy: memlab's is 512 tokens for all four. The
# paper's bars over its batches give 458 (Max), 430 (Pow2), 441 (Oracle) and 498 (vLLM): no
# single stream has all four. Orca (Max), whose batch the buddy allocator pins at 7, measures the
# stream itself: the synthetic lengths have a heavier tail than the paper's ShareGPT (512 tokens
# per running request against 458), which is what puts Max and Oracle about 2 points high. Pow2
# runs the paper's batch (9.7 against 9.81) with 512 tokens per request instead of 430:
# 31.6 % instead of 26.8 %. Lengths with a lighter tail, fitted to the Max bar
# (`sim.figure2(sigma=0.8)`: 455 tokens per request), bring Pow2 to 29.7 and Oracle to 39.4; the
# last 3 points are the gap between the paper's own 458 and 430, which no stream closes.
#
# **With first fit** instead, Pow2 and Oracle gain 8 and 9 points and run about a quarter more
# requests at once (12.1 and 15.1): a reservation takes exactly its length. First fit leaves more
# slots free than the buddy allocator (17 % against 9 to 10 %, nearly all of it while the next
# request waits for a run long enough: external fragmentation), but that is far less than the
# buddy allocator's rounding (24 % and 22 % of the pool), which is most of what the paper calls
# "external fragmentation and others". Orca (Max) and paging do not change: 2,048
# is already a power of two, and paging places no reservations.

# %% [markdown]
# ## What the engines do differently
#
# Both engines page. SGLang's prefix cache is a radix tree over token ids that shares any common
# prefix (in whole pages when pages are larger than one token;
# [`RadixCache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py)); vLLM hashes full blocks and shares whole blocks of
# a prefix ([`KVCacheManager.get_computed_blocks`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_manager.py)).
#
# SGLang's scheduler ([`PrefillAdder`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_policy.py)) admits a request only if the free and evictable pool,
# minus an estimate of what the running requests will still generate (their remaining
# `max_new_tokens`, capped at 4096 each ([`CLIP_MAX_NEW_TOKENS`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_policy.py)) and scaled by a
# `new_token_ratio` that adapts to retractions), still holds the new request's prompt plus its own
# `max_new_tokens`, that one capped at 4096 too ([`PrefillAdder.add_one_req`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_policy.py)); it also clips
# each request's `max_new_tokens` to what the pool could ever hold (memlab's engine and the exercise
# below use a simpler budget, see Admission).
#
# vLLM's scheduler, by default, admits a new request only when blocks for its whole current
# sequence (its prompt, minus what the prefix cache holds) fit, even when chunked prefill will
# compute only its first chunk in this step: `scheduler_reserve_full_isl=True`
# ([`SchedulerConfig`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/config/scheduler.py)) makes it call
# [`KVCacheManager.allocate_slots`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_manager.py) with
# `full_sequence_must_fit`. It reserves nothing for the tokens a request will generate: when a
# decode step runs short, it preempts running requests and recomputes them later
# ([`Scheduler._preempt_request`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/sched/scheduler.py)).
#
# memlab's engine follows SGLang's scheduling ([`PrefillAdder`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_policy.py)); its prefix cache is a choice: `Engine(..., prefix_cache="hash")` (the default)
# indexes full pages by chapter 06's chained block hashes; chapter 11 adds `"radix"` (memlab's
# mirror of SGLang's radix tree) and `"hicache"` (the tree with a host tier) and serves these
# requests through both.
#
# The hash cache reuses chapter 06's hashing but not its `BlockPool`: in vLLM the free queue is
# at the same time the cache's eviction order (a cached block waits among the free blocks until
# it is handed out again, [`BlockPool.get_new_blocks`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/block_pool.py)), so the block
# pool must be the allocator. Here the allocators of chapters 03 to 05 own the free pages; cached
# pages nobody maps wait in an LRU list beside the allocator and are evicted into it when the pool
# runs short, the way SGLang's radix tree does ([`RadixCache.evict`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py)).

# %% [markdown]
# ## Admission
#
# The scheduler's admission step, first come, first served: the budget is what is free minus what
# the running requests' next decode step needs. Without speculative decoding that step writes one
# token per request and opens a page only for a request whose committed length sits on a page
# boundary (SGLang 0.5.23's [`ScheduleBatch.new_tokens_required_next_decode`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_batch.py); chapter 08's doubled
# `alloc_reserve_per_decode` is read only when decoding speculatively). Each request costs its
# prompt in whole pages, plus a page when its prompt ends on a page boundary (its first decode
# step opens one); a request that could never fit even an empty pool is rejected; the first one
# that does not fit now stops admission, so a later, smaller request cannot overtake it and starve
# it. (SGLang's [`PrefillAdder`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_policy.py) also holds back what the running requests may still
# generate; this step leaves that out.)
#
# ## Exercise: `exercises/ch10_admission.py`
#
# Write `admit` (10 points). The cell runs yours on a small queue.

# %%
with exercise("ch10_admission") as ex:
    hooks = ex.CapacityHooks(available=200, token_capacity=400, page_size=16)
    waiting = [
        ex.Request("a", 40, 50),
        ex.Request("b", 900, 10),
        ex.Request("c", 60, 20),
        ex.Request("d", 100, 20),
        ex.Request("e", 10, 5),
    ]
    admitted, rejected = ex.admit(
        waiting, running_seq_lens=[32, 45], hooks=hooks, max_running_requests=8
    )
    print("admitted", [r.rid for r in admitted], "rejected", [r.rid for r in rejected])
    assert [r.rid for r in admitted] == ["a", "c"] and [r.rid for r in rejected] == [
        "b"
    ], "d must stop admission: e waits"

# %% [markdown]
# ## Grade
#
# This is the last chapter. `python -m memlab.grade` (no chapter) grades every exercise of the
# course; `--results results.json` writes Gradescope's file.

# %%
from memlab.grade import main as grade

grade(["10"])
