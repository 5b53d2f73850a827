"""vLLM's block pool (vllm/v1/core/block_pool.py, kv_cache_utils.py): every block's metadata.

vLLM keeps KVCacheBlock and FreeKVCacheBlockQueue in vllm/v1/core/kv_cache_utils.py and
BlockPool in vllm/v1/core/block_pool.py; memlab keeps the three together because they are one
idea. A block is free (in the queue, ref_cnt 0, maybe still carrying a hash that a prefix hit
can revive) or in use (out of the queue, ref_cnt > 0). The queue's head is reused first, so the
queue is at the same time the prefix cache's eviction order.

Where memlab trusts its caller as vLLM does: with ``debug_mode`` off (vLLM's hot path) the
BLOCKS handed to ``touch``, ``free_blocks``, ``cache_full_blocks`` and the queue are trusted to
be this pool's and in the state the call expects. A block freed twice then leaves ``ref_cnt ==
-1``, a block of another pool is linked into this queue, and a block that already has a hash
stops ``cache_full_blocks`` at vLLM's assert after the blocks before it were cached. Debug mode
(the tests turn it on) scans every block first and refuses all of these before anything
changes. The call's own arguments (its counts, its containers, a request without hashes) are
checked on every call: that costs O(1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterator, Sequence
from itertools import islice

from memlab.common import _checks

BlockHash = Hashable  # bytes (sha256) or int (the fast hash), or a trace's own block id
MAX_BLOCKS = 2**31 - 1  # block ids are int32 in the worker's block table
HASHED = "The block already has a hash. This should not happen."  # vLLM's assert


class KVCacheBlock:
    """Metadata of one KV block: slotted, as vLLM's dataclass (a pool makes 100,000s at start).

    vLLM 0.33's block also records how many prefix tokens its hash covers and which pool owns
    it (partial-block hits, frees across pools); memlab's blocks are cached whole, in one pool.
    """

    __slots__ = (
        "block_id",
        "ref_cnt",
        "_block_hash",
        "prev_free_block",
        "next_free_block",
        "is_null",
    )

    def __init__(self, block_id: int, ref_cnt: int = 0):
        self.block_id = block_id
        self.ref_cnt = ref_cnt
        # The content key of a full, cached block; None otherwise.
        self._block_hash: BlockHash | None = None
        # The free queue's links live on the block itself: linking allocates no Python object.
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    @property
    def block_hash(self) -> BlockHash | None:
        return self._block_hash

    def set_block_hash(self, block_hash: BlockHash) -> None:
        assert self._block_hash is None, HASHED
        self._block_hash = block_hash

    def reset_hash(self) -> None:
        """Reset the block hash when the block is evicted."""
        self._block_hash = None

    def __repr__(self) -> str:
        prev_block = self.prev_free_block
        next_block = self.next_free_block
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"_block_hash={self._block_hash!r}, "
            f"prev_free_block={prev_block.block_id if prev_block else None}, "
            f"next_free_block={next_block.block_id if next_block else None})"
        )


class FreeKVCacheBlockQueue:
    """Free blocks as an intrusive doubly linked list between a fake head and a fake tail.

    Not a deque: a prefix hit on a free block must take it out of the MIDDLE in O(1), which a
    deque cannot. The sentinels mean no operation ever tests for an empty end.

    ``debug_mode`` is memlab's (vLLM has none), read on every call; a pool sets its queue's.
    """

    __slots__ = (
        "num_free_blocks",
        "fake_free_list_head",
        "fake_free_list_tail",
        "debug_mode",
    )

    def __init__(self, blocks: Sequence[KVCacheBlock], debug_mode: bool = False):
        # Checked once, at start: the queue trusts its blocks from then on.
        _checks.instance("blocks", blocks, (list, tuple), "a list of KVCacheBlocks")
        _check_blocks("blocks", blocks)
        self.debug_mode = debug_mode
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        chain = [self.fake_free_list_head, *blocks, self.fake_free_list_tail]
        for left, right in zip(chain, chain[1:]):
            left.next_free_block = right
            right.prev_free_block = left

    def popleft(self) -> KVCacheBlock:
        head = self.fake_free_list_head
        first_block = head.next_free_block
        if first_block is self.fake_free_list_tail:
            assert self.num_free_blocks == 0, (
                f"num_free_blocks ({self.num_free_blocks}) is out of sync with the free list."
            )
            raise ValueError("No free blocks available")
        head.next_free_block = first_block.next_free_block
        first_block.next_free_block.prev_free_block = head
        first_block.prev_free_block = first_block.next_free_block = None
        self.num_free_blocks -= 1
        return first_block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Pop the first n free blocks. Asking for more than are free is refused before anything
        is popped, in the words of vLLM's ``BlockPool.get_new_blocks`` (vLLM's queue has only a
        bare assert: its one caller counts first)."""
        n = _checks.integer("n", n, 0)
        if n == 0:
            return []
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot get {n} free blocks from the pool")
        self.num_free_blocks -= n
        ret = []
        curr_block = self.fake_free_list_head.next_free_block
        for _ in range(n):
            ret.append(curr_block)
            last_block = curr_block
            curr_block = curr_block.next_free_block
            last_block.prev_free_block = last_block.next_free_block = None
        # One relink at the end instead of one per popped block.
        self.fake_free_list_head.next_free_block = curr_block
        curr_block.prev_free_block = self.fake_free_list_head
        return ret

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink a block from anywhere in the queue in O(1) (a prefix hit on a free block). A
        block out of the queue is refused, as vLLM refuses it (a RuntimeError there, a
        ValueError naming the block here); debug mode also checks it is a KVCacheBlock of THIS
        queue (a walk to the fake tail)."""
        if self.debug_mode:
            _check_queued(self, block)
        prev_block, next_block = block.prev_free_block, block.next_free_block
        if prev_block is None or next_block is None:
            raise ValueError(f"remove() of block {block.block_id}: not queued")
        prev_block.next_free_block = next_block
        next_block.prev_free_block = prev_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Link one block before the fake tail; it must be out of the queue (checked: O(1))."""
        _check_unqueued("append", [block])
        self.append_n([block])

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Link blocks, in order, right after the fake head (they are reused first).

        Each must be out of the queue: a queued block linked again makes a cycle. vLLM trusts
        BlockPool for it (only a block whose ref_cnt just reached 0 comes back); memlab scans
        for it in debug mode only.
        """
        if type(blocks) is not list:
            _checks.instance("blocks", blocks, tuple, "a list of KVCacheBlocks")
        if self.debug_mode:
            _check_unqueued("prepend_n", blocks)
        if not blocks:
            return
        first_block = self.fake_free_list_head.next_free_block
        assert first_block is not None, (
            "next_free_block of fake_free_list_head should always exist"
        )
        prev_block = self.fake_free_list_head
        for block in blocks:
            block.prev_free_block = prev_block
            prev_block.next_free_block = block
            prev_block = block
        prev_block.next_free_block = first_block
        first_block.prev_free_block = prev_block
        self.num_free_blocks += len(blocks)

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Link blocks, in order, before the fake tail (they are evicted last); as ``prepend_n``,
        each must be out of the queue (scanned in debug mode only)."""
        if type(blocks) is not list:
            _checks.instance("blocks", blocks, tuple, "a list of KVCacheBlocks")
        if self.debug_mode:
            _check_unqueued("append_n", blocks)
        if not blocks:
            return
        tail = self.fake_free_list_tail
        last_block = tail.prev_free_block
        assert last_block is not None, (
            "prev_free_block of fake_free_list_tail should always exist"
        )
        for block in blocks:
            block.prev_free_block = last_block
            last_block.next_free_block = block
            last_block = block
        last_block.next_free_block = tail
        tail.prev_free_block = last_block
        self.num_free_blocks += len(blocks)

    def iter_blocks_after(self, cursor: KVCacheBlock | None) -> Iterator[KVCacheBlock]:
        """The free blocks in eviction order after ``cursor`` (from the head when None)."""
        head = self.fake_free_list_head
        curr_block = (head if cursor is None else cursor).next_free_block
        while curr_block is not None and curr_block is not self.fake_free_list_tail:
            yield curr_block
            curr_block = curr_block.next_free_block

    def get_all_free_blocks(self, limit: int | None = None) -> list[KVCacheBlock]:
        """The free blocks from head (reused first) to tail (evicted last). Walks the list: O(n).
        ``limit`` (memlab's) stops the walk after that many blocks plus one: a broken queue's
        cycle then ends in a list longer than the queue, not in a walk that never returns."""
        stop = None if limit is None else limit + 1
        return list(islice(self.iter_blocks_after(None), stop))

    def __len__(self) -> int:
        return self.num_free_blocks


class BlockHashToBlockMap:
    """Block hash -> the cached block(s) holding that content.

    Several blocks may hold one hash: two requests that computed the same prefix at the same
    time each keep their own copy, because a block id once handed out never changes (block
    tables are append-only). The first copy is stored bare; a second turns the entry into a
    dict keyed by block id, which stays a dict until its last block is popped (vLLM's union
    saves the common case an inner dict and its garbage-collection cost).

    vLLM 0.33 keys the map by the hash plus a 4-byte KV cache group id (one pool serves every
    group of a hybrid model); memlab has one group, so the hash alone is the key.
    """

    __slots__ = ("_cache",)

    def __init__(self):
        self._cache: dict[BlockHash, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: BlockHash) -> KVCacheBlock | None:
        """Any block cached under the key: the first one inserted."""
        blocks = self._cache.get(key)
        if type(blocks) is dict:
            return next(iter(blocks.values()))
        return blocks

    def insert(self, key: BlockHash, block: KVCacheBlock) -> None:
        """Map one more block under the key. One dict lookup for a new key; a block already
        under the key stays as it is (vLLM would make a dict of it: the pool never does it,
        set_block_hash refuses a block that has a hash)."""
        blocks = self._cache.setdefault(key, block)
        if blocks is block:  # the common case: a new key, now the block itself
            return
        if type(blocks) is dict:
            blocks[block.block_id] = block
        else:  # a second copy of the content: both go into a dict
            self._cache[key] = {blocks.block_id: blocks, block.block_id: block}

    def pop(self, key: BlockHash, block_id: int) -> KVCacheBlock | None:
        """Remove one block of a hash; None when that block is not cached under it."""
        blocks = self._cache.pop(key, None)
        if blocks is None:
            return None
        if type(blocks) is not dict:
            if blocks.block_id == block_id:
                return blocks
            self._cache[key] = blocks  # another block's copy: put it back
            return None
        block = blocks.pop(block_id, None)
        if blocks:  # copies remain: the dict goes back, even of one block
            self._cache[key] = blocks
        return block

    def __len__(self) -> int:
        """Number of distinct hashes."""
        return len(self._cache)


class BlockPool:
    """All KV blocks, their free queue and the prefix cache's hash map (vLLM v1's BlockPool).

    Block 0 is popped at start as the null block: a placeholder for blocks a request no longer
    needs (outside a sliding window); it is never handed out, never freed, not counted as used.

    ``hash_block_size`` is vLLM's (the tokens a request's block hash covers): memlab hashes whole
    blocks, so when given, ``cache_full_blocks`` takes only that block size. ``debug_mode``
    (memlab's; the tests turn it on) is read on every call, as SGLang's allocators read theirs:
    it runs the per-block scans of touch, free_blocks, cache_full_blocks and the free queue,
    which vLLM leaves out because it trusts its scheduler (the module's docstring lists what
    that trust lets through). ``num_evictions`` is memlab's count of evicted cached blocks.
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool = True,
        hash_block_size: int | None = None,
        *,
        debug_mode: bool = False,
    ):
        _checks.integer(
            "num_gpu_blocks (with the null block)", num_gpu_blocks, 2, MAX_BLOCKS
        )
        _checks.instance("enable_caching", enable_caching, bool)
        if hash_block_size is not None:
            _checks.integer("hash_block_size", hash_block_size, 1, MAX_BLOCKS)
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.blocks = [KVCacheBlock(idx) for idx in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks, debug_mode)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.num_evictions = 0

    @property
    def debug_mode(self) -> bool:
        # The queue holds the switch; the pool's hot paths read it there (a property is a call).
        return self.free_block_queue.debug_mode

    @debug_mode.setter
    def debug_mode(self, on: bool) -> None:
        # One switch: the pool's scans and its queue's.
        self.free_block_queue.debug_mode = bool(on)

    def get_cached_block(
        self, block_hash: BlockHash, kv_cache_group_ids: Sequence[int] | None = None
    ) -> KVCacheBlock | list[KVCacheBlock] | None:
        """The cached block holding ``block_hash`` (the first copy cached), or None.

        vLLM 0.33 takes the groups to look in and answers one block per group, or None when
        any group misses. memlab's pool serves one group: given ``kv_cache_group_ids`` (``[0]``)
        it answers as vLLM does; without them, with the block itself (memlab's short call).
        """
        try:
            block = self.cached_block_hash_to_block.get_one_block(block_hash)
        except TypeError:  # not a dict key
            raise TypeError(f"block_hash {block_hash!r} is not hashable") from None
        if kv_cache_group_ids is None:
            return block
        _checks.int_list("kv_cache_group_ids (one group: 0)", kv_cache_group_ids, 0, 0)
        return None if block is None else [block] * len(kv_cache_group_ids)

    def cache_full_blocks(
        self,
        request,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int | None = None,
        kv_cache_group_id: int = 0,
    ) -> None:
        """Give blocks[num_cached_blocks:num_full_blocks] the request's block hashes and map them.

        vLLM's signature; ``block_size`` and ``kv_cache_group_id`` may be left out (memlab's one
        group hashes whole blocks). A block that already has a hash stops the loop at vLLM's
        assert, the blocks before it cached already; debug mode first scans every block (this
        pool's, none hashed, none twice), so that such a call is refused with nothing changed.
        """
        _check_cache_full_blocks(
            self,
            request,
            blocks,
            num_cached_blocks,
            num_full_blocks,
            block_size,
            kv_cache_group_id,
        )
        if num_cached_blocks >= num_full_blocks:
            return
        new_full_blocks = blocks[num_cached_blocks:num_full_blocks]
        if self.free_block_queue.debug_mode:
            _check_blocks("blocks", new_full_blocks, self, "cache")
        new_block_hashes = request.block_hashes[num_cached_blocks:num_full_blocks]
        # blk.set_block_hash and the map's insert, written out: the two calls per cached block
        # were a quarter of this call's time. A second copy of a content goes through insert.
        insert = self.cached_block_hash_to_block.insert
        first_copy = self.cached_block_hash_to_block._cache.setdefault
        for blk, block_hash in zip(new_full_blocks, new_block_hashes):
            if blk.is_null:  # a sliding window already dropped it
                continue
            assert blk._block_hash is None, HASHED
            blk._block_hash = block_hash
            if first_copy(block_hash, blk) is not blk:
                insert(block_hash, blk)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop blocks from the head of the free queue; a popped block that still has a hash is
        evicted now (lazy eviction: a freed block stays hittable until its space is needed)."""
        num_blocks = _checks.integer("num_blocks", num_blocks, 0)
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        # As vLLM: the loop written twice, so that the list is walked once. A block without
        # a hash has nothing to evict: the call is saved (vLLM makes it for every block).
        if self.enable_caching:
            for block in ret:
                if block._block_hash is not None:
                    self._maybe_evict_cached_block(block)
                assert block.ref_cnt == 0
                block.ref_cnt += 1
        else:
            for block in ret:
                assert block.ref_cnt == 0
                block.ref_cnt += 1
        return ret

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop the block's hash and its entry in the map; False when it had none."""
        block_hash = block._block_hash
        if block_hash is None:
            return False
        # block.reset_hash() and the map's pop, written out for the common case (the block is
        # the only copy of its content): this runs for every block a full pool hands out.
        block._block_hash = None
        cache = self.cached_block_hash_to_block._cache
        if cache.get(block_hash) is block:
            del cache[block_hash]
        elif self.cached_block_hash_to_block.pop(block_hash, block.block_id) is None:
            return False
        self.num_evictions += 1
        return True

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """A prefix hit: take a reference; a hit block that was free leaves the queue's middle.
        Debug mode first scans every block (this pool's, a free one really queued)."""
        if type(blocks) is not list:
            _checks.instance("blocks", blocks, tuple, "a list of KVCacheBlocks")
        if self.free_block_queue.debug_mode:
            _check_blocks("blocks", blocks, self, "touch")
        for block in blocks:
            if block.is_null:
                continue
            # ref_cnt 0: the block is in the free queue (an eviction candidate).
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks) -> None:
        """Drop one reference from each block, in the given order (callers pass a request's
        blocks reversed). A block reaching 0 goes to the queue's tail if it is cached (kept for
        hits, evicted in LRU order) and to the head if not (nothing to keep: reuse it first).

        ``ordered_blocks`` is a list, a tuple or an iterator (vLLM passes ``reversed(...)``).
        Debug mode first scans every block (this pool's, none freed more often than taken).
        With it off, a block freed twice is trusted as vLLM trusts it: its ref_cnt goes to -1.
        """
        if type(ordered_blocks) is not list:
            ordered_blocks = _blocks_as_list("ordered_blocks", ordered_blocks)
        if self.free_block_queue.debug_mode:
            _check_blocks("ordered_blocks", ordered_blocks, self, "free")
        enable_caching = self.enable_caching
        blocks_to_evict_last = []
        blocks_to_evict_first = []
        for block in ordered_blocks:
            if block.is_null:  # never pooled; its ref_cnt is not maintained
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block._block_hash is None or not enable_caching:
                    # LIFO reuse of blocks without a hash: nothing to keep.
                    blocks_to_evict_first.append(block)
                else:
                    # FIFO reuse of cached blocks: LRU eviction.
                    blocks_to_evict_last.append(block)
        self.free_block_queue.prepend_n(blocks_to_evict_first)
        self.free_block_queue.append_n(blocks_to_evict_last)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False, nothing changed) while any block is in use."""
        num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks()
        if num_used_blocks != 1:  # the null block is always marked as used
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block.reset_hash()
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of the usable blocks (all but the null block) that are in use."""
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)

    def check_invariants(self) -> None:
        """Deep check of the books (debug/tests, O(num blocks)); an AssertionError names the
        first broken rule: the queue's links agree both ways and with its count; a block is in
        the queue with ref_cnt 0 or out of it with ref_cnt > 0 (the null block: out, never
        counted); a block has a hash exactly when the map holds it under that hash."""
        queue = self.free_block_queue
        free = queue.get_all_free_blocks(limit=self.num_gpu_blocks)
        chain = [queue.fake_free_list_head, *free, queue.fake_free_list_tail]
        for left, right in zip(chain, chain[1:]):
            assert right.prev_free_block is left, f"links disagree at {right}"
        in_queue = {b.block_id for b in free}
        assert len(in_queue) == len(free) == queue.num_free_blocks, "free block count"
        for b in self.blocks:
            want = "out of the queue" if b.is_null or b.ref_cnt > 0 else "free"
            where = "free" if b.block_id in in_queue else "out of the queue"
            assert want == where and b.ref_cnt >= 0, f"block {b.block_id} is {where}"
        mapped = {(key, b.block_id) for key, b in _cached_blocks(self)}
        cached = [b for b in self.blocks if b.block_hash is not None]
        hashed = {(b.block_hash, b.block_id) for b in cached}
        assert hashed == mapped, f"hashed and mapped differ: {hashed ^ mapped}"


def _cached_blocks(pool: BlockPool):
    """(hash, block) for every block in the map (a hash with copies: once per copy)."""
    for key, blocks in pool.cached_block_hash_to_block._cache.items():
        for block in blocks.values() if type(blocks) is dict else (blocks,):
            yield key, block


# -- argument checks at the boundary (memlab's; vLLM trusts its scheduler) -----------------------
# _check_blocks, _check_unqueued and _check_queued scan blocks: debug mode only. The rest is O(1).


def _blocks_as_list(name: str, blocks) -> list:
    """A list, a tuple or an iterator of blocks (what ``reversed()`` gives) as a list."""
    _checks.instance(name, blocks, (list, tuple, Iterator), "a list of KVCacheBlocks")
    return list(blocks)


def _check_queued(queue: FreeKVCacheBlockQueue, block) -> None:
    """A KVCacheBlock; if linked, linked into THIS queue (its links lead to this fake tail)."""
    _checks.instance("block", block, KVCacheBlock)
    after = list(islice(queue.iter_blocks_after(block), queue.num_free_blocks))
    last = after[-1] if after else block
    if block.prev_free_block and last.next_free_block is not queue.fake_free_list_tail:
        raise ValueError(f"block {block.block_id} is in another free queue")


def _check_unqueued(where: str, blocks) -> None:
    """Blocks to link: KVCacheBlocks, each out of every queue and listed once."""
    _check_blocks(f"{where}: blocks", blocks)
    linked = [b for b in blocks if b.prev_free_block or b.next_free_block]
    if linked or len(set(map(id, blocks))) < len(blocks):
        raise ValueError(f"{where}(): a block is queued already or listed twice")


def _check_blocks(name: str, blocks, pool=None, op: str = "") -> None:
    """KVCacheBlocks (in a list or tuple); given ``pool``, each of that pool's (another
    pool's block has the same ids), in the state ``op`` needs: "touch" a free one in the
    queue, "free" none freed more often than taken, "cache" none hashed or listed twice
    (null blocks are skipped)."""
    times = Counter(map(id, blocks))
    for i, b in enumerate(blocks):
        _checks.instance(f"{name}[{i}]", b, KVCacheBlock)
        if pool is None or b.is_null:
            continue
        if b is not pool.blocks[b.block_id % pool.num_gpu_blocks]:
            raise ValueError(f"{name}: block {b.block_id} is not a block of this pool")
        if op == "touch" and b.ref_cnt == 0 and b.prev_free_block is None:
            raise ValueError(f"touch of block {b.block_id}: ref_cnt 0 but not queued")
        if op == "free" and times[id(b)] > b.ref_cnt:
            raise ValueError(f"block {b.block_id} freed more often than taken")
        if op == "cache" and (b.block_hash is not None or times[id(b)] > 1):
            raise ValueError(f"cache of block {b.block_id}: hashed or listed twice")


def _check_cache_full_blocks(pool, request, blocks, num_cached, num_full, size, group):
    """The call's own arguments, O(1), checked on every call (the blocks: debug mode)."""
    hashes = getattr(request, "block_hashes", None)
    _checks.instance("request.block_hashes", hashes, list)
    _checks.instance("blocks", blocks, (list, tuple), "a list of KVCacheBlocks")
    _checks.integer("num_cached_blocks", num_cached)
    _checks.integer("num_full_blocks", num_full)
    if num_full > max(num_cached, min(len(blocks), len(hashes))):
        raise ValueError(f"num_full_blocks {num_full}: more than blocks or hashes")
    if size is not None:
        _checks.integer("block_size", size, 1, MAX_BLOCKS)
        if pool.hash_block_size not in (None, size):
            raise ValueError(f"block_size {size} is not hash_block_size (whole blocks)")
    _checks.integer("kv_cache_group_id (one group: 0)", group, 0, 0)
