"""The capstone: a Llama-style model served through memlab's books.

The model is ``memlab.capstone.tiny_llama.TinyLlama`` (re-exported here), random weights
from a fixed seed or a Hugging Face Llama checkpoint's (``memlab.capstone.checkpoint``;
the tests check it against transformers). ``generate_reference`` keeps each request's
K/V in one contiguous tensor; ``Engine`` serves a batch through the request table, a KV
pool, an allocator (page size 1 or more), a prefix cache and a scheduler with chunked
prefill, decode batches, admission against the allocator's capacity and retraction when
a decode step cannot fit. Greedy outputs of the two must agree token for token; a
request ends after ``max_new_tokens`` or on one of the model's end-of-sequence tokens.

What the chapters taught, reused: the rows and slots go through
``memlab.sglang.allocation`` (SGLang's ``alloc_for_extend`` / ``alloc_for_decode``), the
decode check and retraction through ``sizing.check_decode_mem`` /
``sizing.retract_decode`` (chapter 08). A request meets the prefix cache the way SGLang
0.5.23's scheduler has it meet the tree: matched and locked at admission
(``match_and_lock``), checkpointed after every prefill chunk (``checkpoint_kv_cache``:
the tree takes what it computed, the lock moves), released when it finishes
(``release_kv_cache(req, tree, checkpoint=True)``) or is retracted
(``checkpoint=False``: the tree keeps what was checkpointed). The prefix cache is one of
four, driven the same way: SGLang's ``RadixCache``, disabled (no prefix cache: 0.5.23
builds a disabled tree, it has no ``ChunkCache``) or not, ``HiRadixCache`` with a host
tier (chapter 11), or vLLM's block hashes on SGLang's pages (``HashPrefixCache``,
chapter 06's hashing).
"""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict, deque

import torch

# The model lives in its own module (memlab.capstone.checkpoint fills it); chapters
# import it from here too.
from memlab.capstone.tiny_llama import TinyConfig as TinyConfig
from memlab.capstone.tiny_llama import TinyLlama as TinyLlama
from memlab.capstone.tiny_llama import generate_reference as generate_reference
from memlab.capstone.tiny_llama import rope_inv_freq as rope_inv_freq
from memlab.common import _checks
from memlab.common.sizing import (
    RunningReq,
    check_decode_mem,
    estimate_swa_kv_tokens,
    new_tokens_required_next_decode,
    retract_decode,
)
from memlab.common.utils import ceil_align
from memlab.sglang.allocation import (
    alloc_for_decode,
    alloc_for_extend,
    checkpoint_kv_cache,
    evict_from_tree_cache,
    extend_positions,
    free_kv_row,
    release_kv_cache,
)
from memlab.sglang.allocator import make_allocator
from memlab.sglang.hicache import HiRadixCache, HostKVCache
from memlab.sglang.kv_pool import MHATokenToKVPool
from memlab.sglang.page_copy import page_rows
from memlab.sglang.radix_cache import (
    EvictResult,
    MatchResult,
    RadixCache,
    TreeLock,
    match_and_lock,
)
from memlab.sglang.req_to_token import Req, ReqToTokenPool
from memlab.sglang.swa import SWAKVPool, SWATokenToKVPoolAllocator
from memlab.sglang.write_loc import KVWriteLoc
from memlab.vllm.hashing import (
    get_hash_fn_by_name,
    hash_block_tokens,
    hash_request_tokens,
)


class HashPrefixCache:
    """vLLM's prefix cache (chapter 06) on SGLang's books: each full page a request computed is
    indexed by its chained block hash (``memlab.vllm.hashing``: the hash of a page stands for the
    whole prefix up to it); a later request whose prompt starts with the same pages maps them.

    Why not vLLM's ``BlockPool`` itself: there, the free queue IS the cache's eviction order (a
    cached block waits among the free blocks until it is handed out again), so the block pool
    must be the allocator. Here SGLang's allocators (chapters 03 to 05) own the free pages, so
    cached pages nobody maps wait in an LRU list outside the allocator and are evicted into it
    when the pool runs short, the way SGLang's radix cache does. It speaks the radix cache's
    names (``match_prefix``, ``lock``/``unlock``, ``checkpoint``, ``free_kv_row``, ``evict``), so
    the engine drives either one the same way; a match's "node" is the tuple of its pages.
    """

    __slots__ = (
        "token_to_kv_pool_allocator",
        "req_to_token_pool",
        "page_size",
        "hash_fn",
        "page_of",
        "hash_of",
        "ref",
        "lru",
    )

    def __init__(self, allocator, req_to_token_pool=None, hash_fn: str = "fast"):
        self.token_to_kv_pool_allocator = allocator
        self.req_to_token_pool = req_to_token_pool
        self.page_size = allocator.page_size
        self.hash_fn = get_hash_fn_by_name(hash_fn)
        self.page_of: dict = {}  # block hash -> page id
        self.hash_of: dict = {}  # page id -> block hash
        self.ref: Counter = Counter()  # running requests mapping each cached page
        self.lru: OrderedDict = (
            OrderedDict()
        )  # cached pages nobody maps, next to be evicted first

    def match_prefix(self, key) -> MatchResult:
        """The cached pages of ``key``'s longest prefix of full pages; a miss ends the chain."""
        ps, pages, parent = self.page_size, [], None
        for i in range(len(key) // ps):
            parent = hash_block_tokens(self.hash_fn, parent, key[i * ps : (i + 1) * ps])
            page = self.page_of.get(parent)
            if page is None:
                break
            pages.append(page)
        node = tuple(pages)
        return MatchResult(len(pages) * ps, node, node)

    def lock(self, node: tuple) -> TreeLock:
        self.inc_lock_ref(node)
        return TreeLock(node)

    def unlock(self, lock: TreeLock | None) -> None:
        if lock is not None:
            self.dec_lock_ref(lock.node)

    def inc_lock_ref(self, node: tuple) -> None:
        for page in node:
            self.ref[page] += 1
            self.lru.pop(page, None)

    def dec_lock_ref(self, node: tuple) -> None:
        for page in reversed(
            node
        ):  # the prefix's head goes last: a chain's tail is evicted first
            self.ref[page] -= 1
            if self.ref[page] == 0:
                del self.ref[page]
                self.lru[page] = None

    def path_device_indices(self, node: tuple) -> torch.Tensor:
        pages = torch.tensor(
            node, dtype=torch.int64, device=self.token_to_kv_pool_allocator.device
        )
        return page_rows(pages, self.page_size)

    def evictable_size(self) -> int:
        return len(self.lru) * self.page_size

    def supports_prefix_sharing(self) -> bool:
        return True

    def supports_swa(self) -> bool:
        return False  # shared pages keep their SWA slots (see RadixCache.supports_swa)

    def evict(self, num_tokens: int) -> EvictResult:
        """Drop the least recently used unmapped pages (at least ``num_tokens`` slots, when there
        are that many) and give them back to the allocator."""
        pages = []
        while self.lru and len(pages) * self.page_size < num_tokens:
            page, _ = self.lru.popitem(last=False)
            del self.page_of[self.hash_of.pop(page)]
            pages.append(page)
        if pages:
            alloc = self.token_to_kv_pool_allocator
            alloc.free_page_ids(
                torch.tensor(pages, dtype=torch.int64, device=alloc.device)
            )
        return EvictResult(len(pages) * self.page_size)

    def checkpoint(self, req, *, up_to: int) -> None:
        """The cache takes the request's full pages up to row position ``up_to``: each new page is
        indexed by its hash; a page whose hash is cached already (another request computed the
        same prefix) goes back to the allocator and the row maps the cached one. The request's
        lock moves to the new prefix and ``req.kv.cache_protected_len`` to its end (a checkpoint
        as the radix tree's: the partial last page stays the request's)."""
        ps, kv = self.page_size, req.kv
        full, start = up_to // ps, kv.cache_protected_len // ps
        if full <= start:
            return
        alloc, row = (
            self.token_to_kv_pool_allocator,
            self.req_to_token_pool.req_to_token[kv.req_pool_idx],
        )
        pages = (row[: full * ps : ps].to(torch.int64) // ps).tolist()
        hashes = hash_request_tokens(
            self.hash_fn, ps, req.full_untruncated_fill_ids[: full * ps]
        )
        dup = []
        for i in range(start, full):
            cached = self.page_of.get(hashes[i])
            if cached is None:
                self.page_of[hashes[i]], self.hash_of[pages[i]] = pages[i], hashes[i]
            else:
                dup.append((i, pages[i]))
                pages[i] = cached
        if dup:
            alloc.free_page_ids(
                torch.tensor(
                    [p for _, p in dup], dtype=torch.int64, device=alloc.device
                )
            )
            at = torch.tensor([i for i, _ in dup])
            slots = page_rows(
                torch.tensor([pages[i] for i, _ in dup], dtype=torch.int64), ps
            )
            positions = (at[:, None] * ps + torch.arange(ps)).reshape(-1)
            self.req_to_token_pool.write(
                (kv.req_pool_idx, positions.to(row.device)),
                slots.to(row.device, torch.int32),
            )
        node = tuple(pages)
        new_lock = self.lock(
            node
        )  # before the unlock: pages on both paths never pass through the LRU list
        self.unlock(req.lock)
        req.lock, req.last_node = new_lock, node
        kv.cache_protected_len = full * ps

    def free_kv_row(self, kv, ranges) -> None:
        free_kv_row(self.req_to_token_pool, self.token_to_kv_pool_allocator, kv, ranges)

    def device_pages(self) -> set:
        return set(self.hash_of)


class EngineReq(Req):
    """A request the engine serves: SGLang's request books (``memlab.sglang.req_to_token.Req``,
    with ``req.kv``) plus when it stops."""

    __slots__ = ("max_new_tokens", "prefix_indices", "finished")

    def __init__(self, rid, prompt, max_new_tokens):
        super().__init__(rid, prompt)
        self.max_new_tokens = max_new_tokens
        self.prefix_indices = None  # admitted, not yet allocated: the matched slots its new row starts with
        self.finished = False

    @property
    def prompt(self) -> list[int]:
        return self.origin_input_ids

    @property
    def output(self) -> list[int]:
        return self.output_ids

    @property
    def tokens(self) -> list[int]:
        return self.full_untruncated_fill_ids

    @property
    def kv_len(self) -> int:
        return self.kv.kv_allocated_len

    @property
    def prefilling(self) -> bool:
        """Still computing its prompt (or, after a retraction, prompt and output again)."""
        return (
            not self.output_ids
            or self.kv.kv_committed_len
            < len(self.origin_input_ids) + len(self.output_ids) - 1
        )


PREFIX_CACHES = (None, "hash", "radix", "hicache")
SCHEDULE_POLICIES = ("fcfs", "lpm")
# SGLang 0.5.23's schedule_policy.py: past this many waiting requests LPM falls back to FCFS (the
# matching is too expensive); a request whose cached prefix is at most CHECK tokens and that shares
# at least DEPRIORITIZE tokens with an earlier waiting request goes last this round (in-batch
# prefix caching: the earlier one computes the shared part, the later one then finds it cached).
WAITING_QUEUE_PREFIX_MATCH_MAX = 128
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32


def _common_prefix_len(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Engine:
    """Serve greedy generation for a stream of requests through memlab's books.

    ``prefix_cache``: ``"hash"`` (or True) vLLM's block hashes on SGLang's pages (chapter 06);
    ``"radix"`` SGLang's radix tree (chapter 11); ``"hicache"`` the radix tree with a host tier of
    ``host_tokens`` slots (chapter 11: evicted pages move to the host, a later hit loads them
    back); None (or False) no prefix cache (a disabled radix tree, as SGLang 0.5.23 builds).
    ``schedule_policy``: ``"fcfs"`` (the default) or ``"lpm"``, SGLang's longest prefix match first.
    A model with sliding-window layers is served through chapter 07's two pools (``size_swa`` SWA
    slots, ``num_tokens`` by default), or through ``memory``: a (KV pool, allocator) pair built by
    the caller, such as chapter 12's unified pool. Without a prefix cache each running request's
    window slides: before every decode step (and before a chunk of a chunked prefill) the SWA
    slots it no longer reads go back (``maybe_evict_swa``). With one, they stay until the tree
    evicts them: SGLang's hybrid tree tombstones the SWA side of shared nodes, memlab's tree does
    not (see ``RadixCache.supports_swa``). Whatever the allocator, the scheduler asks it
    only its capacity questions (``available_size``, ``request_slot_reserve``,
    ``max_new_tokens_for_memory``, ``prealloc_ceiling_fits``, ``prealloc_fits``,
    ``evict_to_free_tokens``).
    """

    def __init__(
        self,
        model: TinyLlama,
        *,
        page_size: int = 1,
        num_tokens: int = 2048,
        max_running: int = 8,
        max_context: int = 512,
        chunk_size: int = 64,
        attention: str = "triton",
        alloc_backend: str = "torch",
        prefix_cache: bool | str | None = True,
        host_tokens: int | None = None,
        write_policy: str = "write_through",
        ignore_eos: bool = False,
        all_logits: bool = False,
        schedule_policy: str = "fcfs",
        size_swa: int | None = None,
        memory: tuple | None = None,
        debug_mode: bool = False,
    ):
        kind = _validate_engine(
            model,
            page_size,
            num_tokens,
            max_running,
            max_context,
            chunk_size,
            attention,
            prefix_cache,
            schedule_policy,
        )
        c, dev = model.cfg, model.device
        self.model, self.page_size, self.chunk_size, self.attention = (
            model,
            page_size,
            chunk_size,
            attention,
        )
        self.debug_mode = debug_mode
        self.req_to_token_pool = ReqToTokenPool(max_running, max_context, device=dev)
        self.swa_layers = [i for i in range(c.num_layers) if c.is_sliding(i)]
        if self.swa_layers and attention != "torch":
            raise ValueError(
                "a model with sliding-window layers is served with attention='torch'"
            )
        if (
            memory is not None
        ):  # a KV pool and its allocator built by the caller (the unified pool, chapter 12)
            self.kv_pool, self.allocator = memory
        elif (
            self.swa_layers
        ):  # chapter 07's two pools: full layers and sliding-window layers
            full = [i for i in range(c.num_layers) if not c.is_sliding(i)]
            size_swa = num_tokens if size_swa is None else size_swa
            self.kv_pool = SWAKVPool(
                num_tokens,
                size_swa,
                page_size,
                model.dtype,
                c.num_kv_heads,
                c.head_dim,
                full,
                self.swa_layers,
                device=dev,
            )
            self.allocator = SWATokenToKVPoolAllocator(
                num_tokens,
                size_swa,
                page_size,
                model.dtype,
                dev,
                kvcache=self.kv_pool,
                debug_mode=debug_mode,
                backend=alloc_backend,
            )
        else:
            self.kv_pool = MHATokenToKVPool(
                num_tokens,
                page_size,
                model.dtype,
                c.num_kv_heads,
                c.head_dim,
                c.num_layers,
                device=dev,
            )
            self.allocator = make_allocator(
                num_tokens,
                page_size,
                dtype=model.dtype,
                device=dev,
                kvcache=self.kv_pool,
                debug_mode=debug_mode,
                backend=alloc_backend,
            )
        # SGLang's window size: the positions a query reads before its own
        # (config.sliding_window - 1)
        window = c.sliding_window - 1 if self.swa_layers else None
        self.tree_cache = self._make_tree_cache(kind, host_tokens, write_policy, window)
        # SGLang turns a cache-aware policy into FCFS when there is no prefix cache to be aware of
        self.schedule_policy = (
            schedule_policy if self.tree_cache.supports_prefix_sharing() else "fcfs"
        )
        # The allocator's questions count on the window only where the tree slides it (supports_swa)
        self.sliding_window_size = window if self.tree_cache.supports_swa() else None
        # A request finishes at max_new_tokens or on an end-of-sequence token (SGLang's ignore_eos)
        self.stop_token_ids = frozenset(() if ignore_eos else c.eos_token_ids)
        self.waiting: deque[EngineReq] = deque()
        self.running: list[EngineReq] = []
        self.finished: list[EngineReq] = []  # in the order they finished
        # The last forward pass's logits: one row per request (its last token), or, with
        # all_logits, every token's (the tests compare a whole prefill with transformers).
        self.all_logits = all_logits
        self.last_logits: torch.Tensor | None = None
        self.stats = Counter()

    def _make_tree_cache(self, kind, host_tokens, write_policy, window):
        pool = self.req_to_token_pool
        if kind == "hash":
            return HashPrefixCache(self.allocator, pool)
        if kind in (None, "radix"):
            return RadixCache(
                self.allocator,
                disable=kind is None,
                debug_mode=self.debug_mode,
                req_to_token_pool=pool,
                sliding_window_size=window,
            )
        host_tokens = 2 * self.allocator.size if host_tokens is None else host_tokens
        host = HostKVCache(
            self.kv_pool.host_pool_decls()[0],
            host_tokens,
            self.page_size,
            debug_mode=self.debug_mode,
        )
        return HiRadixCache(
            self.allocator,
            host,
            write_policy=write_policy,
            io_backend=self.attention,
            debug_mode=self.debug_mode,
            req_to_token_pool=pool,
        )

    # -- requests --------------------------------------------------------------------------
    def add_request(self, prompt, max_new_tokens: int) -> EngineReq:
        return self._enqueue(
            self._validate_request(prompt, max_new_tokens), max_new_tokens
        )

    def _enqueue(self, prompt: list[int], max_new_tokens: int) -> EngineReq:
        r = EngineReq(self.stats["requests"], prompt, max_new_tokens)
        self.stats["requests"] += 1
        self.waiting.append(r)
        return r

    def _swa_demand(self, input_tokens: int, max_new_tokens: int) -> int:
        """The most sliding-window slots a request holds at once (all of its slots without a window)."""
        return estimate_swa_kv_tokens(
            input_tokens,
            max_new_tokens,
            sliding_window_size=self.sliding_window_size,
            page_size=self.page_size,
            allocation_limit=self.chunk_size,
        )

    def generate(self, prompts, max_new_tokens: int) -> list[list[int]]:
        """Serve the prompts to completion; every prompt is checked before any is queued."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)):
            raise TypeError(
                f"prompts must be a list of prompts, got {type(prompts).__name__}"
            )
        checked = []
        for i, p in enumerate(prompts):
            try:
                checked.append(self._validate_request(p, max_new_tokens))
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"prompt {i}: {exc}") from None
        reqs = [self._enqueue(p, max_new_tokens) for p in checked]
        while self.step():
            pass
        return [r.output for r in reqs]

    def _validate_request(self, prompt, max_new_tokens) -> list[int]:
        """The prompt as a list of token ids in the vocabulary; the request must fit a row and the
        pool (else it could never be scheduled)."""
        if isinstance(prompt, torch.Tensor):
            if prompt.dim() != 1:
                raise ValueError(
                    f"prompt must be 1-D token ids, got shape {tuple(prompt.shape)}"
                )
            prompt = prompt.tolist()
        prompt = _checks.int_list(
            "prompt (token ids)", prompt, 0, self.model.cfg.vocab_size - 1
        )
        if len(prompt) == 0:
            raise ValueError("empty prompt")
        max_new_tokens = _checks.integer("max_new_tokens", max_new_tokens, 1)
        total = len(prompt) + max_new_tokens
        if total > self.req_to_token_pool.max_context_len:
            raise ValueError(
                f"a request of {total} tokens (prompt + max_new_tokens) exceeds max_context "
                f"{self.req_to_token_pool.max_context_len}"
            )
        if not self._can_ever_fit(len(prompt), max_new_tokens):
            raise ValueError(
                f"a request of {total} tokens (prompt + max_new_tokens) can never fit a pool of "
                f"{self.allocator.size} slots"
            )
        return prompt

    def _can_ever_fit(self, input_tokens: int, max_new_tokens: int) -> bool:
        """Two of the allocator's questions about an empty pool. SGLang's scheduler clips
        max_new_tokens to max_new_tokens_for_memory and aborts a prompt it answers None for;
        memlab never clips (an output must not depend on the pool's size), so it refuses the
        None, then asks whether the whole request could ever be held: prealloc_ceiling_fits,
        where None means the pool has no ceiling of its own and its token count is the bound."""
        alloc, ps = self.allocator, self.page_size
        demand = (
            ceil_align(input_tokens + max_new_tokens, ps) + ps
        )  # a page spare: the next token may open one
        if (
            alloc.max_new_tokens_for_memory(
                input_tokens,
                max_new_tokens,
                token_capacity=alloc.size,
                sliding_window_size=self.sliding_window_size,
                chunk_size=self.chunk_size,
            )
            is None
        ):
            return False
        ceiling = alloc.prealloc_ceiling_fits(
            demand, self._swa_demand(input_tokens, max_new_tokens)
        )
        return demand <= alloc.size if ceiling is None else ceiling

    def available(self) -> int:
        """Slots a request could get now: free ones plus cached ones nobody maps (evictable)."""
        return self.allocator.available_size() + self.tree_cache.evictable_size()

    # -- scheduling ------------------------------------------------------------------------
    def step(self) -> bool:
        """One forward pass: a prefill batch if one can be formed, else a decode batch."""
        batch = self._schedule_prefill()
        decoding = [r for r in self.running if not r.prefilling]
        if batch:
            self._run_extend(batch)
        elif decoding:
            self._run_decode(decoding)
        elif len(self.running) > 1:
            # Only prefills that cannot go on: the newest gives its pages back to the older ones.
            self._retract(self.running[-1])
        elif self.waiting or self.running:
            raise RuntimeError(
                f"stuck: {len(self.waiting)} waiting and {len(self.running)} running, none can run"
            )
        else:
            return False
        if self.debug_mode:
            self.check_books()
        return True

    def _schedule_prefill(self) -> list[tuple[EngineReq, int]]:
        """Chunks to compute this step as (request, tokens): unfinished chunked prefills first, then
        waiting requests in order while the pool can hold them (nobody overtakes). A new
        request first looks its tokens up in the prefix cache and locks what it finds;
        cut short, its chunk ends on a page boundary (SGLang's ``PrefillAdder``; a
        continuing chunk is not cut to a page, nor a chunk shorter than a page). Room is
        kept for the next decode step: a page for each decoding request
        whose committed length sits on a page boundary (``new_tokens_required_next_decode``)."""
        self._calc_priority()
        ps, budget, batch, taken = self.page_size, self.chunk_size, [], 0
        rows_left = self.req_to_token_pool.available_size()
        reserve = new_tokens_required_next_decode(
            self._decode_views([r for r in self.running if not r.prefilling]), ps
        )
        for r in [r for r in self.running if r.prefilling] + list(self.waiting):
            if budget <= 0:
                break
            new = not r.kv.holds_kv
            if new and rows_left == 0:
                break
            if new:
                r.prefix_indices, loaded = match_and_lock(self.tree_cache, r)
            start = r.prefix_len
            n = min(len(r.tokens) - start, budget)
            if new and start + n < len(r.tokens):
                # unless that leaves nothing: no progress is worse than a partial page
                # (SGLang's rule for its chunk grid, floor_chunked_tokens)
                n = (start + n) // ps * ps - start or n
            need = ceil_align(start + n, ps) - ceil_align(start, ps)
            need += self.allocator.request_slot_reserve(
                has_req_pool_slot=not new, prefill_tokens=start + n
            )
            if n <= 0 or not self._fits(need, self.available() - reserve - taken):
                if new:
                    self._unmatch(r)
                break
            if new:
                self._admit(r, loaded)
                rows_left -= 1
            r.extend_end = start + n
            if r.extend_end == len(r.tokens) and r.extend_end % ps == 0:
                reserve += ps  # it decodes next step, and its next token opens a page
            batch.append((r, n))
            budget -= n
            taken += need
        return batch

    def _calc_priority(self) -> None:
        """Order the waiting queue (SGLang's ``SchedulePolicy.calc_priority``). FCFS: as they came
        (a retracted request is at the front). LPM: longest cached prefix first, each request
        matched against the prefix cache without a lock (the match refreshes the path's LRU time,
        as SGLang's does); a request that would only recompute what an earlier waiting one is
        about to compute goes last (in-batch prefix caching). The sort is stable: ties stay FCFS."""
        if (
            self.schedule_policy != "lpm"
            or len(self.waiting) > WAITING_QUEUE_PREFIX_MATCH_MAX
        ):
            return
        matched, deprioritized, waiting_prefixes = {}, set(), []
        for r in self.waiting:
            fill = r.full_untruncated_fill_ids
            m = self.tree_cache.match_prefix(fill[: len(fill) - 1])
            matched[r.rid] = m.device_prefix_len + m.host_hit_length
            if matched[r.rid] <= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
                shared = max(
                    (_common_prefix_len(fill, p) for p in waiting_prefixes), default=0
                )
                if shared >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                    deprioritized.add(r.rid)
                else:
                    waiting_prefixes.append(fill)
        self.waiting = deque(
            sorted(
                self.waiting,
                key=lambda r: math.inf if r.rid in deprioritized else -matched[r.rid],
            )
        )

    def _fits(self, need: int, budget: int) -> bool:
        """The allocator's answer: does a chunk of ``need`` slots fit what the step has left (free and
        evictable slots, less the decode reserve and this step's earlier chunks)? A single pool
        compares the two; a composite prices both of its sides at once. (SGLang's decode side asks
        ``prealloc_fits`` this way; its prefill adder keeps per-side budgets.)"""
        return self.allocator.prealloc_fits(
            self.tree_cache, need, need, full_budget_tokens=budget
        )

    def _unmatch(self, r: EngineReq) -> None:
        """A matched request that is not admitted this step gives its lock back."""
        self.tree_cache.unlock(r.lock)
        r.lock = r.last_node = r.prefix_indices = None
        r.prefix_len = r.kv.cache_protected_len = 0

    def _admit(self, r: EngineReq, loaded: int) -> None:
        self.waiting.remove(r)
        self.running.append(r)
        self.stats["prompt_tokens"] += len(r.tokens)
        self.stats["cached_tokens"] += r.prefix_len
        self.stats["loaded_back_tokens"] += loaded

    # -- forward passes --------------------------------------------------------------------
    def _forward(
        self, ids, positions, rows, out_cache_loc, logits_rows=None, extend=None
    ):
        """Write each token's K/V to its slot, then let each token attend to its row up to itself.

        Triton: every token is a one-query decode through chapter 09's kernel (a prefill chunk
        too: causal by construction). Torch: a decode batch goes through ``attention_over_slots``;
        a prefill batch (``extend``: per request, its row, its first token in the batch, its token
        count and how many were already in the pool) attends request by request with a causal mask,
        SGLang's extend attention, so a prefill gathers each row once instead of once per token.
        """
        from memlab.common import attention

        if self.swa_layers:
            return self._forward_swa(
                ids, positions, rows, out_cache_loc, logits_rows, extend
            )
        loc = KVWriteLoc(out_cache_loc, physical=True)
        seq_lens = (positions + 1).to(torch.int32)
        table = self.req_to_token_pool.req_to_token
        if (
            self.attention == "torch" and extend is None
        ):  # the same slots for every layer: gather once
            slots, mask = attention.slots_from_req_to_token(table, rows, seq_lens)
        elif self.attention == "torch":
            segments = [self._extend_segment(*e) for e in extend]

        def attend(layer, q, k, v):
            self.kv_pool.set_kv_buffer(layer, loc, k, v)
            k_buf, v_buf = self.kv_pool.get_kv_buffer(layer)
            if self.attention == "triton":
                return attention.decode_attention_fwd(
                    q, k_buf, v_buf, table, rows, seq_lens
                )
            if extend is None:
                return attention.attention_over_slots(
                    q, k_buf, v_buf, slots, mask, 1 / math.sqrt(q.shape[-1])
                )
            return self._extend_attention(q, k_buf, v_buf, segments)

        logits = self.last_logits = self.model.forward(
            ids, positions, attend, None if self.all_logits else logits_rows
        )
        return (
            logits[logits_rows]
            if self.all_logits and logits_rows is not None
            else logits
        )

    def _forward_swa(self, ids, positions, rows, out_cache_loc, logits_rows, extend):
        """A model with sliding-window layers: the allocator's write location carries both sides' ids
        (translated once per batch, marked physical by the unified pool); each layer
        reads its own side (a full layer its slots, translated to physical ones by a
        unified pool; a sliding layer the SWA slots mapped from them) and a sliding
        layer masks what left its window. Every request
        goes through the extend path (a decode is an extend of one token)."""
        loc = self.allocator.write_loc(out_cache_loc)
        if extend is None:
            extend = [
                (row, i, 1, p)
                for i, (row, p) in enumerate(zip(rows.tolist(), positions.tolist()))
            ]
        alloc, window = self.allocator, self.model.cfg.sliding_window
        full_ids = getattr(
            alloc, "translate_kv_loc", lambda s: s
        )  # only virtual ids need translating
        segments, swa_segments = [], []
        for e in extend:
            off, n, slots, future = self._extend_segment(*e)
            segments.append((off, n, full_ids(slots), future))
            pre = e[3]
            q_pos = pre + torch.arange(n, device=slots.device)[:, None]
            gone = q_pos - torch.arange(pre + n, device=slots.device)[None, :] >= window
            swa_segments.append(
                (off, n, alloc.translate_loc_from_full_to_swa(slots), future | gone)
            )

        def attend(layer, q, k, v):
            self.kv_pool.set_kv_buffer(layer, loc, k, v)
            k_buf, v_buf = self.kv_pool.get_kv_buffer(layer)
            return self._extend_attention(
                q, k_buf, v_buf, swa_segments if layer in self.swa_layers else segments
            )

        logits = self.last_logits = self.model.forward(
            ids, positions, attend, None if self.all_logits else logits_rows
        )
        return (
            logits[logits_rows]
            if self.all_logits and logits_rows is not None
            else logits
        )

    def _extend_segment(self, row: int, off: int, n: int, pre: int):
        """One request of a prefill batch: its slots (what was in the pool and this chunk) and which
        keys each of its ``n`` queries must not see (key j is visible to query t iff j <= pre + t)."""
        dev = self.model.device
        slots = self.req_to_token_pool.req_to_token[row, : pre + n].to(torch.int64)
        future = (
            torch.arange(pre + n, device=dev)[None, :]
            > pre + torch.arange(n, device=dev)[:, None]
        )
        return off, n, slots, future

    @staticmethod
    def _extend_attention(q, k_buf, v_buf, segments):
        """Causal attention of each request's new queries over its slots, in float32."""
        _, h, d = q.shape
        kvh = k_buf.shape[1]
        out = torch.empty_like(q)
        for off, n, slots, future in segments:
            qs = (
                q[off : off + n].float().view(n, kvh, h // kvh, d)
            )  # grouped query heads share a KV head
            k, v = k_buf[slots].float(), v_buf[slots].float()  # (keys, kv heads, d)
            s = torch.einsum("nkgd,skd->kgns", qs, k) / math.sqrt(d)
            p = s.masked_fill(future, float("-inf")).softmax(-1)
            out[off : off + n] = (
                torch.einsum("kgns,skd->nkgd", p, v).reshape(n, h, -1).to(q.dtype)
            )
        return out

    def _run_extend(self, batch) -> None:
        dev = self.model.device
        ext = torch.tensor([n for _, n in batch])
        # Rows for the new requests, slots for every chunk, all written into the request table
        # (after evicting from the prefix cache if the pool is short).
        out = alloc_for_extend(
            self.req_to_token_pool,
            self.allocator,
            [r for r, _ in batch],
            ext.tolist(),
            [r.prefix_indices for r, _ in batch],
            self.tree_cache,
        )
        if out is None:
            raise RuntimeError(
                "alloc_for_extend refused a batch the scheduler admitted"
            )
        for r, _ in batch:
            r.prefix_indices = None
        pre = torch.tensor([r.prefix_len for r, _ in batch])  # where each chunk starts
        rows = torch.tensor([r.kv.req_pool_idx for r, _ in batch], device=dev)
        total = int(ext.sum())
        tok_req, starts, pos = extend_positions(pre, ext)
        pos = pos.to(dev)
        tok_rows = rows[tok_req.to(dev)]
        ids = torch.tensor(
            [t for (r, n), p in zip(batch, pre.tolist()) for t in r.tokens[p : p + n]],
            device=dev,
        )
        ends = (starts + ext - 1).to(dev)
        extend = [
            (r.kv.req_pool_idx, off, n, p)
            for (r, n), off, p in zip(batch, starts.tolist(), pre.tolist())
        ]
        picks = (
            self._forward(ids, pos, tok_rows, out, logits_rows=ends, extend=extend)
            .argmax(-1)
            .tolist()
        )
        self.stats["prefill_tokens"] += total
        for (r, _n), nxt in zip(batch, picks):
            if r.extend_end == len(
                r.tokens
            ):  # the whole sequence is in: its last logits give the next token
                if not self._append(r, nxt):
                    checkpoint_kv_cache(
                        r, self.tree_cache
                    )  # prefill done: the tree takes it, decoding goes on
            else:  # a chunk of a longer prefill: the tree takes it before the next chunk
                checkpoint_kv_cache(r, self.tree_cache)

    def _run_decode(self, decoding: list[EngineReq]) -> None:
        decoding = self._retract_for_decode(decoding)
        dev = self.model.device
        out = alloc_for_decode(
            self.req_to_token_pool, self.allocator, decoding, self.tree_cache
        )
        if out is None:
            raise RuntimeError(
                f"the pool ({self.allocator.size} slots) cannot hold one more token of a single request"
            )
        rows = torch.tensor([r.kv.req_pool_idx for r in decoding], device=dev)
        positions = torch.tensor([r.kv_len - 1 for r in decoding], device=dev)
        ids = torch.tensor([r.tokens[-1] for r in decoding], device=dev)
        logits = self._forward(ids, positions, rows, out)
        self.stats["decode_tokens"] += len(decoding)
        for r, nxt in zip(decoding, logits.argmax(-1).tolist()):
            self._append(r, nxt)

    @staticmethod
    def _decode_views(decoding) -> list[RunningReq]:
        # seq_len is the committed length: every token but the newest, whose KV this step computes
        return [
            RunningReq(r.rid, len(r.prompt), len(r.output) - 1, r.kv_len)
            for r in decoding
        ]

    def _evict(self, num_tokens: int) -> None:
        evict_from_tree_cache(self.tree_cache, num_tokens)

    def _retract_for_decode(self, decoding: list[EngineReq]) -> list[EngineReq]:
        """The requests that keep decoding when this step's pages are short (chapter 08).

        The check is SGLang's ``check_decode_mem``: a page for each request whose committed length
        sits on a page boundary, evicting from the prefix cache inside the check. When it fails,
        first the requests still prefilling go: they hold pages, take no part in this step, and
        retracting them loses least (memlab's order; SGLang's admission keeps a larger reserve
        for future decode tokens and rarely gets here). Then ``sizing.retract_decode`` over the
        decode batch, as SGLang: fewest decoded tokens first, releasing each victim at once and
        reading the books again, always keeping one. (SGLang also evicts 20 tokens per request
        left from the tree after each victim; memlab does not.)
        """
        ps, free = self.page_size, self.allocator.available_size
        views = self._decode_views(decoding)
        if check_decode_mem(views, free, ps, evict=self._evict):
            return decoding
        for r in [r for r in reversed(self.running) if r.prefilling]:
            self._retract(r)
            if check_decode_mem(views, free, ps, evict=self._evict):
                return decoding
        by_rid = {r.rid: r for r in decoding}
        kept, _, fits = retract_decode(
            views,
            free,
            ps,
            release=lambda v: self._retract(by_rid[v.rid]),
            evict=self._evict,
        )
        if not fits:
            raise RuntimeError(
                f"the pool ({self.allocator.size} slots) cannot hold one more token of a single request"
            )
        return [by_rid[v.rid] for v in kept]

    def _append(self, r: EngineReq, token: int) -> bool:
        """The request's next token; True when it finished, and then its KV is released into the
        prefix cache (``release_kv_cache(..., checkpoint=True)``: the tree keeps what it can key,
        the rest goes back to the allocator, the row to the request table)."""
        r.output_ids.append(token)
        if len(r.output_ids) < r.max_new_tokens and token not in self.stop_token_ids:
            return False
        r.finished = True
        self.running.remove(r)
        self.finished.append(r)
        release_kv_cache(r, self.tree_cache, checkpoint=True)
        return True

    def _retract(self, r: EngineReq) -> None:
        """Give back a running request's memory; the prefix cache keeps what earlier checkpoints gave
        it (its prompt, once prefilled). It waits at the front and recomputes the rest later."""
        self.running.remove(r)
        release_kv_cache(r, self.tree_cache, checkpoint=False)
        r.reset_for_retract()
        self.waiting.appendleft(r)
        self.stats["retracted"] += 1

    # -- books -----------------------------------------------------------------------------
    def page_books(self) -> tuple[dict, set, dict]:
        """Who holds each page: (page -> rid for pages a running request owns, the pages the prefix
        cache holds, cached page -> how many running requests map it)."""
        ps, table = self.page_size, self.req_to_token_pool.req_to_token
        owned, shared = {}, Counter()
        for r in self.running:
            if not r.kv.holds_kv:  # matched, not yet allocated: it holds only its lock
                continue
            row = table[r.kv.req_pool_idx, : r.kv_len].tolist()
            cpl = r.kv.cache_protected_len  # the prefix cache owns the row up to here
            for s in row[cpl:]:
                assert owned.setdefault(s // ps, r.rid) == r.rid, (
                    f"page {s // ps} held by requests {owned[s // ps]} and {r.rid}"
                )
            shared.update({s // ps for s in row[:cpl]})
        return owned, self.tree_cache.device_pages(), dict(shared)

    def check_books(self) -> None:
        """Every page is exactly one of: free, owned by a running request, or held by the prefix
        cache; running requests map only cached pages in their prefixes; idle, the cache and the
        free list hold the whole pool."""
        if not hasattr(
            self.allocator, "free_pages"
        ):  # a composite keeps books per side: it checks them
            self.allocator.check_books()
            return
        owned, cached, shared = self.page_books()
        free = self.allocator.get_all_free_pages().tolist()
        both = cached & set(owned)
        assert not both, f"pages {sorted(both)} are cached and owned"
        used = set(free) & (cached | set(owned))
        assert not used, f"pages {sorted(used)} are free and in use"
        assert len(free) + len(cached) + len(owned) == self.allocator.num_pages, (
            f"{len(free)} free + {len(cached)} cached + {len(owned)} owned != {self.allocator.num_pages} pages"
        )
        assert set(shared) <= cached, (
            f"prefix pages {sorted(set(shared) - cached)} are not in the cache"
        )
        if not self.running:
            total = self.allocator.num_pages * self.page_size
            assert self.available() == total, (
                f"idle: {self.available()} available + evictable != {total} slots"
            )


def _validate_engine(
    model,
    page_size,
    num_tokens,
    max_running,
    max_context,
    chunk_size,
    attention,
    prefix_cache,
    schedule_policy,
):
    """The engine's own arguments, before any pool is built; returns the prefix cache's kind. The
    pools check the rest (dtype, device) under their own names."""
    if not isinstance(model, TinyLlama):
        raise TypeError(f"model must be a TinyLlama, got {type(model).__name__}")
    limit = 2**31 - 1  # slots and rows are int32 in the request table
    for name, v in (
        ("page_size", page_size),
        ("num_tokens", num_tokens),
        ("max_running", max_running),
        ("max_context", max_context),
        ("chunk_size", chunk_size),
    ):
        _checks.integer(name, v, 1, limit)
    if attention not in ("triton", "torch"):
        raise ValueError(f"attention must be 'triton' or 'torch', got {attention!r}")
    if schedule_policy not in SCHEDULE_POLICIES:
        raise ValueError(
            f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {schedule_policy!r}"
        )
    kind = (
        {True: "hash", False: None}.get(prefix_cache, prefix_cache)
        if isinstance(prefix_cache, (bool, str)) or prefix_cache is None
        else prefix_cache
    )
    if kind not in PREFIX_CACHES:
        raise ValueError(
            f"prefix_cache must be one of {PREFIX_CACHES} (or True/False), got {prefix_cache!r}"
        )
    return kind


def throughput(engine: Engine, prompts, max_new_tokens: int) -> dict:
    """Run a batch to completion; tokens per second of the whole run (prefill + decode)."""
    t0 = time.perf_counter()
    outs = engine.generate(prompts, max_new_tokens)
    dt = time.perf_counter() - t0
    gen = sum(len(o) for o in outs)
    return dict(
        seconds=dt,
        generated=gen,
        prefill=engine.stats["prefill_tokens"],
        tokens_per_s=(gen + engine.stats["prefill_tokens"]) / dt,
        generated_per_s=gen / dt,
    )
