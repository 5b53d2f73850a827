# %% [markdown]
# # 07 · Hybrid models: sliding windows and Mamba state
#
# [Open in Colab](https://colab.research.google.com/github/memlab-course/memlab/blob/v0.1.0/chapters/07_hybrid_models.ipynb)
#
# Not every layer needs every token's KV. Sliding-window layers (Gemma-3: 52 of its 62 layers)
# read only the last `sliding_window` tokens (the model's own count, the current token included);
# linear-attention layers (Qwen3-Next: 36 of 48) keep a fixed-size state per request instead of KV
# per token. SGLang gives each kind its own ledger
# ([`SWATokenToKVPoolAllocator`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/swa.py), [`MambaPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)).
#
# **After this chapter you can**
# - run two allocators side by side with a map from full-side slots to sliding-window slots, and
#   say why capacity is the smaller of the two;
# - release the sliding-window pages that fell out of the window while a request still runs;
# - free a hybrid request in the right order;
# - give each request a Mamba state slot and ping-pong tracking slots, and say when it takes two;
# - write the release range, the SWA side of a free, and the Mamba row books (exercises
#   `ch07_swa_release`, `ch07_mamba_tracking`).

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
from memlab.course.notebook import exercise, start; FAST = start("07", REF, drive=DRIVE)
# fmt: on

# %% [markdown]
# ## See it: a sliding window
#
# Full pool: 16 pages of 2 slots; sliding-window pool: 6 pages; window: 4 tokens (the tokens before the current one,
# see "Two ways to count a window" below). A and B arrive,
# decode three tokens, B finishes. Left: the request table, which stores **full-side** slots.
# Middle and right: the two ledgers, each with its own free list and its own slot numbers. Bottom:
# the map from each held full slot to its SWA slot. Watch the SWA side empty out behind the window
# while the full side keeps every token.

# %% [markdown]
# ![Two ledgers after two decode steps](img/07_swa.png)

# %%
from memlab.course import viz
from memlab.course.viz.hybrid_books import draw_mamba, draw_swa

swa_scene = viz.hybrid_books.sliding_window()
viz.Stepper(swa_scene.frames, draw_swa)

# %% [markdown]
# ### Your own steps
#
# The instrument below starts where the story ends: A holds 9 tokens, its first 4 SWA slots
# released (`swa_evicted_len` 4: positions 0-3 show a dot). `extend` a request (a new one gets a row), run a `decode step` for the requests you
# name, `finish` one; after each extend and decode the scheduler calls `release_out_of_window`,
# and the instrument shows every call it made. Each position shows its full slot on top and its
# SWA slot below (a dot: released); pick another window and your steps are replayed under it. A
# batch either ledger cannot hold is refused, with nothing taken. Hover a cell to read it.

# %%
swa = viz.hybrid_books.swa_instrument(window=4)
swa

# %% [markdown]
# ## Two ledgers
#
# `SWATokenToKVPoolAllocator` holds a full allocator and an SWA allocator with independent id
# spaces. Every new token gets a slot on both sides; the full slot goes into the request table and
# `full_to_swa_index_mapping[full_slot]` remembers the SWA slot. Both sides must have room, so
#
# $$\text{available} = \min(\text{full available}, \text{SWA available})$$
#
# and capacity is settled for both before either takes anything (SGLang settles it before a
# prefill, [`SWATokenToKVPoolAllocator.alloc_extend`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/swa.py); for a decode step its scheduler checks
# first, see the table at the end). The map has `size + page_size + 1`
# entries; the last is -1, so that `last_loc = -1` (an empty prefix) maps to -1 by Python's negative
# indexing and the SWA side sees "no prefix" too.

# %%
al = swa_scene.allocator
print(
    "available: full",
    al.full_available_size(),
    " SWA",
    al.swa_available_size(),
    " -> min",
    al.available_size(),
)
m = al.full_to_swa_index_mapping
print(
    "map length",
    len(m),
    "= size",
    al.size,
    "+ page",
    al.page_size,
    "+ 1; m[-1] =",
    int(m[-1]),
)
a_full = swa_scene.slots("A")
print("A's full slots:", a_full, "-> SWA:", m[a_full].tolist(), "(0 = released)")

# %% [markdown]
# ## Out of the window
#
# The next query of a request of length $s$ reads positions $\ge s - w$ (window $w$). Everything
# before is dead on the SWA side, but only **whole pages** can go back, from where the last release
# stopped (`swa_evicted_len`) up to
#
# $$\text{end} = \left\lfloor (s - w) / P \right\rfloor \cdot P$$
#
# The run is page-aligned and contiguous, so it is released without a `unique` (chapter 05:
# one slot per page names the SWA page). Positions a prefix cache protects (a page-aligned
# `cache_protected_len`) are left to it. With a **prefix-sharing** cache SGLang keeps more
# ([`free_swa_out_of_window_slots`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/common.py)):
#
# $$\text{end} = \left\lfloor \left(s - \lceil \max(w, P) \rceil_P\right) / P \right\rfloor \cdot P$$
#
# ($\lceil x \rceil_P$: rounded up to whole pages), so that a cached key ending at the last page
# boundary still has a whole window of live SWA behind it.
#
# When does SGLang release? Its scheduler calls [`ScheduleBatch.maybe_evict_swa`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_batch.py) for every
# batch. In a **decode** batch it waits until 128 more tokens
# ([`SGLANG_SWA_EVICTION_INTERVAL`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/environ.py)) have left the window since the last release,
# then gives back every whole page behind the window at once. In a **prefill** batch on a cache
# that does not share prefixes, it releases after every chunk, with no interval. And the window it
# keeps is not always the model's: a speculative draft model that reads the SWA pool too widens it
# to `max(w, draft window)` ([`BasePrefixCache.swa_retain_window`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/base_prefix_cache.py)).
# The widget and the cell below release at every step, with the model's window, so that you can
# see it happen.
#
# ### Two ways to count a window
#
# The engines count the window differently. SGLang's window $w$ counts the tokens *before* the
# current one: a query at position $q$ reads $q - w \ldots q$, $w + 1$ tokens
# ([`free_swa_out_of_window_slots`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/common.py) takes it as `sliding_window_size`). Where $w$ comes from
# is up to each model file: Gemma-3's
# [`get_attention_sliding_window_size`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/models/gemma3_causal.py) returns the config's
# `sliding_window` $- 1$; a model file without that method gets the config's value as it is
# ([`resolve_sliding_window_size`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/model_executor/model_runner_components/load_model_utils.py)).
# vLLM's `sliding_window` counts the current token too, as the model configs do: a query at $q$
# reads $q - w + 1 \ldots q$.
#
# Why two counts? The attention kernels (FlashAttention, FlashInfer) take a *left window*: how many
# tokens before the current one a query may see. A config's `sliding_window` counts the current
# token, so someone must subtract 1. SGLang does it once, in the model file, and from then on its
# whole stack (scheduler, allocator, kernels) speaks in the kernel's count. vLLM keeps the config's
# count everywhere and subtracts 1 only inside its attention backend
# ([`FlashAttentionImpl`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/attention/backends/flash_attn.py): `(sliding_window - 1, 0)`). So window 4 here and `sliding_window=4` in vLLM's cell
# at the end are not the same window. After 10 tokens (positions 0-9), SGLang keeps positions 6-9
# for the next query (position 10), while vLLM needs only 7-9 and frees whole blocks only
# ([`SlidingWindowManager.get_num_skipped_tokens`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/single_type_kv_cache_manager.py)).
# SGLang's window 4 is vLLM's (and the model config's) `sliding_window=5`: for one model, say
# `sliding_window=4096`, SGLang's $w$ is 4095 and both read the same 4096 tokens.

# %%
import torch

from memlab.course.viz.hybrid_books import SwaScene
from memlab.sglang.req_to_token import ReqToTokenPool
from memlab.sglang.swa import SWATokenToKVPoolAllocator

demo = SwaScene(ReqToTokenPool(2, 16), SWATokenToKVPoolAllocator(32, 16, 2), window=4)
demo.extend_batch({"R": 5})
for _ in range(5):
    demo.decode(["R"])
    released = demo.release("R")  # calls allocator.release_out_of_window(...)
    print(
        f"seq_len {demo.reqs['R'].kv.kv_allocated_len}: out of the window up to position {demo.swa_evicted_len['R']}; "
        f"SWA slots released now: {released}"
    )

t = lambda *xs: torch.tensor(xs)  # noqa: E731
for sharing in (False, True):
    probe = SWATokenToKVPoolAllocator(64, 32, 4)
    slots = probe.alloc_extend(t(0), t(0), t(23), t(23), t(-1), 23)
    end = probe.release_out_of_window(
        slots[None, :], 0, 23, 0, 6, supports_prefix_sharing=sharing
    )
    print(
        f"page 4, window 6, 23 tokens, prefix-sharing cache {sharing!s:<5}: released up to position {end}"
    )

# %% [markdown]
# ## Freeing
#
# A hybrid free goes **SWA side first**: it reads the map to find the SWA slots, clears the map for
# the freed pages, gives the SWA slots back (at the group's end, inside a free group), and only then
# frees the full side. The SWA side must read the map at the moment of the call: later in the same
# group, the prefix cache may point that full slot at a different SWA slot.
# Map entries of 0 (already released out of the window) are skipped: 0 is the SWA pool's padding
# slot and must never reach its free list. (SGLang's scheduler frees a finished request in
# page-aligned segments instead: the out-of-window part with
# [`SWATokenToKVPoolAllocator.free_full_segment`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/swa.py), the full side only, the rest with
# [`SWATokenToKVPoolAllocator.free_segment`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/swa.py); memlab has both too.) Inside a free group the SWA ids are
# read, and the map cleared, at each call; the SWA pages go back at the group's end, deduplicated
# once, as on the full side.

# %%
dbg = SWATokenToKVPoolAllocator(16, 8, 2, debug_mode=True)
x = dbg.alloc(4)
print("full slots", x.tolist(), "-> SWA", dbg.full_to_swa_index_mapping[x].tolist())
dbg.free(x)
print(
    "after free: map",
    dbg.full_to_swa_index_mapping[x].tolist(),
    "; free full",
    dbg.full_available_size(),
    "SWA",
    dbg.swa_available_size(),
)
dbg.check_books()

# %% [markdown]
# In **ring mode**, each request row owns a ring of `ceil(ring, P) * P` SWA slots instead, and a
# token's SWA slot is `ring_start(row) + pos % ring`: nothing to allocate or release per token, and
# SWA capacity is counted in request rows.
#
# ## See it: Mamba state
#
# A linear-attention layer keeps, per request, a conv state (the last few inputs per channel) and a
# recurrent state. `HybridReqToTokenPool` gives each request row a **state slot** in a `MambaPool`,
# and, with the extra buffer for prefix caching, **tracking slots** that snapshots of the state are
# written to. The * marks where the next snapshot goes.

# %% [markdown]
# ![A request's state slot and its two tracking slots](img/07_mamba.png)

# %%
options = {
    "extra buffer, overlap scheduler (2 tracking slots)": viz.hybrid_books.mamba_slots(
        True, True
    ),
    "extra buffer, no overlap (1 tracking slot)": viz.hybrid_books.mamba_slots(
        True, False
    ),
    "no extra buffer": viz.hybrid_books.mamba_slots(False, True),
}
viz.Stepper(options, draw_mamba)

# %% [markdown]
# ### Your own requests
#
# Starting where the first story ends (B and C hold their slots, A's went to the tail of the free
# list): `alloc` a request, `track_state` a running one at a sequence length of your choice (watch
# the * move between the two tracking slots), free one. Switch overlap off and your steps are
# replayed with one tracking slot per request: a snapshot always overwrites the same slot.

# %%
mamba = viz.hybrid_books.mamba_instrument(overlap=True)
mamba

# %% [markdown]
# ## State per request
#
# The state's size does not depend on the request's length: for Qwen3-Next it is about 74 MiB per
# request across its 36 linear layers (bf16 conv state, fp32 recurrent state), whatever the context. So the ledger counts **request slots**.
# Slot 0 is padding. A state left by the previous owner must never be read as the new request's
# history, yet SGLang does not zero a slot when it hands it out: it marks the request
# (`mamba_needs_clear`, [`HybridReqToTokenPool.alloc`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)) and zeroes the slot on the GPU's
# forward stream just before the request's first prefill runs its Mamba layers
# ([`ScheduleBatch._collect_deferred_mamba_cow_and_clear`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_batch.py)); if the prefix cache supplies a
# saved state, that state is copied in instead. memlab does the same: its
# `HybridReqToTokenPool.alloc` only marks the request, and
# `execute_deferred_mamba_cow_and_clear(reqs)` zeroes (or copies) before the extend. Layers are
# sparse among the model's layers, so a dense map turns a model layer id into a Mamba layer index.
#
# The layout is SGLang's ([`MambaPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)): `MambaPool.conv` is a **list over the conv-state components** (most
# models have one, `(channels, kernel - 1)`: the last inputs of the causal convolution), each
# stacked over the mamba layers as `(num_mamba_layers, size + 1, *shape)`; `temporal` is one tensor
# `(num_mamba_layers, size + 1, heads, head_dim, state)`. All mamba layers of a model share the
# shapes, so one tensor per component holds every layer, and a slot's state is column `slot` of
# each.

# %%
from memlab.common.models import MODELS

qn = MODELS["Qwen3-Next-80B-A3B"]
print(
    f"{qn.name}: {len(qn.layer_ids('linear_attention'))} linear layers, state per request "
    f"{qn.state_bytes_per_request() / 2**20:.1f} MiB; conv {qn.conv_state_shape()} temporal {qn.temporal_state_shape()}"
)
mamba_frames = options["extra buffer, overlap scheduler (2 tracking slots)"]
print(mamba_frames[1].caption)

from memlab.sglang.mamba import MambaPool

small = MambaPool(
    4, num_mamba_layers=3, conv_state_shape=[(8, 3)], temporal_state_shape=(2, 4, 4)
)
print(
    "conv:",
    [tuple(c.shape) for c in small.conv],
    " temporal:",
    tuple(small.temporal.shape),
)
conv, temporal = small.get_state(1)  # mamba layer 1: views, indexed by slot
print("layer 1:", [tuple(c.shape) for c in conv], tuple(temporal.shape))

# %% [markdown]
# ## Ping-pong
#
# How many tracking slots does a request take besides its state slot? The columns follow
# `mamba_tracking_slots(extra_buffer, overlap, lazy)` (SGLang's
# [`get_mamba_tracking_slots`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocation_sizing.py)):
#
# | extra buffer | overlap scheduler | lazy | tracking slots |
# |---|---|---|---|
# | no | - | - | 0 |
# | yes | no | no | 1 |
# | yes | yes | no | 2 |
# | yes | no | yes | 1 |
# | yes | yes | yes | 1, and a second when first needed |
#
# With the overlap scheduler, step $t$ is prepared while step $t-1$ still runs and may still read
# the last snapshot; writing the next one into the *other* slot (ping-pong) keeps them apart.

# %%
from memlab.sglang.mamba import mamba_tracking_slots

for extra, overlap, lazy in (
    (False, True, False),
    (True, False, False),
    (True, True, False),
    (True, True, True),
):
    print(
        f"extra={extra!s:<5} overlap={overlap!s:<5} lazy={lazy!s:<5} -> {mamba_tracking_slots(extra, overlap, lazy)}"
    )

# %% [markdown]
# ## What the engines do differently
#
# vLLM handles sliding windows inside one block pool: its `KVCacheManager` works through a
# coordinator ([`KVCacheCoordinator`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_coordinator.py)), which keeps one manager
# per group of layers (a [`SingleTypeKVCacheManager`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/single_type_kv_cache_manager.py)); for the sliding-window group that
# manager is [`SlidingWindowManager`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/single_type_kv_cache_manager.py). Before each allocation it replaces the blocks that fell
# out of the window with the **[null block](glossary.md#null-block)** in the request's list (the
# block table stays append-only) and frees them
# ([`SingleTypeKVCacheManager.remove_skipped_blocks`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/single_type_kv_cache_manager.py)), and a prefix hit only needs the blocks
# inside the window. (The cell below uses memlab's class, which plays both parts for
# one group; `sliding_window=4` there is vLLM's count, see "Two ways to count a window".)
# SGLang keeps a separate pool for the SWA layers, a configurable fraction of the full pool's size
# (`swa_full_tokens_ratio`, [`HybridSWAPoolConfigurator`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/model_executor/pool_configurator.py),
# chapter 08), so tokens that left the window cost those layers nothing. For Mamba-style layers
# SGLang keeps per-request state in a pool of its own, outside the token pool
# ([`MambaPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)); vLLM stores it in blocks of the same block pool, handed out by a Mamba
# manager ([`MambaManager`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/single_type_kv_cache_manager.py); one block holds one request's state).

# %%
from memlab.vllm import KVCacheManager, Request

# its group: a SlidingWindowManager
sw = KVCacheManager(num_gpu_blocks=16, block_size=2, sliding_window=4)
r = Request("A", list(range(6)), block_hasher=sw.request_block_hasher)
sw.allocate_slots(r, 6)
r.num_computed_tokens = 6
r.append_output_token_ids(6)
sw.allocate_slots(r, 1)
print(
    "vLLM, window 4, after 7 tokens: A's blocks",
    sw.get_block_ids("A"),
    "(0 = null block)",
)

# %% [markdown]
# ## Where memlab differs from the engine
#
# `./course engines` drives SGLang 0.5.23's `SWATokenToKVPoolAllocator`, `ReqToTokenPool`,
# `HybridReqToTokenPool` and `MambaPool` next to memlab's (`tests/engines/sglang/test_swa.py`,
# `tests/engines/sglang/test_mamba.py`; chapter 05 tells how): same rows, slots, free lists, map and
# evicted lengths after every step. Where memlab departs on purpose:
#
# | | memlab | SGLang 0.5.23 | why |
# |---|---|---|---|
# | SWA decode refused | both sides are checked first: a refusal takes nothing | takes the full side's page, then returns `None` when the SWA side is short (its scheduler checks capacity before, so it does not happen there; [`SWATokenToKVPoolAllocator.alloc_decode`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/swa.py)) | an allocator never leaks on a refused request |
# | `free()` at page size 1 after an out-of-window release | skips map entries of 0 | would hand SWA slot 0 back; the caller must use `free_full` for those slots ([`SWATokenToKVPoolAllocator.free`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/swa.py)) | a plain `free` of a request is always safe |
# | a Mamba row short of state slots | `alloc` returns `None` before taking a row | takes the rows, then asserts (the scheduler checks state slots first; [`HybridReqToTokenPool.alloc`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)) | all or nothing, as for rows |
# | a freed row | its map entries are reset to 0 | left as they were until the row is reused ([`HybridReqToTokenPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)) | a stale slot never shows in a picture |
# | lazy second tracking slot | `ensure_tracking_slots(rows)` | taken by the scheduler's tracking code when needed ([`HybridReqToTokenPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)) | the chapter's one entry point |
# | the window under a prefix cache | the capstone engine slides windows only without one (`maybe_evict_swa` before each decode step and each later chunk); a cached node keeps its SWA slots until the tree evicts it | a hybrid model's tree ([`UnifiedRadixCache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/unified_radix_cache.py) with an SWA component) always slides, and tombstones the SWA side of the nodes it shares | memlab's radix tree (chapter 11) has one component: a node is all there or gone |
# | ring mode (`swa_req_ring_size`) | `ring_loc(row, position)` gives each token's ring slot | the ring lives in its DeepSeek-V4 pool and backend ([`DeepSeekV4TokenToKVPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py)) | shown, not compared stream by stream |
#
# ## Exercises
#
# **`exercises/ch07_swa_release.py`** (10 points): the release range and the SWA side of a free.

# %%
with exercise("ch07_swa_release") as ex:
    for seq_len, evicted, want in ((8, 0, (0, 4)), (9, 4, (4, 4)), (12, 4, (4, 8))):
        got = ex.swa_release_range(seq_len, evicted, sliding_window=4, page_size=2)
        assert tuple(got) == want, (
            f"seq_len {seq_len}, released up to {evicted}: yours {got}, want {want}"
        )
    print("release ranges agree")

# %% [markdown]
# **`exercises/ch07_mamba_tracking.py`** (10 points): tracking-slot counts and the Mamba row books.

# %%
with exercise("ch07_mamba_tracking") as exm:
    cases = ((False, True), (True, True, True), (True, False), (True, True))
    assert [exm.get_mamba_tracking_slots(*a) for a in cases] == [0, 1, 1, 2]
    rows = exm.MambaRows(rows=3, num_slots=9, state_dim=4, tracking=2)
    assert rows.alloc_row(3)
    assert [rows.next_track_slot(3) for _ in range(3)] == [2, 3, 2], (
        "ping-pong between the two tracking slots"
    )
    rows.free_row(3)
    print("tracking counts, ping-pong and free agree")

# %% [markdown]
# ## Grade

# %%
from memlab.grade import main as grade

grade(["07"])
