"""A slim KVCacheManager (vllm/v1/core/kv_cache_manager.py) for one KV cache group.

vLLM splits this across KVCacheManager, a coordinator and one SingleTypeKVCacheManager per
attention type (vllm/v1/core/kv_cache_manager.py, kv_cache_coordinator.py,
single_type_kv_cache_manager.py); with one group they collapse into the classes below, which
hand out the same blocks as vLLM 0.33 for the same calls (``./course engines`` runs both in
lockstep). Left out: KV connectors (external computed tokens), EAGLE's dropped last hit,
partial-block hits, sparse caching of sliding-window blocks, events and metrics. The
scheduler's calls, in order:

    blocks, n = manager.get_computed_blocks(request)           # prefix-cache lookup
    new_blocks = manager.allocate_slots(request, request.num_tokens - n, n, blocks)
    if new_blocks is None: ...                                 # short: preempt someone
    manager.free(request)                                      # finished
"""

from __future__ import annotations

from memlab.common.utils import ceil_div as cdiv  # vLLM's name for it
from memlab.vllm.block_pool import BlockPool, KVCacheBlock
from memlab.vllm.hashing import BlockHash, get_hash_fn_by_name, get_request_block_hasher


class KVCacheManager:
    """Full attention: every block a request ever took stays in its list until it finishes."""

    def __init__(self, num_gpu_blocks: int, block_size: int = 16, enable_caching: bool = True,
                 watermark: float = 0.0, hash_fn: str = "sha256", max_model_len: int | None = None):
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {watermark!r}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching)
        self.null_block = self.block_pool.null_block
        # Blocks kept free for requests already running, so a newly admitted request does not
        # force a preemption at the very next decode step. A fraction of ALL blocks, the null
        # block included, as in vLLM 0.33; only admissions (new or preempted requests) pay it.
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.request_block_hasher = get_request_block_hasher(block_size, get_hash_fn_by_name(hash_fn))
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}  # how many of a request's blocks are in the map
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    # ---- lookup ------------------------------------------------------------------------------

    def get_computed_blocks(self, request) -> tuple[list[KVCacheBlock], int]:
        """The longest run of cached blocks from the request's start, and its token count.

        At most num_tokens - 1 tokens can hit: the last token must be computed again to get the
        logits of the next one. Nothing is touched yet: the scheduler may still not admit it.
        """
        if not self.enable_caching:
            return [], 0
        blocks = self.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
        num_computed_tokens = len(blocks) * self.block_size
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += num_computed_tokens
        return blocks, num_computed_tokens

    def find_longest_cache_hit(self, block_hashes: list[BlockHash], max_length: int) -> list[KVCacheBlock]:
        get_cached_block = self.block_pool.get_cached_block
        computed = []
        for block_hash in block_hashes[:max(0, max_length) // self.block_size]:
            block = get_cached_block(block_hash)
            if block is None:  # the chain is broken: no later block can be the same prefix
                break
            computed.append(block)
        return computed

    # ---- allocation --------------------------------------------------------------------------

    def allocate_slots(self, request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[KVCacheBlock] | None = None,
                       num_lookahead_tokens: int = 0) -> list[KVCacheBlock] | None:
        """Blocks for num_new_tokens more tokens of the request, after its cache hits.

        Returns the newly taken blocks, or None when the pool is short (nothing changes: the
        scheduler preempts or waits). Hit blocks with ref_cnt 0 count as taken, because touching
        them takes them out of the free queue.
        """
        if not isinstance(num_new_tokens, int) or num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be an int > 0, got {num_new_tokens!r}")
        if num_lookahead_tokens < 0:
            raise ValueError(f"num_lookahead_tokens must be >= 0, got {num_lookahead_tokens!r}")
        new_computed_blocks = new_computed_blocks or []
        if new_computed_blocks and not self.enable_caching:  # before anything below changes the books
            raise ValueError("computed blocks given while prefix caching is disabled")
        if num_new_computed_tokens > len(new_computed_blocks) * self.block_size or num_new_computed_tokens < 0:
            raise ValueError(f"num_new_computed_tokens={num_new_computed_tokens} does not fit "
                             f"{len(new_computed_blocks)} computed blocks of {self.block_size} tokens")
        request_id = request.request_id
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens + num_lookahead_tokens
        if self.max_model_len is not None:
            num_tokens_need_slot = min(num_tokens_need_slot, self.max_model_len)

        # Out-of-window blocks can go back even when this request cannot be scheduled.
        self.remove_skipped_blocks(request_id, request.num_computed_tokens)

        is_new = request_id not in self.req_to_blocks
        req_blocks = self.req_to_blocks.get(request_id, [])
        num_new_blocks = max(0, cdiv(num_tokens_need_slot, self.block_size) - len(req_blocks)
                             - len(new_computed_blocks))
        num_evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)
        num_free = self.block_pool.get_num_free_blocks()
        if is_new:  # vLLM also waives it while no other request is scheduled in the step
            num_free -= self.watermark_blocks
        if num_new_blocks + num_evictable_hits > num_free:
            return None

        # Touch the hits first: get_new_blocks below could otherwise evict the very blocks hit.
        if self.enable_caching:
            self.block_pool.touch(new_computed_blocks)
        if is_new:
            self.req_to_blocks[request_id] = req_blocks
            self.num_cached_block[request_id] = len(new_computed_blocks)  # hits are cached already
        req_blocks.extend(new_computed_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks) if num_new_blocks else []
        req_blocks.extend(new_blocks)

        if self.enable_caching:
            # Only tokens whose KV this step computes; lookahead slots hold no real token yet.
            self.cache_blocks(request, min(num_computed_tokens + num_new_tokens, request.num_tokens))
        return new_blocks

    def cache_blocks(self, request, num_tokens: int) -> None:
        num_cached = self.num_cached_block.get(request.request_id, 0)
        num_full = num_tokens // self.block_size
        if num_full > num_cached:
            self.block_pool.cache_full_blocks(request, self.req_to_blocks[request.request_id], num_cached, num_full)
            self.num_cached_block[request.request_id] = num_full

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Full attention skips nothing; the sliding-window manager overrides this."""

    # ---- release -----------------------------------------------------------------------------

    def free(self, request) -> None:
        """Return a finished request's blocks in REVERSE order: with equal ref counts the tail
        of a prefix then reaches the free queue first and is evicted first, and the shared
        beginning stays cached longest."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_block.pop(request.request_id, None)
        self.block_pool.free_blocks(blocks[::-1])

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    # ---- views -------------------------------------------------------------------------------

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


class SlidingWindowKVCacheManager(KVCacheManager):
    """Sliding-window attention: a token only attends to the last sliding_window tokens, so
    blocks entirely before the window are returned to the pool and replaced by the null block
    in the request's list (positions stay put: the block table remains append-only)."""

    def __init__(self, num_gpu_blocks: int, block_size: int = 16, sliding_window: int = 4096, **kwargs):
        if not isinstance(sliding_window, int) or sliding_window <= 0:
            raise ValueError(f"sliding_window must be a positive int, got {sliding_window!r}")
        super().__init__(num_gpu_blocks, block_size, **kwargs)
        self.sliding_window = sliding_window

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        # The next token to compute is at position num_computed_tokens; it reads back to
        # position num_computed_tokens - sliding_window + 1, so whole blocks before that go.
        # vLLM's window counts the query, so position n - window goes (SGLang's leaves it out and keeps it).
        last_useful_block = (num_computed_tokens - self.sliding_window + 1) // self.block_size
        blocks = self.req_to_blocks.get(request_id)
        if last_useful_block <= 0 or not blocks:
            return
        removed = []
        for i in range(min(last_useful_block, len(blocks)) - 1, -1, -1):
            if blocks[i] is self.null_block:  # everything before was dropped on an earlier step
                break
            removed.append(blocks[i])
            blocks[i] = self.null_block
        self.block_pool.free_blocks(removed)  # collected back to front: tail first, as in free()

    def find_longest_cache_hit(self, block_hashes: list[BlockHash], max_length: int) -> list[KVCacheBlock]:
        """A hit needs only the blocks inside the window: scan from the right for enough
        consecutive cached blocks; everything before them is a null block."""
        max_num_blocks = max(0, max_length) // self.block_size
        needed = cdiv(self.sliding_window - 1, self.block_size)
        computed: list[KVCacheBlock] = [self.null_block] * max_num_blocks
        run = 0
        for i in range(max_num_blocks - 1, -1, -1):
            block = self.block_pool.get_cached_block(block_hashes[i])
            if block is None:
                run = 0
                continue
            computed[i] = block
            run += 1
            if run >= needed:
                return computed[:i + run]
        # No run long enough: only a run starting at block 0 (the prompt's beginning) counts.
        return computed[:run]
