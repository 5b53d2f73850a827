# %% [markdown]
# # 09 · Writing and reading KV through the mappings
#
# [Open in Colab](https://colab.research.google.com/github/memlab-course/memlab/blob/v0.1.0/chapters/09_attention_through_pages.ipynb)
#
# Everything so far was bookkeeping. This chapter uses the books: a forward pass writes each new
# token's K and V at the slot the allocator gave it, and decode attention reads a request's KV
# back from wherever its pages landed. The answer must be exactly what attention over one
# contiguous tensor would give.
#
# **After this chapter you can**
# - write K and V through a write location, and say why a hybrid pool insists on physical ids;
# - run paged decode attention reading through `req_to_token` (as SGLang's
#   [`decode_attention_fwd`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/kernels/ops/attention/decode_attention.py) does) and through a block table
#   (as vLLM's [`unified_attention`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/attention/ops/triton_unified_attention.py) does), on the same pool, and check both against dense attention;
# - explain how the kernel walks a request's scattered slots block by block with an online softmax;
# - write the kernel's gather yourself (exercise `ch09_paged_gather`).

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
from memlab.course.notebook import exercise, start; FAST = start("09", REF, drive=DRIVE)
# fmt: on

# %% [markdown]
# ## See it
#
# The books of chapter 00 after its chunked prefill: A holds pages 1, 2 and 7, C pages 4 to 6,
# D pages 3 and 8. Every slot got random K and V. One decode query per request reads its
# request's KV a page at a time: each step shows the slots read (black edges) and, on the right,
# the attention weight every position ends up with. Pick the request with the dropdown.

# %% [markdown]
# ![Request A's query reading its third page](img/09_attention.png)

# %%
import torch

from memlab.course import viz
from memlab.course.viz.draw_attention import attention_frames, draw_attention, fill_kv

scene = viz.sglang_books.orientation(dtype=torch.float32, head_dim=16)
# the chunked prefill of chapter 00: A and D get scattered pages
scene.extend_batch({"A": 6, "D": 3})
fill_kv(scene)
rids = list(scene.reqs)
# 4 query heads, 2 KV heads
q = torch.randn(len(rids), 4, 16, generator=torch.Generator().manual_seed(1))
viz.Stepper(attention_frames(scene, q), draw_attention)

# %% [markdown]
# ### Your own request, layer and head
#
# The instrument below holds the same books and queries. Pick a request, a layer and a head and
# press `read`: it runs the Triton kernel `decode_attention_fwd` on the whole batch and shows,
# for the request and head you picked, the slots and pages its query reads (black edges), each
# position's weight (hover a bar: position, slot, page, weight), and the kernel's output next to
# dense attention over the same K and V copied out into a contiguous tensor. `finish` a request,
# `extend` another (its new slots get random K and V) and read again: the pages move, the output
# still agrees. The pool starts full, so an extend before a finish is refused, with nothing taken.

# %%
inst = viz.draw_attention.attention_instrument(request="A", layer=0, head=0)
inst

# %% [markdown]
# ## Writing: the write location
#
# The allocator's output for a batch, `out_cache_loc`, holds one slot per new token. Each layer's
# attention writes the token's K and V there: `set_kv_buffer(layer, loc, k, v)`. A pool with one
# id space takes the slots as they are. A hybrid sliding-window pool has two (full and
# sliding-window, chapter 07): its full layers write at `loc`, its SWA layers at the same tokens'
# SWA-side ids. Those are translated **once per batch**: SGLang's attention backend looks up the
# batch's SWA-side ids when it builds its metadata
# ([`KVIndexTranslator.write_ids`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/kv_index_translator.py)) and hands them with `loc`
# to the pool as one `KVWriteLoc` ([`KVWriteLoc.for_batch`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)`(forward_batch, swa_loc=...)`);
# the pool never translates. (memlab's allocator does the lookup in one call,
# `write_loc(out_cache_loc)`, below.) An SWA layer handed a bare tensor has no SWA ids and refuses
# it (SGLang asserts, [`SWAKVPool.set_kv_buffer`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/swa_memory_pool.py); memlab raises
# `ValueError` with a message).
#
# `KVWriteLoc` also carries a **physical** mark, which guards something else: SGLang's *unified*
# pools hand out **virtual** ids, which a per-batch plan maps to physical slots; their write doors
# ([`UnifiedMHATokenToKVPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/unified_memory_pool.py):
# `requires_physical_write_loc = True`, checked by [`KVCache._check_physical_write_loc`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py))
# refuse a location not marked physical, so an
# untranslated virtual id never lands in somebody else's rows. Every other pool, the SWA pool
# included, holds physical ids by allocation and needs no mark. Chapter 12 builds the unified
# pool and shows its door refusing an unmarked write.

# %%
from memlab.sglang.swa import SWAKVPool, SWATokenToKVPoolAllocator

pool = SWAKVPool(
    16,
    8,
    1,
    torch.float32,
    head_num=1,
    head_dim=4,
    full_attention_layer_ids=[0],
    swa_attention_layer_ids=[1],
)
al = SWATokenToKVPoolAllocator(16, 8, 1, kvcache=pool)
out_cache_loc = al.alloc(3)
kv_new = torch.ones(3, 1, 4)
# a full layer: the bare slots will do
pool.set_kv_buffer(0, out_cache_loc, kv_new, kv_new)
try:
    # an SWA layer: which SWA slots?
    pool.set_kv_buffer(1, out_cache_loc, kv_new, kv_new)
except ValueError as exc:
    print("SWA layer, bare tensor refused:", str(exc)[:100], "...")
loc = al.write_loc(out_cache_loc)
pool.set_kv_buffer(1, loc, kv_new, kv_new)
print(
    "KVWriteLoc: full ids",
    loc.loc.tolist(),
    "SWA ids",
    loc.swa_loc.tolist(),
    "physical",
    loc.physical,
    "(not needed: these ids are physical by allocation)",
)

# %% [markdown]
# ## Reading: one kernel, two spellings
#
# `kernels/paged_decode_attention.py` runs one program per (request, query head). It loops over the
# request's positions a block at a time, looks up each position's slot, loads those K rows, and
# keeps a running maximum and sum (an **online softmax**), so it never needs all scores at once:
#
# $$m' = \max(m, \max_j s_j), \quad \ell' = \ell\, e^{m - m'} + \sum_j e^{s_j - m'}, \quad
# o' = o\, e^{m - m'} + \sum_j e^{s_j - m'} v_j$$
#
# The slot lookup is the only place the engines differ: SGLang's [`decode_attention_fwd`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/kernels/ops/attention/decode_attention.py) reads the slot from
# `req_to_token[row, pos]` (through a per-batch index list, see the end of the chapter); vLLM's
# [`unified_attention`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/attention/ops/triton_unified_attention.py) reads `block_table[b, pos // B] * B + pos % B`. The pool is the same: a flat
# `(slots, heads, dim)` tensor is a free view as `(blocks, B, heads, dim)`.

# %%
from memlab.common import attention
from memlab.common.env import kernel_device

dev = kernel_device()
kv = scene.kvcache
k_buf, v_buf = kv.get_key_buffer(0).to(dev), kv.get_value_buffer(0).to(dev)
table = scene.req_pool.req_to_token.to(dev)
rows = torch.tensor([scene.reqs[r].kv.req_pool_idx for r in rids], device=dev)
seq_lens = torch.tensor([scene.reqs[r].kv.kv_allocated_len for r in rids], device=dev)
qd = q.to(dev)

sglang = attention.decode_attention_fwd(qd, k_buf, v_buf, table, rows, seq_lens)

P = scene.allocator.page_size
# the slot at each page start, divided by P: one id per page
block_table = (table[rows, ::P] // P).to(torch.int32)
vllm = attention.paged_attention(
    qd,
    k_buf.view(-1, P, *k_buf.shape[1:]),
    v_buf.view(-1, P, *v_buf.shape[1:]),
    block_table,
    seq_lens,
)
print("block table (vLLM spelling):", block_table.tolist())
print("SGLang spelling == vLLM spelling:", torch.allclose(sglang, vllm, atol=1e-5))

# %% [markdown]
# ## Equal to dense attention
#
# The reference answer ignores pages entirely: copy each request's K and V into one contiguous
# tensor, in position order, and run ordinary attention. The torch reference (gathered slots) and
# the plain-Python reference (loops) must agree too.

# %%
import math

dense = []
for b, rid in enumerate(rids):
    idx = torch.tensor(scene.slots(rid))
    # (L, 4 heads, 16): GQA groups of 2
    k_seq = kv.get_key_buffer(0)[idx].repeat_interleave(2, dim=1)
    v_seq = kv.get_value_buffer(0)[idx].repeat_interleave(2, dim=1)
    w = torch.softmax(torch.einsum("hd,lhd->hl", q[b], k_seq) / math.sqrt(16), dim=-1)
    dense.append(torch.einsum("hl,lhd->hd", w, v_seq))
dense = torch.stack(dense)
slots, mask = attention.slots_from_req_to_token(
    scene.req_pool.req_to_token, rows.cpu(), seq_lens.cpu()
)
ref = attention.attention_over_slots(
    q, kv.get_key_buffer(0), kv.get_value_buffer(0), slots, mask, 1 / math.sqrt(16)
)
py = attention.python_attention_over_slots(
    q,
    kv.get_key_buffer(0),
    kv.get_value_buffer(0),
    attention.python_slots_from_req_to_token(
        scene.req_pool.req_to_token, rows.cpu(), seq_lens.cpu()
    ),
    1 / math.sqrt(16),
)
for name, x in (
    ("kernel", sglang.cpu()),
    ("torch reference", ref),
    ("python reference", py),
):
    print(f"{name:<17} max |x - dense| = {(x - dense).abs().max().item():.2e}")
    assert torch.allclose(x, dense, atol=1e-4)

# %% [markdown]
# ## What the engines do differently
#
# SGLang's attention backends copy each request's slots out of `req_to_token` (row
# `req_pool_indices[b]`) into a per-batch index list once per step (`kv_indices`, with `kv_indptr`
# offsets: [`TritonAttnBackend.init_forward_metadata`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/layers/attention/triton_backend.py) with
# [`create_flashinfer_kv_indices_triton`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/kernels/ops/attention/kv_indices.py)), and the decode kernel
# ([`decode_attention_fwd`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/kernels/ops/attention/decode_attention.py)) reads a token's slot from that list: one load per token. (memlab's `decode_attention_fwd`
# reads `req_to_token` directly, the same lookup without the copy.) vLLM's kernels take the block
# table ([`unified_attention`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/attention/ops/triton_unified_attention.py)): one load per block, then arithmetic. With page size 1 the block table *is* a
# per-token table. MLA models read one latent buffer for both K and V: SGLang passes the same
# buffer to [`decode_attention_fwd`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/kernels/ops/attention/decode_attention.py) (its `has_mla` argument), with a view of its first `kv_lora_rank` columns as V.
# memlab spells that case as a function of its own, `mla_decode_attention_fwd`; the mappings are
# the same.
#
# ## Where memlab differs from the engine
#
# | | memlab | SGLang 0.5.23 | why |
# |---|---|---|---|
# | unified pools (virtual ids) | in chapter 12 (`memlab.sglang.unified`): its pools refuse a write loc not marked physical; the pools here keep `requires_physical_write_loc` off | the unified pools refuse a write loc not marked physical ([`KVCache._check_physical_write_loc`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)) | this chapter's pools hold physical ids |
# | decode attention | one Triton kernel, one program per (request, query head), an online softmax over blocks of positions | FlashInfer, FlashAttention or its own Triton kernels (split-K decode, [`decode_attention_fwd`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/kernels/ops/attention/decode_attention.py)) | the slot lookup is what the chapter is about |
# | KV writes | `buffer[loc] = k` per layer | fused store kernels, fp8 quantization, write checks in debug mode ([`MHATokenToKVPool.set_kv_buffer`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)) | same rows written |
#
# ## Exercise: `exercises/ch09_paged_gather.py`
#
# The kernel's gather: load the block's slots through `req_to_token` (row `req_pool_indices[b]`,
# not `b`) and the K and V tiles at those slots (7 points, +2 on a GPU). The cell runs yours on
# this chapter's pool.
#
# Cast the slot to int64 before you multiply it by a stride. `req_to_token` is int32, and so is
# `slot * stride_ks` unless one side is 64-bit: past 2^31 elements (a pool of about two million
# tokens at 8 KV heads x 128 dims) the product wraps to a negative offset and the kernel reads
# another token's KV, or faults. The grader checks your gather's source for this on a CPU and, on
# a GPU, runs a pool past 2^31 elements.

# %%
with exercise("ch09_paged_gather") as ex:
    mine = ex.decode_attention(qd, k_buf, v_buf, table, rows, seq_lens)
    assert torch.allclose(mine.cpu(), dense, atol=1e-4), (
        f"max difference {(mine.cpu() - dense).abs().max().item():.3g}"
    )
    print("your kernel equals dense attention")

# %% [markdown]
# ## Grade

# %%
from memlab.grade import main as grade

grade(["09"])
