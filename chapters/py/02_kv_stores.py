# %% [markdown]
# # 02 · KV stores: MHA, MLA, fp8 storage, layer ranges
#
# [Open in Colab](https://colab.research.google.com/github/memlab-course/memlab/blob/v0.1.0/chapters/02_kv_stores.ipynb)
#
# The third mapping: a physical slot -> bytes. A [KV pool](glossary.md#kv-pool) is a list of big
# tensors, one (or two) per layer; [slot](glossary.md#slot) `s` is row `s` of each. This chapter
# measures those rows for real models, the [bytes per token](glossary.md#bytes-per-token).
#
# **After this chapter you can**
# - compute the KV bytes of one token for an MHA/GQA model and for an MLA model, and check them
#   against real tensors' `nbytes`;
# - explain why fp8 KV is stored as `uint8` and viewed back as fp8;
# - size DeepSeek-V3.2's sparse-attention pool (the latent plus the indexer's keys) and a K-only pool;
# - build a pool that holds only a pipeline stage's layers and index it by model layer id;
# - write `mha_bytes_per_token` and `mla_bytes_per_token` (exercise `ch02_bytes_per_token`).

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
from memlab.course.notebook import exercise, start; FAST = start("02", REF, drive=DRIVE)
# fmt: on

# %% [markdown]
# ## See it: bytes per token for real models
#
# Pick a model, a KV dtype, a tensor-parallel size and a context length. Left: KV bytes per token
# over all layers for each model in `memlab.common.models` (numbers from their published `config.json`).
# Right: one token's row in one layer, drawn to the same scale for every model.

# %% [markdown]
# ![KV bytes per token for six real models](img/02_kv_bytes.png)

# %%
import ipywidgets as W

from memlab.common.models import MODELS
from memlab.course import viz
from memlab.course.viz.draw_models import draw_kv_bytes, kv_text

controls = dict(
    model=W.Dropdown(options=list(MODELS), value="Llama-3.1-8B"),
    dtype_bytes=W.Dropdown(
        options=[("bf16 / fp16", 2), ("fp8", 1)], value=2, description="KV dtype"
    ),
    tp_size=W.Dropdown(options=[1, 2, 4, 8], value=1, description="TP size"),
    context=W.IntSlider(
        value=32768,
        min=1024,
        max=131072,
        step=1024,
        description="context",
        continuous_update=False,
    ),
)
viz.Explorer(controls, draw_kv_bytes, text=kv_text, columns=2)

# %% [markdown]
# ## MHA: K and V
#
# With multi-head attention (and its grouped-query variant, GQA), every layer stores a key and a
# value per KV head. With $L$ layers, $H$ KV heads of width $d$ (and $d_v$ for V) and $b$ bytes a
# value:
#
# $$\text{bytes per token} = L \cdot H \cdot (d + d_v) \cdot b \;=\; 2 L H d b \quad (d_v = d)$$
#
# `MHATokenToKVPool` keeps a K and a V tensor per layer, each of shape `(size + page_size, H, d)`:
# the first page is padding (the [padding slot](glossary.md#padding-slot), chapter 00). Let us build a small one and count its real bytes.

# %%
import torch

from memlab.sglang.kv_pool import (
    MHATokenToKVPool,
    MLATokenToKVPool,
    mha_bytes_per_token,
    mla_bytes_per_token,
)

mha = MHATokenToKVPool(
    size=64, page_size=16, dtype=torch.bfloat16, head_num=8, head_dim=128, layer_num=4
)
k = mha.get_key_buffer(0)
print("k_buffer[0]:", tuple(k.shape), k.dtype, f"{k[0].nbytes} bytes a row")
print(
    "formula:",
    mha_bytes_per_token(4, 8, 128),
    " pool.bytes_per_token:",
    mha.bytes_per_token,
)
print(
    "all tensors:", mha.kv_size_bytes(), "=", mha.bytes_per_token, "x", 64 + 16, "rows"
)
assert mha.kv_size_bytes() == mha.bytes_per_token * (64 + 16)

# %% [markdown]
# ## MLA: one latent row
#
# DeepSeek's multi-head latent attention stores one compressed vector per token and layer, shared
# by all heads: `kv_lora_rank` values ($r$) plus a small rotary part ($d_r$). There is no V tensor:
# the values are a view of the latent's first $r$ columns.
#
# $$\text{bytes per token} = L \cdot (r + d_r) \cdot b$$
#
# For DeepSeek-V3 ($r = 512$, $d_r = 64$, 61 layers) that is 70,272 bytes in bf16: about half of
# Llama-3.1-8B's, for a model 80 times larger.

# %%
mla = MLATokenToKVPool(
    size=64,
    page_size=16,
    dtype=torch.bfloat16,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    layer_num=2,
)
kv0, v0 = mla.get_key_buffer(0), mla.get_value_buffer(0)
print(
    "kv_buffer[0]:",
    tuple(kv0.shape),
    "  V view:",
    tuple(v0.shape),
    " shares memory:",
    v0.data_ptr() == kv0.data_ptr(),
)
print("formula:", mla_bytes_per_token(2, 512, 64), " pool:", mla.bytes_per_token)
print("DeepSeek-V3:", MODELS["DeepSeek-V3"].kv_bytes_per_token(), "bytes per token")

# %% [markdown]
# ## Two more shapes: DeepSeek's sparse-attention pool, the K-only pool
#
# DeepSeek-V3.2 keeps V3's latent and adds **DeepSeek sparse attention**: a small "lightning
# indexer" scores every cached token for each query and the attention reads only the top 2,048.
# To score, the indexer keeps a key of its own per token and layer: 128 values in fp8 plus one
# fp32 scale per 128 values, 132 bytes whatever the latent's dtype. SGLang's [`DSATokenToKVPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)
# is an MLA pool with one more per-layer buffer, `index_k_with_scale_buffer`, page-major: a row
# per page, all the page's fp8 keys first, then their scales. `MHATokenToKOnlyPool` is the other
# new shape: K without V, for MiniMax's sparse layers whose index branch never reads V (one head
# of 128 per layer, half an MHA pool of that shape).

# %%
from memlab.sglang.kv_pool import (
    DSATokenToKVPool,
    MHATokenToKOnlyPool,
    dsa_index_bytes_per_token,
)

dsa = DSATokenToKVPool(
    size=128,
    page_size=64,
    dtype=torch.bfloat16,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    layer_num=2,
)
idx = dsa.get_index_k_with_scale_buffer(0)
print(
    "kv_buffer[0]:",
    tuple(dsa.kv_buffer[0].shape),
    " index_k_with_scale_buffer[0]:",
    tuple(idx.shape),
    idx.dtype,
    f"= {idx.shape[1] // 64} bytes a token",
)
print(
    "formula:",
    mla_bytes_per_token(2, 512, 64),
    "+",
    dsa_index_bytes_per_token(2),
    "=",
    dsa.bytes_per_token,
)
v32 = MODELS["DeepSeek-V3.2"]
print(
    f"DeepSeek-V3.2: {v32.kv_bytes_per_token():,} bytes per token (bf16 latent), {v32.kv_bytes_per_token(dtype_bytes=1):,}"
    f" (fp8 latent); the indexer adds {dsa_index_bytes_per_token(61):,} to V3's {MODELS['DeepSeek-V3'].kv_bytes_per_token():,}"
)
k_only = MHATokenToKOnlyPool(
    size=64, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=128, layer_num=1
)
print(
    "K-only:",
    tuple(k_only.k_buffer[0].shape),
    f"{k_only.bytes_per_token} bytes per token per layer (no V buffer)",
)

# %% [markdown]
# | pool (SGLang 0.5.23) | one token, one layer | bytes | on a real config |
# |---|---|---|---|
# | [`MHATokenToKVPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py) | K and V of every KV head | $2 H d b$ | Llama-3.1-8B: 4,096 (bf16), 131,072 over 32 layers |
# | [`MLATokenToKVPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py) | one latent, $r + d_r$ | $(r + d_r) b$ | DeepSeek-V3: 1,152 (bf16), 70,272 over 61 layers |
# | [`DSATokenToKVPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py) | the latent + the indexer's key (128 fp8 + one fp32 scale) | $(r + d_r) b + 132$ | DeepSeek-V3.2: 1,284 (bf16), **78,324** over 61 layers; fp8 latent 708, 43,188 |
# | [`MHATokenToKOnlyPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py) | K of one head, no V | $H d b$ | a MiniMax sparse index layer: 1 head of 128, 256 (bf16) |
#
# With an fp8 KV cache, SGLang's default CUDA backends for DeepSeek store the latent in a *scaled*
# layout rather than as 576 raw bytes: 512 fp8 values, four fp32 scales (one per 128) and the
# rotary part kept in bf16, 512 + 16 + 128 = 656 bytes
# ([`calculate_mla_kv_cache_dim`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/kv_cache_configurator.py)), so
# DeepSeek-V3.2 takes 61 x (656 + 132) = 48,068 bytes a token there. memlab's pools store fp8
# as raw bytes (the 43,188 above). The indexer has its own constraints on a GPU too: 64-token
# physical pages, and layers that reuse the previous top-k keep no indexer keys.

# %% [markdown]
# ## fp8 storage
#
# An fp8 KV cache halves the bytes again. PyTorch cannot scatter into an fp8 tensor
# (`buffer[loc] = x` has no fp8 kernel), so the pool **stores** `uint8` and **views** the bytes as
# fp8 when a layer reads them: `store_dtype` vs `dtype`. Writes go through the same view, after an
# optional division by a scale.

# %%
fp8 = MHATokenToKVPool(
    size=8, page_size=1, dtype=torch.float8_e4m3fn, head_num=1, head_dim=4, layer_num=1
)
print(
    "dtype",
    fp8.dtype,
    "| store_dtype",
    fp8.store_dtype,
    "| bytes per token",
    fp8.bytes_per_token,
)
x = torch.tensor([[[0.5, -1.0, 2.0, 3.0]]])
fp8.set_kv_buffer(0, torch.tensor([3]), x, x, k_scale=2.0)
print("stored bytes :", fp8.k_buffer[0][3].tolist())
print("read as fp8  :", fp8.get_key_buffer(0)[3].float().tolist(), "(x / k_scale)")

# %% [markdown]
# ## Layer ranges
#
# With pipeline parallelism each GPU runs a range of layers and keeps KV only for those (its
# [layer range](glossary.md#layer-range)). A pool holds layers `start_layer..end_layer` and is
# indexed by the model's layer id, which it turns into `layer_id - start_layer`. memlab refuses a
# layer outside the range. SGLang does not check
# ([`MHATokenToKVPool.get_key_buffer`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)): a layer id below `start_layer` becomes a
# negative list index and quietly reads another of the pool's layers (only an index far out of
# range raises `IndexError`).

# %%
stage = MHATokenToKVPool(
    size=16,
    page_size=1,
    dtype=torch.float16,
    head_num=2,
    head_dim=8,
    layer_num=4,
    start_layer=4,
    end_layer=7,
)
print(
    "layers",
    stage.start_layer,
    "..",
    stage.end_layer,
    "; tensors:",
    len(stage.k_buffer),
)
print(
    "layer 5 is local tensor",
    5 - stage.start_layer,
    "->",
    tuple(stage.get_key_buffer(5).shape),
)
try:
    stage.get_key_buffer(2)
except IndexError as exc:
    print("IndexError:", exc)

# %% [markdown]
# ## What the engines do differently
#
# SGLang allocates one tensor per layer (`k_buffer[layer]`, [`MHATokenToKVPool`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)), rows indexed
# by slot. vLLM 0.33
# describes its cache with one **logical** shape, `[layer, block, head, token, content]` (`[L, B, H,
# N, C]` in [`KVCacheLayout`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/kv_cache_layout.py)), where the content axis holds a token's K *and* V side by
# side. A layer sees the 4-D view `[num_blocks, num_kv_heads, block_size, 2 * head_size]`, and the
# FlashAttention backend splits it into K and V at every step (`kv_cache.transpose(1, 2).split(...)`
# in [`FlashAttentionImpl.forward`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/attention/backends/flash_attn.py)).
# Where the five axes sit in memory is a separate choice, a `KVCacheLayout`: the axes listed
# outermost first. FlashAttention states no preference, so vLLM takes the first of its default list
# ([`get_supported_kv_cache_layouts`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/attention/backends/utils.py)),
# `LBNHC`: inside a block the tokens follow one another, each with all its heads' K|V. A
# slot is `(block, offset)` rather than a flat row; the bytes per token are the same formula.
# `memlab.vllm.kv_layout` builds the same views (`tests/engines/vllm/test_kv_layout.py`, run by
# `./course engines`, checks its strides against vLLM's own code):

# %%
from memlab.vllm.kv_layout import allocate_kv_cache, layout_strides, split_kv

layer0 = allocate_kv_cache(
    num_layers=4,
    num_blocks=6,
    num_kv_heads=8,
    block_size=16,
    head_size=128,
    dtype=torch.bfloat16,
)[0]
k_view, v_view = split_kv(layer0, 128)
print("layer view [B, H, N, C]:", tuple(layer0.shape), "strides", layer0.stride())
print(
    "K view     [B, N, H, d]:",
    tuple(k_view.shape),
    "strides",
    k_view.stride(),
    "(heads 2 * d apart: K|V interleave)",
)
print(
    "strides in [L, B, H, N, C] order, LBNHC:",
    layout_strides((4, 6, 8, 16, 256), "LBNHC"),
    " LBHNC:",
    layout_strides((4, 6, 8, 16, 256), "LBHNC"),
)
print("bytes per token:", 4 * 8 * 256 * 2, "=", mha_bytes_per_token(4, 8, 128))

# %% [markdown]
# Hybrid models (Gemma-3's sliding layers, Qwen3-Next's linear layers) are chapter 07.
#
# ### Where memlab differs from the engines
#
# | | the engine (SGLang 0.5.23 / vLLM 0.33) | memlab |
# |---|---|---|
# | SGLang's K and V tensors | one allocation per layer when $d_v = d$, `(2, rows, H, d)`, K and V its two halves (rows padded to whole pages), so a paged kernel reaches V from one base; a page-major `hnd` layout on request ([`MHATokenToKVPool._create_buffers`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)) | two separate tensors per layer, `(size + page_size, H, d)`: the same rows and bytes, no shared base |
# | SGLang's write | a fused [`store_cache`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/kernels/ops/kvcache/kvcache.py) kernel on CUDA; when that kernel is not available, plain indexed writes, with K and V on two streams while a CUDA graph is being captured ([`MHATokenToKVPool.set_kv_buffer`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)) | `k_buffer[layer][loc] = k`, SGLang's fallback path |
# | a layer outside the pool's range | no check: `k_buffer[layer_id - start_layer]` ([`MHATokenToKVPool.get_key_buffer`](https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/mem_cache/memory_pool.py)), so a layer below the range reads another local layer | refused (`IndexError`) with a message naming the layer and the range |
# | vLLM's cache | one buffer, logical `[L, B, H, N, C]`, physical order from [`KVCacheLayout`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/kv_cache_layout.py); written by [`reshape_and_cache_flash`](https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/_custom_ops.py) (CUDA C++) through the split K and V views | `memlab.vllm.kv_layout` builds the same views; chapter 06 writes into them with memlab's Triton `store_kv` |
#
# ## Exercise: `exercises/ch02_bytes_per_token.py`
#
# Write `mha_bytes_per_token` and `mla_bytes_per_token` (7 points), bad arguments included. The
# cell below checks yours against `memlab.sglang.kv_pool` for every model of the table.

# %%
with exercise("ch02_bytes_per_token") as ex:
    for name, m in MODELS.items():
        if m.attention == "mla":
            mine, ref = (
                ex.mla_bytes_per_token(
                    m.num_hidden_layers, m.kv_lora_rank, m.qk_rope_head_dim
                ),
                mla_bytes_per_token(
                    m.num_hidden_layers, m.kv_lora_rank, m.qk_rope_head_dim
                ),
            )
        else:
            mine, ref = (
                ex.mha_bytes_per_token(
                    m.num_hidden_layers, m.num_key_value_heads, m.head_dim
                ),
                mha_bytes_per_token(
                    m.num_hidden_layers, m.num_key_value_heads, m.head_dim
                ),
            )
        print(f"{name:<22} yours {mine:>9,}  memlab {ref:>9,}")
        assert mine == ref

# %% [markdown]
# ## Grade

# %%
from memlab.grade import main as grade

grade(["02"])
