"""The engine serves a tiny model with sliding-window layers (every other layer, Gemma-style) through
chapter 07's two-pool SWA allocator and through chapter 12's unified pool, token for token as the
model's own contiguous-KV reference with the same window; its scheduler asks only the allocator's
capacity questions (tests/test_scheduler_questions.py)."""

import random

import pytest
import torch

from memlab.capstone.engine import Engine, TinyConfig, TinyLlama, generate_reference
from memlab.sglang.unified import (MHASubPoolSpec, UnifiedKVPool, UnifiedSWAKVPool,
                                   UnifiedSWATokenToKVPoolAllocator)

WINDOW = 8
CFG = TinyConfig(num_layers=4, sliding_window=WINDOW)  # layers 0 and 2 slide, 1 and 3 see everything
MODEL = TinyLlama(CFG)
NEW = 8


def prompts(n=5, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(1, CFG.vocab_size) for _ in range(rng.randint(12, 40))] for _ in range(n)]


def unified_memory(num_tokens, ps, debug=True):
    """A unified buffer with room for ``num_tokens`` tokens on both sides (plus the sinks)."""
    c = CFG
    full = [i for i in range(c.num_layers) if not c.is_sliding(i)]
    swa = [i for i in range(c.num_layers) if c.is_sliding(i)]

    def spec(name, grow, layers):
        return MHASubPoolSpec(name=name, layer_num=layers, head_num=c.num_kv_heads, head_dim=c.head_dim,
                              store_dtype=MODEL.dtype, grow_direction=grow)
    specs = [spec("full", "down", len(full)), spec("swa", "up", len(swa))]
    per_token = sum(s.entry_bytes() for s in specs)
    pool = UnifiedKVPool(total_bytes=(num_tokens + 2 * ps) * per_token, sub_pool_specs=specs, page_size=ps)
    kv = UnifiedSWAKVPool(unified_buffer=pool, full_attention_layer_ids=full, swa_attention_layer_ids=swa,
                          page_size=ps)
    return kv, UnifiedSWATokenToKVPoolAllocator(unified_buffer=pool, kvcache=kv, page_size=ps, debug_mode=debug)


def engine(kind, ps, num_tokens=512, prefix_cache=None, **kw):
    memory = unified_memory(num_tokens, ps) if kind == "unified" else None
    return Engine(MODEL, page_size=ps, num_tokens=num_tokens, max_running=4, max_context=128, chunk_size=16,
                  attention="torch", prefix_cache=prefix_cache, ignore_eos=True, memory=memory, debug_mode=True, **kw)


def test_the_window_changes_the_reference():
    ps = prompts()
    full = TinyLlama(TinyConfig(num_layers=4))  # the same weights (same seed and shapes), no window
    assert generate_reference(full, ps, NEW) != generate_reference(MODEL, ps, NEW)


@pytest.mark.parametrize("kind", ["two_pool", "unified"])
@pytest.mark.parametrize("ps", [1, 4])
def test_swa_serving_is_token_exact(kind, ps):
    p = prompts(seed=ps)
    e = engine(kind, ps)
    assert e.generate(p, NEW) == generate_reference(MODEL, p, NEW)
    assert type(e.allocator).__name__ == {"two_pool": "SWATokenToKVPoolAllocator",
                                          "unified": "UnifiedSWATokenToKVPoolAllocator"}[kind]


@pytest.mark.parametrize("kind", ["two_pool", "unified"])
def test_swa_serving_under_a_small_pool_with_a_prefix_cache(kind):
    rng = random.Random(3)
    shared = [rng.randrange(1, CFG.vocab_size) for _ in range(20)]
    p = [shared + [rng.randrange(1, CFG.vocab_size) for _ in range(rng.randint(4, 12))] for _ in range(6)]
    e = engine(kind, 2, num_tokens=128, prefix_cache="radix")
    assert e.generate(p, NEW) == generate_reference(MODEL, p, NEW)
    assert e.stats["cached_tokens"] > 0


def test_swa_models_need_torch_attention():
    with pytest.raises(ValueError, match="attention='torch'"):
        Engine(MODEL, attention="triton")
