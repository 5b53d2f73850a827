"""vLLM 0.33's KV cache layout: logical [L, B, H, N, C], physical order per layout, K|V split."""

import pytest
import torch

from memlab.vllm.block_table import store_kv
from memlab.vllm.kv_layout import (
    DEFAULT_LAYOUT,
    KV_CACHE_LAYOUTS,
    allocate_kv_cache,
    layout_strides,
    split_kv,
    stride_order,
)

L, B, H, N, D = 2, 5, 3, 4, 8


def test_default_layout_is_token_major_inside_a_block():
    assert DEFAULT_LAYOUT == "LBNHC" and stride_order("LBNHC") == (0, 1, 3, 2, 4)
    layer = allocate_kv_cache(L, B, H, N, D)[0]
    assert layer.shape == (B, H, N, 2 * D)
    # content innermost, then head, then token, then block: [B, N, H, C] in memory
    assert layer.stride() == (N * H * 2 * D, 2 * D, H * 2 * D, 1)


@pytest.mark.parametrize("layout", KV_CACHE_LAYOUTS)
def test_every_layout_is_a_dense_permutation(layout):
    shape = (L, B, H, N, 2 * D)
    strides = layout_strides(shape, layout)
    order = stride_order(layout)
    assert strides[order[-1]] == 1 and sorted(order) == [0, 1, 2, 3, 4]
    # each axis further out steps over all the axes inside it
    for outer, inner in zip(order, order[1:]):
        assert strides[outer] == strides[inner] * shape[inner]
    layers = allocate_kv_cache(L, B, H, N, D, layout=layout)
    for l_idx, layer in enumerate(layers):
        layer[...] = l_idx + 1
    assert torch.equal(
        torch.stack(layers).sum(),
        torch.tensor(3.0 * B * H * N * 2 * D, dtype=torch.float16),
    )


def test_split_kv_views_the_halves_of_each_token_and_store_kv_writes_through_them():
    layer = allocate_kv_cache(1, B, H, N, D, head_size_v=6, dtype=torch.float32)[0]
    k_cache, v_cache = split_kv(layer, D)
    assert k_cache.shape == (B, N, H, D) and v_cache.shape == (B, N, H, 6)
    # heads interleave K|V
    assert k_cache.data_ptr() == layer.data_ptr() and k_cache.stride(2) == D + 6
    key, value = torch.randn(3, H, D), torch.randn(3, H, 6)
    slots = torch.tensor([9, -1, 0])
    for backend in ("torch", "python"):
        layer.zero_()
        store_kv(key, value, k_cache, v_cache, slots, backend=backend)
        # logical [B, H, N, C]: K first
        assert torch.equal(layer[9 // N, :, 9 % N, :D], key[0])
        assert torch.equal(layer[9 // N, :, 9 % N, D:], value[0])
        assert torch.equal(layer[0, :, 0, :D], key[2]) and int(
            (layer != 0).sum()
        ) == 2 * H * (D + 6)


@pytest.mark.kernel
def test_store_kv_kernel_writes_through_the_split_views():
    from memlab.common.env import kernel_device

    dev = kernel_device()
    layer = allocate_kv_cache(1, B, H, N, D, dtype=torch.float32, device=dev)[0]
    k_cache, v_cache = split_kv(layer, D)
    key, value = torch.randn(4, H, D, device=dev), torch.randn(4, H, D, device=dev)
    slots = torch.tensor([5, 19, -1, 2], device=dev)
    store_kv(key, value, k_cache, v_cache, slots, backend="triton")
    want = torch.zeros_like(layer)
    w_k, w_v = split_kv(want, D)
    store_kv(key, value, w_k, w_v, slots, backend="python")
    assert torch.equal(layer, want)


def test_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="unknown KV cache layout 'NHD'"):
        stride_order("NHD")
