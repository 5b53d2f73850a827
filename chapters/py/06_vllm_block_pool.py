# %% [markdown]
# # 06 · vLLM's block pool and prefix cache
#
# [Open in Colab](https://colab.research.google.com/github/memlab-course/memlab/blob/v0.1.0/chapters/06_vllm_block_pool.ipynb)
#
# vLLM keeps the same three mappings as SGLang with different objects: its scheduler owns a
# **block pool** ([`BlockPool`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/block_pool.py); a [block](glossary.md#block) is a page of `block_size` tokens) whose
# [free queue](glossary.md#free-queue) doubles as the [eviction](glossary.md#eviction) order of a
# **[prefix cache](glossary.md#prefix-cache)**; its workers keep a
# **[block table](glossary.md#block-table)** and derive a per-token
# [`slot_mapping`](glossary.md#slot-mapping) before every step.
#
# **After this chapter you can**
# - follow blocks through the free queue: allocation from the head, lazy eviction, hits removed
#   from the middle, frees in reverse order;
# - compute chained block hashes and say what besides the tokens goes into them;
# - say how many tokens of a prompt can hit the cache, and how hits count against capacity;
# - compute `slot_mapping` from a block table with a Triton kernel, and store K and V through it;
# - write the free path, the block hashes and the slot_mapping kernel (exercises `ch06_free_queue`,
#   `ch06_block_hash`, `ch06_slot_mapping`).

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
from memlab.course.notebook import exercise, start; FAST = start("06", REF, drive=DRIVE)
# fmt: on

# %% [markdown]
# ## See it
#
# A pool of 12 blocks of 4 tokens. A arrives with 10 tokens, decodes 2, finishes. B shares A's
# first 8 tokens; C and D fill the pool; B finishes. Top left: every block (null, in use in its
# owner's colour, free, or free and still **cached**: teal, with its hash label). Top right: each
# request's blocks; hatched ones came from a cache hit. Bottom: the free queue. A red edge marks a
# block evicted by this step. Switch the story to see the same requests with caching off.

# %% [markdown]
# ![B arrives and hits A's first two blocks in the middle of the free queue](img/06_block_pool.png)

# %%
from memlab.course import viz
from memlab.course.viz.vllm_books import draw_vllm

stories = {
    "prefix caching on": viz.vllm_books.prefix_cache(True).frames,
    "prefix caching off": viz.vllm_books.prefix_cache(False).frames,
}
viz.Stepper(stories, draw_vllm)

# %% [markdown]
# ### Your own prompts
#
# The instrument below starts where the story ends: C and D run, blocks 4, 2 and 1 are free, 1 and
# 2 still carry A's hashes. Type a request name and a prompt (token ids, or words: the same word
# gets the same id) and press `submit`: it runs the scheduler's lookup, `get_computed_blocks`, then
# `allocate_slots` after the hits on a real `KVCacheManager`, and shows both calls. The prompt
# typed first shares A's first 8 tokens: its hits come out of the middle and the tail of the free
# queue, its new block from the head. `decode` appends tokens, `finish` calls `manager.free`. A
# block reused while it still carries a hash is evicted (red edge). A prompt the pool cannot hold
# is refused, with nothing taken. Hover a block to read its ref count, hash, owner and neighbours
# in the queue; `undo`, `reset` and prefix caching off replay your steps on fresh objects.

# %%
inst = viz.vllm_books.block_pool_instrument()
inst

# %% [markdown]
# ## The free queue
#
# `FreeKVCacheBlockQueue` is a doubly linked list threaded through the blocks themselves, between
# a fake head and a fake tail. Allocation pops from the head (`popleft_n`). A prefix hit on a free
# block must take it out of the **middle**, in O(1): a deque cannot, a linked list can. Block 0 is
# the *null block*: popped at start, never freed, a placeholder for blocks a request no longer
# needs.

# %%
from memlab.vllm import BlockPool

pool = BlockPool(num_gpu_blocks=8)
queue = pool.free_block_queue
print(
    "null block:",
    pool.null_block.block_id,
    " free:",
    [b.block_id for b in queue.get_all_free_blocks()],
)
taken = pool.get_new_blocks(3)
print(
    "took",
    [b.block_id for b in taken],
    " free:",
    [b.block_id for b in queue.get_all_free_blocks()],
)
queue.remove(pool.blocks[5])  # what a hit on a free block does
print("removed 5 from the middle:", [b.block_id for b in queue.get_all_free_blocks()])
queue.append(pool.blocks[5])

# %% [markdown]
# ## Block hashes
#
# A full block's hash ([block hash](glossary.md#block-hash)) is
# `hash(parent hash, its token ids, extra keys)`. The parent makes the chain:
# one hash stands for the whole prefix up to that block, so a lookup compares one value per block.
# Only full blocks are hashed (a partial block's content is still growing). The first block's
# parent is `NONE_HASH`, the hash of a fixed seed string (`"vllm-none-hash"`, [`init_none_hash`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_utils.py)), so with the
# default `sha256` every process and every machine computes the same hashes and could share
# cached KV. (The fast `xxhash` options draw a random seed per process instead, unless
# `PYTHONHASHSEED` is set: a predictable seed would let an attacker make colliding blocks.) The extra keys hold
# whatever else decides the KV: the LoRA adapter (`("lora", name, path)`), multimodal items
# overlapping the block (`("mm", content hash, offset in the block)`), and a per-user **cache
# salt** on the first block only (`("cache_salt", salt)`), which through the chain changes every
# later hash too ([`generate_block_hash_extra_keys`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_utils.py), [`hash_block_tokens`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_utils.py)). `sha256` is
# vLLM's default ([`sha256`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/utils/hashing.py)): SHA-256 of the pickled key. memlab's hashes are
# vLLM 0.33's, byte for byte (`tests/engines/vllm/test_hashing.py`).

# %%
from memlab.vllm import Request, get_request_block_hasher, sha256

hasher = get_request_block_hasher(block_size=4, hash_fn=sha256)
tokens = list(range(10))
plain = Request("a", tokens, block_hasher=hasher).block_hashes
salted = Request("b", tokens, block_hasher=hasher, cache_salt="alice").block_hashes
same_prefix = Request("c", tokens[:8] + [99, 98], block_hasher=hasher).block_hashes
print(f"{len(plain)} full blocks of 4 in 10 tokens")
print("same first 8 tokens -> same hashes:", same_prefix[:2] == plain[:2])
print("a salt changes every hash         :", [s != p for s, p in zip(salted, plain)])

# %% [markdown]
# ## Cache hits
#
# `get_computed_blocks` walks the prompt's hashes and stops at the first miss: after a miss no
# later block can share the prefix. At most `num_tokens - 1` tokens can hit (a
# [cache hit](glossary.md#cache-hit)), because the last token must be computed again to produce
# the next token's logits. Hits come in whole blocks, so that cap is rounded down to a block
# boundary: a prompt that fills its blocks exactly recomputes its whole last block.
# `allocate_slots` then counts the hit blocks whose [reference count](glossary.md#reference-count)
# is 0 as *needed*: touching them takes them off the free queue, so they are no longer available
# to others.

# %%
from memlab.vllm import KVCacheManager

mgr = KVCacheManager(num_gpu_blocks=16, block_size=4)
a = Request("A", list(range(12)), block_hasher=mgr.request_block_hasher)
mgr.allocate_slots(a, a.num_tokens)
a.num_computed_tokens = a.num_tokens
mgr.free(a)
# the very same prompt
b = Request("B", list(range(12)), block_hasher=mgr.request_block_hasher)
hits, n = mgr.get_computed_blocks(b)
print(
    f"B's prompt: 12 tokens in 3 full blocks; hit {n} tokens ({len(hits)} blocks): at most 11 may hit, and "
    f"hits are whole blocks, so the whole last block ({b.num_tokens - n} tokens) is computed again"
)

# %% [markdown]
# ## Freeing in reverse
#
# `KVCacheManager.free` hands a request's blocks to the pool **last block first**. A block whose
# count drops to 0 goes to the queue's tail if it carries a hash (still useful to a later hit;
# LRU order) and to the head if not (nothing to keep: reuse it first). Reversed, the tail of a
# prefix reaches the queue before its start, so eviction from the head removes the prefix's end
# first and keeps its shared beginning cached the longest.

# %%
print(
    "free queue after A's free:",
    [blk.block_id for blk in mgr.block_pool.free_block_queue.get_all_free_blocks()][
        -4:
    ],
    "<- tail: A's blocks, last block first",
)

# %% [markdown]
# ## Block table and slot_mapping
#
# The worker's block table has a row of block ids per request
# ([`BlockTables`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/worker/gpu/block_table.py) in vLLM 0.33's default model runner, one per
# group of layers; [`BlockTable`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/worker/block_table.py) in the older V1 runner, which memlab
# mirrors). Before each step a kernel turns every scheduled token (request row, position) into a
# slot:
#
# $$\text{slot} = \text{block\_table}[r, \lfloor \text{pos} / B \rfloor] \cdot B + \text{pos} \bmod B$$
#
# A batch padded to a fixed size (for CUDA graphs) gets slot -1 for its padding tokens, and the
# KV-store kernel skips negative slots. Here: C and D from the widget's last step, C decoding one
# token and D prefilling its 8, padded to 16 tokens. The kernel, the torch reference and the plain
# Python reference must agree.

# %%
import torch

from memlab.common.env import kernel_device
from memlab.vllm.block_table import BlockTable, slot_mapping_python, store_kv

last = stories["prefix caching on"][-1]
dev = kernel_device()
table = BlockTable(
    block_size=4,
    max_num_reqs=4,
    max_num_blocks_per_req=8,
    max_num_batched_tokens=16,
    device=dev,
)
for row, rid in enumerate(("C", "D")):
    table.add_row(list(last.req_blocks[rid]), row)
req_idx = torch.tensor([0] + [1] * 8, device=dev)
positions = torch.tensor([23] + list(range(8)), device=dev)
by_kernel = table.compute_slot_mapping(
    req_idx, positions, num_padded=16, backend="triton"
).clone()
by_torch = table.compute_slot_mapping(
    req_idx, positions, num_padded=16, backend="torch"
).clone()
by_python = slot_mapping_python(
    [table.get_row(0), table.get_row(1)], req_idx.tolist(), positions.tolist(), 4, 16
)
print("block table rows:", table.get_row(0), table.get_row(1))
print("slot_mapping    :", by_kernel.tolist())
assert by_kernel.tolist() == by_torch.tolist() == by_python

# %% [markdown]
# The KV-store kernel writes each token's K and V at its slot, and skips the padding. The cache is
# laid out as vLLM 0.33 lays it out (chapter 02, [`KVCacheLayout`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/kv_cache_layout.py)): one layer's view `[block, head, token, K|V]`,
# split into K and V views shaped `(num_blocks, block_size, heads, head_dim)`, whose heads sit
# `2 * head_dim` apart because each token's K and V are side by side:

# %%
from memlab.vllm.kv_layout import allocate_kv_cache, split_kv

H, D = 2, 8
key = torch.randn(16, H, D, device=dev)
value = torch.randn(16, H, D, device=dev)
layer_cache = allocate_kv_cache(
    num_layers=1,
    num_blocks=12,
    num_kv_heads=H,
    block_size=4,
    head_size=D,
    dtype=torch.float32,
    device=dev,
)[0]
k_cache, v_cache = split_kv(layer_cache, D)
store_kv(key, value, k_cache, v_cache, by_kernel, backend="triton")
slot = int(by_kernel[1])  # D's first token
print(
    f"token 1 -> slot {slot} = block {slot // 4}, offset {slot % 4}:",
    torch.equal(k_cache[slot // 4, slot % 4], key[1]),
)
written = int((k_cache.abs().sum(dim=(2, 3)) > 0).sum())
print(
    f"{written} of 48 slots written, in blocks {sorted({int(s) // 4 for s in by_kernel.tolist() if s >= 0})}; "
    f"the {int((by_kernel < 0).sum())} padding tokens wrote nothing"
)

# %% [markdown]
# ## A real trace
#
# The Mooncake traces (FAST'25) list, per request, its prompt length and one id per 512-token
# block of the prompt, equal ids meaning an equal prefix. Replaying them through memlab's
# `KVCacheManager` shows how the hit rate grows with the pool's capacity (LRU eviction, the rules
# above). The full conversation trace has 12,031 requests, replayed once per capacity: the
# progress bar counts requests over all capacities. Fast mode replays the first requests only.

# %%
from memlab.vllm.trace_replay import hit_rate_curve, load_trace
from memlab.course.viz.style import new_figure

trace = load_trace("conversation", limit=300 if FAST else None)
curve = hit_rate_curve(
    trace,
    fractions=(0.05, 0.2, 0.5, 1.0) if FAST else (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
    trace="conversation",
)
fig, ax = new_figure(6.5, 3.5)
curve.plot(ax)
viz.show(fig)
print(curve.table())

# %% [markdown]
# ## What the engines do differently
#
# The same request stream through chapter 03's token allocator, chapter 04's paged allocator and
# this chapter's block pool: how many slots each reserves, how many it wastes in the last page,
# and where its free puts what it releases (`memlab.course.compare`). SGLang's prefix cache is a
# radix tree over token ids ([`RadixCache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py), chapter 11) instead of a
# hash map over blocks; its allocators know nothing of caching.

# %%
from memlab.course.compare import compare, format_table, make_stream

print(format_table(compare(make_stream(6, seed=1), block_size=16)))

# %% [markdown]
# ### memlab next to the real vLLM
#
# `./course engines` (`tests/engines/vllm/test_block_pool.py`, `test_kv_cache_manager.py`,
# `test_hashing.py`) downloads vLLM 0.33's published wheel, loads its block pool, free queue,
# hashing and KV cache manager (pure Python), and runs them side by side with memlab's: random
# streams of admissions with prefix hits, chunked prefills, decode steps, twins, preemptions,
# frees and resets, compared after every step (every block id handed out, every refusal, the
# free queue's order, the hash map). They agree, stream by stream.
#
# ### Where memlab differs from the engine
#
# | | vLLM 0.33 | memlab |
# |---|---|---|
# | managers | [`KVCacheManager`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_manager.py) + a coordinator + one [`SingleTypeKVCacheManager`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/single_type_kv_cache_manager.py) per KV cache group (hybrid models) | one group: `KVCacheManager` over vLLM's `UnitaryKVCacheCoordinator` and one `FullAttentionManager` or `SlidingWindowManager` |
# | hash map keys | the block hash plus a 4-byte KV cache group id ([`make_block_hash_with_group_id`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_utils.py)) | the block hash |
# | partial blocks | in hybrid Mamba models (Mamba's `align` mode, Mamba blocks larger than the hash unit), a hit may end inside a block (finer hash units, copy-on-write of the shared tail; [`MambaManager`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/single_type_kv_cache_manager.py)) | only whole blocks are cached and hit |
# | `allocate_slots` | also KV-connector (external) tokens, EAGLE's dropped last hit, delayed caching, a full-sequence admission gate ([`KVCacheManager.allocate_slots`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_manager.py)) | new tokens, hits and lookahead only |
# | watermark | waived while no other request is scheduled in the step ([`KVCacheManager.allocate_slots`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_manager.py)) | applied to every admission |
# | sliding window | may skip caching blocks no later hit can use (retention settings, [`SlidingWindowManager`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/single_type_kv_cache_manager.py)) | caches every full block (vLLM's default for one group) |
# | hash functions | `sha256` (default), `sha256_cbor`, `xxhash`, `xxhash_cbor`; `PYTHONHASHSEED` overrides the seed; without it the xxhash variants use a random seed per process ([`get_hash_fn_by_name`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/utils/hashing.py), [`init_none_hash`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_utils.py)) | `sha256` (the same digests) and `fast_hash` (memlab's own, a built-in hash); always the fixed seed |
# | extra keys | LoRA, multimodal items, cache salt, prompt-embedding digests ([`generate_block_hash_extra_keys`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_utils.py)) | LoRA, multimodal items, cache salt |
# | a free of a free block | not checked ([`BlockPool.free_blocks`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/block_pool.py)) | refused with an error, nothing changed |
# | KV store | [`reshape_and_cache_flash`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/_custom_ops.py), a CUDA C++ op | a Triton kernel (`store_kv`) |

# %% [markdown]
# ## Exercises
#
# **`exercises/ch06_free_queue.py`** (9 points): `free_request_blocks`, the order in which a
# finished request's blocks join the queue.

# %%
with exercise("ch06_free_queue") as ex:
    q = ex.FreeQueue([ex.Block(i) for i in (7, 8)])
    blocks = [
        ex.Block(1, 1, "h1"),
        ex.Block(2, 2, "h2"),
        ex.Block(3, 1, "h3"),
        ex.Block(4, 1),
    ]
    ex.free_request_blocks(q, blocks)
    print("queue:", q.ids())
    assert q.ids() == [4, 7, 8, 3, 1], (
        "want: the unhashed block 4 at the head, then 3 and 1 at the tail (2 is still shared)"
    )

# %% [markdown]
# **`exercises/ch06_block_hash.py`** (9 points): the chained hashes with their extra keys.

# %%
with exercise("ch06_block_hash") as exh:
    h = exh.request_block_hashes(list(range(10)), 4)
    h_salted = exh.request_block_hashes(list(range(10)), 4, cache_salt="alice")
    assert len(h) == 2 and all(a != b for a, b in zip(h, h_salted))
    assert exh.request_block_hashes(list(range(8)) + [99], 4) == h
    print("2 full blocks; the salt changes both; the same prefix gives the same hashes")

# %% [markdown]
# **`exercises/ch06_slot_mapping.py`** (7 points, +2 on a GPU): the slot_mapping kernel.

# %%
with exercise("ch06_slot_mapping") as exs:
    qsl = torch.tensor([0, 1, 9], device=dev)  # C has token 0, D tokens 1..8
    got = exs.compute_slot_mapping(table.block_table, qsl, positions, 4, 16)
    assert got.tolist() == by_python, f"yours {got.tolist()}"
    print("your kernel matches:", got.tolist())

# %% [markdown]
# ## Grade

# %%
from memlab.grade import main as grade

grade(["06"])
