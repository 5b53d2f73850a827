"""vLLM's KV cache manager (vllm/v1/core/kv_cache_manager.py), for one KV cache group.

With its coordinator (kv_cache_coordinator.py) and single-type managers
(single_type_kv_cache_manager.py).

The scheduler calls only ``KVCacheManager``. It hands each step to a coordinator, which fans out
to one ``SingleTypeKVCacheManager`` per KV cache group: ``FullAttentionManager`` keeps every block
a request took until it finishes, ``SlidingWindowManager`` gives back the blocks that left the
window. Each manager splits an allocation into the steps the manager's books need, in vLLM's
order: ``remove_skipped_blocks`` (out-of-window blocks go back, even when the call is refused
later), ``get_num_blocks_to_allocate`` (the capacity check counts them), then
``add_local_computed_blocks`` (the prefix hits are touched and joined to the request),
``allocate_new_blocks`` and ``cache_blocks``. memlab has one group, so its coordinator is vLLM's
``UnitaryKVCacheCoordinator``; the blocks are the same as vLLM 0.33's for the same calls
(``./course engines`` runs both in lockstep). The scheduler's calls, in order:

    blocks, n = manager.get_computed_blocks(request)           # prefix-cache lookup
    new_blocks = manager.allocate_slots(request, request.num_tokens - n, n, blocks)
    if new_blocks is None: ...                                 # short: preempt someone
    manager.free(request)                                      # finished

Left out: KV connectors (external computed tokens), EAGLE's dropped last hit, partial-block hits
(their copy-on-write block), hash alignment across groups, encoder tokens, the full-sequence
admission gate, events and metrics. vLLM returns ``KVCacheBlocks`` (one list per group) where
memlab returns the one list.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from memlab.common import _checks
from memlab.common.utils import ceil_div as cdiv  # vLLM's name for it
from memlab.vllm.block_pool import MAX_BLOCKS, BlockPool, KVCacheBlock
from memlab.vllm.hashing import BlockHash, get_hash_fn_by_name, get_request_block_hasher


class SingleTypeKVCacheManager:
    """The books of one KV cache group: each request's blocks (``req_to_blocks``) and how many of
    them are in the prefix cache (``num_cached_block``, running requests only)."""

    def __init__(
        self, block_pool: BlockPool, block_size: int, enable_caching: bool = True
    ):
        self.block_pool = block_pool
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.req_to_blocks: defaultdict[str, list[KVCacheBlock]] = defaultdict(list)
        self.num_cached_block: dict[str, int] = {}
        self._null_block = block_pool.null_block

    @staticmethod
    def _get_num_evictable_blocks(blocks: Sequence[KVCacheBlock]) -> int:
        return sum(blk.ref_cnt == 0 and not blk.is_null for blk in blocks)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
    ) -> int:
        """Blocks the request takes from the free queue to hold ``num_tokens`` tokens: new blocks,
        plus the hits that are free now (touching them takes them off the queue)."""
        num_required_blocks = cdiv(num_tokens, self.block_size)
        num_req_blocks = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:  # a running request: no new hits
            return max(num_required_blocks - num_req_blocks, 0)
        num_skipped_blocks = (
            self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        )
        # Blocks for what the window still needs: skipped blocks are nulls, not taken.
        num_new_blocks = max(
            num_required_blocks
            - max(num_skipped_blocks, len(new_computed_blocks) + num_req_blocks),
            0,
        )
        num_skipped_new_computed_blocks = max(0, num_skipped_blocks - num_req_blocks)
        return num_new_blocks + self._get_num_evictable_blocks(
            new_computed_blocks[num_skipped_new_computed_blocks:]
        )

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
    ) -> None:
        """The prefix hits join the request: touched (so nobody evicts them), skipped ones as
        nulls. Only for a request that holds no block yet."""
        req_blocks = self.req_to_blocks[request_id]
        num_skipped_blocks = (
            self.get_num_skipped_tokens(num_local_computed_tokens) // self.block_size
        )
        if num_skipped_blocks > 0:
            new_computed_blocks = new_computed_blocks[num_skipped_blocks:]
        if self.enable_caching:
            self.block_pool.touch(new_computed_blocks)
        req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(new_computed_blocks)
        self.num_cached_block[request_id] = len(req_blocks)  # hits are cached already

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int
    ) -> list[KVCacheBlock]:
        """Blocks so that the request holds at least ``num_tokens`` slots."""
        req_blocks = self.req_to_blocks[request_id]
        num_new_blocks = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new_blocks <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request, num_tokens: int) -> None:
        """Put the request's full blocks up to ``num_tokens`` into the prefix cache."""
        num_cached_blocks = self.num_cached_block.get(request.request_id, 0)
        num_full_blocks = (
            min(num_tokens, len(request.block_hashes) * self.block_size)
            // self.block_size
        )
        if num_cached_blocks >= num_full_blocks:
            return
        self.block_pool.cache_full_blocks(
            request,
            self.req_to_blocks[request.request_id],
            num_cached_blocks,
            num_full_blocks,
        )
        self.num_cached_block[request.request_id] = num_full_blocks

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        """The request's books, popped: its blocks without the leading nulls."""
        req_blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        num_null = next(
            (i for i, b in enumerate(req_blocks) if not b.is_null), len(req_blocks)
        )
        return req_blocks[num_null:]

    def free(self, request_id: str) -> None:
        """Blocks go back in REVERSE order: with equal ref counts the tail of a prefix then reaches
        the free queue first and is evicted first, and the shared beginning stays cached longest."""
        self.block_pool.free_blocks(self.pop_blocks_for_free(request_id)[::-1])

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int
    ) -> None:
        """Blocks no attention will read again go back; nulls take their place, so positions
        stay put (the block table is append-only)."""
        num_skipped_tokens = self.get_num_skipped_tokens(processed_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        # a defaultdict: a new request gets its (empty) entry, as in vLLM
        blocks = self.req_to_blocks[request_id]
        self._remove_blocks_in_range(
            request_id, 0, min(num_skipped_tokens // self.block_size, len(blocks))
        )

    def _remove_blocks_in_range(
        self, request_id: str, first_block: int, last_block: int
    ) -> None:
        """Free blocks ``[first_block, last_block)``, back to front, down to the first null (all
        before it went on an earlier step), in one free (tail first, as ``free``)."""
        blocks = self.req_to_blocks[request_id]
        freed = []
        for i in range(last_block - 1, first_block - 1, -1):
            if blocks[i] is self._null_block:
                break
            freed.append(blocks[i])
            blocks[i] = self._null_block
        if freed:
            self.block_pool.free_blocks(freed)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the next token's attention window (none for full attention)."""
        return 0

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> tuple[list[KVCacheBlock], int]:
        raise NotImplementedError


class FullAttentionManager(SingleTypeKVCacheManager):
    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> tuple[list[KVCacheBlock], int]:
        """The longest run of cached blocks from the start: the first miss ends the chain (no
        later block can be the same prefix)."""
        get_cached_block = self.block_pool.get_cached_block
        computed = []
        for block_hash in block_hashes[: max(0, max_length) // self.block_size]:
            block = get_cached_block(block_hash)
            if block is None:
                break
            computed.append(block)
        return computed, len(computed) * self.block_size


class SlidingWindowManager(SingleTypeKVCacheManager):
    """A token attends to the last ``sliding_window`` tokens, itself included (vLLM's window counts
    the query; SGLang's leaves it out)."""

    def __init__(
        self,
        block_pool: BlockPool,
        block_size: int,
        sliding_window: int,
        enable_caching: bool = True,
    ):
        super().__init__(block_pool, block_size, enable_caching)
        self.sliding_window = sliding_window

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> tuple[list[KVCacheBlock], int]:
        """A hit needs only the blocks inside the window: scan from the right for enough
        consecutive cached blocks; everything before them is a null block."""
        max_num_blocks = max(0, max_length) // self.block_size
        needed = cdiv(self.sliding_window - 1, self.block_size)
        computed: list[KVCacheBlock] = [self._null_block] * max_num_blocks
        run = 0
        for i in range(max_num_blocks - 1, -1, -1):
            block = self.block_pool.get_cached_block(block_hashes[i])
            if block is None:
                run = 0
                continue
            computed[i] = block
            run += 1
            if run >= needed:
                del computed[i + run :]
                return computed, len(computed) * self.block_size
        # no run long enough: only a run from the prompt's start counts
        del computed[run:]
        return computed, run * self.block_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # The next token sits at position num_computed_tokens and reads back to
        # num_computed_tokens - sliding_window + 1: everything before goes.
        return max(0, num_computed_tokens - self.sliding_window + 1)


class UnitaryKVCacheCoordinator:
    """vLLM's coordinator for one KV cache group: each step goes to every manager (here one)."""

    def __init__(self, block_pool: BlockPool, manager: SingleTypeKVCacheManager):
        self.block_pool = block_pool
        self.single_type_managers = (manager,)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
    ) -> int:
        return sum(
            m.get_num_blocks_to_allocate(
                request_id, num_tokens, new_computed_blocks, total_computed_tokens
            )
            for m in self.single_type_managers
        )

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
    ) -> None:
        if any(request_id in m.num_cached_block for m in self.single_type_managers):
            return  # a running request: its hits were added when it was admitted
        for m in self.single_type_managers:
            m.add_local_computed_blocks(
                request_id, new_computed_blocks, num_local_computed_tokens
            )

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int
    ) -> list[KVCacheBlock]:
        (manager,) = self.single_type_managers
        return manager.allocate_new_blocks(request_id, num_tokens)

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        for m in self.single_type_managers:
            if m.enable_caching:
                m.cache_blocks(request, num_computed_tokens)

    def free(self, request_id: str) -> None:
        for m in self.single_type_managers:
            m.free(request_id)

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int
    ) -> None:
        for m in self.single_type_managers:
            m.remove_skipped_blocks(request_id, processed_computed_tokens)

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        (manager,) = self.single_type_managers
        return manager.req_to_blocks.get(request_id, [])

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_cache_hit_length: int
    ):
        (manager,) = self.single_type_managers
        return manager.find_longest_cache_hit(block_hashes, max_cache_hit_length)


class KVCacheManager:
    """What the scheduler calls: the prefix-cache lookup, ``allocate_slots``, ``free``.

    ``sliding_window`` (tokens, the query included) makes its one group a sliding-window group
    (``SlidingWindowManager``); None a full-attention one (``FullAttentionManager``). vLLM reads
    both from the KV cache config.
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int = 16,
        enable_caching: bool = True,
        watermark: float = 0.0,
        hash_fn: str = "sha256",
        max_model_len: int | None = None,
        sliding_window: int | None = None,
    ):
        _validate_init(
            num_gpu_blocks,
            block_size,
            watermark,
            hash_fn,
            max_model_len,
            sliding_window,
        )
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching)
        manager = (
            FullAttentionManager(self.block_pool, block_size, enable_caching)
            if sliding_window is None
            else SlidingWindowManager(
                self.block_pool, block_size, sliding_window, enable_caching
            )
        )
        self.coordinator = UnitaryKVCacheCoordinator(self.block_pool, manager)
        # Blocks kept free for requests already running, so a newly admitted request does not
        # force a preemption at the very next decode step. A fraction of ALL blocks, the null
        # block included, as in vLLM 0.33; only admissions pay it.
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.request_block_hasher = get_request_block_hasher(
            block_size, get_hash_fn_by_name(hash_fn)
        )
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    # ---- lookup ------------------------------------------------------------------------------

    def get_computed_blocks(self, request) -> tuple[list[KVCacheBlock], int]:
        """The longest run of cached blocks from the request's start, and its token count.

        At most num_tokens - 1 tokens can hit: the last token must be computed again to get the
        logits of the next one. Nothing is touched yet: the scheduler may still not admit it.
        """
        _validate_request(request)
        if not self.enable_caching:
            return [], 0
        blocks, num_new_computed_tokens = self.coordinator.find_longest_cache_hit(
            request.block_hashes, request.num_tokens - 1
        )
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += num_new_computed_tokens
        return blocks, num_new_computed_tokens

    # ---- allocation --------------------------------------------------------------------------

    def allocate_slots(
        self,
        request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[KVCacheBlock] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> list[KVCacheBlock] | None:
        """Blocks for ``num_new_tokens`` more tokens of the request, after its cache hits.

        Returns the newly taken blocks, or None when the pool is short; then nothing changed but
        the out-of-window blocks that went back (the scheduler preempts or waits). Hit blocks
        with ref_cnt 0 count as taken, because touching them takes them out of the free queue.
        """
        _validate_allocate_slots(
            self,
            request,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            num_lookahead_tokens,
        )
        request_id = request.request_id
        num_local_computed_tokens = (
            request.num_computed_tokens + num_new_computed_tokens
        )
        total_computed_tokens = num_local_computed_tokens
        num_tokens_need_slot = (
            total_computed_tokens + num_new_tokens + num_lookahead_tokens
        )
        if self.max_model_len is not None:
            total_computed_tokens = min(total_computed_tokens, self.max_model_len)
            num_tokens_need_slot = min(num_tokens_need_slot, self.max_model_len)
        # vLLM charges the watermark to waiting and preempted requests while others are scheduled;
        # memlab has no statuses: a request that holds no block yet pays it.
        watermark_blocks = (
            self.watermark_blocks if not self.coordinator.get_blocks(request_id) else 0
        )

        # Out-of-window blocks can go back even when this request cannot be scheduled, before
        # counting, so fewer cached blocks are evicted.
        self.coordinator.remove_skipped_blocks(request_id, total_computed_tokens)
        num_blocks_to_allocate = self.coordinator.get_num_blocks_to_allocate(
            request_id,
            num_tokens_need_slot,
            new_computed_blocks or [],
            num_local_computed_tokens,
        )
        if (
            num_blocks_to_allocate + watermark_blocks
            > self.block_pool.get_num_free_blocks()
        ):
            return None

        # The hits first: allocate_new_blocks could otherwise evict the very blocks hit.
        if new_computed_blocks:
            self.coordinator.allocate_new_computed_blocks(
                request_id, new_computed_blocks, num_local_computed_tokens
            )
        new_blocks = self.coordinator.allocate_new_blocks(
            request_id, num_tokens_need_slot
        )
        # Only tokens whose KV this step computes; lookahead slots hold no real token yet.
        self.coordinator.cache_blocks(
            request, min(total_computed_tokens + num_new_tokens, request.num_tokens)
        )
        return new_blocks

    # ---- release -----------------------------------------------------------------------------

    def free(self, request) -> None:
        """A finished (or preempted) request's blocks go back, tail first."""
        _validate_request(request)
        self.coordinator.free(request.request_id)

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int
    ) -> None:
        _validate_request_id(request_id)
        _checks.integer("processed_computed_tokens", processed_computed_tokens, 0)
        self.coordinator.remove_skipped_blocks(request_id, processed_computed_tokens)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    # ---- views -------------------------------------------------------------------------------

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        _validate_request_id(request_id)
        return self.coordinator.get_blocks(request_id)

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.get_blocks(request_id)]

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    @property
    def prefix_cache_hit_rate(self) -> float:
        return (
            self.prefix_cache_hits / self.prefix_cache_queries
            if self.prefix_cache_queries
            else 0.0
        )


# -- argument checks at the boundary ------------------------------------------------------------


def _validate_init(
    num_gpu_blocks, block_size, watermark, hash_fn, max_model_len, sliding_window
) -> None:
    """Everything the constructor reads, before any of it is built (the pool checks num_gpu_blocks
    again, with its own name for it)."""
    _checks.integer("num_gpu_blocks", num_gpu_blocks, 2, MAX_BLOCKS)
    _checks.integer("block_size", block_size, 1, MAX_BLOCKS)
    _checks.real("watermark", watermark, 0.0, 1.0, hi_open=True)
    get_hash_fn_by_name(hash_fn)
    if max_model_len is not None:
        _checks.integer("max_model_len", max_model_len, 1)
    if sliding_window is not None:
        _checks.integer("sliding_window", sliding_window, 1)


def _validate_request_id(request_id) -> None:
    _checks.instance("request_id", request_id, str)


def _validate_request(request) -> None:
    """What the manager reads of a request (a memlab.vllm.Request, or any object with these):
    its id, its block hashes and its token counts."""
    _checks.instance("request.request_id", getattr(request, "request_id", None), str)
    _checks.instance("request.block_hashes", getattr(request, "block_hashes", 0), list)
    _checks.integer("request.num_tokens", getattr(request, "num_tokens", None))
    num_computed_tokens = getattr(request, "num_computed_tokens", None)
    _checks.integer("request.num_computed_tokens", num_computed_tokens)


def _validate_allocate_slots(
    mgr,
    request,
    num_new_tokens,
    num_new_computed_tokens,
    new_computed_blocks,
    num_lookahead_tokens,
) -> None:
    _validate_request(request)
    # vLLM: "num_new_tokens must be greater than 0"
    _checks.integer("num_new_tokens", num_new_tokens, 1)
    _checks.integer("num_lookahead_tokens", num_lookahead_tokens, 0)
    _checks.integer("num_new_computed_tokens", num_new_computed_tokens, 0)
    blocks = [] if new_computed_blocks is None else new_computed_blocks
    _checks.instance(
        "new_computed_blocks", blocks, (list, tuple), "a list of KVCacheBlocks or None"
    )
    if blocks and not mgr.enable_caching:
        raise ValueError("computed blocks given while prefix caching is disabled")
    if num_new_computed_tokens > len(blocks) * mgr.block_size:
        raise ValueError(
            f"num_new_computed_tokens={num_new_computed_tokens} does not fit "
            f"{len(blocks)} computed blocks of {mgr.block_size} tokens"
        )
    if blocks and mgr.block_pool.debug_mode:  # scans: debug mode only, as the pool's
        _check_hits(mgr, request, blocks)


def _check_hits(mgr, request, blocks) -> None:
    """The hits get_computed_blocks found for this request, still holding its prefix: blocks
    of this pool, each (but the null blocks of a window) cached under the request's hash at its
    position, and the request not running yet (a running request's hits are in its table)."""
    if mgr.get_blocks(request.request_id):
        raise ValueError(
            f"new_computed_blocks for request {request.request_id!r}, which holds blocks "
            "already: hits are for a request being admitted"
        )
    own = mgr.block_pool.blocks
    for i, block in enumerate(blocks):
        _checks.instance(f"new_computed_blocks[{i}]", block, KVCacheBlock)
        if not 0 <= block.block_id < len(own) or own[block.block_id] is not block:
            raise ValueError(
                f"new_computed_blocks holds {block!r}, which is not a block of this pool"
            )
        if not block.is_null and (
            i >= len(request.block_hashes)
            or block.block_hash != request.block_hashes[i]
        ):
            raise ValueError(
                f"new_computed_blocks[{i}] (block {block.block_id}) no longer holds the "
                f"request's block {i}: a stale hit (look it up again)"
            )
