# %% [markdown]
# # 12 · The unified pool: one buffer, two ends, virtual ids
#
# [Open in Colab](https://colab.research.google.com/github/memlab-course/memlab/blob/v0.1.0/chapters/12_unified_pool.ipynb)
#
# Chapter 07 gave a sliding-window model two pools: full attention and sliding window, each sized
# once at start-up, with a map from every full-side slot to its SWA-side slot. SGLang 0.5.23's
# `--enable-unified-memory` puts both in **one byte buffer** ([`UnifiedKVPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/unified_memory_pool.py)): the full-attention sub-pool grows
# down from the top, the sliding-window sub-pool up from the bottom, and whatever lies between
# their frontiers is free for either. Above the allocator every id is **virtual**: the request
# table, the radix tree and the scheduler never see where a page physically sits. The allocator
# hands out virtual ids with the very `alloc_extend` / `alloc_decode` of chapters 04-05, binds each
# virtual page to a physical page on each side, and translates ids just before KV is written or
# read. The trade-off, in one sentence: chapter 07's full-to-SWA map is no longer needed (one
# virtual id names a token's slot on both sides), and in exchange the allocator must manage both
# pools' byte budgets at once.
#
# **After this chapter you can**
# - lay out sub-pools in one byte buffer (bytes per entry, grow direction, the padding floor) and
#   find the byte a physical slot starts at;
# - follow virtual pages from chapter 04-05's kernels to the physical pages they are bound to,
#   through the `v2p` / `p2v` page tables, and translate a batch's write locations;
# - count capacity in bytes: one token of a hybrid model costs a full entry *and* an SWA entry,
#   and a token out of the window only the full one;
# - say why a free compacts pages and why nothing above the allocator notices;
# - explain the `physical` mark: the unified pool's write door refuses a location not marked
#   physical, which chapter 07's two-pool layout never needs;
# - name the capacity questions a scheduler asks any allocator, and read a composite's answers;
# - say what longest-prefix-first scheduling buys over first come first served, and what it costs;
# - write the translation, the byte-counted capacity and the compaction of one sub-pool (exercise
#   `ch12_virtual_pages`).

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
from memlab.course.notebook import exercise, start; FAST = start("12", REF, drive=DRIVE)
# fmt: on

# %% [markdown]
# ## See it
#
# A 3,072-byte buffer for a tiny hybrid model: one full-attention layer (K and V of 16 fp16
# values: 64 bytes a slot) and two sliding-window layers (64 bytes a slot too), pages of 2 slots.
# Top: the buffer itself. The dark grey band at the bottom is the **padding floor** (every
# sub-pool's slot 0 lies there: padded tokens write into it); SWA pages (hatched) grow up from it, full pages grow down from the top, each in its request's colour and labelled with its
# physical page number; between the two frontiers lies the gap. Middle: the request table, one
# cell per virtual page with the virtual token ids it holds (pale: its SWA page already went,
# out of the window). Bottom: each side's page table, virtual page over physical page. A black
# edge marks what the step bound or moved. Press **next**.
#
# ![A finishes: B's pages move into A's old ones; B's virtual ids stay](img/12_unified.png)

# %%
from memlab.course import viz
from memlab.course.viz.unified_books import draw_unified, unified_story

story = unified_story(page_size=2, window=4)
viz.Stepper({"page size 2": story.frames}, draw_unified, interval_ms=2500)

# %% [markdown]
# ### Your own requests in one buffer
#
# The instrument below starts where the story ends: C took all that fit, and the 128-byte gap
# holds one page, not the full-and-SWA pair a token needs, so `alloc_extend` is refused. Free a request and watch
# the pages left in the band move into the freed ones (black edges) while the request table's
# virtual ids stay; then `alloc_extend` a new request (or a chunk more), `alloc_decode` a step,
# or let a window go with `free_swa`. Each call is shown as the engine spells it, with the books
# read from the real allocator: the joint `available_size()`, each side's room alone, the gap,
# and each request's virtual pages with the full and SWA pages they map to. Hover a page to read
# its side, its bytes and the virtual page it holds.

# %%
from memlab.course.viz.unified_books import unified_instrument

inst = unified_instrument(page_size=2, window=4)
inst

# %% [markdown]
# ## One buffer, two ends
#
# `memlab/sglang/unified/pool.py` follows SGLang's [`UnifiedKVPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/unified_memory_pool.py). A sub-pool is a
# `SubPoolSpec`: a name, its layers, and the end it grows from. Its **entry** is one slot holding
# every one of its layers, token-major (`[K_0 | V_0 | K_1 | V_1 | ...]`, rounded up to 32 bytes),
# and every sub-pool sees the *whole* buffer as an array of its own entries: physical slot `t` of
# sub-pool X starts at byte `t * entry_bytes(X)`. The sub-pools overlap as address spaces; only
# their allocators keep the pages in use apart. The lowest bytes are the padding floor
# (`reserved_floor` bytes), where every sub-pool's slot 0 lies (padded tokens write there), so each
# sub-pool's first usable slot, `min_slot_index`, starts past it.

# %%
import torch

from memlab.sglang.unified import MHASubPoolSpec, UnifiedKVPool

full_spec = MHASubPoolSpec(
    name="full",
    layer_num=1,
    head_num=1,
    head_dim=16,
    store_dtype=torch.float16,
    grow_direction="down",
)
swa_spec = MHASubPoolSpec(
    name="swa",
    layer_num=2,
    head_num=1,
    head_dim=8,
    store_dtype=torch.float16,
    grow_direction="up",
)
pool = UnifiedKVPool(
    total_bytes=3072, sub_pool_specs=[full_spec, swa_spec], page_size=2
)
for s in pool.sub_pool_specs:
    print(
        f"{s.name:4} grows {s.grow_direction:4}: {s.entry_bytes()} B an entry, max_slots {pool.max_slots(s.name)}, "
        f"first usable slot {pool.min_slot_index(s.name)}"
    )
print("reserved floor:", pool.reserved_floor, "bytes (page 0 of each paged sub-pool)")
k, v = pool.mha_views_for("swa")
print(
    "swa layer 1's K view:",
    tuple(k[1].shape),
    "slot stride",
    k[1].stride(0) * 2,
    "bytes; slot 5 starts at byte",
    k[1][5].data_ptr() - pool._raw.data_ptr(),
    "= 5 x 64 + layer 1's offset 32",
)

# %% [markdown]
# ## Virtual ids and their translation
#
# `memlab/sglang/unified/sub_pool.py` follows SGLang's [`MultiEndedAllocator`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/unified_sub_pool.py). A
# `MultiEndedAllocator` **is** chapter 04-05's paged allocator: `alloc_extend` and `alloc_decode`
# run the same code path and the same Triton kernels, on a free list of **virtual** pages
# (`free_virtual_ids`). The kernel computes `page * page_size + offset` and cannot tell what a
# page id stands for. Each virtual page it takes is then bound to a physical page at this
# sub-pool's growing end, in two page tables: `virtual_to_physical` (v2p) and
# `physical_to_virtual` (p2v). A kernel that touches KV reads the translation:
#
# $$\text{physical}(t) = \text{v2p}[t \,/\!/\, ps] \cdot ps + t \bmod ps$$
#
# and an id that is unbound, negative or past the table goes to 0, a slot of the padding floor.
#
# [`UnifiedSWATokenToKVPoolAllocator`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/unified_hybrid_swa.py) puts a full side (grows down, **owns** the virtual ids)
# and an SWA side (grows up, owns none) over one buffer. Every virtual page the full side hands out
# is bound on both sides, so one virtual id names a full slot and an SWA slot: the SWA side's v2p
# table does the job of chapter 07's `full_to_swa_index_mapping` (it maps the same id to the SWA
# slot), so no separate full-to-SWA map is kept. Here are two requests through the chapter 04 kernel (`backend="triton"`):

# %%
from memlab.common.env import kernel_device
from memlab.sglang.unified import UnifiedSWAKVPool, UnifiedSWATokenToKVPoolAllocator

# where the Triton kernels run: the GPU (the interpreter: the CPU)
dev = kernel_device()
# the pool above, there
kpool = UnifiedKVPool(
    total_bytes=3072, sub_pool_specs=[full_spec, swa_spec], page_size=2, device=dev
)
kv = UnifiedSWAKVPool(
    unified_buffer=kpool,
    full_attention_layer_ids=[1],
    swa_attention_layer_ids=[0, 2],
    page_size=2,
)
alloc = UnifiedSWATokenToKVPoolAllocator(
    unified_buffer=kpool,
    kvcache=kv,
    device=dev,
    page_size=2,
    debug_mode=True,
    backend="triton",
)
T = lambda *xs: torch.tensor(xs, dtype=torch.int64, device=dev)  # noqa: E731
C = lambda *xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731 (the host copies)
free_before = alloc.full_attn_allocator.free_virtual_ids[:6].tolist()
# two new requests, 5 and 4 tokens
a = alloc.alloc_extend(T(0, 0), C(0, 0), T(5, 4), C(5, 4), T(-1, -1), 9)
print("free virtual pages before:", free_before, "-> virtual ids:", a.tolist())
fa, sa = alloc.full_attn_allocator, alloc.swa_attn_allocator
print(
    "full v2p:",
    {v: int(fa.virtual_to_physical[v]) for v in range(1, 6)},
    " swa v2p:",
    {v: int(sa.virtual_to_physical[v]) for v in range(1, 6)},
)
print("full slots:", alloc.translate_kv_loc(a).tolist())
print("swa slots: ", alloc.translate_loc_from_full_to_swa(a).tolist())
# one decode step each (chapter 05's kernel)
d = alloc.alloc_decode(T(6, 5), C(6, 5), T(a[4], a[8]))
print(
    "decode:",
    d.tolist(),
    "; unbound, negative and out-of-range ids go to the sink:",
    alloc.translate_kv_loc(T(40, -1, 10_000)).tolist(),
)

# %% [markdown]
# The first request's pages are 1, 2 and 3 (ids 2-6), the second's 4 and 5 (ids 8-11): the
# chapter 04 kernel, page by page from the head of the free list. The full side bound them to
# its top pages, the SWA side to its bottom pages, both in ascending order. (At page size 1, where a
# page is a token, SGLang's scheduler calls `alloc(n)` instead: [`alloc_for_extend`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocation.py).)
#
# ## Capacity in bytes
#
# Each side can take as many pages as fit in the gap between its frontier and the other side's,
# and no more than its own page ids allow:
# `available_size() = min(gap_bytes // entry_bytes_per_page, num_pages - min_page_index - pages in use) * page_size`
# (the second term is the room left in the side's own index space; SGLang:
# [`MultiEndedAllocator._available_tokens`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/unified_sub_pool.py)). A token of the composite needs a page on
# **both** sides, so a page of tokens costs one full page and one SWA page of the shared gap,
# $e_\text{full} + e_\text{swa}$ bytes (each side's `entry_bytes_per_page`): the composite's
# `available_size()` is `gap_bytes // (e_full + e_swa)` pages times `page_size` tokens (capped by
# both sides' page ids; [`UnifiedSWATokenToKVPoolAllocator._compute_available_size`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/unified_hybrid_swa.py)). A token
# that has left the sliding window keeps its full slot and gives its SWA bytes back (`free_swa`: its
# SWA v2p entry becomes -1 and the SWA page goes back, while its virtual id and full page stay), so
# a long request costs ever less than a short one per token. The split
# between the two sides floats with the load; it is never fixed.

# %%
gap = fa._current_gap_bytes()
print(
    f"gap {gap} B: full side alone {fa.available_size()} tokens, SWA side alone {sa.available_size()}, "
    f"both (a page pair of {fa.entry_bytes_per_page + sa.entry_bytes_per_page} B) {alloc.available_size()}"
)
alloc.free_swa(a[:4])  # the first request's first two pages leave its window
print(
    "after free_swa of ids",
    a[:4].tolist(),
    ": swa slots",
    alloc.translate_loc_from_full_to_swa(a[:4]).tolist(),
    "(the sink), full slots",
    alloc.translate_kv_loc(a[:4]).tolist(),
    "(kept)",
)
print(f"gap {fa._current_gap_bytes()} B: both {alloc.available_size()} tokens")
big = alloc.available_size() + 2
print(
    f"alloc({big}):",
    alloc.alloc(big),
    f"- the full side alone has room for {fa.available_size()} tokens, but "
    "every new token also needs an SWA page",
)

# %% [markdown]
# ## A free compacts at once
#
# memlab compacts **eagerly**, as SGLang does when `SGLANG_DISABLE_LAZY_COMPACTION=1` is set
# ([`SGLANG_DISABLE_LAZY_COMPACTION`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/environ.py); SGLang's default is lazy, below). When pages
# are freed, the frontier retreats by that many pages; the pages still in use in the band of pages
# the frontier just gave up move into the freed ones further in (sources and holes both in
# ascending order). The
# pages in use always form one dense run at each end, so the gap stays one band. A move copies
# the page's bytes and rewrites v2p and p2v; the virtual ids, hence the request table, the radix
# tree and the scheduler's books, stay exactly as they were. Below: the second request's KV is
# written (through the write door, next section), the first request is freed, its pages are
# filled with the second's, and the second's KV reads back intact through the new translation.

# %%
second = torch.cat((a[5:], d[1:]))
full_pool = kv.full_kv_pool
kv_in = torch.randn(len(second), 1, 16).half().to(dev)
kv.set_kv_buffer(1, alloc.write_loc(second), kv_in, -kv_in)
before = {
    "full slots": alloc.translate_kv_loc(second).tolist(),
    "virtual ids": second.tolist(),
}
alloc.free(torch.cat((a[:5], d[:1])))  # the first request finishes
after = {
    "full slots": alloc.translate_kv_loc(second).tolist(),
    "virtual ids": second.tolist(),
}
for key in before:
    print(f"{key:12}: {before[key]} -> {after[key]}")
assert torch.equal(full_pool.get_key_buffer(0)[alloc.translate_kv_loc(second)], kv_in)
print(
    "the second request's K and V moved with their pages: read back through the new translation, intact"
)
alloc.check_books()

# %% [markdown]
# SGLang's default is **lazy** compaction ([`_should_enable_lazy_compaction`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/kv_cache_configurator.py)): a free only
# marks the pages as holes (a hole inside the run is still taken first by the next allocation on
# that side), and pages move on demand. An **urgent** flush compacts both sides whenever an
# allocation is short ([`_relieve_for_alloc`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/unified_sub_pool.py), [`UnifiedSWAAllocatorBase.ensure_capacity`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/unified_hybrid_swa.py)).
# A bounded, **opportunistic** one runs whenever the scheduler is idle ([`Scheduler.on_idle`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/scheduler.py))
# and, when the overlap scheduler is off for a batch, at the sync point between two batches
# ([`Scheduler.event_loop_overlap`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/scheduler.py)); a move must wait for the forward pass still reading
# the pages (CUDA events).
# Lazy mode copies fewer pages and never stalls a free, at the price of that machinery. Both
# accept and refuse exactly the same requests: lazy counts its own holes as room, and the flush
# turns the neighbour's holes into gap before it answers. `./course engines` checks it
# (`tests/engines/sglang/test_unified.py`): it runs
# SGLang's lazy allocator beside memlab's eager one and compares every accept and refusal, and
# its `schedulable_available_size()` (room after the neighbour's flush) with memlab's
# `available_size()`.
#
# ## The physical mark
#
# Above the allocator the ids are virtual, and a unified pool's write door cannot tell a virtual
# id from a physical one: it never translates. So SGLang's unified KV pools
# ([`UnifiedMHATokenToKVPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/unified_memory_pool.py), [`UnifiedMLATokenToKVPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/unified_memory_pool.py)) set
# `requires_physical_write_loc = True` and their `set_kv_buffer` refuses anything but a `KVWriteLoc`
# marked physical ([`KVCache._check_physical_write_loc`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)). The per-batch plan translates the batch's `out_cache_loc` once
# and binds it to the batch (`KVWriteLoc.for_batch` reads `out_cache_loc_is_physical`); ids
# translated some other way must say so: `KVWriteLoc(loc, physical=True)`. memlab's
# `alloc.write_loc(out_cache_loc)` is that plan in one call: the translated full-side ids and
# SWA-side ids, marked physical. Chapter 07's two-pool layout holds physical ids by allocation,
# so it takes a plain location and needs no mark.

# %%
from memlab.sglang.swa import SWAKVPool
from memlab.sglang.write_loc import KVWriteLoc

ids = alloc.alloc(2)
x = torch.ones(2, 1, 16, device=dev).half()
for what, loc in (
    ("the virtual ids", ids),
    ("translated but unmarked", KVWriteLoc(alloc.translate_kv_loc(ids))),
):
    try:
        full_pool.set_kv_buffer(0, loc, x, x)
    except ValueError as exc:
        print(f"{what}: refused ({str(exc).split(';')[0]})")
full_pool.set_kv_buffer(0, KVWriteLoc(alloc.translate_kv_loc(ids), physical=True), x, x)
# an SWA layer: its swa_loc, the same mark
kv.set_kv_buffer(0, alloc.write_loc(ids), x[:, :, :8], x[:, :, :8])
print(
    "marked physical: written; requires_physical_write_loc: unified",
    kv.requires_physical_write_loc,
    "| chapter 07's SWAKVPool",
    SWAKVPool.requires_physical_write_loc,
)

# %% [markdown]
# ## The trade-off, measured
#
# What the shared buffer buys: the split between the two sides is no longer fixed. Below, the
# same byte budget serves a model with one full-attention layer and five sliding-window layers
# (a Gemma-like 5:1; 64 and 320 bytes a slot), window 8, page size 1. Chapter 07's two pools are
# sized the way SGLang sizes them (`--swa-full-tokens-ratio 0.8`, [`HybridSWAPoolConfigurator`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/model_executor/pool_configurator.py): 0.8 SWA slots per full slot,
# chapter 08); the unified buffer has the same bytes. Requests of one prompt length arrive until
# one is refused, and after every third arrival the oldest request finishes; each keeps only its
# last 8 tokens on the SWA side. The table counts the requests admitted before the first refusal,
# and the page copies the unified side made on the way (the price of eager compaction: a free
# that leaves pages in use inside the band it gives up moves them).

# %%
from memlab.sglang.swa import SWATokenToKVPoolAllocator


class CountMoves:  # a KV pool stand-in that only counts the allocator's page moves
    def __init__(self):
        self.full_kv_pool = self.swa_kv_pool = self
        self.moves = 0

    def move_physical_pages(self, tgt, src, page_size):
        self.moves += len(src)


def serve(al, prompt, window=8):
    """Requests of ``prompt`` tokens arrive until one is refused; after every third the oldest
    finishes. Returns how many were admitted."""
    held, admitted = [], 0
    while (ids := al.alloc(prompt)) is not None:
        held.append(ids)
        admitted += 1
        al.free_swa(ids[: prompt - window])  # out of the window
        if admitted % 3 == 0:
            al.free(held.pop(0))
    return admitted


budget, e_full, e_swa = 64 * 1024, 64, 320
specs = [
    MHASubPoolSpec(
        name="full",
        layer_num=1,
        head_num=1,
        head_dim=16,
        store_dtype=torch.float16,
        grow_direction="down",
    ),
    MHASubPoolSpec(
        name="swa",
        layer_num=5,
        head_num=1,
        head_dim=16,
        store_dtype=torch.float16,
        grow_direction="up",
    ),
]
full_tokens = int(budget / (e_full + 0.8 * e_swa))
print(
    f"{budget:,} B: two pools of {full_tokens} full and {int(0.8 * full_tokens)} SWA slots, or one buffer"
)
print(f"{'prompt':>7} {'two pools':>10} {'unified':>8} {'page copies':>12}")
for prompt in (8, 32, 96):
    two = SWATokenToKVPoolAllocator(full_tokens, int(0.8 * full_tokens), 1)
    moves = CountMoves()
    one = UnifiedSWATokenToKVPoolAllocator(
        unified_buffer=UnifiedKVPool(total_bytes=budget, sub_pool_specs=specs),
        kvcache=moves,
    )
    print(
        f"{prompt:>7} {serve(two, prompt):>10} {serve(one, prompt):>8} {moves.moves:>12}"
    )

# %% [markdown]
# With short prompts (all in the window) both layouts are bounded by bytes, and the unified
# buffer wins a little: two fixed pools strand whatever the other side does not need. With long
# prompts most of a request's tokens are out of the window; the two pools then fill up on the full
# side while the SWA pool sits nearly empty, and the unified buffer gives those bytes to the full
# side. The price is on the right: every free compacts, copying pages. And the allocator now
# answers the scheduler's capacity questions in bytes for both sides at once.
#
# **Against the real engine.** `./course engines` runs `tests/engines/sglang/test_unified.py`: it
# loads 0.5.23's `UnifiedKVPool`, `MultiEndedAllocator`, `UnifiedSWATokenToKVPoolAllocator` and
# the `virtual_slot` functions (their torch paths off CUDA) from the published wheel, drives
# them and memlab's with the same random streams (two END allocators with a KV or a Mamba-state
# lower end at page sizes 1, 2, 3 and 4; the SWA composite with `alloc`, `free_swa`, `free_full`
# and `free` at page sizes 1 to 4, and with the paged kernels at 2, 4 and 16), and compares after
# every step the virtual ids and refusals, both page tables, the watermarks, the free virtual ids
# in order, every page move, both sides' capacities and every translation. What it cannot compare
# on a CPU: a lazy flush while a forward pass is in flight (it waits on a CUDA event), the write
# door of SGLang's own unified KV pools (they subclass the CUDA-heavy `MHATokenToKVPool`, so the
# test hands the allocators stand-ins and compares the ids that reach the door), the per-batch
# translation plan (`KVLocPlan` and `KVIndexTranslator` import attention kernels; memlab's
# `write_loc` is compared through the translations it is made of), and the Triton `virtual_slot`
# kernels (off CUDA SGLang takes their torch paths).

# %% [markdown]
# ## The scheduler's side
#
# Who reads these byte budgets? SGLang's scheduler ([`PrefillAdder`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_policy.py)): the base allocator
# ([`BaseTokenToKVPoolAllocator`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/base.py)) defines the questions, and its
# hooks carry no type branches: a single pool answers for itself, a composite (two pools, or one
# buffer with two ends) for all its sides at once. The scheduler is not wholly type-blind, though:
# [`PrefillAdder`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_policy.py) checks with `isinstance` whether it holds an SWA allocator (to budget the
# SWA side) or a unified Mamba allocator (to charge each new state slot):
#
# | question | what the scheduler does with the answer |
# |---|---|
# | `available_size()` | slots a request could get now (a composite: what every side can give) |
# | `request_slot_reserve(has_req_pool_slot=, prefill_tokens=)` | slots a request needs beyond its KV (a Mamba request's state; none for a KV pool) |
# | `max_new_tokens_for_memory(input, max_new, ...)` | clips a request's `max_new_tokens` to what an empty pool could hold after its prompt; None: abort, the prompt alone never fits |
# | `prealloc_ceiling_fits(full, swa)` | could a demand this size ever fit? None: no ceiling of its own, the token count is the bound |
# | `prealloc_fits(tree_cache, full, swa, full_budget_tokens=...)` | does it fit this step's budget, evictable cache included? |
# | `evict_to_free_tokens(tree_cache, n)` | evict from the prefix cache until `n` slots can be handed out (a composite: on both sides) |
#
# Below, the same loop asks four of this course's allocators the same questions: chapter 03's
# token pool, chapter 04's paged pool (page 4), chapter 07's two pools (256 full, 128 SWA slots)
# and this chapter's buffer (24,576 bytes; a token costs 64 bytes on each side). The request
# asks for 400 new tokens after a 100-token prompt, window 8; the ceiling question asks for 300
# full and 16 SWA slots.

# %%
from memlab.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

two_sides = [
    MHASubPoolSpec(
        name="full",
        layer_num=1,
        head_num=1,
        head_dim=16,
        store_dtype=torch.float16,
        grow_direction="down",
    ),
    MHASubPoolSpec(
        name="swa",
        layer_num=1,
        head_num=1,
        head_dim=16,
        store_dtype=torch.float16,
        grow_direction="up",
    ),
]
allocators = {
    "token (ch03)": TokenToKVPoolAllocator(256),
    "paged, page 4 (ch04)": PagedTokenToKVPoolAllocator(256, 4),
    "two pools (ch07)": SWATokenToKVPoolAllocator(256, 128, 1),
    "unified (ch12)": UnifiedSWATokenToKVPoolAllocator(
        unified_buffer=UnifiedKVPool(total_bytes=384 * 64, sub_pool_specs=two_sides),
        kvcache=None,
    ),
}
print(
    f"{'':22}{'available':>10}{'reserve':>8}{'max_new':>8}{'ceiling':>8}{'reclaim?':>9}"
)
for name, a in allocators.items():  # the same questions, whatever the allocator
    max_new = a.max_new_tokens_for_memory(
        100,
        400,
        token_capacity=getattr(a, "size_full", a.size),
        sliding_window_size=8,
        chunk_size=None,
    )
    print(
        f"{name:22}{a.available_size():>10}{a.request_slot_reserve(has_req_pool_slot=False):>8}{max_new!s:>8}"
        f"{a.prealloc_ceiling_fits(300, 16)!s:>8}{a.prealloc_fits_assumes_reclaim()!s:>9}"
    )

# %% [markdown]
# Read the columns. The token and paged pools clip the request to what is left after the prompt,
# one page and one slot kept spare (154, and 151 once the prompt is rounded up to whole pages).
# The two pools can hand out only as much as their smaller side holds (128 SWA slots), yet clip
# like one pool of 256: out-of-window tokens leave the SWA side. (The loop passes the full side's
# `size_full`, 256, where there are two sides: the number SGLang's scheduler passes there, its
# `max_total_num_tokens`
# ([`Scheduler`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/scheduler.py)).
# `size` itself is `min(full, swa)`, 128, as in SGLang's
# [`SWATokenToKVPoolAllocator.size`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/swa.py).)
# The unified buffer answers in
# bytes: 191 tokens fit now (the padding floor takes a slot), 181 new tokens fit after the prompt
# with a window's worth on the SWA side, and it is the only one with a ceiling of its own (300
# full and 16 SWA slots fit the empty buffer's bytes) and the only one whose `prealloc_fits`
# assumes the evictable pages are reclaimed first, so admitting on its answer still owes
# `evict_to_free_tokens`. memlab's engine (chapter 10) asks only these questions
# (`Engine._can_ever_fit`, `Engine._fits`), which is why it serves a hybrid model through chapter
# 07's two pools or through this buffer with the same scheduler. One difference: SGLang clips
# `max_new_tokens` to the answer ([`BaseTokenToKVPoolAllocator.max_new_tokens_for_memory`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/base.py)); memlab refuses a request it would have to clip, so an output never
# depends on the pool's size.
#
# ### Cache-aware scheduling: the longest prefix first
#
# The scheduler also decides who goes first. With `--schedule-policy lpm` (0.5.23's default is
# `fcfs`), [`SchedulePolicy.calc_priority`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_policy.py) matches every waiting request against the prefix cache
# and sorts the queue by the length of its cached prefix, longest first. Two refinements: a
# request whose cached prefix is short (at most 32 tokens) but that shares at least 32 tokens with
# an earlier waiting one goes last this round (in-batch prefix caching: let the first compute the
# shared part, then the second finds it cached), and past 128 waiting requests the matching costs
# too much and the queue stays first come first served. memlab's engine takes
# `schedule_policy="lpm"` with the same thresholds.
#
# Below: 16 requests from 4 "system prompts" of 64 tokens (8 tokens of their own each), arriving
# interleaved, A B C D A B C D ..., two running at a time, a pool of 160 slots: room for the
# prefixes of two families, not four. First come first served evicts each system prompt before
# its family comes back; longest prefix first serves a family while its prompt is cached.

# %%
import random

from memlab.capstone.engine import Engine, TinyConfig, TinyLlama

tiny = TinyLlama(TinyConfig())
rng = random.Random(0)
system_prompts = [[rng.randrange(1, 128) for _ in range(64)] for _ in range(4)]
prompts = [
    system_prompts[i % 4] + [rng.randrange(1, 128) for _ in range(8)] for i in range(16)
]
served = {}
for policy in ("fcfs", "lpm"):
    e = Engine(
        tiny,
        page_size=1,
        num_tokens=160,
        max_running=2,
        max_context=128,
        chunk_size=64,
        attention="torch",
        prefix_cache="radix",
        ignore_eos=True,
        schedule_policy=policy,
    )
    reqs = [e.add_request(p, 4) for p in prompts]
    while e.step():
        pass
    served[policy] = e
    print(
        f"{policy}: cached {e.stats['cached_tokens']:>4} of {e.stats['prompt_tokens']} prompt tokens, "
        f"prefill computed {e.stats['prefill_tokens']:>4}\n      finishing order {[r.rid for r in e.finished]}"
    )
print(
    "same output for every request:",
    [r.output for r in sorted(served["fcfs"].finished, key=lambda r: r.rid)]
    == [r.output for r in sorted(served["lpm"].finished, key=lambda r: r.rid)],
)

# %% [markdown]
# First come first served finds nothing cached (0 of 1,152 prompt tokens) and prefills every
# token; longest prefix first finds 769 and prefills 383, with the same outputs.
# The order is the price: request 1 arrived second and finishes fifth, while the rest of the
# first family is served. On a real trace the gain is smaller, because requests share less. `python
# bench/bench_schedule.py` serves 96 requests of the Mooncake conversation trace (each 512-token
# block of the trace scaled to 2 token ids, 4 new tokens each, a radix cache of 768 slots, 8
# running) both ways; measured on this course's CPU machine:
#
# | | first come first served | longest prefix first |
# |---|---:|---:|
# | prefix hit rate | 4.8 % | 5.2 % |
# | cached prompt tokens | 195 | 213 |
# | tokens computed (prefill + decode) | 4,159 | 4,141 |
# | mean displacement in the finishing order | 0.0 | 13.5 places |
# | outputs | the same | the same |
#
# Eighteen fewer tokens computed for a finishing order that moved each request 13.5 places on
# average: a policy worth it where many requests share long prefixes (agents, few-shot prompts,
# a shared system prompt) and the queue is long enough to reorder.
#
# ## Where memlab differs from SGLang
#
# | | memlab | SGLang 0.5.23 |
# |---|---|---|
# | compaction | eager: every free moves the pages in the band it gives up | lazy by default: holes, an urgent flush when the other side is short, an opportunistic one when idle, CUDA events guarding pages a forward may still read; eager with `SGLANG_DISABLE_LAZY_COMPACTION=1` ([`MultiEndedAllocator`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/unified_sub_pool.py)). The same accept and refuse decisions |
# | sub-pools | two ends: full + SWA (the allocators also take a Mamba-state end) | also the three-pool layout Mamba + SWA + full, the SWA side a "float" between the ends, with `make_room` and leapfrog moves; the Mamba composite [`UnifiedMambaTokenToKVPoolAllocator`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/unified_mamba.py) and its slot allocator |
# | the write path | `alloc.write_loc(out_cache_loc)`: translate once, mark physical | [`KVIndexTranslator`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/kv_index_translator.py) and a per-batch [`KVLocPlan`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/kv_loc_plan.py) that rebinds `out_cache_loc` to physical ids and keeps the virtual ones in `out_cache_loc_virtual`; read-side translation tables for attention |
# | views | MHA sub-pools; MLA and Mamba specs give their entry bytes | views for MLA and Mamba state too; a fused speculative-draft region inside each entry ([`UnifiedKVPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/unified_memory_pool.py)) |
# | capacity | recomputed at each call | memoised on an epoch the capacity fields bump; [`MultiEndedAllocator.schedulable_available_size`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/unified_sub_pool.py) credits the neighbour's lazy holes; `can_reserve` / `reclaim_plan` price evictions in bytes for the scheduler |
# | scheduling | `fcfs` and `lpm` (in-batch prefix caching and the 128-request fallback included); a request whose `max_new_tokens` would need clipping is refused | also `dfs-weight`, `hrrn`, `shortest-prefill-first`, `lof`, `random`, `routing-key` and priority scheduling; `max_new_tokens` is clipped to `max_new_tokens_for_memory`; [`SchedulePolicy`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/managers/schedule_policy.py); the in-batch check matches against a simulated radix tree of waiting prefixes (memlab compares prefixes pairwise: the same answer, in O(n²)) |
# | the rest | none of it | decode context parallelism ([`UnifiedSWAAllocatorBase.translate_write_loc`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/unified_hybrid_swa.py) drops ids another rank owns), move gates for PD disaggregation and HiCache, post-capture virtual-memory backing of the buffer, NaN poisoning in debug runs |
#
# SGLang refuses the flag, with a `ValueError` at start-up ("fail loud", not a silent fall-back to
# the usual pools), for a model that is neither hybrid sliding-window nor hybrid Mamba, and for
# DeepSeek-V4 even though it is hybrid ([`KVCacheConfigurator._init_pools`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/kv_cache_configurator.py)): a plain model
# has nothing to share a buffer with.
#
# ## Exercise: `exercises/ch12_virtual_pages.py`
#
# Write one sub-pool's books (10 points): `translate` (virtual token ids to physical ones through
# a v2p table, slot 0 for the unbound and the out-of-range), `available_tokens` (the capacity of
# an END sub-pool, SGLang's name ([`MultiEndedAllocator`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/allocator/unified_sub_pool.py)) for a sub-pool that grows from one end of the buffer, from its
# watermark and its neighbour's frontier, in bytes) and
# `compact_after_free` (the eager compaction after a free: the new watermark, the pages that move
# and where, both page tables rewritten). The references are `translate_token_ids`,
# `MultiEndedAllocator.available_size` and `MultiEndedAllocator._compact_pending` in
# `memlab/sglang/unified/sub_pool.py`; the graded tests also run random streams of that allocator
# at page sizes 1 to 6 and compare after every step. The cell below runs yours on this chapter's
# allocator.

# %%
with exercise("ch12_virtual_pages") as ex:
    live = torch.cat((second, ids))
    assert torch.equal(
        ex.translate(live, fa.virtual_to_physical, 2), fa.translate_kv_loc(live)
    ), "translate"
    for side, other in ((fa, sa), (sa, fa)):
        frontier = (
            other._byte_low_frontier()
            if side.grow_direction == "up"
            else other._byte_high_frontier()
        )
        mine = ex.available_tokens(
            side.grow_direction,
            side.watermark_physical,
            side.num_pages,
            side.min_page_index,
            side.entry_bytes_per_page,
            side.page_size,
            frontier,
        )
        print(f"{side.sub_pool_name}: yours {mine}, memlab {side.available_size()}")
        assert mine == side.available_size()
    v2p, p2v = fa.virtual_to_physical.clone(), fa.physical_to_virtual.clone()
    pages = sorted({t // 2 for t in ids.tolist()})
    freed = v2p[pages].tolist()
    v2p[pages] = -1
    print(
        "compact_after_free:",
        ex.compact_after_free("down", fa.watermark_physical, freed, v2p, p2v),
    )
    alloc.free(ids)
    assert torch.equal(v2p, fa.virtual_to_physical) and torch.equal(
        p2v, fa.physical_to_virtual
    ), "compact_after_free"
    print("translate, available_tokens and compact_after_free agree with memlab's")

# %% [markdown]
# ## Grade

# %%
from memlab.grade import main as grade

grade(["12"])
