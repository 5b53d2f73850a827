"""vLLM 0.33's KV cache layout (vllm/v1/kv_cache_layout.py): one logical shape, many memory orders.

vLLM describes every attention layer's cache with one LOGICAL shape,
``[layer, block, head, token, content]`` (``[L, B, H, N, C]`` in vllm/v1/kv_cache_layout.py),
where the content axis holds one token's K and V side by side (``head_size + head_size_v``
values). A layer sees the 4-D view ``[B, H, N, C]``, that is
``[num_blocks, num_kv_heads, block_size, 2 * head_size]``, and FlashAttention splits it into K
and V at every step: ``kv_cache.transpose(1, 2).split(head_size, dim=-1)`` gives two
``(num_blocks, block_size, num_kv_heads, head_size)`` views of the same memory.

Where the five axes sit in memory is a separate choice, a ``KVCacheLayout``: the axes listed
outermost first. FlashAttention states no preference, so vLLM takes the first of its default
list, ``LBNHC``: layer, then block, then token, then head, then content. Inside a block the
tokens follow one another, each with all its heads' K|V: a slot is ``(block, offset)``, and the
bytes per token are the same formula as SGLang's (chapter 02).
"""

from __future__ import annotations

import math

import torch

from memlab.common import _checks
from memlab.common.env import resolve_device

LOGICAL_AXES = ("layer", "block", "head", "token", "content")  # vLLM's [L, B, H, N, C]
# Each layout names the logical axes from outermost to innermost in memory.
# vLLM's default preference order
KV_CACHE_LAYOUTS = ("LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC", "LHBNC")
DEFAULT_LAYOUT = "LBNHC"


def stride_order(layout: str) -> tuple[int, ...]:
    """The layout as vLLM's ``KVCacheLayout`` value: logical axis indices, outermost first."""
    if layout not in KV_CACHE_LAYOUTS:
        raise ValueError(
            f"unknown KV cache layout {layout!r}; choose one of {KV_CACHE_LAYOUTS}"
        )
    return tuple("LBHNC".index(axis) for axis in layout)


def layout_strides(
    shape: tuple[int, ...], layout: str = DEFAULT_LAYOUT
) -> tuple[int, ...]:
    """Element strides, in logical ``[L, B, H, N, C]`` order, of a dense cache of logical
    ``shape`` stored in ``layout``'s order: the innermost axis has stride 1, each axis further
    out steps over everything inside it."""
    _validate_shape(shape)
    strides = [0] * 5
    step = 1
    for axis in reversed(stride_order(layout)):
        strides[axis] = step
        step *= shape[axis]
    return tuple(strides)


def allocate_kv_cache(
    num_layers: int,
    num_blocks: int,
    num_kv_heads: int,
    block_size: int,
    head_size: int,
    head_size_v: int | None = None,
    dtype: torch.dtype = torch.float16,
    layout: str = DEFAULT_LAYOUT,
    device: str | torch.device = "cpu",
) -> list[torch.Tensor]:
    """One buffer for all layers (zeros); per layer, the logical view
    ``[num_blocks, num_kv_heads, block_size, head_size + head_size_v]``."""
    head_size_v = head_size if head_size_v is None else head_size_v
    sizes = (num_layers, num_blocks, num_kv_heads, block_size, head_size, head_size_v)
    _validate_allocate(sizes, dtype)
    device = resolve_device(device)
    shape = (num_layers, num_blocks, num_kv_heads, block_size, head_size + head_size_v)
    raw = torch.zeros(math.prod(shape), dtype=dtype, device=device)
    return list(torch.as_strided(raw, shape, layout_strides(shape, layout)).unbind(0))


def split_kv(
    layer_cache: torch.Tensor, head_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention's K and V views of one layer's cache: ``(num_blocks, block_size,
    num_kv_heads, head_size)`` and the same with ``head_size_v``, sharing the layer's memory."""
    _checks.tensor("layer_cache", layer_cache, ndim=4)
    _checks.integer(
        "head_size (V keeps the rest)", head_size, 1, layer_cache.shape[-1] - 1
    )
    key_cache, value_cache = layer_cache.transpose(1, 2).split(
        [head_size, layer_cache.shape[-1] - head_size], dim=-1
    )
    return key_cache, value_cache


# -- argument checks at the boundary ------------------------------------------------------------


def _validate_shape(shape) -> None:
    _checks.instance("shape", shape, (tuple, list), "[L, B, H, N, C] sizes")
    if len(shape) != 5:
        raise ValueError(f"shape must hold 5 sizes [L, B, H, N, C], got {shape}")
    _checks.positive_ints(**dict(zip(LOGICAL_AXES, shape)))


def _validate_allocate(sizes, dtype) -> None:
    """The six sizes positive ints, a torch dtype (the layout: ``stride_order``)."""
    names = ("num_layers", "num_blocks", "num_kv_heads", "block_size", "head_size")
    _checks.positive_ints(**dict(zip((*names, "head_size_v"), sizes)))
    _checks.instance("dtype", dtype, torch.dtype)
