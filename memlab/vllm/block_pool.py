"""vLLM's block pool (vllm/v1/core/block_pool.py, kv_cache_utils.py): every block's metadata in one object.

vLLM keeps KVCacheBlock and FreeKVCacheBlockQueue in vllm/v1/core/kv_cache_utils.py and
BlockPool in vllm/v1/core/block_pool.py; memlab keeps the three together because they are one
idea. A block is free (in the queue, ref_cnt 0, maybe still carrying a hash that a prefix hit
can revive) or in use (out of the queue, ref_cnt > 0). The queue's head is reused first, so the
queue is at the same time the prefix cache's eviction order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence

from memlab.common import _checks

BlockHash = Hashable  # bytes (sha256) or int (the fast hash), or a trace's own block id
MAX_BLOCKS = 2**31 - 1  # block ids are int32 in the worker's block table


class KVCacheBlock:
    """Metadata of one KV block. Slotted: a pool creates one per block, 100,000s at start.

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

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self._block_hash: BlockHash | None = None
        # The free queue's links live on the block itself: linking allocates no Python object.
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    @property
    def block_hash(self) -> BlockHash | None:
        return self._block_hash

    @block_hash.setter
    def block_hash(self, block_hash: BlockHash) -> None:
        self.check_unhashed()
        self._block_hash = block_hash

    def check_unhashed(self) -> None:
        if self._block_hash is not None:  # a cached block's content must not change
            raise ValueError(
                f"block {self.block_id} already has hash {self._block_hash!r}"
            )

    def reset_hash(self) -> None:
        self._block_hash = None

    def __repr__(self) -> str:
        prev_id = (
            None if self.prev_free_block is None else self.prev_free_block.block_id
        )
        next_id = (
            None if self.next_free_block is None else self.next_free_block.block_id
        )
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"block_hash={self._block_hash!r}, prev={prev_id}, next={next_id}, is_null={self.is_null})"
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
        block = head.next_free_block
        if block is self.fake_free_list_tail:
            assert self.num_free_blocks == 0, (
                f"num_free_blocks ({self.num_free_blocks}) is out of sync with the free list."
            )
            raise ValueError("No free blocks available")
        head.next_free_block = block.next_free_block
        block.next_free_block.prev_free_block = head
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        n = _checks.integer(
            "n", n, 0
        )  # memlab's boundary check; vLLM's count would grow
        if n == 0:
            return []
        # vLLM's bare assert: callers check first (get_new_blocks)
        assert self.num_free_blocks >= n
        ret = []
        block = self.fake_free_list_head.next_free_block
        for _ in range(n):
            ret.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        # One relink at the end instead of one per popped block.
        self.fake_free_list_head.next_free_block = block
        block.prev_free_block = self.fake_free_list_head
        self.num_free_blocks -= n
        return ret

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink a block from anywhere in the queue in O(1) (a prefix hit on a free block); one out
        of the queue is refused, as in vLLM. Debug mode also checks it is a KVCacheBlock."""
        if self.debug_mode:
            _checks.instance("block", block, KVCacheBlock)
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise ValueError(
                f"remove() of block {block.block_id}, which is not in the free queue"
            )
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Link one block before the fake tail; it must be out of the queue (checked: O(1))."""
        _check_unqueued("append", (block,))
        self._link_between(
            self.fake_free_list_tail.prev_free_block, self.fake_free_list_tail, (block,)
        )

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Link blocks, in order, before the fake tail (they are evicted last).

        The blocks must be out of the queue: a queued block linked again makes a cycle. vLLM
        trusts BlockPool for it (only a block whose ref_cnt just reached 0 comes back); memlab
        scans for it in debug mode only.
        """
        _checks.instance("blocks", blocks, (list, tuple), "a list of KVCacheBlocks")
        if self.debug_mode:
            _check_unqueued("append_n", blocks)
        tail = self.fake_free_list_tail
        self._link_between(tail.prev_free_block, tail, blocks)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Link blocks, in order, right after the fake head (they are reused first); as ``append_n``,
        each must be out of the queue (scanned in debug mode only)."""
        _checks.instance("blocks", blocks, (list, tuple), "a list of KVCacheBlocks")
        if self.debug_mode:
            _check_unqueued("prepend_n", blocks)
        head = self.fake_free_list_head
        self._link_between(head, head.next_free_block, blocks)

    def _link_between(
        self, left: KVCacheBlock, right: KVCacheBlock, blocks: Sequence[KVCacheBlock]
    ) -> None:
        if not blocks:
            return
        last = left
        for block in blocks:
            last.next_free_block = block
            block.prev_free_block = last
            last = block
        last.next_free_block = right
        right.prev_free_block = last
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks from head (reused first) to tail (evicted last). Walks the list: O(n)."""
        ret = []
        block = self.fake_free_list_head.next_free_block
        while block is not self.fake_free_list_tail:
            ret.append(block)
            block = block.next_free_block
        return ret

    def __len__(self) -> int:
        return self.num_free_blocks


class BlockHashToBlockMap:
    """Block hash -> the cached block(s) holding that content.

    Several blocks may hold one hash: two requests that computed the same prefix at the same
    time each keep their own copy, because a block id once handed out never changes (block
    tables are append-only). One block is stored bare, several in a dict keyed by block id, so
    the common case costs no extra dict.

    vLLM 0.33 keys the map by the hash plus a 4-byte KV cache group id (one pool serves every
    group of a hybrid model); memlab has one group, so the hash alone is the key.
    """

    __slots__ = ("_cache",)

    def __init__(self):
        self._cache: dict[BlockHash, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: BlockHash) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if blocks is None or isinstance(blocks, KVCacheBlock):
            return blocks
        return next(iter(blocks.values()))

    def insert(self, key: BlockHash, block: KVCacheBlock) -> None:
        blocks = self._cache.get(key)
        if blocks is None:
            self._cache[key] = block
        elif isinstance(blocks, KVCacheBlock):
            self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
        else:
            blocks[block.block_id] = block

    def pop(self, key: BlockHash, block_id: int) -> KVCacheBlock | None:
        """Remove one block of a hash; None when that block is not cached under it."""
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        if isinstance(blocks, KVCacheBlock):
            if blocks.block_id != block_id:
                return None
            del self._cache[key]
            return blocks
        block = blocks.pop(block_id, None)
        if len(blocks) == 1:
            self._cache[key] = next(iter(blocks.values()))
        return block

    def items(self):
        """(hash, block) pairs, one per cached block (a hash with copies appears once per copy)."""
        for key, blocks in self._cache.items():
            if isinstance(blocks, KVCacheBlock):
                yield key, blocks
            else:
                for block in blocks.values():
                    yield key, block

    def __len__(self) -> int:
        """Number of distinct hashes."""
        return len(self._cache)


class BlockPool:
    """All KV blocks, their free queue and the prefix cache's hash map (vLLM v1's BlockPool).

    Block 0 is popped at start as the null block: a placeholder for blocks a request no longer
    needs (outside a sliding window); it is never handed out, never freed, not counted as used.

    ``debug_mode`` (memlab's; the tests turn it on) is read on every call, as SGLang's allocators
    read theirs: it runs the per-block scans of touch, free_blocks, cache_full_blocks and the free
    queue, which vLLM leaves out because it trusts its scheduler. The O(1) checks of a call's own
    arguments (a count, a range, the container, one block) always run.
    """

    def __init__(
        self, num_gpu_blocks: int, enable_caching: bool = True, debug_mode: bool = False
    ):
        # block ids are int32 in the worker's block table
        num_gpu_blocks = _checks.integer(
            "num_gpu_blocks (block 0 is the null block)", num_gpu_blocks, 2, MAX_BLOCKS
        )
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks, debug_mode)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.num_evictions = 0  # cached blocks whose content was dropped to make room

    @property
    def debug_mode(self) -> bool:
        return self.free_block_queue.debug_mode

    @debug_mode.setter
    def debug_mode(self, on: bool) -> None:
        self.free_block_queue.debug_mode = bool(
            on
        )  # one switch: the pool's scans and its queue's

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get_one_block(block_hash)

    def cache_full_blocks(
        self,
        request,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Give blocks[num_cached_blocks:num_full_blocks] the request's block hashes and map them.

        A block that already has a hash is refused when the loop reaches it, as vLLM asserts (the
        blocks before it stay cached); debug mode first scans every block (this pool's, none
        twice, none hashed), so that a refusal changes nothing.
        """
        _check_cache_full_blocks(
            self, request, blocks, num_cached_blocks, num_full_blocks
        )
        if self.debug_mode:
            _check_unhashed(self, blocks[num_cached_blocks:num_full_blocks])
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = request.block_hashes
        insert = self.cached_block_hash_to_block.insert
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null:  # a sliding window already dropped it
                continue
            block.block_hash = hashes[i]  # the setter refuses a block hashed already
            insert(hashes[i], block)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop blocks from the head of the free queue; a popped block that still has a hash is
        evicted now (lazy eviction: a freed block stays hittable until its space is needed)."""
        num_blocks = _checks.integer("num_blocks", num_blocks, 0)
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        if self.enable_caching:
            for block in ret:
                if block._block_hash is not None:
                    self._maybe_evict_cached_block(block)
                block.ref_cnt = 1
        else:
            for block in ret:
                block.ref_cnt = 1
        return ret

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        block_hash = block.block_hash
        if block_hash is None:
            return False
        block.reset_hash()
        if self.cached_block_hash_to_block.pop(block_hash, block.block_id) is None:
            return False
        self.num_evictions += 1
        return True

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """A prefix hit: take a reference; a hit block that was free leaves the queue's middle.
        Debug mode first scans every block (this pool's, a free one really queued); vLLM trusts its caller."""
        _checks.instance("blocks", blocks, Iterable, "a list of KVCacheBlocks")
        if self.debug_mode:
            blocks = _check_blocks("blocks", blocks, self)
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block, in the given order (callers pass a request's
        blocks reversed). A block reaching 0 goes to the queue's tail if it is cached (kept for
        hits, evicted in LRU order) and to the head if not (nothing to keep: reuse it first).
        Debug mode first scans every block (this pool's, none freed more often than taken); vLLM
        trusts its caller."""
        _checks.instance(
            "ordered_blocks", ordered_blocks, Iterable, "a list of KVCacheBlocks"
        )
        if self.debug_mode:
            ordered_blocks = _check_blocks("ordered_blocks", ordered_blocks, self)
            _check_freeable(ordered_blocks)
        to_evict_first, to_evict_last = [], []
        for block in ordered_blocks:
            if block.is_null:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block._block_hash is None or not self.enable_caching:
                    to_evict_first.append(block)
                else:
                    to_evict_last.append(block)
        # prepend_n keeps the list's order at the head: the first block freed is reused first.
        self.free_block_queue.prepend_n(to_evict_first)
        self.free_block_queue.append_n(to_evict_last)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False, nothing changed) while any block is in use."""
        num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks()
        if num_used_blocks != 1:  # only the null block may be out of the queue
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
        """Deep check of the books (debug/tests, O(num blocks)); raises AssertionError naming
        the first broken rule: every block is either in the free queue with ref_cnt 0, or out of
        it with ref_cnt > 0 (the null block: out, never counted); a block has a hash exactly
        when the map holds it under that hash."""
        queue = self.free_block_queue
        chain = [
            queue.fake_free_list_head,
            *queue.get_all_free_blocks(),
            queue.fake_free_list_tail,
        ]
        assert all(r.prev_free_block is l for l, r in zip(chain, chain[1:])), (
            "free queue links disagree"
        )
        in_queue = {
            b.block_id for b in chain[1:-1]
        }  # each linked once, as many as counted
        assert len(in_queue) == len(chain) - 2 == queue.num_free_blocks, (
            f"num_free_blocks {queue.num_free_blocks}"
        )
        for b in self.blocks:  # the null block is never free
            where = "free" if b.block_id in in_queue else "out of the queue"
            ok = (
                b.ref_cnt == 0
                if where == "free"
                else b.ref_cnt > 0 and b.prev_free_block is b.next_free_block is None
            )
            assert where != "free" if b.is_null else ok, (
                f"block {b.block_id} is {where} with ref_cnt {b.ref_cnt}"
            )
        pairs = [
            (b.block_id, key == b.block_hash)
            for key, b in self.cached_block_hash_to_block.items()
        ]
        hashed = {(b.block_id, True) for b in self.blocks if b.block_hash is not None}
        assert hashed == set(pairs), (
            f"hashed but not mapped (or under another hash): {sorted(hashed ^ set(pairs))[:5]}"
        )


# -- argument checks at the boundary (memlab's; vLLM trusts its scheduler) -----------------------
# _check_blocks, _check_freeable, _check_unhashed and _check_unqueued scan every block: the methods
# call them in debug mode only. The O(1) checks run on every call: a method's container, append's
# one block, _check_cache_full_blocks's counts.


def _check_blocks(name: str, blocks, pool: BlockPool | None = None) -> list:
    """An iterable (checked by the caller) as a list of KVCacheBlocks; given ``pool``, each one of that
    pool's (a block of another pool has the same ids) and, when free, really in its queue."""
    blocks = blocks if isinstance(blocks, (list, tuple)) else list(blocks)
    for i, b in enumerate(blocks):
        if (
            type(b) is not KVCacheBlock
        ):  # the message is built only for a bad block; a str is iterable: this names it
            _checks.instance(f"{name}[{i}]", b, KVCacheBlock)
        if pool is not None and (
            b.block_id >= len(pool.blocks) or pool.blocks[b.block_id] is not b
        ):
            raise ValueError(f"block {b.block_id} is not a block of this pool")
        if (
            pool is not None
            and b.ref_cnt == 0
            and not b.is_null
            and b.prev_free_block is None
        ):
            raise ValueError(
                f"block {b.block_id} has ref_cnt 0 but is not in the free queue"
            )
    return blocks


def _check_unqueued(where: str, blocks) -> None:
    for block in _check_blocks(f"{where}: blocks", blocks):
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise ValueError(
                f"{where}() of block {block.block_id}, which is already in the free queue"
            )
    if len({id(b) for b in blocks}) < len(blocks):
        raise ValueError(f"{where}(): a block appears twice among the blocks to link")


def _check_freeable(blocks: list) -> None:
    """No block freed more often than it was taken (listed twice counts twice): vLLM's count would go
    negative."""
    times = Counter(b.block_id for b in blocks if not b.is_null)
    bad = next(
        (b for b in blocks if not b.is_null and times[b.block_id] > b.ref_cnt), None
    )
    if bad is not None:
        raise ValueError(
            f"free of block {bad.block_id} with ref_cnt {bad.ref_cnt}: freed more often than taken"
        )


def _check_cache_full_blocks(
    pool: BlockPool, request, blocks, num_cached_blocks, num_full_blocks
) -> None:
    """The call's own arguments, O(1), checked on every call (the blocks: ``_check_unhashed``)."""
    _checks.instance("blocks", blocks, (list, tuple), "a list of KVCacheBlocks")
    (
        _checks.integer("num_cached_blocks", num_cached_blocks),
        _checks.integer("num_full_blocks", num_full_blocks),
    )
    if (
        num_cached_blocks
        < num_full_blocks
        > min(len(blocks), len(request.block_hashes))
    ):
        raise ValueError(
            f"cannot cache {num_full_blocks} full blocks (num_full_blocks): the request holds "
            f"{len(blocks)} blocks and {len(request.block_hashes)} block hashes"
        )


def _check_unhashed(pool: BlockPool, blocks) -> None:
    """The blocks to cache: this pool's, none hashed yet, none twice (null blocks are skipped)."""
    todo = [b for b in _check_blocks("blocks", blocks, pool) if not b.is_null]
    for block, times in Counter(todo).items():  # a block is hashed by identity
        block.check_unhashed()
        if times > 1:
            raise ValueError(
                f"block {block.block_id} appears twice among the blocks to cache"
            )
