"""store_kv: write each token's K and V into a paged cache at its slot (what vLLM's
reshape_and_cache_flash does; vLLM's is a CUDA C++ op, memlab's a Triton kernel). Caches are
(num_blocks, block_size, heads, head_dim) views, any strides with head_dim contiguous: plain
tensors, or the K and V halves FlashAttention splits off vLLM 0.33's per-layer cache (there a
token's heads sit 2 * head_dim apart, K and V interleaved per head; see memlab.vllm.kv_layout).
Slot s lands in block s // block_size, row s % block_size. Slot -1 (padding) is skipped.

One program per token copies its heads * head_dim values. References:
memlab.vllm.block_table.store_kv_torch / store_kv_python.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    k_stride_tok,
    k_stride_head,
    v_stride_tok,
    v_stride_head,
    kc_stride_blk,
    kc_stride_slot,
    kc_stride_head,
    vc_stride_blk,
    vc_stride_slot,
    vc_stride_head,
    num_slots,
    block_size,
    head_dim,
    head_dim_v,
    k_elems,
    v_elems,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    blk = slot // block_size
    off = slot % block_size

    # Padding (slot < 0) writes nothing. A slot past the cache is refused on the host only when
    # slot_mapping is on the CPU (checking a GPU tensor would sync), so the mask drops it here
    # too: no slot can write past the cache. The slot is broadcast to a vector first: the
    # interpreter rejects a scalar-and-vector mask.
    k_offs = tl.arange(0, BLOCK_K)
    k_head, k_col = k_offs // head_dim, k_offs % head_dim
    k_slot = tl.zeros([BLOCK_K], dtype=tl.int64) + slot
    k_mask = (k_offs < k_elems) & (k_slot >= 0) & (k_slot < num_slots)
    k = tl.load(
        key_ptr + tok * k_stride_tok + k_head * k_stride_head + k_col, mask=k_mask
    )
    tl.store(
        key_cache_ptr
        + blk * kc_stride_blk
        + off * kc_stride_slot
        + k_head * kc_stride_head
        + k_col,
        k,
        mask=k_mask,
    )

    v_offs = tl.arange(0, BLOCK_V)
    v_head, v_col = v_offs // head_dim_v, v_offs % head_dim_v
    v_slot = tl.zeros([BLOCK_V], dtype=tl.int64) + slot
    v_mask = (v_offs < v_elems) & (v_slot >= 0) & (v_slot < num_slots)
    v = tl.load(
        value_ptr + tok * v_stride_tok + v_head * v_stride_head + v_col, mask=v_mask
    )
    tl.store(
        value_cache_ptr
        + blk * vc_stride_blk
        + off * vc_stride_slot
        + v_head * vc_stride_head
        + v_col,
        v,
        mask=v_mask,
    )


def _head_dim_contiguous(t: torch.Tensor, name: str) -> None:
    if t.stride(-1) != 1:
        raise ValueError(
            f"{name} needs a contiguous head_dim (stride 1), got strides {tuple(t.stride())}"
        )


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key (T, H, D), value (T, H, Dv); caches (N, block_size, H, D) and (N, block_size, H, Dv)."""
    for t, name in (
        (key, "key"),
        (value, "value"),
        (key_cache, "key_cache"),
        (value_cache, "value_cache"),
    ):
        _head_dim_contiguous(t, name)
    num_tokens = slot_mapping.numel()
    if num_tokens == 0:
        return
    k_elems = key.shape[1] * key.shape[2]
    v_elems = value.shape[1] * value.shape[2]
    _store_kv_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        key_cache.shape[0] * key_cache.shape[1],
        key_cache.shape[1],
        key.shape[2],
        value.shape[2],
        k_elems,
        v_elems,
        BLOCK_K=triton.next_power_of_2(k_elems),
        BLOCK_V=triton.next_power_of_2(v_elems),
    )
