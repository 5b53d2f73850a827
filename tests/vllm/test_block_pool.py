"""vLLM's free queue and block pool: exact orders, lazy eviction, the null block, copies, debug.

Pools and queues are built with ``debug_mode=True`` (memlab's per-block scans), but where a test
says otherwise: debug mode off is vLLM's trusting hot path.
"""

from types import SimpleNamespace

import pytest

from memlab.vllm.block_pool import (
    BlockHashToBlockMap,
    BlockPool,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
)


def ids(blocks):
    return [b.block_id for b in blocks]


def queue_ids(pool):
    return ids(pool.free_block_queue.get_all_free_blocks())


def cache(pool, blocks, hashes):
    """Give blocks their hashes the way the manager does (through cache_full_blocks)."""
    pool.cache_full_blocks(
        SimpleNamespace(block_hashes=list(hashes)), blocks, 0, len(hashes)
    )


# ---- the free queue ------------------------------------------------------------------------


def make_queue(n):
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks, debug_mode=True)


def test_queue_starts_in_block_id_order_and_pops_from_the_head():
    blocks, q = make_queue(6)
    assert ids(q.get_all_free_blocks()) == [0, 1, 2, 3, 4, 5] and q.num_free_blocks == 6
    assert q.popleft().block_id == 0
    assert ids(q.popleft_n(3)) == [1, 2, 3]
    assert ids(q.get_all_free_blocks()) == [4, 5] and len(q) == 2
    assert all(
        b.prev_free_block is None and b.next_free_block is None for b in blocks[:4]
    )
    assert q.popleft_n(0) == []


def test_queue_remove_from_the_middle_is_o1_relinking():
    blocks, q = make_queue(5)
    q.remove(blocks[2])
    assert ids(q.get_all_free_blocks()) == [0, 1, 3, 4] and q.num_free_blocks == 4
    assert (
        blocks[1].next_free_block is blocks[3]
        and blocks[3].prev_free_block is blocks[1]
    )
    q.remove(blocks[0])
    q.remove(blocks[4])
    assert ids(q.get_all_free_blocks()) == [1, 3]


def test_queue_append_prepend_keep_the_given_order():
    blocks, q = make_queue(3)
    extra = [KVCacheBlock(i) for i in range(3, 8)]
    q.append_n(extra[:2])
    q.prepend_n(extra[2:4])
    q.append(extra[4])
    assert (
        ids(q.get_all_free_blocks()) == [5, 6, 0, 1, 2, 3, 4, 7]
        and q.num_free_blocks == 8
    )
    q.append_n([])
    q.prepend_n([])
    assert q.num_free_blocks == 8


def test_queue_errors_on_empty_pop_and_unlinked_remove():
    blocks, q = make_queue(2)
    # vLLM's queue has a bare assert here; memlab says it in the words of get_new_blocks.
    with pytest.raises(ValueError, match="^Cannot get 3 free blocks from the pool$"):
        q.popleft_n(3)
    assert q.num_free_blocks == 2  # refused: nothing popped
    assert ids(q.get_all_free_blocks()) == [0, 1]
    with pytest.raises(ValueError, match="n must be an int >= 0"):
        q.popleft_n(-1)
    q.popleft_n(2)
    with pytest.raises(ValueError, match="^No free blocks available$"):  # vLLM's words
        q.popleft()
    assert q.popleft_n(0) == []
    with pytest.raises(ValueError, match="block 1: not queued"):
        q.remove(blocks[1])
    q.append(blocks[1])
    with pytest.raises(ValueError, match="append.*queued already"):
        q.append(blocks[1])
    assert q.num_free_blocks == 1


def test_block_is_slotted_and_its_hash_is_set_once_through_set_block_hash():
    b = KVCacheBlock(3)
    assert not hasattr(b, "__dict__")
    with pytest.raises(AttributeError):
        b.block_hash = b"h"  # vLLM's property is read-only: set_block_hash() sets it
    b.set_block_hash(b"h")
    assert b.block_hash == b"h"
    with pytest.raises(AssertionError, match="The block already has a hash"):
        b.set_block_hash(b"other")  # vLLM's assert, word for word
    assert b.block_hash == b"h"
    b.reset_hash()
    assert b.block_hash is None
    b.set_block_hash(b"again")
    assert b.block_hash == b"again"


# ---- the pool ------------------------------------------------------------------------------


def test_null_block_is_popped_at_start_never_handed_out_never_freed():
    pool = BlockPool(8, debug_mode=True)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert queue_ids(pool) == [1, 2, 3, 4, 5, 6, 7]
    assert pool.get_usage() == 0.0  # the null block is not "used"
    got = pool.get_new_blocks(7)
    assert 0 not in ids(got) and pool.get_usage() == 1.0
    pool.free_blocks([pool.null_block, got[0], pool.null_block])
    assert queue_ids(pool) == [1] and pool.null_block.prev_free_block is None
    pool.touch([pool.null_block])
    assert pool.null_block.ref_cnt == 0
    pool.check_invariants()


def test_get_new_blocks_short_raises_and_changes_nothing():
    pool = BlockPool(4, debug_mode=True)
    with pytest.raises(ValueError, match="^Cannot get 4 free blocks from the pool$"):
        pool.get_new_blocks(4)
    with pytest.raises(ValueError, match="-1"):
        pool.get_new_blocks(-1)
    assert queue_ids(pool) == [1, 2, 3]
    pool.check_invariants()
    with pytest.raises(ValueError, match="num_gpu_blocks.*1"):
        BlockPool(1)


def expected_order_after_free(pool):
    """Request holds blocks 1..5; 1-3 full and cached, 4-5 not (a partial tail and a block the
    step has not filled). Freed in reverse: unhashed 5, 4 go to the head in that order, hashed
    3, 2, 1 to the tail, so the prefix's last block is evicted first."""
    blocks = pool.get_new_blocks(5)
    cache(pool, blocks[:3], ["h1", "h2", "h3"])
    pool.free_blocks(blocks[::-1])
    return queue_ids(pool)


def test_exact_free_queue_order_after_freeing_mixed_hashed_and_unhashed_blocks():
    assert expected_order_after_free(BlockPool(10, debug_mode=True)) == [
        5,
        4,
        6,
        7,
        8,
        9,
        3,
        2,
        1,
    ]


class BuggyTailPool(BlockPool):
    """Bug zoo: every freed block goes to the tail, as in a plain FIFO free list."""

    def free_blocks(self, ordered_blocks):
        blocks = list(ordered_blocks)
        for b in blocks:
            b.ref_cnt -= 1
        self.free_block_queue.append_n(
            [b for b in blocks if b.ref_cnt == 0 and not b.is_null]
        )


def test_the_order_check_catches_unhashed_blocks_appended_to_the_tail():
    # Unhashed blocks at the tail are reused LAST, so hittable blocks get evicted before them.
    assert expected_order_after_free(BuggyTailPool(10, debug_mode=True)) != [
        5,
        4,
        6,
        7,
        8,
        9,
        3,
        2,
        1,
    ]


def test_hit_on_a_free_block_takes_it_out_of_the_middle():
    pool = BlockPool(10, debug_mode=True)
    expected_order_after_free(pool)
    hit = pool.get_cached_block("h2")
    assert hit.block_id == 2 and hit.ref_cnt == 0
    pool.touch([hit])
    assert hit.ref_cnt == 1 and queue_ids(pool) == [5, 4, 6, 7, 8, 9, 3, 1]
    pool.touch([hit])  # a second request shares it: no queue change
    assert hit.ref_cnt == 2 and queue_ids(pool) == [5, 4, 6, 7, 8, 9, 3, 1]
    pool.free_blocks([hit])
    assert queue_ids(pool) == [5, 4, 6, 7, 8, 9, 3, 1]  # still referenced
    pool.free_blocks([hit])
    # most recently used: evicted last
    assert queue_ids(pool) == [5, 4, 6, 7, 8, 9, 3, 1, 2]
    pool.check_invariants()


def test_eviction_happens_when_a_block_is_reused_not_when_it_is_freed():
    pool = BlockPool(10, debug_mode=True)
    expected_order_after_free(pool)
    assert pool.get_cached_block("h3").block_id == 3  # freed, still hittable
    assert pool.num_evictions == 0
    assert ids(pool.get_new_blocks(6)) == [5, 4, 6, 7, 8, 9]
    assert pool.get_cached_block("h3") is not None and pool.num_evictions == 0
    (b3,) = pool.get_new_blocks(1)
    assert b3.block_id == 3 and b3.block_hash is None and b3.ref_cnt == 1
    assert pool.get_cached_block("h3") is None and pool.num_evictions == 1
    assert pool.get_cached_block("h1").block_id == 1  # the prefix's start stays longest
    pool.check_invariants()


def test_duplicate_blocks_for_one_hash():
    pool = BlockPool(6, debug_mode=True)
    a, b = pool.get_new_blocks(1), pool.get_new_blocks(1)
    cache(pool, a, ["same"])
    cache(pool, b, ["same"])  # a second request computed the same prefix meanwhile
    assert len(pool.cached_block_hash_to_block) == 1
    assert pool.cached_block_hash_to_block._cache == {"same": {1: a[0], 2: b[0]}}
    assert pool.get_cached_block("same") is a[0]  # the first copy cached
    pool.free_blocks(b)
    pool.free_blocks(a)
    assert queue_ids(pool) == [3, 4, 5, 2, 1]
    pool.get_new_blocks(4)  # reaches block 2: evicts that copy only
    assert pool.get_cached_block("same").block_id == 1
    # vLLM keeps the dict of the one copy left (its union type turns back only when empty).
    assert pool.cached_block_hash_to_block._cache == {"same": {1: a[0]}}
    pool.check_invariants()


def test_hash_map_pop_removes_only_the_named_copy():
    m = BlockHashToBlockMap()
    b1, b2, b3 = KVCacheBlock(1), KVCacheBlock(2), KVCacheBlock(3)
    for b in (b1, b2, b3):
        m.insert("k", b)
    assert m.pop("k", 9) is None and m.pop("nope", 1) is None
    assert m.pop("k", 2) is b2 and m.pop("k", 1) is b1
    assert m._cache == {"k": {3: b3}}  # as vLLM: a map of the one block left
    assert m.get_one_block("k") is b3
    assert m.pop("k", 3) is b3 and m.get_one_block("k") is None
    assert len(m) == 0
    m.insert("k", b1)
    assert m._cache == {"k": b1}  # one copy: the block itself
    assert m.pop("k", 2) is None and m._cache == {"k": b1}  # another block's: kept


def test_reset_prefix_cache_refused_while_blocks_are_in_use():
    pool = BlockPool(6, debug_mode=True)
    blocks = pool.get_new_blocks(2)
    cache(pool, blocks, ["a", "b"])
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block("a") is blocks[0]  # refused: nothing changed
    pool.free_blocks(blocks[::-1])
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block("a") is None and all(
        b.block_hash is None for b in pool.blocks
    )
    pool.check_invariants()


def test_double_free_raises_and_changes_nothing():
    pool = BlockPool(6, debug_mode=True)
    a, b = pool.get_new_blocks(2)
    pool.free_blocks([a])
    with pytest.raises(
        ValueError, match=f"block {a.block_id} freed more often than taken"
    ):
        pool.free_blocks([b, a])
    assert b.ref_cnt == 1 and b.block_id not in queue_ids(pool)
    pool.check_invariants()


def test_caching_disabled_sends_every_freed_block_to_the_head():
    pool = BlockPool(6, enable_caching=False, debug_mode=True)
    blocks = pool.get_new_blocks(3)
    pool.free_blocks(blocks[::-1])
    assert queue_ids(pool) == [3, 2, 1, 4, 5]


def test_cache_full_blocks_checks_it_has_the_hashes():
    pool = BlockPool(6, debug_mode=True)
    blocks = pool.get_new_blocks(2)
    with pytest.raises(
        ValueError, match="num_full_blocks 2: more than blocks or hashes"
    ):
        pool.cache_full_blocks(SimpleNamespace(block_hashes=["x"]), blocks, 0, 2)


def test_a_refused_cache_full_blocks_changes_nothing():
    pool = BlockPool(6, debug_mode=True)
    blocks = pool.get_new_blocks(3)
    cache(pool, blocks[2:], ["c"])  # the third block is hashed already
    with pytest.raises(
        ValueError, match=f"cache of block {blocks[2].block_id}: hashed"
    ):
        pool.cache_full_blocks(
            SimpleNamespace(block_hashes=["a", "b", "x"]), blocks, 0, 3
        )
    assert blocks[0].block_hash is None and blocks[1].block_hash is None
    assert pool.get_cached_block("a") is None and pool.get_cached_block("b") is None
    a, b = blocks[:2]
    with pytest.raises(
        ValueError, match=f"cache of block {a.block_id}: hashed or listed twice"
    ):
        pool.cache_full_blocks(SimpleNamespace(block_hashes=["a", "b"]), [a, a], 0, 2)
    assert a.block_hash is None and pool.get_cached_block("a") is None
    pool.check_invariants()


def test_check_invariants_catches_a_corrupted_pool():
    pool = BlockPool(6, debug_mode=True)
    (b,) = pool.get_new_blocks(1)
    b.ref_cnt = 0  # out of the queue but unreferenced: a leak
    with pytest.raises(AssertionError, match=f"block {b.block_id} is out of the queue"):
        pool.check_invariants()
    pool = BlockPool(6, debug_mode=True)
    pool.blocks[2]._block_hash = "ghost"  # hashed but not in the map
    with pytest.raises(AssertionError, match="hashed and mapped differ"):
        pool.check_invariants()


def test_a_hundred_thousand_blocks_are_cheap():
    pool = BlockPool(100_000)
    assert pool.get_num_free_blocks() == 99_999
    got = pool.get_new_blocks(50_000)
    pool.free_blocks(got[::-1])
    assert pool.get_num_free_blocks() == 99_999


# ---- debug mode: the per-block scans run there only -------------------------------------------

SCANS = ("_check_blocks", "_check_unqueued", "_check_queued")


def count_scans(monkeypatch):
    """Wrap each per-block validator of the module so that every call to it is counted."""
    import memlab.vllm.block_pool as bp

    calls = dict.fromkeys(SCANS, 0)

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    for name in SCANS:
        monkeypatch.setattr(bp, name, counted(name, getattr(bp, name)))
    return calls


def hot_calls(pool):
    """A request's life on the pool, one call at a time (allocate, cache, free: hashed, so to the
    tail; hit, free again), then the queue's own batch links; the name of each call that scans."""
    blocks = pool.get_new_blocks(3)  # O(1) checks only: its count
    cache(pool, blocks, ["a", "b", "c"])
    yield "cache_full_blocks"
    pool.free_blocks(blocks[::-1])
    yield "free_blocks"
    hits = [pool.get_cached_block(h) for h in ("a", "b")]
    pool.touch(hits)
    yield "touch"
    pool.free_blocks(hits[::-1])
    yield "free_blocks"
    queue = pool.free_block_queue
    taken = queue.popleft_n(2)
    queue.prepend_n(taken[:1])
    yield "prepend_n"
    queue.append_n(taken[1:])
    yield "append_n"


def scans_per_call(pool, calls):
    before, out = 0, []
    for name in hot_calls(pool):
        out.append((name, sum(calls.values()) - before))
        before = sum(calls.values())
    return out


def test_the_scans_run_in_debug_mode_only_and_the_mode_is_read_per_call(monkeypatch):
    pool = BlockPool(8)  # debug mode off: vLLM's hot path, which trusts its caller
    calls = count_scans(monkeypatch)  # (the queue checks its blocks once, when built)
    off = scans_per_call(pool, calls)
    assert all(n == 0 for _, n in off), (
        f"a per-block scan ran outside debug mode: {off}"
    )
    pool.debug_mode = (
        True  # read on every call: switching it on later works, the queue's too
    )
    assert pool.free_block_queue.debug_mode is True
    on = scans_per_call(pool, calls)
    assert all(n > 0 for _, n in on), f"a call skipped its scan in debug mode: {on}"
    pool.check_invariants()


def bad_calls():
    """(what, the bad call on a pool holding ``held``): refused in debug mode, trusted outside
    it."""
    return [
        (
            "free of a block of another pool",
            lambda pool, held: pool.free_blocks([BlockPool(8).get_new_blocks(1)[0]]),
        ),
        (
            "touch of a block of another pool",
            lambda pool, held: pool.touch([held[0], BlockPool(8).blocks[5]]),
        ),
        ("double free", lambda pool, held: pool.free_blocks([held[0], held[0]])),
        (
            "a queued block linked again (a cycle)",
            lambda pool, held: pool.free_block_queue.append_n([pool.blocks[-1]]),
        ),  # the queue's last block
    ]


@pytest.mark.parametrize("what,call", bad_calls(), ids=[w for w, _ in bad_calls()])
def test_debug_mode_refuses_what_vllm_trusts_its_caller_with(what, call):
    pool = BlockPool(8, debug_mode=True)
    held = pool.get_new_blocks(2)
    with pytest.raises(ValueError, match="block"):
        call(pool, held)
    pool.check_invariants()  # refused before anything changed
    # Debug mode off: no scan, the call goes through as in vLLM, and the books break.
    pool = BlockPool(8)
    held = pool.get_new_blocks(2)
    call(pool, held)
    with pytest.raises(AssertionError):
        pool.check_invariants()


def test_remove_checks_the_type_of_its_block_in_debug_mode_only():
    _, q = make_queue(2)  # debug mode on
    with pytest.raises(TypeError, match="block must be KVCacheBlock, got NoneType"):
        q.remove(None)
    # vLLM's remove: the free-queue check only (a touch calls it per hit block)
    q.debug_mode = False
    with pytest.raises(AttributeError):
        q.remove(None)
    assert q.num_free_blocks == 2


# ---- vLLM 0.33's names, asserts and calling conventions -----------------------------------------


def test_get_new_blocks_keeps_vllms_ref_cnt_assert():
    """vLLM asserts that a block popped from the free queue has ref_cnt 0 (block_pool.py,
    get_new_blocks); a queue holding a referenced block is a broken book, caught there."""
    pool = BlockPool(4)
    pool.blocks[1].ref_cnt = 2  # referenced, yet at the head of the free queue
    with pytest.raises(AssertionError):
        pool.get_new_blocks(1)


class NoRefAssertPool(BlockPool):
    """Bug zoo: get_new_blocks without vLLM's assert (memlab's before issue 31)."""

    def get_new_blocks(self, num_blocks):
        ret = self.free_block_queue.popleft_n(num_blocks)
        for block in ret:
            self._maybe_evict_cached_block(block)
            block.ref_cnt = 1
        return ret


def test_the_ref_cnt_check_can_fail():
    pool = NoRefAssertPool(4)
    pool.blocks[1].ref_cnt = 2
    assert pool.get_new_blocks(1)[0].ref_cnt == 1  # the broken book passes unnoticed


def test_vllms_calls_need_no_adapter():
    """vLLM 0.33's own calls (tests/v1/core/test_prefix_caching.py's): the pool built with
    hash_block_size, cache_full_blocks by keyword with block_size and kv_cache_group_id,
    get_cached_block with kv_cache_group_ids (a list per group, None on a miss)."""
    pool = BlockPool(num_gpu_blocks=5, enable_caching=True, hash_block_size=4)
    req = SimpleNamespace(block_hashes=[b"a", b"b", b"c"])
    blocks = [KVCacheBlock(block_id=i) for i in range(2)]
    pool.cache_full_blocks(
        request=req,
        blocks=blocks,
        num_cached_blocks=0,
        num_full_blocks=2,
        block_size=4,
        kv_cache_group_id=0,
    )
    assert len(pool.cached_block_hash_to_block) == 2
    assert pool.get_cached_block(b"a", kv_cache_group_ids=[0]) == [blocks[0]]
    assert pool.get_cached_block(b"c", kv_cache_group_ids=[0]) is None
    assert pool.get_cached_block(b"b") is blocks[1]  # memlab's short call
    with pytest.raises(ValueError, match="kv_cache_group_ids"):
        pool.get_cached_block(b"a", kv_cache_group_ids=[1])  # memlab's pool: one group
    with pytest.raises(ValueError, match="kv_cache_group_id"):
        pool.cache_full_blocks(
            req, [*blocks, KVCacheBlock(3)], 2, 3, 4, kv_cache_group_id=1
        )
    with pytest.raises(ValueError, match="block_size 16 is not hash_block_size"):
        pool.cache_full_blocks(req, [*blocks, KVCacheBlock(3)], 2, 3, 16, 0)
    assert len(pool.cached_block_hash_to_block) == 2  # the refusals changed nothing


def test_what_debug_mode_off_trusts_is_vllms_and_documented():
    """With debug mode off the pool trusts its caller's blocks as vLLM does: a double free
    leaves ref_cnt -1, a hashed block stops cache_full_blocks at vLLM's assert after the
    blocks before it were cached. The docstrings say so; debug mode refuses both first."""
    assert "ref_cnt goes to -1" in BlockPool.free_blocks.__doc__
    assert "vLLM's" in BlockPool.cache_full_blocks.__doc__
    pool = BlockPool(6)
    (a,) = pool.get_new_blocks(1)
    pool.free_blocks([a, a])
    assert a.ref_cnt == -1
    pool = BlockPool(6)
    blocks = pool.get_new_blocks(2)
    cache(pool, blocks[1:], ["b"])
    with pytest.raises(AssertionError, match="The block already has a hash"):
        cache(pool, blocks, ["a", "x"])
    assert blocks[0].block_hash == "a"  # cached before the assert: vLLM's order
    pool = BlockPool(6, debug_mode=True)
    blocks = pool.get_new_blocks(2)
    cache(pool, blocks[1:], ["b"])
    with pytest.raises(ValueError, match="hashed"):
        cache(pool, blocks, ["a", "x"])
    assert blocks[0].block_hash is None  # refused first
    with pytest.raises(ValueError, match="freed more often than taken"):
        pool.free_blocks([blocks[0], blocks[0]])
    pool.check_invariants()


def test_debug_mode_refuses_removing_a_block_of_another_queue():
    _, q = make_queue(3)
    other_blocks, other = make_queue(2)
    with pytest.raises(ValueError, match="in another free queue"):
        q.remove(other_blocks[1])
    assert q.num_free_blocks == 3 and other.num_free_blocks == 2
    q.remove(q.fake_free_list_tail.prev_free_block)  # its own last block: fine
    assert q.num_free_blocks == 2
