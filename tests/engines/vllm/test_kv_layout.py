"""memlab.vllm.kv_layout against vLLM 0.33's own layout code: the same logical shape
[L, B, H, N, C], the same stride permutation per KVCacheLayout, the same strides."""

from __future__ import annotations

import pytest
import torch

from memlab.vllm.kv_layout import KV_CACHE_LAYOUTS, layout_strides, stride_order
from memlab_tests.tools.engines.vllm_loader import load


def test_layout_names_and_permutations_match_vllm():
    V = load()
    assert {m.name for m in V.kv_cache_layout.KVCacheLayout} == set(KV_CACHE_LAYOUTS)
    for layout in V.kv_cache_layout.KVCacheLayout:
        assert stride_order(layout.name) == layout.stride_order


@pytest.mark.parametrize(
    "num_layers, num_blocks, heads, block_size, head_size",
    [(1, 3, 1, 1, 4), (3, 7, 4, 16, 64)],
)
def test_strides_match_vllm(num_layers, num_blocks, heads, block_size, head_size):
    """vLLM counts the content axis in bytes: element strides times the element size."""
    V = load()
    I = V.kv_cache_interface
    spec = I.FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=heads,
        head_size=head_size,
        dtype=torch.float16,
    )
    assert I.compute_layer_kv_cache_shape_bytes(spec, num_blocks) == (
        num_blocks,
        heads,
        block_size,
        2 * head_size * 2,
    )
    shape = (num_layers, num_blocks, heads, block_size, 2 * head_size)
    for layout in V.kv_cache_layout.KVCacheLayout:
        ours = layout_strides(shape, layout.name)
        theirs = I.compute_layout_strides(spec, num_blocks, num_layers, layout)
        assert tuple(s * 2 for s in ours[:4]) + (1,) == theirs, layout.name
