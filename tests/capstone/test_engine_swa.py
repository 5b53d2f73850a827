"""The engine serves a tiny model with sliding-window layers (every other layer, Gemma-style)
through chapter 07's two-pool SWA allocator and through chapter 12's unified pool, token for token
as the model's own contiguous-KV reference with the same window; its scheduler asks only the
allocator's capacity questions (tests/sglang/allocator/test_capacity_questions.py)."""

import random

import pytest

from memlab.capstone.engine import Engine, TinyConfig, TinyLlama, generate_reference
from memlab.sglang.unified import (
    MHASubPoolSpec,
    UnifiedKVPool,
    UnifiedSWAKVPool,
    UnifiedSWATokenToKVPoolAllocator,
)

WINDOW = 8
# layers 0 and 2 slide, 1 and 3 see everything
CFG = TinyConfig(num_layers=4, sliding_window=WINDOW)
MODEL = TinyLlama(CFG)
NEW = 8


def prompts(n=5, seed=0):
    rng = random.Random(seed)
    return [
        [rng.randrange(1, CFG.vocab_size) for _ in range(rng.randint(12, 40))]
        for _ in range(n)
    ]


def unified_memory(num_tokens, ps, debug=True):
    """A unified buffer with room for ``num_tokens`` tokens on both sides (plus the sinks)."""
    c = CFG
    full = [i for i in range(c.num_layers) if not c.is_sliding(i)]
    swa = [i for i in range(c.num_layers) if c.is_sliding(i)]

    def spec(name, grow, layers):
        return MHASubPoolSpec(
            name=name,
            layer_num=layers,
            head_num=c.num_kv_heads,
            head_dim=c.head_dim,
            store_dtype=MODEL.dtype,
            grow_direction=grow,
        )

    specs = [spec("full", "down", len(full)), spec("swa", "up", len(swa))]
    per_token = sum(s.entry_bytes() for s in specs)
    pool = UnifiedKVPool(
        total_bytes=(num_tokens + 2 * ps) * per_token,
        sub_pool_specs=specs,
        page_size=ps,
    )
    kv = UnifiedSWAKVPool(
        unified_buffer=pool,
        full_attention_layer_ids=full,
        swa_attention_layer_ids=swa,
        page_size=ps,
    )
    return kv, UnifiedSWATokenToKVPoolAllocator(
        unified_buffer=pool, kvcache=kv, page_size=ps, debug_mode=debug
    )


def engine(kind, ps, num_tokens=512, prefix_cache=None, **kw):
    memory = unified_memory(num_tokens, ps) if kind == "unified" else None
    return Engine(
        MODEL,
        page_size=ps,
        num_tokens=num_tokens,
        max_running=4,
        max_context=128,
        chunk_size=16,
        attention="torch",
        prefix_cache=prefix_cache,
        ignore_eos=True,
        memory=memory,
        debug_mode=True,
        **kw,
    )


def test_the_window_changes_the_reference():
    ps = prompts()
    # the same weights (same seed and shapes), no window
    full = TinyLlama(TinyConfig(num_layers=4))
    assert generate_reference(full, ps, NEW) != generate_reference(MODEL, ps, NEW)


@pytest.mark.parametrize("kind", ["two_pool", "unified"])
@pytest.mark.parametrize("ps", [1, 4])
def test_swa_serving_is_token_exact(kind, ps):
    p = prompts(seed=ps)
    e = engine(kind, ps)
    assert e.generate(p, NEW) == generate_reference(MODEL, p, NEW)
    assert (
        type(e.allocator).__name__
        == {
            "two_pool": "SWATokenToKVPoolAllocator",
            "unified": "UnifiedSWATokenToKVPoolAllocator",
        }[kind]
    )


@pytest.mark.parametrize("kind", ["two_pool", "unified"])
def test_swa_serving_under_a_small_pool_with_a_prefix_cache(kind):
    rng = random.Random(3)
    shared = [rng.randrange(1, CFG.vocab_size) for _ in range(20)]
    p = [
        shared + [rng.randrange(1, CFG.vocab_size) for _ in range(rng.randint(4, 12))]
        for _ in range(6)
    ]
    e = engine(kind, 2, num_tokens=128, prefix_cache="radix")
    assert e.generate(p, NEW) == generate_reference(MODEL, p, NEW)
    assert e.stats["cached_tokens"] > 0


def test_swa_models_need_torch_attention():
    with pytest.raises(ValueError, match="attention='torch'"):
        Engine(MODEL, attention="triton")


# -- the window slides while a request runs (SGLang's maybe_evict_swa) ---------------------------

# SGLang's sliding_window_size: what a query reads before its own position
SWS = WINDOW - 1


def swa_held(alloc) -> int:
    """SWA slots in use: the two-pool side's count, or the unified SWA sub-pool's (its free count
    depends on the shared gap, so it is read from the sub-pool's own books)."""
    side = alloc.swa_attn_allocator
    return (
        side.allocated_count()
        if hasattr(side, "allocated_count")
        else side.size - side.available_size()
    )


def holding(e) -> list:
    """The requests that hold KV: the decode batch and a prefill in chunks."""
    return e.running + ([e.chunked_req] if e.chunked_req is not None else [])


def serve_watching_the_window(e, p):
    """Serve ``p`` step by step; after each step, every running request's SWA cursor must be where
    SGLang's free_swa_out_of_window_slots leaves it (the batch's first position for the request,
    less the window, down to a page), and the SWA side must hold exactly the slots of the
    positions past each cursor. Returns the outputs and the SWA side's peak use."""
    ps, alloc, peak = e.page_size, e.allocator, 0
    reqs = [e.add_request(x, NEW) for x in p]
    want = {}
    while True:
        before = {r.rid: r.kv.kv_allocated_len for r in holding(e)}
        if not e.step():
            break
        held = 0
        for r in holding(e):
            kv, pre_len = r.kv, before.get(r.rid, 0)
            # in this batch, computing from pre_len on
            if kv.kv_allocated_len != pre_len:
                want[r.rid] = max(want.get(r.rid, 0), max(0, pre_len - SWS) // ps * ps)
            assert kv.swa_evicted_seqlen == want.get(r.rid, 0), (
                r,
                kv.swa_evicted_seqlen,
                want.get(r.rid),
            )
            held += -(-kv.kv_allocated_len // ps) * ps - kv.swa_evicted_seqlen
        used = swa_held(alloc)
        assert used == held, (used, held)
        peak = max(peak, used)
    assert max(want.values()) > 0  # the window did slide
    return [r.output for r in reqs], peak


@pytest.mark.parametrize("kind", ["two_pool", "unified"])
@pytest.mark.parametrize("ps", [1, 4])
def test_without_a_prefix_cache_the_window_slides(kind, ps):
    p = prompts(n=4, seed=10 + ps)
    e = engine(kind, ps)
    assert e.tree_cache.supports_swa() and e.sliding_window_size == SWS
    out, peak = serve_watching_the_window(e, p)
    assert out == generate_reference(MODEL, p, NEW)
    # every request's SWA side is bounded by its window, not by its length
    assert peak <= len(p) * (16 + SWS + 2 * ps)
    assert swa_held(e.allocator) == 0  # all back at the end


def test_the_slide_is_what_keeps_the_swa_side_small(monkeypatch):
    """The buggy variant: a tree that never slides (memlab's engine before the slide was wired)
    holds every token's SWA slot, and the bound above fails."""
    from memlab.sglang.radix_cache import RadixCache

    p = prompts(n=4, seed=11)
    monkeypatch.setattr(RadixCache, "supports_swa", lambda self: False)
    e = engine("two_pool", 1)
    peak = 0
    # the outputs do not show it
    assert e.generate(p, NEW) == generate_reference(MODEL, p, NEW)
    e = engine("two_pool", 1)
    reqs = [e.add_request(x, NEW) for x in p]
    while e.step():
        peak = max(peak, swa_held(e.allocator))
    assert all(r.kv.swa_evicted_seqlen == 0 for r in reqs)
    assert peak > len(p) * (16 + SWS + 2)


def test_a_sliding_swa_pool_smaller_than_the_requests():
    """64 SWA slots for four requests of 20 to 48 tokens: only the slide makes them fit at once."""
    rng = random.Random(5)
    p = [
        [rng.randrange(1, CFG.vocab_size) for _ in range(rng.randint(12, 40))]
        for _ in range(4)
    ]
    e = Engine(
        MODEL,
        page_size=1,
        num_tokens=256,
        size_swa=64,
        max_running=4,
        max_context=128,
        chunk_size=16,
        attention="torch",
        prefix_cache=None,
        ignore_eos=True,
        debug_mode=True,
    )
    assert e.generate(p, NEW) == generate_reference(MODEL, p, NEW)
    assert e.stats["retracted"] == 0 and e.allocator.swa_available_size() == 64


def test_with_a_prefix_cache_the_window_does_not_slide():
    """memlab's tree has no SWA tombstones: a shared node keeps its SWA slots (the docstring says
    so)."""
    e = engine("two_pool", 2, prefix_cache="radix")
    assert not e.tree_cache.supports_swa() and e.sliding_window_size is None
    reqs = [e.add_request(x, NEW) for x in prompts(n=3, seed=4)]
    while e.step():
        assert all(r.kv.swa_evicted_seqlen == 0 for r in e.running)
    assert all(r.finished for r in reqs)
