# %% [markdown]
# # 11 · Above and below the allocator: the radix prefix cache and HiCache's host tier
#
# [Open in Colab](https://colab.research.google.com/github/memlab-course/memlab/blob/v0.1.0/chapters/11_radix_and_hicache.ipynb)
#
# The allocator is not alone. **Above** it, SGLang's [prefix cache](glossary.md#prefix-cache)
# decides which prefixes are reused: a radix tree over token ids whose nodes hold the KV slots the
# allocator handed out ([`TreeNode`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py)). (SGLang 0.5.23's scheduler builds a
# [`UnifiedRadixCache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/unified_radix_cache.py) for this by default. This chapter follows
# [`RadixCache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py), SGLang's classic version of the same tree, which memlab mirrors method by
# method; `tests/engines/sglang/test_radix_cache.py` drives both side by side.) **Below** it, HiCache moves pages between
# GPU memory and host memory (and storage): a node evicted from the GPU can keep its KV in a host
# pool and come back later. Both sides lean on the allocator's free pages. The scheduler admits a
# new request only if enough pages are free, or can be freed from the tree; and HiCache, to bring
# a node back from host memory, first takes free device pages and only then copies the KV back
# into them.
#
# **After this chapter you can**
# - follow a radix tree through inserts, matches that split a node, locks held by running
#   requests and LRU eviction of unlocked leaves, and check its books
#   (`available + evictable + protected == total`);
# - say why keys are cut to whole pages, and what a finished request hands to the tree and what
#   it frees;
# - build a host pool from the device pool's declaration, move pages with a Triton gather/scatter
#   kernel, and follow a node from the device to the host and back (write-through, write-back);
# - say where SGLang's radix tree ([`RadixCache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py)) and vLLM's block hashes differ, with
#   measured hit rates and evictions on one stream of shared-prefix conversations;
# - write `match_prefix` with its split and `evict` (exercise `ch11_radix_match`).

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
from memlab.course.notebook import exercise, start; FAST = start("11", REF, drive=DRIVE)
# fmt: on

# %% [markdown]
# ## See it
#
# A device pool of 24 slots and a host pool of 32, a tree with write-through (every node is
# copied to the host when it is inserted). Requests A to D share a system prompt and parts of
# their questions. Left: the tree; each node shows its tokens, its device slots (`dev`), its host
# slots (`host`) and its lock count. Dark blue: locked by a running request; peach: an evictable
# leaf (the next eviction's candidates, least recently used first); mint: on the device with a
# child on the device; grey and hatched: evicted from the device, its KV only on the host. A black
# edge marks what the step changed. Right: every device and host slot in the colour of its
# node; cross-hatched slots belong to a running request and are not in the tree yet; slot 0 (dark
# grey) is the padding slot, never handed out (chapter 03). Press **next** and watch the tree.
#
# The second story (the `story` menu) replays the same requests with pages of 2 tokens: every
# match and every split now falls on a page boundary. B shares 7 tokens with A
# (`<s> You are brief . What is`), yet hits only 6 (three whole pages), and the split lands after 'What', not
# after 'is'; the captions say so.

# %% [markdown]
# ![D hits nodes that live only on the host: they are loaded back into new device pages](img/11_radix.png)

# %%
from memlab.course import viz
from memlab.course.viz.radix_books import draw_radix, story

viz.Stepper(
    {"page size 1": story(), "page size 2": story(page_size=2)},
    draw_radix,
    interval_ms=2000,
)

# %% [markdown]
# ### Your own words
#
# The instrument below starts where the story ends: every node lives on the host only, and the
# host eviction dropped the least recently used leaves. Type words of your own (a new word gets
# the next token id) and call the tree's operations on the real `HiRadixCache`: `arrive` admits a
# request as the scheduler does (match, load back, lock, allocate, compute, checkpoint) and
# `finish` releases it; `insert`, `match_prefix` (a match that ends inside a node splits it),
# `inc_lock_ref` on the node a match ends at and `dec_lock_ref` on a node; `evict` demotes
# unlocked leaves to the host, `write_backup` copies a device node to the host, `load_back`
# brings a host-only match back into new device slots and `evict_host` drops host-only leaves.
# Each call is shown as made, with what it returned; a call the library refuses (unlocking a
# node nobody locks, a key the pool cannot hold) shows its message and changes nothing. Every
# node shows its whole key, wrapped; hover a node or a slot for its ids, slots and lock count.

# %%
inst = viz.radix_books.radix_instrument(page_size=1)
inst

# %% [markdown]
# ## The radix tree
#
# `memlab/sglang/radix_cache.py` follows SGLang's [`RadixCache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py) method by method, with one
# difference in how they are called: SGLang's `match_prefix`, `insert` and `evict` each take one
# parameter object ([`MatchPrefixParams`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/base_prefix_cache.py), [`InsertParams`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/base_prefix_cache.py), [`EvictParams`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/base_prefix_cache.py))
# and its keys are [`RadixKey`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py) objects (token ids, `extra_key`, `is_bigram`, `limit`,
# `cache_salt`); memlab's take the key (a list of token ids), the value or the count directly:
#
# - `match_prefix(key)` walks down from the root, one child per step (a child is found by its
#   first token). A match that ends **inside** a node splits it, so the match always ends
#   exactly on a node: `MatchResult(device_prefix_len, last_device_node, ...)` (a
#   [cache hit](glossary.md#cache-hit) of `device_prefix_len` tokens). The slots are
#   read off the path with `path_device_indices(node)`.
# - `insert(key, value)` adds what the tree did not have and returns `prefix_len`, how much it
#   already had: the caller's own slots for that part are duplicates, and the **caller** frees
#   them.
# - `inc_lock_ref(node)` / `dec_lock_ref(node)` lock or unlock the whole path to the root;
#   [locked](glossary.md#locked) tokens move from `evictable_size()` to `protected_size()`
#   ([evictable](glossary.md#evictable): cached, but no running request uses them).
# - `evict(num_tokens)` frees unlocked leaves, least recently used first, through the allocator;
#   a parent whose last child went becomes a leaf and may go in the same call. A node is the unit:
#   evict frees *at least* what was asked.

# %%
import torch

from memlab.sglang.allocator import TokenToKVPoolAllocator
from memlab.sglang.radix_cache import RadixCache

alloc = TokenToKVPoolAllocator(32, debug_mode=True)
# 0.5.23's scheduler builds UnifiedRadixCache; RadixCache is its reference class
tree = RadixCache(alloc, debug_mode=True)


def finished(tokens):
    """What a finished request hands over: its tokens and fresh slots; duplicates go back."""
    slots = alloc.alloc(len(tokens))
    r = tree.insert(tokens, slots)
    alloc.free(slots[: r.prefix_len])
    return r.prefix_len


print("insert [1 2 3 4 5]: tree already had", finished([1, 2, 3, 4, 5]))
print(
    "insert [1 2 3 9 9]: tree already had",
    finished([1, 2, 3, 9, 9]),
    "-> (1 2 3 4 5) split after 3",
)
m = tree.match_prefix([1, 2, 3, 4, 7])
print(
    "match [1 2 3 4 7]:",
    m.device_prefix_len,
    "tokens, slots",
    tree.path_device_indices(m.last_device_node).tolist(),
    "(the match split (4 5) after 4)",
)
tree.inc_lock_ref(m.last_device_node)
print("locked: evictable", tree.evictable_size(), "protected", tree.protected_size())
print(
    "evict(10) frees",
    tree.evict(10).num_tokens_evicted,
    "tokens: only the unlocked leaves (5) and (9 9)",
)
tree.dec_lock_ref(m.last_device_node)
tree.check_idle(32)
print(
    "idle check: available",
    alloc.available_size(),
    "+ evictable",
    tree.evictable_size(),
    "+ protected",
    tree.protected_size(),
    "== 32",
)

# %% [markdown]
# **The idle check.** With no request running, every slot of the pool is free, held by the tree
# (evictable) or locked (protected): SGLang's scheduler checks `available + evictable +
# protected == total` whenever it is idle
# ([`SchedulerInvariantChecker`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/scheduler_components/invariant_checker.py)) (plus the tokens streaming sessions hold, when there are
# any), and a leak (a slot nobody owns) shows up there. In
# `debug_mode`, memlab's tree also recounts its books from the tree after every change.
#
# **Pages.** With `page_size > 1` a key is cut to whole pages (`page_aligned`) and compared page
# by page; a child is found by its first *page*. The tree only ever holds whole pages, so a
# request's partial last page is freed when it finishes and every value is a run of page-aligned
# slots (which is what lets eviction free pages without a dedup).

# %%
from memlab.capstone.prefix_compare import RadixDriver
from memlab.sglang.allocator import PagedTokenToKVPoolAllocator

ptree = RadixCache(PagedTokenToKVPoolAllocator(64, 4, debug_mode=True), debug_mode=True)
# admit: match, lock, allocate, checkpoint; finish: release_kv_cache(checkpoint=True)
drv = RadixDriver(ptree)
a = drv.admit(list(range(10)))
drv.finish(a)
print(
    "A: 10 tokens -> the tree keeps",
    ptree.total_size(),
    "(two pages); the page of tokens 8, 9 was freed",
)
b = drv.admit(list(range(6)) + [50, 51, 52])
print(
    "B shares tokens 0-5 but hits",
    b.hit_tokens,
    "tokens: one whole page; its second page (4 5 50 51) is not A's (4 5 6 7)",
)
drv.finish(b)

# %% [markdown]
# ## Below the allocator: the host pool
#
# memlab's host pool mirrors the device pool: one tensor per layer for each buffer the device
# pool holds (MHA: K and V; MLA: one latent buffer). (SGLang keeps one host tensor for all layers,
# by default with all layers of a page side by side, the `page_first` layout:
# [`MHATokenToKVPoolHost`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/pool_host/mha.py).) SGLang's device pools declare what they
# need ([`KVCache.host_pool_decls`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)), and so do memlab's:
# `pool.host_pool_decls()` names each per-layer buffer with its row shape and dtype. The host pool
# is sized in tokens, in whole pages, and hands out its slots from its own free list, a whole
# number of pages at a time.

# %%
from memlab.sglang.hicache import HostKVCache
from memlab.sglang.kv_pool import MHATokenToKVPool, MLATokenToKVPool

for dev_pool in (
    MHATokenToKVPool(64, 4, torch.float16, head_num=8, head_dim=128, layer_num=4),
    MLATokenToKVPool(
        64, 4, torch.float16, kv_lora_rank=512, qk_rope_head_dim=64, layer_num=4
    ),
):
    (decl,) = dev_pool.host_pool_decls()
    host = HostKVCache(decl, 256, 4, pin_memory=False)
    print(
        f"{type(dev_pool).__name__:18} declares {[(b.name, b.row_shape) for b in decl.buffers]}; host pool of "
        f"{host.size} tokens: {host.size_per_token} bytes per token (device: {dev_pool.bytes_per_token})"
    )

# %% [markdown]
# ## The copy kernel
#
# A transfer moves whole pages: page `src_pages[i]` of one layer's buffer to page `dst_pages[i]`
# of another. `kernels/page_copy.py` gives each program one chunk of one page (a page is one
# contiguous run of `page_size` rows); a page id outside either buffer copies nothing. It moves
# elements without looking at them, so fp8 pools (stored as bytes) copy like any other.
#
# On a GPU the kernel only touches device memory: device to host, it gathers the pages into a
# contiguous device buffer, one bulk copy moves that to pinned host memory, and the host scatters
# it into the host pool's pages; host to device runs the other way. (SGLang's `kernel` io backend
# lets its CUDA kernels read and write pinned host memory directly, [`HiCacheController`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/cache_controller.py); memlab stages, so every step
# also runs, and is tested, in the Triton interpreter.) Here it is against its torch and Python
# references:

# %%
from memlab.common.env import kernel_device
from memlab.sglang.page_copy import copy_pages_python, copy_pages_torch

dev = kernel_device()
# 8 pages of 4 rows, MHA-like rows (2 heads of 8)
src = torch.randn(8 * 4, 2, 8, device=dev)
sp, dp = torch.tensor([5, 0, 7], device=dev), torch.tensor([1, 3, 2], device=dev)
outs = []
for how in ("kernel", "torch", "python"):
    dst = torch.zeros(4 * 4, 2, 8, device=dev)
    if how == "kernel":
        from memlab.kernels import page_copy

        page_copy.copy_pages(src, dst, sp, dp, 4)
    else:
        (copy_pages_torch if how == "torch" else copy_pages_python)(src, dst, sp, dp, 4)
    outs.append(dst.cpu())
assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
print(
    "page 5 -> 1, 0 -> 3, 7 -> 2: kernel == torch == python; page 0 of dst untouched:",
    bool((outs[0][:4] == 0).all()),
)

# %% [markdown]
# ## Evict to the host, load back
#
# `HiRadixCache` (memlab/sglang/hicache.py) is the tree over both tiers; `HiCacheController` moves the
# KV. A node's `value` holds its device slots, its `host_value` its host slots:
#
# - **write-through** copies a node to the host when it is inserted (`write_through_selective`:
#   on its second hit), backing up its unbacked ancestors first; eviction then only drops the
#   device copy (the node is *demoted*). **write-back** copies a node only when it is evicted.
#   A node that cannot get a host copy is dropped, with the host-only nodes below it.
# - A match walks through host-only nodes too: `host_hit_length` counts the tokens past
#   `last_device_node` that only the host holds.
# - `load_back(node)` locks the device ancestors, takes **device pages first** (evicting if
#   short), copies host -> device into them (the slot ids pass through the device pool's
#   `host_transfer_translate` when it has one: virtual ids; a static pool has none), then
#   re-points the nodes.
# - `evict_host` drops host-only leaves, least recently used first.

# %%
from memlab.sglang.hicache import HiRadixCache

from memlab.common.env import kernel_device

dev = kernel_device()  # the copy kernel reads GPU memory (the interpreter: the CPU's)
pool = MHATokenToKVPool(
    16, 1, torch.float32, head_num=1, head_dim=2, layer_num=2, device=dev
)
hi_alloc = TokenToKVPoolAllocator(16, kvcache=pool, debug_mode=True, device=dev)
hi = HiRadixCache(
    hi_alloc,
    HostKVCache(pool.host_pool_decls()[0], 32, 1),  # pinned when there is a GPU
    write_policy="write_through",
    io_backend="triton",
    load_back_threshold=1,
    debug_mode=True,
)


# the 'model': K of token i = (i, token id) in every layer
def compute(slots, tokens, start):
    kv = torch.tensor(
        [[float(i), float(tokens[i])] for i in range(start, start + len(slots))],
        device=dev,
    )[:, None]
    for layer in range(2):
        pool.set_kv_buffer(layer, slots, kv, kv)


hdrv = RadixDriver(hi, compute)
hdrv.finish(hdrv.admit([7, 8, 9, 10, 11, 12]))
(node,) = hi.root_node.children.values()
print("inserted: device", node.value.tolist(), "host", node.host_value.tolist())
hi.evict(100)
print(
    "evicted : device",
    node.value,
    "host",
    node.host_value.tolist(),
    "-> the node lives on the host only",
)
m = hi.match_prefix([7, 8, 9, 10, 11, 12, 13])
print(
    "match   : device_prefix_len",
    m.device_prefix_len,
    "host_hit_length",
    m.host_hit_length,
)
r = hdrv.admit([7, 8, 9, 10, 11, 12, 13])
print(
    "admit   : loaded back",
    r.host_hit_tokens,
    "tokens into new device slots",
    node.value.tolist(),
)
k = pool.get_key_buffer(1)[r.kv_indices][:, 0]
assert k[:, 0].tolist() == list(range(7)) and k[:, 1].tolist() == [
    7.0,
    8,
    9,
    10,
    11,
    12,
    13,
]
print("every byte came back: layer 1's K of the whole row =", k.tolist())
hdrv.finish(r)
hi.check_idle(16)

# %% [markdown]
# ## The capstone's engine on a radix tree
#
# Chapter 10's engine takes its prefix cache as a choice: `Engine(..., prefix_cache="hash")` indexes
# full pages by chapter 06's chained block hashes, `"radix"` is this chapter's `RadixCache`, and
# `"hicache"` the tree with a host tier. A new request matches its prompt in the tree and locks the
# hit; a finished one hands its pages to the tree (SGLang 0.5.23:
# [`release_kv_cache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/common.py)`(req, tree_cache, checkpoint=True)`, which calls the
# tree's [`RadixCache.checkpoint`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py): it
# inserts the page-aligned part, frees the slots the tree already had, and the rest of the row is
# freed after); when the pool runs short,
# the scheduler evicts from the tree before it refuses. Chapter 10's eight requests (a shared
# 16-token system prompt) through each cache give the same tokens; the radix tree also shares a
# prefix that ends inside a page when pages hold one token.

# %%
from memlab.capstone.engine import Engine, TinyLlama

model = TinyLlama()
g = torch.Generator().manual_seed(0)
system = torch.randint(0, 128, (16,), generator=g).tolist()
prompts = [
    system + torch.randint(0, 128, (int(n),), generator=g).tolist()
    for n in torch.randint(4, 24, (8,), generator=g)
]
served = {}
for kind in ("hash", "radix", "hicache"):
    e = Engine(
        model,
        page_size=4,
        num_tokens=160,
        max_running=4,
        max_context=96,
        chunk_size=32,
        attention="torch",
        prefix_cache=kind,
    )
    served[kind] = e.generate(prompts, 8 if FAST else 16)
    e.check_books()
    print(
        f"{kind:8} prompt tokens read from the cache: {e.stats['cached_tokens']:4}, retracted: {e.stats['retracted']}"
    )
assert served["hash"] == served["radix"] == served["hicache"]

# %% [markdown]
# ## Radix tree or block hashes?
#
# Chapter 06's vLLM prefix cache ([`KVCacheManager`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_manager.py), [`BlockPool`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/block_pool.py)) and SGLang's radix
# tree ([`RadixCache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py)) solve the same problem differently:
#
# | | SGLang: radix tree | vLLM: block hashes |
# |---|---|---|
# | what is shared | any common prefix of tokens (with pages: of whole pages; [`RadixCache.match_prefix`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py)) | whole blocks, by a chained hash of the prefix up to each ([`BlockPool.cache_full_blocks`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/block_pool.py)) |
# | a lookup | walk the tree, compare tokens; the match may split a node ([`RadixCache.match_prefix`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py)) | one hash per block, stop at the first miss ([`KVCacheManager.get_computed_blocks`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_manager.py)) |
# | duplicates | a finished request's duplicate slots are freed at insert ([`RadixCache.checkpoint`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py)) | two requests that computed a block both keep it; block tables stay append-only ([`BlockPool.cache_full_blocks`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/block_pool.py)) |
# | when a prefix becomes hittable | after the request's step (insert, [`RadixCache.insert`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py)) | as soon as its blocks are allocated in a step ([`KVCacheManager.allocate_slots`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/kv_cache_manager.py)) |
# | eviction | whole unlocked leaves (a node is the unit), LRU by access time ([`RadixCache.evict`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py)) | block by block from the free queue's head (LRU; a request's tail first; [`BlockPool.get_new_blocks`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/block_pool.py)) |
# | below the GPU | HiCache: host (and storage) tiers under the same tree ([`HiCacheController`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/cache_controller.py)) | a separate KV connector / offloading layer ([`KVConnectorBase_V1`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/distributed/kv_transfer/kv_connector/v1/base.py)) |
#
# `memlab.capstone.prefix_compare` replays one stream of multi-turn conversations through both, one
# request after another, at a few cache sizes (tokens of KV the device pool holds), and counts
# the **hit rate** (prompt tokens whose KV was reused, over all prompt tokens; a request never
# hits its last prompt token, which is computed for its logits) and the **evictions** (tokens of
# cached KV dropped to make room). The stream (`shared_prefix_conversations`, seed 0): 120
# conversations of 4 turns, each opening with one of 4 system prompts of 384 tokens; a turn adds
# a user message and an answer of 24 to 160 random tokens each, and its prompt is the whole
# conversation so far plus the new message; the turns of different conversations arrive
# interleaved in a random order. memlab's hashed blocks (chapter 06) and the radix tree's pages hold 16 tokens; the
# radix tree also runs with pages of 1 token, and with a HiCache host tier of 32,768 tokens (its
# "evicted" tokens were demoted to the host, not lost). In fast mode the cell below replays a
# shorter stream (30 conversations of 3 turns, 90 requests) at two sizes without the host tier:
# fewer conversations compete for the cache, so its hit rates are higher than the table after it.

# %%
from memlab.capstone.prefix_compare import compare, shared_prefix_conversations

stream = shared_prefix_conversations(30, 3) if FAST else shared_prefix_conversations()
sizes = (2048, 8192) if FAST else (2048, 4096, 8192, 16384)
cmp = compare(stream, sizes, page_size=16, host_tokens=0 if FAST else 32768)
print(cmp.table())
viz.show(cmp.plot())

# %% [markdown]
# Measured with `python bench/bench_prefix_cache.py` on the full stream (480 requests, 364,088
# prompt tokens; a cache that never evicts would hit 87.2 %), hit rate / tokens evicted:
#
# | cache (tokens) | 2,048 | 4,096 | 8,192 | 16,384 |
# |---|---|---|---|---|
# | block hashes (chapter 06's), blocks of 16 | 31.3 % / 288,880 | 45.8 % / 234,096 | 57.3 % / 187,968 | 65.4 % / 150,128 |
# | radix, pages of 16 | 26.5 % / 306,560 | 44.7 % / 238,080 | 57.1 % / 189,264 | 65.2 % / 151,536 |
# | radix, pages of 1 | 26.4 % / 310,555 | 44.7 % / 241,529 | 57.2 % / 192,399 | 65.5 % / 154,178 |
# | radix, pages of 16 + host tier of 32,768 | 75.3 % / 295,888 | 75.3 % / 237,200 | 75.3 % / 188,720 | 75.3 % / 151,152 |
# | radix: share of its evicted tokens it was not asked to evict, pages of 16 / of 1 | 42.7 % / 43.6 % | 40.8 % / 42.0 % | 46.2 % / 47.5 % | 45.6 % / 45.0 % |
#
# On this stream the two caches hit almost the same once the cache holds a few conversations:
# both share the system prompts and each conversation's history (requests run one at a time here,
# so the block hashes' earlier sharing within a step does not show). At the smallest cache the
# radix tree hits less and evicts more: it evicts whole leaves (a conversation's whole last turn)
# where the block pool frees exactly the blocks it needs, tail first. Between 41 % and 48 % of the tokens the radix
# tree evicts are more than its `evict` calls asked for (the last row): a leaf goes whole even
# when fewer of its tokens were needed. Freed early, they delay
# the next eviction, which is why the totals stay close once the cache is larger. Pages of 1 token
# change the hit rate by 0.3 points at most here: their only extra hits are the partial last pages of each
# turn, and they cost as many evictions. A host tier 2 to 16 times the device pool turns most
# evictions into demotions: the hit rate no longer depends on the device pool at all, only on what
# the host can hold.
#
# **Against the real engine.** `./course engines` runs `tests/engines/sglang/test_radix_cache.py`: it
# loads SGLang 0.5.23's own [`RadixCache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py) from its
# published wheel and drives it and memlab's tree with the same random streams of insert, match,
# lock, unlock and evict (page sizes 1 and 4). After every step both must agree: the same matched
# lengths and slots, the same evicted slots in the same order, the same sizes and the same tree.
#
# ## Where memlab differs from SGLang
#
# memlab's radix tree is SGLang's [`RadixCache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py), method by method (the calling convention
# aside, see above; `tests/engines/sglang/test_radix_cache.py`). Its host tier keeps HiCache's
# names and order of operations, but SGLang 0.5.23 builds HiCache on a larger structure: the
# scheduler's tree is a [`UnifiedRadixCache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/unified_radix_cache.py) over a
# [`UnifiedTreeCore`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/unified_cache/unified_tree_core.py), and
# [`UnifiedRadixCache.init_hicache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/unified_radix_cache.py) gives it a [`HiCacheController`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/cache_controller.py) that moves the KV.
#
# | | what differs, in plain words | SGLang 0.5.23's names |
# |---|---|---|
# | the tree | memlab has one tree class, plus a subclass with a host tier. SGLang's server runs a more general tree that can also keep sliding-window and Mamba state on each node, with its core written in Rust; SGLang also keeps a simple reference tree, the one memlab mirrors and the engine tests compare with memlab's. | [`RadixCache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py); [`UnifiedRadixCache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/unified_radix_cache.py), built by [`create_unified_radix_cache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/registry.py), components FULL / SWA / MAMBA; the Rust `TreeCore`, Python as the fallback |
# | keys | memlab's keys are plain lists of token ids. SGLang's keys also carry a namespace (the LoRA adapter, a per-user salt), so requests that must not share KV never match, and a special view for speculative decoding. | [`RadixKey`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py)`(token_ids, extra_key, is_bigram, limit, cache_salt)`; the bigram view is EAGLE's |
# | LRU order | Both evict the least recently used leaf first. memlab orders by a counter; SGLang's classic tree by clock timestamps, and its unified tree keeps nodes in linked lists sorted by use. SGLang can also be told to evict in other orders. | [`TreeNode`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py)`.last_access_time = time.monotonic()` and a heap in [`RadixCache.evict`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/radix_cache.py); [`UnifiedLRUList`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/unified_cache/unified_tree_core.py); `--radix-eviction-policy` ([`Memory`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/arg_groups/fields/memory.py)) `lru` (default), `lfu`, `slru`, `priority`, `tlru` |
# | transfers | memlab copies KV between GPU and host at once and waits for the copy. SGLang queues copies and runs them in the background on their own GPU streams; it keeps a node locked until its copy is done, lets layer 0's attention start before later layers have arrived, and makes all tensor-parallel GPUs agree on which copies are done. | [`HiCacheController`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/cache_controller.py) with CUDA events ([`HiCacheAck`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/cache_controller.py)), one event per layer on a load ([`LayerDoneCounter`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/cache_controller.py)), an all-reduce across ranks |
# | the copy | memlab copies pages with a Triton kernel plus one bulk copy through a staging buffer, so it also runs without a GPU. SGLang's default copy kernels read and write host memory directly, and its host memory can be laid out in several ways. | `--hicache-io-backend kernel` (default) or `direct`; `--hicache-mem-layout` `page_first` (default), `layer_first`, `page_first_direct`, ... (both in [`Memory`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/arg_groups/fields/memory.py)) |
# | pools | memlab backs up only the KV pool. SGLang backs up every kind of state a device pool declares (KV, sliding-window KV, Mamba state, indexer keys) and moves them together. | [`KVCache.host_pool_decls`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py); [`HybridCacheController`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/hybrid_cache/hybrid_cache_controller.py) |
# | host size | memlab takes the host pool's size in tokens. SGLang makes it twice the device pool by default (smaller when the machine is short of host memory), or takes a size in GB. | `--hicache-ratio` (2.0 in cache mode), `--hicache-size` (GB), `--hicache-host-memory-fraction` (0.8), in [`Memory`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/arg_groups/fields/memory.py) |
# | below the host | memlab stops at host memory. SGLang can add a third tier, a disk or a remote store, where pages are saved under a hash of all the tokens before them and fetched ahead of time while a request waits. | `--hicache-storage-backend` (`file`, `mooncake`, `hf3fs`, `nixl`, ...); `--hicache-storage-prefetch-policy` ([`Memory`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/arg_groups/fields/memory.py)) |
#
# What stays the same: the three write policies (`write_through`, `write_through_selective`,
# `write_back`), device pages taken *before* a load copies into them, slot ids translated to
# buffer rows before every copy (the device pool's `host_transfer_translate`, set only by pools
# with virtual ids; SGLang's allocators carry the same idea as
# [`BaseTokenToKVPoolAllocator.translate_kv_indices_for_transfer`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/base.py)
# for PD-disaggregation transfers, which memlab leaves out), and the rule that a
# node on the host never hangs below a node that is only on the device.
#
# ## Exercise: `exercises/ch11_radix_match.py`
#
# Write `split_node`, `match_prefix` and `evict` for a small radix tree (12 points). The file
# gives the tree: `TreeNode` (a key of token ids, a Python list of slots, a lock count, an access
# time), `RadixTree` with its LRU clock (`tree.tick()`), `child_key` (a child is found by its first
# token, or its first page as a tuple), `key_match` (tokens shared, in whole pages), `add_child`,
# `lock`/`unlock` and `evictable_leaves()`. `evict` gives slots back through the `free` function
# it receives, as `RadixCache.evict` does through the allocator. The reference is
# `memlab/sglang/radix_cache.py` (`_match_prefix_helper`, `_split_node`, `evict`); the graded tests also
# try pages of 2, an eviction that fits exactly, leaves with the same access time, and parents
# that are locked or still have children. The cell runs yours on the split of the section above.

# %%
with exercise("ch11_radix_match") as ex:
    t = ex.RadixTree()
    leaf = t.add_child(t.root, (1, 2, 3, 4, 5), range(100, 105))
    n, node = ex.match_prefix(t, [1, 2, 3, 9])
    print("matched", n, "ending on", node)
    assert n == 3 and node.key == (1, 2, 3) and node.children == {4: leaf}, (
        "the match must split (1 2 3 4 5) after 3"
    )
    freed = []
    assert ex.evict(t, 1, freed.append) == 2 and freed == [[103, 104]], (
        "evict frees the leaf (4 5) whole"
    )

# %% [markdown]
# ## Grade

# %%
from memlab.grade import main as grade

grade(["11"])
