"""The tiny engine serves a real model through memlab's books and matches a contiguous-KV reference."""

import random

import pytest

from memlab.engine import Engine, PrefixCache, TinyConfig, TinyLlama, generate_reference

MODEL = TinyLlama(TinyConfig())
RNG = random.Random(0)
PROMPTS = [[RNG.randrange(128) for _ in range(n)] for n in (5, 23, 17, 9)]
NEW = 8
REF = generate_reference(MODEL, PROMPTS, NEW)


@pytest.mark.parametrize("ps", [1, 16])
def test_engine_matches_the_reference(ps):
    e = Engine(MODEL, page_size=ps, num_tokens=512, chunk_size=16, attention="torch", debug_mode=True)
    assert e.generate(PROMPTS, NEW) == REF
    assert e.stats["decode_tokens"] > 0 and e.stats["prefill_tokens"] == sum(map(len, PROMPTS))
    e.check_books()
    assert len(e.req_to_token_pool.free_slots) == e.req_to_token_pool.size


@pytest.mark.parametrize("ps,tokens,new", [(1, 64, NEW), (16, 64, 24)])
def test_retraction_under_a_small_pool_keeps_the_outputs(ps, tokens, new):
    # The pool cannot hold every request at its final length, so decode steps must retract.
    want = REF if new == NEW else generate_reference(MODEL, PROMPTS, new)
    e = Engine(MODEL, page_size=ps, num_tokens=tokens, chunk_size=16, attention="torch", prefix_cache=False,
               debug_mode=True)
    assert e.generate(PROMPTS, new) == want
    assert e.stats["retracted"] > 0
    e.check_books()
    assert e.allocator.available_size() == e.allocator.num_pages * ps


@pytest.mark.parametrize("ps", [1, 4])
def test_prefix_sharing_reuses_pages_and_counts_hits(ps):
    shared = PROMPTS[1][:20]
    first, second = [shared + [1, 2]], [shared + [3], shared + [4, 5, 6]]
    want = generate_reference(MODEL, first + second, NEW)
    e = Engine(MODEL, page_size=ps, num_tokens=256, chunk_size=32, attention="torch", debug_mode=True)
    assert e.generate(first, NEW) == want[:1]
    e.check_books()
    assert e.stats["cached_tokens"] == 0
    assert e.generate(second, NEW) == want[1:]
    assert e.stats["cached_tokens"] == 2 * (20 // ps * ps)  # both reuse the shared whole pages
    e.check_books()


def test_cache_eviction_makes_room_and_books_balance():
    e = Engine(MODEL, page_size=4, num_tokens=96, chunk_size=32, attention="torch", debug_mode=True)
    for p in PROMPTS:  # each finished request leaves cached pages that later ones must evict
        assert e.generate([p], NEW) == [REF[PROMPTS.index(p)]]
        e.check_books()
    assert e.cache.evictable() > 0


@pytest.mark.kernel
def test_engine_with_the_triton_attention_kernel():
    prompts = [PROMPTS[0], PROMPTS[3][:4]]
    e = Engine(MODEL, page_size=16, num_tokens=128, chunk_size=16, attention="triton", alloc_backend="triton")
    assert e.generate(prompts, 3) == [r[:3] for r in (REF[0], generate_reference(MODEL, prompts[1:], 3)[0])]


def test_prefix_cache_match_stops_at_the_first_miss_and_keeps_the_last_token():
    c = PrefixCache(2)
    assert c.insert([1, 2, 3, 4, 5, 6], [7, 8, 9], 0) == []
    assert c.match([1, 2, 3, 4]) == [7]  # at most len - 1 tokens may hit
    assert c.match([1, 2, 9, 9, 5, 6, 0]) == [7]  # a miss ends the chain, later equal pages do not count
    assert c.evictable() == 2 and c.evict(5) == [8, 9]
    c.release([7, 7])
    assert c.evict(1) == [7]


def test_bad_requests_are_named():
    e = Engine(MODEL, page_size=4, num_tokens=64, max_context=128, attention="torch")
    with pytest.raises(ValueError, match="empty prompt"):
        e.add_request([], 3)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1, got 0"):
        e.add_request([1], 0)
    with pytest.raises(ValueError, match="130 tokens exceeds max_context 128"):
        e.add_request([1] * 100, 30)
    with pytest.raises(ValueError, match="can never fit a pool of 64 slots"):
        e.add_request([1] * 60, 10)
    with pytest.raises(ValueError, match="'flash'"):
        Engine(MODEL, attention="flash")
