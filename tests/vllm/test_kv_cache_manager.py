"""vLLM's KVCacheManager for one group: cache lookup, allocate_slots and the single-type manager's
steps under it, reverse free, sliding window; property tests over random request streams;
bug-zoo variants of three classic mistakes."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlab.vllm.kv_cache_manager import KVCacheManager, SlidingWindowManager, cdiv
from memlab.vllm.request import Request


def new_request(mgr, rid, tokens, **kw):
    return Request(rid, tokens, block_hasher=mgr.request_block_hasher, **kw)


def admit(mgr, req):
    """What the scheduler does for a waiting request: look up, allocate, run the step."""
    hits, n = mgr.get_computed_blocks(req)
    new = mgr.allocate_slots(req, req.num_tokens - n, n, hits)
    if new is not None:
        req.num_computed_tokens = req.num_tokens
    return new, n


def decode(mgr, req, token=7):
    req.append_output_token_ids(token)
    new = mgr.allocate_slots(req, 1)
    if new is not None:
        req.num_computed_tokens += 1
    return new


def group(mgr):
    """The manager of the one KV cache group."""
    (m,) = mgr.coordinator.single_type_managers
    return m


def snapshot(mgr):
    pool = mgr.block_pool
    return (
        [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        [b.ref_cnt for b in pool.blocks],
        [b.block_hash for b in pool.blocks],
        {k: list(v) for k, v in group(mgr).req_to_blocks.items()},
        dict(group(mgr).num_cached_block),
    )


# ---- bug zoo -------------------------------------------------------------------------------


class ForwardFreeManager(KVCacheManager):
    """Frees a request's blocks first to last: the prefix's START is then evicted first."""

    def free(self, request):
        self.block_pool.free_blocks(group(self).pop_blocks_for_free(request.request_id))


class AllocateBeforeTouchManager(KVCacheManager):
    """Takes new blocks before touching the hits: get_new_blocks may evict a block just hit."""

    def allocate_slots(
        self,
        request,
        num_new_tokens,
        num_new_computed_tokens=0,
        new_computed_blocks=None,
        num_lookahead_tokens=0,
    ):
        m, hits = group(self), new_computed_blocks or []
        need = cdiv(
            request.num_computed_tokens + num_new_computed_tokens + num_new_tokens,
            self.block_size,
        )
        new = self.block_pool.get_new_blocks(
            max(0, need - len(hits) - len(m.req_to_blocks.get(request.request_id, [])))
        )
        self.block_pool.touch(hits)
        blocks = m.req_to_blocks[request.request_id]
        blocks.extend(hits + new)
        m.num_cached_block[request.request_id] = len(blocks)
        return new


class IgnoreEvictableHitsManager(KVCacheManager):
    """Counts only new blocks against the free pool, forgetting that touching a free hit block
    takes it off the free queue too."""

    def allocate_slots(
        self,
        request,
        num_new_tokens,
        num_new_computed_tokens=0,
        new_computed_blocks=None,
        num_lookahead_tokens=0,
    ):
        m, hits = group(self), new_computed_blocks or []
        need = cdiv(
            request.num_computed_tokens + num_new_computed_tokens + num_new_tokens,
            self.block_size,
        )
        num_new = max(
            0, need - len(hits) - len(m.req_to_blocks.get(request.request_id, []))
        )
        if num_new > self.block_pool.get_num_free_blocks():
            return None
        self.block_pool.touch(hits)
        blocks = m.req_to_blocks[request.request_id]
        blocks.extend(hits)
        new = self.block_pool.get_new_blocks(num_new)
        blocks.extend(new)
        return new


# ---- lookup --------------------------------------------------------------------------------


def test_lookup_stops_at_the_first_miss():
    mgr = KVCacheManager(32, block_size=4)
    a = new_request(mgr, "a", list(range(16)))
    admit(mgr, a)
    mgr.free(a)
    # block 2 differs
    b = new_request(mgr, "b", list(range(8)) + [99] * 4 + list(range(12, 17)))
    hits, n = mgr.get_computed_blocks(b)
    # block 3's tokens match, but not its prefix
    assert [h.block_id for h in hits] == [1, 2] and n == 8


def test_at_most_num_tokens_minus_one_tokens_hit_and_the_recomputed_block_is_a_duplicate():
    mgr = KVCacheManager(32, block_size=4)
    a = new_request(mgr, "a", list(range(8)))
    admit(mgr, a)
    b = new_request(mgr, "b", list(range(8)))  # the same 2-block prompt
    new, n = admit(mgr, b)
    # the last token is recomputed for its logits, so block 1 is not a hit
    assert n == 4
    assert mgr.get_block_ids("b") == [1, 3]
    copies = mgr.block_pool.cached_block_hash_to_block._cache[a.block_hashes[1]]
    # Two blocks for one hash: block tables stay append-only.
    assert sorted(copies) == [2, 3]
    mgr.block_pool.check_invariants()


def test_disabled_caching_never_hits_or_hashes():
    mgr = KVCacheManager(16, block_size=4, enable_caching=False)
    a = new_request(mgr, "a", list(range(8)))
    admit(mgr, a)
    mgr.free(a)
    assert mgr.get_computed_blocks(new_request(mgr, "b", list(range(8)))) == ([], 0)
    assert all(b.block_hash is None for b in mgr.block_pool.blocks)


# ---- allocate_slots ------------------------------------------------------------------------


def two_cached_prefixes(cls):
    """Usable blocks 1..4, block size 2. A=[1,2,3,4] and B=[5,6,7,8] ran and finished, so the
    free queue (head first) is [2, 1, 4, 3]: A's blocks are the least recently used."""
    mgr = cls(5, block_size=2)
    for rid, toks in (("A", [1, 2, 3, 4]), ("B", [5, 6, 7, 8])):
        r = new_request(mgr, rid, toks)
        admit(mgr, r)
        mgr.free(r)
    assert [
        b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()
    ] == [2, 1, 4, 3]
    return mgr


def hits_are_touched_before_new_blocks_are_taken(cls):
    mgr = two_cached_prefixes(cls)
    # hits A's blocks 1, 2, which sit at the queue head
    d = new_request(mgr, "D", [1, 2, 3, 4, 9])
    new, n = admit(mgr, d)
    assert n == 4
    assert mgr.get_block_ids("D") == [1, 2, 4], mgr.get_block_ids("D")
    mgr.block_pool.check_invariants()


def test_hits_are_touched_before_new_blocks_are_taken():
    hits_are_touched_before_new_blocks_are_taken(KVCacheManager)


def test_the_touch_order_check_catches_allocating_first():
    with pytest.raises(AssertionError):
        hits_are_touched_before_new_blocks_are_taken(AllocateBeforeTouchManager)


def evictable_hits_count_against_capacity(cls):
    mgr = two_cached_prefixes(cls)
    before = snapshot(mgr)
    # 2 free hits + 3 new > 4 free
    e = new_request(mgr, "E", [1, 2, 3, 4, 9, 9, 9, 9, 9])
    new, n = admit(mgr, e)
    assert new is None and snapshot(mgr) == before  # refused: nothing changed
    # 2 free hits + 2 new = 4: fits exactly
    f = new_request(mgr, "F", [1, 2, 3, 4, 9, 9, 9])
    new, _ = admit(mgr, f)
    assert len(new) == 2 and mgr.block_pool.get_num_free_blocks() == 0
    mgr.block_pool.check_invariants()


def test_evictable_hits_count_against_capacity():
    evictable_hits_count_against_capacity(KVCacheManager)


def test_the_capacity_check_catches_ignoring_evictable_hits():
    with pytest.raises((AssertionError, ValueError)):
        evictable_hits_count_against_capacity(IgnoreEvictableHitsManager)


def test_hits_held_by_a_running_request_cost_nothing():
    mgr = KVCacheManager(7, block_size=2)
    a = new_request(mgr, "a", [1, 2, 3, 4, 5])
    admit(mgr, a)  # holds blocks 1, 2, 3; 1 and 2 cached
    # 2 hits with ref_cnt 1, 2 new; 3 free
    b = new_request(mgr, "b", [1, 2, 3, 4, 8, 8, 8])
    new, n = admit(mgr, b)
    assert n == 4 and len(new) == 2 and mgr.block_pool.blocks[1].ref_cnt == 2


def test_short_pool_returns_none_and_changes_nothing():
    mgr = KVCacheManager(4, block_size=4)
    a = new_request(mgr, "a", list(range(10)))
    admit(mgr, a)  # 3 blocks: the pool is full
    before = snapshot(mgr)
    assert admit(mgr, new_request(mgr, "b", [5]))[0] is None
    a.append_output_token_ids([1, 2, 3])  # 13 tokens: a 4th block is needed
    assert mgr.allocate_slots(a, 3) is None
    assert snapshot(mgr) == before


def test_watermark_holds_back_new_requests_only():
    # 0.2 of all 11 blocks: 2 held back
    mgr = KVCacheManager(11, block_size=1, watermark=0.2)
    assert mgr.watermark_blocks == 2
    assert admit(mgr, new_request(mgr, "big", list(range(9))))[0] is None
    a = new_request(mgr, "a", list(range(8)))
    assert len(admit(mgr, a)[0]) == 8
    # a running request may use them
    assert len(decode(mgr, a)) == 1 and len(decode(mgr, a)) == 1
    assert decode(mgr, a) is None


def test_decode_hashes_each_block_when_it_fills():
    mgr = KVCacheManager(32, block_size=4)
    a = new_request(mgr, "a", [1, 2, 3, 4, 5, 6])
    admit(mgr, a)
    assert group(mgr).num_cached_block["a"] == 1
    assert decode(mgr, a) == [] and group(mgr).num_cached_block["a"] == 1  # 7 tokens
    # 8 tokens: block 2 full
    assert decode(mgr, a) == [] and group(mgr).num_cached_block["a"] == 2
    assert len(decode(mgr, a)) == 1  # 9th token opens block 3
    b = new_request(mgr, "b", a.all_token_ids[:8] + [0])
    assert mgr.get_computed_blocks(b)[1] == 8  # the decoded tokens' block is a hit


def test_bad_inputs_raise_naming_the_value():
    with pytest.raises(ValueError, match="block_size must be an int >= 1.*, got 0"):
        KVCacheManager(8, block_size=0)
    with pytest.raises(ValueError, match="watermark.*1.5"):
        KVCacheManager(8, watermark=1.5)
    with pytest.raises(ValueError, match="sliding_window must be an int >= 1, got 0"):
        KVCacheManager(8, sliding_window=0)
    mgr = KVCacheManager(8, block_size=4)
    r = new_request(mgr, "r", [1, 2, 3])
    with pytest.raises(ValueError, match="num_new_tokens must be an int >= 1, got 0"):
        mgr.allocate_slots(r, 0)
    with pytest.raises(
        ValueError, match="num_new_computed_tokens=8 does not fit 1 computed blocks"
    ):
        mgr.allocate_slots(r, 1, 8, [mgr.block_pool.blocks[1]])


# ---- the single-type manager's steps ------------------------------------------------------


def test_allocate_slots_is_the_managers_steps_through_the_coordinator():
    mgr = KVCacheManager(8, block_size=4, sliding_window=8)
    m = group(mgr)
    assert (
        isinstance(m, SlidingWindowManager)
        and mgr.coordinator.block_pool is mgr.block_pool
    )
    a = new_request(mgr, "a", list(range(12)))
    # pure
    assert (
        m.get_num_blocks_to_allocate("a", 12, [], 0) == 3
        and mgr.block_pool.get_num_free_blocks() == 7
    )
    assert [b.block_id for b in m.allocate_new_blocks("a", 12)] == [1, 2, 3]
    m.cache_blocks(a, 12)
    assert (
        m.num_cached_block["a"] == 3
        and a.block_hashes[2] == mgr.block_pool.blocks[3].block_hash
    )
    a.num_computed_tokens = 12
    a.append_output_token_ids(7)
    # the next token (12) reads back to 5: block 0 (tokens 0..3) goes
    m.remove_skipped_blocks("a", 12)
    assert mgr.get_block_ids("a") == [0, 2, 3] and mgr.block_pool.blocks[1].ref_cnt == 0
    # running: what its list lacks
    assert m.get_num_blocks_to_allocate("a", 13, [], 12) == 1
    assert mgr.allocate_slots(a, 1) is not None and mgr.get_block_ids("a") == [
        0,
        2,
        3,
        4,
    ]


def test_a_hit_after_the_window_moved_is_padded_with_nulls_and_counts_only_what_it_takes():
    mgr = KVCacheManager(20, block_size=4, sliding_window=8)
    m = group(mgr)
    a = new_request(mgr, "a", list(range(16)))
    admit(mgr, a)
    mgr.free(a)  # blocks 1..4 cached, free (4 at the head: the tail went first)
    b = new_request(mgr, "b", list(range(16)) + [0, 0])
    hits, n = mgr.get_computed_blocks(b)  # [null, null, 3, 4]: the window's two blocks
    assert n == 16 and [h.block_id for h in hits] == [0, 0, 3, 4]
    # 18 tokens need 5 blocks; 16 computed skip 2 (the window for token 16 starts at 9): 1 new
    # block, plus the 2 free hits it takes off the queue; the nulls cost nothing
    assert m.get_num_blocks_to_allocate("b", 18, hits, 16) == 1 + 2
    m.add_local_computed_blocks("b", hits, 16)
    assert mgr.get_block_ids("b") == [0, 0, 3, 4] and m.num_cached_block["b"] == 4
    # only the window's are touched
    assert [mgr.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [0, 0, 1, 1]


def test_a_refused_call_still_gives_back_out_of_window_blocks():
    mgr = KVCacheManager(4, block_size=2, sliding_window=3)  # 3 usable blocks
    c = new_request(mgr, "c", list(range(6)))
    admit(mgr, c)  # blocks 1, 2, 3: the pool is full
    # 11 tokens: 6 blocks, 2 of them skipped: 1 more than there are
    c.append_output_token_ids([7, 7, 7, 7, 7])
    assert mgr.allocate_slots(c, 5) is None  # refused ...
    # ... after the release
    assert (
        mgr.get_block_ids("c") == [0, 0, 3]
        and mgr.block_pool.get_num_free_blocks() == 2
    )


# ---- free ----------------------------------------------------------------------------------


def prefix_survives_pressure(cls):
    """A 3-block prompt finishes; a newcomer then takes the 2 least recently used blocks.
    Reverse free makes those the prefix's LAST blocks, so its start still hits."""
    mgr = cls(5, block_size=2)
    a = new_request(mgr, "a", [1, 2, 3, 4, 5, 6])
    admit(mgr, a)
    mgr.free(a)
    admit(mgr, new_request(mgr, "x", [9, 9, 9, 9]))
    again = new_request(mgr, "a2", [1, 2, 3, 4, 5, 6, 7])
    return mgr.get_computed_blocks(again)[1]


def test_free_in_reverse_order_keeps_the_shared_start_longest():
    assert prefix_survives_pressure(KVCacheManager) == 4


def test_the_reverse_free_check_catches_forward_free():
    # the start went first: nothing hits
    assert prefix_survives_pressure(ForwardFreeManager) == 0


# ---- sliding window ------------------------------------------------------------------------


def test_out_of_window_blocks_become_null_blocks():
    mgr = KVCacheManager(20, block_size=4, sliding_window=8)
    a = new_request(mgr, "a", list(range(12)))
    admit(mgr, a)
    assert mgr.get_block_ids("a") == [1, 2, 3]
    decode(mgr, a)  # next token at 12 reads back to position 5: block 0 (0..3) is out
    assert (
        mgr.get_block_ids("a") == [0, 2, 3, 4]
        and group(mgr).req_to_blocks["a"][0] is mgr.block_pool.null_block
    )
    pool = mgr.block_pool
    assert (
        pool.blocks[1].ref_cnt == 0
        and pool.free_block_queue.fake_free_list_tail.prev_free_block is pool.blocks[1]
    )
    for _ in range(4):
        # with 16 tokens computed, the next reads back to 9: block 1 (4..7) goes
        decode(mgr, a)
    assert mgr.get_block_ids("a")[:2] == [0, 0]
    assert pool.null_block.ref_cnt == 0 and pool.null_block.prev_free_block is None
    pool.check_invariants()
    mgr.free(a)
    assert pool.get_num_free_blocks() == 19
    pool.check_invariants()


def test_vllm_window_convention_drops_position_num_computed_minus_window():
    # vLLM's sliding_window counts the query too: the query at position n reads n - window + 1 .. n,
    # so position n - window goes (SGLang's window leaves the query out and keeps it: test_swa.py).
    mgr = KVCacheManager(20, block_size=1, sliding_window=4)
    a = new_request(mgr, "a", list(range(10)))
    admit(mgr, a)
    decode(mgr, a)  # 10 tokens computed; the query at 10 reads 7..10
    ids = mgr.get_block_ids("a")
    assert ids[:7] == [0] * 7 and 0 not in ids[7:]


def test_computed_blocks_without_prefix_caching_are_refused_before_anything_changes():
    mgr = KVCacheManager(20, block_size=4, sliding_window=8, enable_caching=False)
    a = new_request(mgr, "a", list(range(12)))
    admit(mgr, a)
    a.append_output_token_ids(7)
    before = snapshot(mgr)
    with pytest.raises(ValueError, match="prefix caching is disabled"):
        # block 0 (positions 0..3) is out of window
        mgr.allocate_slots(a, 1, 0, [mgr.block_pool.blocks[9]])
    assert snapshot(mgr) == before


def test_sliding_window_hit_needs_only_the_blocks_in_the_window():
    mgr = KVCacheManager(20, block_size=4, sliding_window=8)
    a = new_request(mgr, "a", list(range(16)))
    admit(mgr, a)
    mgr.free(a)
    b = new_request(mgr, "b", list(range(16)) + [0])
    hits, n = mgr.get_computed_blocks(b)
    # The scan from the right stops at the first run of cdiv(8 - 1, 4) = 2 cached blocks.
    assert (
        n == 16
        and hits[:2] == [mgr.block_pool.null_block] * 2
        and [h.block_id for h in hits[2:]] == [3, 4]
    )
    mgr.block_pool.get_new_blocks(mgr.block_pool.get_num_free_blocks() - 4)
    # evicts a's blocks 4 and 3 (the prefix's tail goes first)
    mgr.block_pool.get_new_blocks(2)
    hits, n = mgr.get_computed_blocks(b)
    # a run from the start still counts
    assert n == 8 and [h.block_id for h in hits] == [1, 2]
    c = new_request(mgr, "c", list(range(8)) + [5] * 9)
    assert mgr.get_computed_blocks(c)[1] == 8


def test_sliding_window_hit_fills_skipped_blocks_with_null():
    mgr = KVCacheManager(20, block_size=4, sliding_window=8)
    a = new_request(mgr, "a", list(range(16)))
    admit(mgr, a)
    mgr.free(a)
    pool = mgr.block_pool
    # keep block 1 out of the queue's way, then evict block 2 only
    pool.touch([pool.blocks[1]])
    pool._maybe_evict_cached_block(pool.blocks[2])
    pool.free_blocks([pool.blocks[1]])
    hits, n = mgr.get_computed_blocks(new_request(mgr, "b", list(range(16)) + [1]))
    # Blocks 2 and 3 (tokens 8..15) form a run of cdiv(8 - 1, 4) = 2: enough for the window.
    assert (
        n == 16
        and hits[0] is mgr.block_pool.null_block
        and hits[1] is mgr.block_pool.null_block
    )
    assert [h.block_id for h in hits[2:]] == [3, 4]
    new, _ = admit(mgr, new_request(mgr, "c", list(range(16)) + [1]))
    assert mgr.get_block_ids("c")[:3] == [0, 0, 3]
    pool.check_invariants()


# ---- property tests ------------------------------------------------------------------------

PREFIXES = [[], [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9], [3] * 11]

op = st.one_of(
    st.tuples(
        st.just("add"),
        st.integers(0, len(PREFIXES) - 1),
        st.integers(1, 9),
        st.integers(0, 3),
    ),
    st.tuples(
        st.just("decode"), st.integers(0, 99), st.integers(1, 3), st.integers(0, 3)
    ),
    st.tuples(st.just("free"), st.integers(0, 99), st.just(0), st.just(0)),
)


@pytest.mark.parametrize("window", [None, 6])
@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(op, max_size=40),
    num_blocks=st.integers(3, 24),
    block_size=st.sampled_from([1, 2, 4]),
)
def test_random_streams_keep_the_books_consistent(window, ops, num_blocks, block_size):
    """Every block is in the queue with ref_cnt 0 or out of it with ref_cnt > 0; ref counts equal
    the number of running requests holding the block; the map holds exactly the hashed blocks."""
    if window is None:
        mgr = KVCacheManager(num_blocks, block_size=block_size)
    else:
        mgr = KVCacheManager(num_blocks, block_size=block_size, sliding_window=window)
    running, n = [], 0
    for kind, a, b, c in ops:
        if kind == "add":
            n += 1
            req = new_request(mgr, f"r{n}", PREFIXES[a] + [10 + c] * b)
            new, hit = admit(mgr, req)
            if new is not None:
                running.append(req)
                assert hit % block_size == 0 and hit <= req.num_tokens - 1
        elif kind == "decode" and running:
            req = running[a % len(running)]
            for _ in range(b):
                if decode(mgr, req, 10 + c) is None:
                    # The scheduler would preempt; keep the request as it was.
                    req.all_token_ids.pop()
                    req.block_hashes[:] = req.block_hashes[
                        : req.num_tokens // block_size
                    ]
                    break
        elif kind == "free" and running:
            mgr.free(running.pop(a % len(running)))
        mgr.block_pool.check_invariants()
        holders = {}
        for req in running:
            blocks = group(mgr).req_to_blocks[req.request_id]
            assert len(blocks) == cdiv(req.num_computed_tokens, block_size)
            for blk in blocks:
                if not blk.is_null:
                    holders[blk.block_id] = holders.get(blk.block_id, 0) + 1
        for blk in mgr.block_pool.blocks[1:]:
            assert blk.ref_cnt == holders.get(blk.block_id, 0), blk
    for req in running:
        mgr.free(req)
    assert mgr.block_pool.get_num_free_blocks() == num_blocks - 1
    mgr.block_pool.check_invariants()


def test_a_foreign_computed_block_is_refused_in_debug_mode_only():
    """allocate_slots scans the computed blocks it is handed only when the pool's debug mode is on
    (vLLM trusts its scheduler): a block of another pool is refused before anything is taken."""
    mgr, other = KVCacheManager(8, 4), KVCacheManager(8, 4)
    req = new_request(mgr, "r", list(range(6)))
    foreign = other.block_pool.get_new_blocks(1)
    mgr.block_pool.debug_mode = True
    before = snapshot(mgr)
    with pytest.raises(ValueError, match="not a block of this pool"):
        mgr.allocate_slots(req, 2, 4, foreign)
    assert snapshot(mgr) == before
    mgr.block_pool.debug_mode = (
        False  # off: no scan, the foreign block goes through as in vLLM
    )
    assert mgr.allocate_slots(req, 2, 4, foreign) is not None
