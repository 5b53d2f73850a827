"""The tiny engine serves a real model through memlab's books and matches a contiguous-KV reference,
with each prefix cache: none, vLLM's block hashes, SGLang's radix tree, the radix tree with a host
tier."""

import functools
import random

import pytest
import torch

from memlab.capstone.engine import (
    Engine,
    HashPrefixCache,
    TinyConfig,
    TinyLlama,
    generate_reference,
)
from memlab.common.env import kernel_device
from memlab.sglang.allocation import alloc_for_extend, release_kv_cache
from memlab.sglang.allocator import PagedTokenToKVPoolAllocator
from memlab.sglang.req_to_token import Req, ReqToTokenPool
from memlab.sglang.schedule_policy import PrefillAdder

MODEL = TinyLlama(TinyConfig())
RNG = random.Random(0)
PROMPTS = [[RNG.randrange(128) for _ in range(n)] for n in (5, 23, 17, 9)]
NEW = 8
REF = generate_reference(MODEL, PROMPTS, NEW)
CACHES = [None, "hash", "radix", "hicache"]


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("ps", [1, 16])
def test_engine_matches_the_reference(ps, cache):
    e = Engine(
        MODEL,
        page_size=ps,
        num_tokens=512,
        chunk_size=16,
        attention="torch",
        prefix_cache=cache,
        debug_mode=True,
    )
    assert e.generate(PROMPTS, NEW) == REF
    assert e.stats["decode_tokens"] > 0 and e.stats["prefill_tokens"] == sum(
        map(len, PROMPTS)
    )
    e.check_books()
    assert len(e.req_to_token_pool.free_slots) == e.req_to_token_pool.size


# Eight requests, for pages of 16: four cannot outgrow what admission reserves for them.
MORE = PROMPTS + [[RNG.randrange(128) for _ in range(n)] for n in (11, 3, 14, 7)]


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize(
    "ps,tokens,new,prompts", [(1, 64, NEW, PROMPTS), (16, 128, 32, MORE)]
)
def test_retraction_under_a_small_pool_keeps_the_outputs(
    ps, tokens, new, prompts, cache
):
    # Admission reserves 0.7 of what each running request will still write (new_token_ratio);
    # they write all of it, so a decode step comes up short and must retract.
    want = generate_reference(MODEL, prompts, new)
    e = Engine(
        MODEL,
        page_size=ps,
        num_tokens=tokens,
        chunk_size=16,
        attention="torch",
        prefix_cache=cache,
        debug_mode=True,
    )
    assert e.generate(prompts, new) == want
    assert e.stats["retracted"] > 0
    e.check_books()
    if cache is None:
        assert e.allocator.available_size() == e.allocator.num_pages * ps


@pytest.mark.parametrize("cache", ["hash", "radix", "hicache"])
@pytest.mark.parametrize("ps", [1, 4])
def test_prefix_sharing_reuses_pages_and_counts_hits(ps, cache):
    shared = PROMPTS[1][:20]
    first, second = [shared + [1, 2]], [shared + [3], shared + [4, 5, 6]]
    want = generate_reference(MODEL, first + second, NEW)
    e = Engine(
        MODEL,
        page_size=ps,
        num_tokens=256,
        chunk_size=32,
        attention="torch",
        prefix_cache=cache,
        debug_mode=True,
    )
    assert e.generate(first, NEW) == want[:1]
    e.check_books()
    assert e.stats["cached_tokens"] == 0
    assert e.generate(second, NEW) == want[1:]
    # both reuse the shared whole pages
    assert e.stats["cached_tokens"] == 2 * (20 // ps * ps)
    e.check_books()


def test_a_repeated_prompt_recomputes_its_last_token():
    for cache in ("hash", "radix"):
        e = Engine(
            MODEL,
            page_size=1,
            num_tokens=256,
            attention="torch",
            prefix_cache=cache,
            debug_mode=True,
        )
        assert e.generate([PROMPTS[1]], NEW) == [REF[1]]
        assert e.generate([PROMPTS[1]], NEW) == [REF[1]]
        # its logits need the last one computed
        assert e.stats["cached_tokens"] == len(PROMPTS[1]) - 1


@pytest.mark.parametrize("cache", ["hash", "radix", "hicache"])
def test_cache_eviction_makes_room_and_books_balance(cache):
    e = Engine(
        MODEL,
        page_size=4,
        num_tokens=96,
        chunk_size=32,
        attention="torch",
        prefix_cache=cache,
        debug_mode=True,
    )
    # each finished request leaves cached pages that later ones must evict
    for p in PROMPTS:
        assert e.generate([p], NEW) == [REF[PROMPTS.index(p)]]
        e.check_books()
    assert e.tree_cache.evictable_size() > 0


def test_hicache_loads_an_evicted_prefix_back_from_the_host():
    # A's prefix is cached, then evicted from the device by B (demoted to the host: write-through
    # backed it up when A finished); C shares A's prefix and gets it back from the host.
    system = [RNG.randrange(128) for _ in range(24)]
    a, b, c = system + [1], [RNG.randrange(128) for _ in range(40)], system + [2, 3]
    want = generate_reference(MODEL, [a, b, c], NEW)
    runs = {}
    for cache in ("radix", "hicache"):
        e = Engine(
            MODEL,
            page_size=4,
            num_tokens=64,
            chunk_size=32,
            attention="torch",
            prefix_cache=cache,
            host_tokens=128,
            debug_mode=True,
        )
        assert [e.generate([p], NEW)[0] for p in (a, b, c)] == want
        e.check_books()
        runs[cache] = e
    hi, radix = runs["hicache"], runs["radix"]
    assert (
        hi.tree_cache.num_evicted_tokens > 0 and radix.tree_cache.num_evicted_tokens > 0
    )
    assert hi.stats["loaded_back_tokens"] > 0
    # without the host tier the evicted part of the prefix is recomputed
    assert (
        hi.stats["cached_tokens"]
        == radix.stats["cached_tokens"] + hi.stats["loaded_back_tokens"]
    )


@pytest.mark.kernel
@functools.cache
def kernel_model() -> TinyLlama:
    """MODEL's weights where the Triton kernels run (the GPU; the interpreter: the CPU)."""
    dev = kernel_device()
    return MODEL if dev == "cpu" else TinyLlama(TinyConfig(), device=dev)


def test_engine_with_the_triton_attention_kernel():
    prompts = [PROMPTS[0], PROMPTS[3][:4]]
    e = Engine(
        kernel_model(),
        page_size=16,
        num_tokens=128,
        chunk_size=16,
        attention="triton",
        alloc_backend="triton",
    )
    assert e.generate(prompts, 3) == generate_reference(kernel_model(), prompts, 3)


def test_a_triton_backend_refuses_tensors_where_the_kernels_cannot_read(monkeypatch):
    """On a GPU the compiled kernels read GPU memory only: a model, a pool or an allocator on
    the CPU with a 'triton' backend is refused at once, with what to do."""
    from memlab.common import env

    monkeypatch.setattr(env, "kernel_device", lambda: "cuda")
    with pytest.raises(
        ValueError, match="attention='triton' runs the Triton kernels on cuda"
    ):
        Engine(MODEL, page_size=16, num_tokens=128, attention="triton")
    with pytest.raises(
        ValueError, match="backend='triton' runs .* on cuda, but the tensors"
    ):
        PagedTokenToKVPoolAllocator(64, 4, backend="triton")


def hash_cache(num_tokens=32, page_size=2):
    alloc = PagedTokenToKVPoolAllocator(num_tokens, page_size, debug_mode=True)
    pool = ReqToTokenPool(4, 32)
    return HashPrefixCache(alloc, pool), alloc, pool


def computed(cache, pool, alloc, tokens, prompt_len=None):
    """A request that matched nothing and computed ``tokens`` into fresh slots of its own."""
    prompt_len = len(tokens) if prompt_len is None else prompt_len
    r = Req(len(pool.free_slots), tokens[:prompt_len])
    r.output_ids = list(tokens[prompt_len:])
    r.lock = cache.lock(())
    assert alloc_for_extend(pool, alloc, [r], [len(tokens)]) is not None
    return r


def test_hash_cache_match_stops_at_the_first_miss_and_evicts_the_tail_first():
    c, alloc, pool = hash_cache()
    r = computed(c, pool, alloc, [1, 2, 3, 4, 5, 6])  # pages 1, 2, 3
    release_kv_cache(r, c, checkpoint=True)
    assert c.evictable_size() == 6 and c.device_pages() == {1, 2, 3}
    # only full pages of the key
    assert c.match_prefix([1, 2, 3]).last_device_node == (1,)
    # a miss ends the chain: later equal pages do not count
    m = c.match_prefix([1, 2, 9, 9, 5, 6])
    assert m.device_prefix_len == 2 and c.path_device_indices(
        m.last_device_node
    ).tolist() == [2, 3]
    lock = c.lock(m.last_device_node)
    assert c.evictable_size() == 4
    # pages 3 then 2: the chain's tail
    assert c.evict(3).num_tokens_evicted == 4 and c.device_pages() == {1}
    c.unlock(lock)
    assert c.evict(1).num_tokens_evicted == 2 and alloc.available_size() == 32
    alloc.check_books()


def test_hash_cache_frees_duplicate_pages_and_the_partial_tail():
    c, alloc, pool = hash_cache()
    # 2 full pages, a partial 3rd
    release_kv_cache(computed(c, pool, alloc, [1, 2, 3, 4, 5]), c, checkpoint=True)
    assert c.device_pages() == {1, 2} and alloc.available_size() == 28
    r = computed(c, pool, alloc, [1, 2, 3, 4, 7])  # computed the same prefix again
    row = pool.req_to_token[r.kv.req_pool_idx, :5].tolist()
    # a chunk checkpointed: its copies go back, the row maps the cached pages
    c.checkpoint(r, up_to=5)
    assert pool.req_to_token[r.kv.req_pool_idx, :5].tolist() == [2, 3, 4, 5, row[4]]
    assert (
        r.kv.cache_protected_len == 4
        and r.lock.node == (1, 2)
        and alloc.available_size() == 26
    )
    release_kv_cache(r, c, checkpoint=True)
    assert c.device_pages() == {1, 2} and alloc.available_size() == 28
    alloc.check_books()


def test_bad_requests_are_named():
    e = Engine(MODEL, page_size=4, num_tokens=64, max_context=128, attention="torch")
    with pytest.raises(ValueError, match="empty prompt"):
        e.add_request([], 3)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1, got 0"):
        e.add_request([1], 0)
    with pytest.raises(ValueError, match="130 tokens .*exceeds max_context 128"):
        e.add_request([1] * 100, 30)
    with pytest.raises(ValueError, match="can never fit a pool of 64 slots"):
        e.add_request([1] * 60, 10)
    with pytest.raises(ValueError, match="'flash'"):
        Engine(MODEL, attention="flash")
    with pytest.raises(ValueError, match="prefix_cache must be one of"):
        Engine(MODEL, prefix_cache="lru")


def test_the_engine_books_catch_a_page_owned_twice():
    e = Engine(
        MODEL, page_size=4, num_tokens=128, attention="torch", prefix_cache="radix"
    )
    for p in PROMPTS[1:3]:
        e.add_request(p, NEW)
    e.step()
    a, b = e.running
    table = e.req_to_token_pool.req_to_token
    cpl_a, cpl_b = a.kv.cache_protected_len, b.kv.cache_protected_len
    # b maps a's own page
    table[b.kv.req_pool_idx, cpl_b] = table[a.kv.req_pool_idx, cpl_a]
    with pytest.raises(AssertionError, match="held by requests"):
        e.check_books()


# -- admission: SGLang's PrefillAdder (memlab.sglang.schedule_policy) ------------------------------


def issue_32_prompts():
    """23, 11, 29 and 60 prompt tokens; the first and third share their first 20."""
    rng = random.Random(0)
    shared = [rng.randrange(1, 128) for _ in range(20)]

    def tail(n):
        return [rng.randrange(1, 128) for _ in range(n)]

    return [shared + tail(3), tail(11), shared + tail(9), tail(60)]


def admission_steps(e, prompts, new) -> dict:
    """Serve; the step at which each request first holds KV."""
    reqs = [e.add_request(p, new) for p in prompts]
    first, step = {}, 0
    while e.step():
        step += 1
        for r in e.running + ([e.chunked_req] if e.chunked_req else []):
            first.setdefault(r.rid, step)
    assert [r.output for r in reqs] == generate_reference(MODEL, prompts, new)
    return first


def issue_32_engine():
    return Engine(
        MODEL,
        page_size=16,
        num_tokens=7 * 16,
        attention="torch",
        prefix_cache="radix",
        debug_mode=True,
    )


def test_issue_32_case_queues_instead_of_admitting_all(monkeypatch):
    """Issue 32: a radix cache, pages of 16, 7 pages, 16 new tokens each. The old engine admitted
    all four in its first step and retracted one later. SGLang's adder admits A and B (B leaves
    no room for what A and B will still write), C at step 4 once the reserve has shrunk (its
    first page cached by A), D alone after A, B and C finished; nothing is retracted.
    tests/sglang/test_schedule_policy.py traces the rounds by hand and against the wheel."""
    e = issue_32_engine()
    assert admission_steps(e, issue_32_prompts(), 16) == {0: 1, 1: 1, 2: 4, 3: 20}
    assert e.stats["retracted"] == 0 and e.stats["cached_tokens"] == 16
    # Without the running requests' remaining output in the budget (the issue's mistake), C
    # comes in at step 2, when A and B still have 15 tokens each to write.
    monkeypatch.setattr(
        PrefillAdder, "_get_running_request_total_token_offset", lambda self, r: 0
    )
    assert admission_steps(issue_32_engine(), issue_32_prompts(), 16)[2] == 2


class Watched(Engine):
    """Keeps the decode batch each step left after its fit check (and retractions)."""

    def update_running_batch(self):
        self.kept = list(super().update_running_batch())
        return self.kept


def test_new_token_ratio_decays_rises_on_retraction_and_resets_idle():
    """SGLang's scheduler: each decode step that fits lowers the ratio by (0.7 - 0.098) / 600
    (``NewTokenRatioTracker.decay_step``), a retraction sets it to what the kept requests decoded
    as if 20 more steps had run (``estimate_new_token_ratio_after_retract``), a prefill step
    leaves it, and the idle scheduler resets it to 0.7."""
    e = Watched(
        MODEL, num_tokens=64, chunk_size=16, attention="torch", prefix_cache=None
    )
    t = e.new_token_ratio_tracker
    for p in PROMPTS:
        e.add_request(p, NEW)
    seen = set()
    while True:
        before, retracted, e.kept = t.current, e.stats["retracted"], None
        if not e.step():
            assert t.current == 0.7
            break
        if e.kept is None:  # a prefill step
            seen.add("prefill")
            assert t.current == before
        elif e.stats["retracted"] == retracted:
            seen.add("decode")
            assert t.current == pytest.approx(max(before - t.decay, t.min))
        else:
            seen.add("retract")
            decoded = sum(len(r.output) - 1 for r in e.kept)  # before this step's token
            want = (decoded + 20 * len(e.kept)) / (NEW * len(e.kept) + 1)
            assert t.current == min(1.0, want) > before
    assert seen == {"prefill", "decode", "retract"}


def test_a_retracted_request_joins_the_back_of_the_queue():
    """SGLang's ``_add_request_to_queue`` appends a retracted request: under FCFS the requests
    still waiting go first."""
    e = Engine(
        MODEL, num_tokens=64, chunk_size=16, attention="torch", prefix_cache=None
    )
    for p in PROMPTS + PROMPTS[:2]:
        e.add_request(p, NEW)
    while e.stats["retracted"] == 0:
        assert e.step()
    # it came before the ones still waiting, and waits behind them
    victim = e.waiting[-1]
    assert victim.output and len(e.waiting) > 1
    assert all(r.rid > victim.rid for r in e.waiting[:-1])


def test_chunk_size_must_be_a_multiple_of_the_page():
    with pytest.raises(ValueError, match="multiple of page_size"):
        Engine(MODEL, page_size=16, chunk_size=24, attention="torch")


# -- SGLang's --enable-mixed-chunk, and the torch attention paths --------------------------------


def serve_counting_mixed_steps(e, prompts, new):
    """Serve with newcomers arriving while others decode; (outputs, steps, mixed steps)."""
    reqs = [e.add_request(p, new) for p in prompts[:2]]
    steps = mixed = 0
    late = list(prompts[2:])
    while True:
        before = dict(e.stats)
        if not e.step():
            break
        steps += 1
        grew = [
            e.stats[k] > before.get(k, 0) for k in ("prefill_tokens", "decode_tokens")
        ]
        mixed += all(grew)
        if late and steps % 2:
            reqs.append(e.add_request(late.pop(0), new))
    return [r.output for r in reqs], steps, mixed


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("ps", [1, 16])
def test_mixed_chunks_decode_in_the_prefill_pass(ps, cache):
    """With ``enable_mixed_chunk`` the running requests decode in the pass that prefills a
    newcomer (SGLang's ``mix_with_running``), with the same outputs. (The chunk is larger than
    a page: the adder takes one token per running request off it first.)"""
    prompts = MORE
    want = generate_reference(MODEL, prompts, NEW)
    runs = {}
    for mixed in (False, True):
        e = Engine(
            MODEL,
            page_size=ps,
            num_tokens=512,
            chunk_size=64,
            attention="torch",
            prefix_cache=cache,
            enable_mixed_chunk=mixed,
            debug_mode=True,
        )
        runs[mixed] = serve_counting_mixed_steps(e, prompts, NEW)
        assert sorted(runs[mixed][0]) == sorted(want)
        e.check_books()
    assert runs[False][2] == 0 < runs[True][2]


@pytest.mark.kernel
def test_mixed_chunks_through_the_triton_attention_kernel():
    prompts = [PROMPTS[0], PROMPTS[3][:4], PROMPTS[2][:6]]
    e = Engine(
        kernel_model(),
        page_size=16,
        num_tokens=128,
        chunk_size=64,
        attention="triton",
        enable_mixed_chunk=True,
    )
    outs, _, mixed = serve_counting_mixed_steps(e, prompts, 3)
    assert mixed and outs == generate_reference(kernel_model(), prompts, 3)


def test_decode_attention_equals_chapter_09s_reference():
    """The engine's flat decode attention (every request's keys in one list, a softmax per
    request) against ``attention_over_slots`` (rows padded to the longest), on rows of very
    different lengths, grouped query heads."""
    from memlab.common import attention

    g = torch.Generator().manual_seed(0)
    lens = torch.tensor([1, 37, 5, 120, 2])
    table = torch.randint(1, 601, (5, 128), generator=g)
    k_buf, v_buf = (
        torch.randn(601, 2, 16, generator=g),
        torch.randn(601, 2, 16, generator=g),
    )
    q = torch.randn(5, 4, 16, generator=g)
    rows = torch.arange(5)
    slots, mask = attention.slots_from_req_to_token(table, rows, lens)
    want = attention.attention_over_slots(q, k_buf, v_buf, slots, mask, 16**-0.5)
    tok_req = torch.repeat_interleave(torch.arange(5), lens)
    key_pos = torch.cat([torch.arange(n) for n in lens.tolist()])
    got = Engine._decode_attention(q, k_buf, v_buf, table[tok_req, key_pos], tok_req)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
