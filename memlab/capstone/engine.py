"""The capstone: a Llama-style model served through memlab's books.

The model is ``memlab.capstone.tiny_llama.TinyLlama`` (re-exported here), random weights
from a fixed seed or a Hugging Face Llama checkpoint's (``memlab.capstone.checkpoint``;
the tests check it against transformers). ``generate_reference`` keeps each request's
K/V in one contiguous tensor; ``Engine`` serves a batch through the request table, a KV
pool, an allocator (page size 1 or more), a prefix cache and SGLang 0.5.23's scheduler:
chunked prefill, decode batches, admission by ``PrefillAdder`` and retraction when a
decode step cannot fit. Greedy outputs of the two must agree token for token; a request
ends after ``max_new_tokens`` or on one of the model's end-of-sequence tokens.

What the chapters taught, reused: the rows and slots go through
``memlab.sglang.allocation`` (SGLang's ``alloc_for_extend`` / ``alloc_for_decode``), the
admission through ``memlab.sglang.schedule_policy`` (``SchedulePolicy`` orders the waiting
queue, ``PrefillAdder`` admits against the free and evictable slots less what the running
requests will still write, times ``new_token_ratio``), the decode check and retraction
through ``sizing.check_decode_mem`` / ``sizing.retract_decode`` (chapter 08). A request
meets the prefix cache the way SGLang 0.5.23's scheduler has it meet the tree: matched
before the adder looks at it (``match_kv_cache``), locked when admitted, checkpointed
after every prefill chunk (``checkpoint_kv_cache``: the tree takes what it computed, the
lock moves), released when it finishes (``release_kv_cache(req, tree, checkpoint=True)``)
or is retracted (``checkpoint=False``: the tree keeps what was checkpointed). The prefix
cache is one of four, driven the same way: SGLang's ``RadixCache``, disabled (no prefix
cache: 0.5.23 builds a disabled tree, it has no ``ChunkCache``) or not, ``HiRadixCache``
with a host tier (chapter 11), or vLLM's block hashes on SGLang's pages
(``HashPrefixCache``, chapter 06's hashing).

Where the scheduler differs from SGLang's: one batch at a time (no overlap scheduler, no
mixed prefill and decode batches), greedy sampling only, and when even one request cannot
decode memlab raises where SGLang aborts it.
"""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict

import torch
import torch.nn.functional as F

# The model lives in its own module (memlab.capstone.checkpoint fills it); chapters
# import it from here too.
from memlab.capstone.tiny_llama import TinyConfig as TinyConfig
from memlab.capstone.tiny_llama import TinyLlama as TinyLlama
from memlab.capstone.tiny_llama import generate_reference as generate_reference
from memlab.capstone.tiny_llama import rope_inv_freq as rope_inv_freq
from memlab.common import _checks
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
from memlab.sglang.radix_cache import EvictResult, MatchResult, RadixCache, TreeLock
from memlab.sglang.req_to_token import Req, ReqToTokenPool
from memlab.sglang.schedule_policy import (
    CLIP_MAX_NEW_TOKENS,
    IGNORE_EOS_RESERVE_TOKENS,
    POLICIES,
    AddReqResult,
    NewTokenRatioTracker,
    PrefillAdder,
    SamplingParams,
    SchedulePolicy,
    match_kv_cache,
)
from memlab.sglang.sizing import (
    RunningReq,
    check_decode_mem,
    estimate_swa_kv_tokens,
    retract_decode,
)
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

    disable = (
        False  # an enabled cache, as SGLang's scheduler asks (``tree_cache.disable``)
    )
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
        # cached pages nobody maps, next to be evicted first
        self.lru: OrderedDict = OrderedDict()

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
        # the prefix's head goes last: a chain's tail is evicted first
        for page in reversed(node):
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
            at = torch.tensor([i for i, _ in dup], dtype=torch.int64)
            slots = page_rows(
                torch.tensor([pages[i] for i, _ in dup], dtype=torch.int64), ps
            )
            positions = (at[:, None] * ps + torch.arange(ps)).reshape(-1)
            self.req_to_token_pool.write(
                (kv.req_pool_idx, positions.to(row.device)),
                slots.to(row.device, torch.int32),
            )
        node = tuple(pages)
        # before the unlock: pages on both paths never pass through the LRU list
        new_lock = self.lock(node)
        self.unlock(req.lock)
        req.lock, req.last_node = new_lock, node
        kv.cache_protected_len = full * ps

    def free_kv_row(self, kv, ranges) -> None:
        free_kv_row(self.req_to_token_pool, self.token_to_kv_pool_allocator, kv, ranges)

    def device_pages(self) -> set:
        return set(self.hash_of)


class EngineReq(Req):
    """A request the engine serves: SGLang's request books (``memlab.sglang.req_to_token.Req``,
    with ``req.kv``), its ``sampling_params`` (when it stops) and what the scheduler's match and
    admission leave on it (``memlab.sglang.schedule_policy``)."""

    __slots__ = (
        "sampling_params",
        "prefix_indices",
        "last_host_node",
        "host_hit_length",
        "host_loaded_length",
        "finished",
    )

    def __init__(self, rid, prompt, max_new_tokens, ignore_eos=False):
        super().__init__(rid, prompt)
        self.sampling_params = SamplingParams(max_new_tokens, ignore_eos)
        # admitted, not yet allocated: the matched slots its new row starts with
        self.prefix_indices = None
        self.last_host_node = None
        self.host_hit_length = self.host_loaded_length = 0
        self.finished = False

    @property
    def max_new_tokens(self) -> int:
        return self.sampling_params.max_new_tokens

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


PREFIX_CACHES = (None, "hash", "radix", "hicache")
SCHEDULE_POLICIES = POLICIES
# SGLang's default --max-prefill-tokens: the prefill tokens of one batch (the chunk binds first)
MAX_PREFILL_TOKENS = 16384


class Engine:
    """Serve greedy generation for a stream of requests through memlab's books.

    ``prefix_cache``: ``"hash"`` (or True) vLLM's block hashes on SGLang's pages (chapter 06);
    ``"radix"`` SGLang's radix tree (chapter 11); ``"hicache"`` the radix tree with a host tier of
    ``host_tokens`` slots (chapter 11: evicted pages move to the host, a later hit loads them
    back); None (or False) no prefix cache (a disabled radix tree, as SGLang 0.5.23 builds).
    ``schedule_policy``: ``"fcfs"`` (the default) or ``"lpm"``, SGLang's longest prefix match
    first. ``chunk_size`` is SGLang's ``chunked_prefill_size`` (a multiple of the page); at most
    one request is prefilled in chunks at a time (``chunked_req``), the others wait or decode
    (``running``). ``ignore_eos``: requests run to ``max_new_tokens`` (the scheduler then counts
    their whole remaining output, not ``new_token_ratio`` of it). ``enable_mixed_chunk``:
    SGLang's ``--enable-mixed-chunk`` (off by default there too), the running requests decode in
    the same pass as a prefill instead of waiting for it. ``step_times`` adds up the
    seconds each step spends scheduling, allocating, in the model and on the requests' books.
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
        enable_mixed_chunk: bool = False,
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
        self.enable_mixed_chunk = enable_mixed_chunk
        self.req_to_token_pool = ReqToTokenPool(max_running, max_context, device=dev)
        self.swa_layers = [i for i in range(c.num_layers) if c.is_sliding(i)]
        if self.swa_layers and attention != "torch":
            raise ValueError(
                "a model with sliding-window layers is served with attention='torch'"
            )
        # a KV pool and its allocator built by the caller (the unified pool, chapter 12)
        if memory is not None:
            self.kv_pool, self.allocator = memory
        # chapter 07's two pools: full layers and sliding-window layers
        elif self.swa_layers:
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
        # what an idle pool offers
        self.empty_pool_tokens = self.allocator.available_size()
        # SGLang turns a cache-aware policy into FCFS when there is no prefix cache to be aware of
        self.policy = SchedulePolicy(schedule_policy, self.tree_cache)
        self.schedule_policy = self.policy.policy
        self.new_token_ratio_tracker = NewTokenRatioTracker()
        # The allocator's questions count on the window only where the tree slides it (supports_swa)
        self.sliding_window_size = window if self.tree_cache.supports_swa() else None
        # A request finishes at max_new_tokens or on an end-of-sequence token (SGLang's ignore_eos)
        self.ignore_eos = ignore_eos
        self.stop_token_ids = frozenset(() if ignore_eos else c.eos_token_ids)
        self.waiting: list[EngineReq] = []
        self.running: list[EngineReq] = []  # the decode batch (SGLang's running_batch)
        self.chunked_req: EngineReq | None = (
            None  # its prompt is being computed in chunks
        )
        self.finished: list[EngineReq] = []  # in the order they finished
        # The last forward pass's logits: one row per request (its last token), or, with
        # all_logits, every token's (the tests compare a whole prefill with transformers).
        self.all_logits = all_logits
        self.last_logits: torch.Tensor | None = None
        self.stats = Counter()
        # seconds per part of the steps so far: scheduling, allocation, model, the rest (the
        # requests' books: outputs, checkpoints, releases); the bench prints them
        self.step_times = Counter()

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
        r = EngineReq(self.stats["requests"], prompt, max_new_tokens, self.ignore_eos)
        self.stats["requests"] += 1
        self.waiting.append(r)
        return r

    def _swa_demand(self, input_tokens: int, max_new_tokens: int) -> int:
        """The most sliding-window slots a request holds at once (all of its slots without a
        window)."""
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
        """Whether the request could ever run. SGLang's scheduler clips max_new_tokens to
        max_new_tokens_for_memory and aborts a prompt it answers None for; memlab never clips (an
        output must not depend on the pool's size), so it refuses the None. Then two bounds on an
        empty pool: the adder's admission (``PrefillAdder``: the prompt, its whole output and a
        page, less than the pool holds; the walk of fixed-length requests without a prefix cache
        keeps one slot more), and the whole request held with a page spare
        (prealloc_ceiling_fits, where None means the pool has no ceiling of its own and its token
        count is the bound)."""
        alloc, ps = self.allocator, self.page_size
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
        if self.ignore_eos and self.tree_cache.disable:
            admission = ceil_align(input_tokens, ps) + ps + max_new_tokens
            admission += IGNORE_EOS_RESERVE_TOKENS
        else:
            admission = input_tokens + min(max_new_tokens, CLIP_MAX_NEW_TOKENS) + ps
        admission += alloc.request_slot_reserve(
            has_req_pool_slot=False, prefill_tokens=input_tokens
        )
        if admission >= self.empty_pool_tokens:
            return False
        # the next token may open a page
        demand = ceil_align(input_tokens + max_new_tokens, ps) + ps
        ceiling = alloc.prealloc_ceiling_fits(
            demand, self._swa_demand(input_tokens, max_new_tokens)
        )
        return demand <= alloc.size if ceiling is None else ceiling

    def available(self) -> int:
        """Slots a request could get now: free ones plus cached ones nobody maps (evictable)."""
        return self.allocator.available_size() + self.tree_cache.evictable_size()

    # -- scheduling ------------------------------------------------------------------------
    def step(self) -> bool:
        """One forward pass (SGLang's ``get_next_batch_to_run``, without the overlap scheduler):
        a prefill batch when the adder forms one (with ``enable_mixed_chunk``, the running
        requests decode in the same pass when their tokens fit), else a decode step of the
        running batch."""
        t0 = time.perf_counter()
        batch = self.get_new_batch_prefill()
        decoding = [] if batch else self.update_running_batch()
        self.step_times["scheduling"] += time.perf_counter() - t0
        if batch or decoding:
            self._run_batch(batch, decoding)
        elif self.waiting or self.chunked_req is not None:
            raise RuntimeError(
                f"stuck: {len(self.waiting)} waiting and a chunked prefill "
                f"{'' if self.chunked_req else 'not '}in progress, nothing can run"
            )
        else:
            self.new_token_ratio_tracker.reset()  # idle: SGLang resets it in its idle check
            return False
        if self.debug_mode:
            self.check_books()
        return True

    def get_new_batch_prefill(self) -> list[EngineReq]:
        """The next prefill batch (SGLang's ``Scheduler.get_new_batch_prefill``): the waiting queue
        ordered by the policy, then a ``PrefillAdder`` built on the running batch (their future
        output reserved through ``new_token_ratio``) takes the continuing chunked prefill first,
        then waiting requests in order, each matched against the prefix cache, until one does
        not fit (nobody overtakes) or the rows run out. Each request in the batch has its
        ``extend_end``; one cut short becomes ``chunked_req``."""
        if not self.waiting and self.chunked_req is None:
            return []
        rows = self.req_to_token_pool.available_size()
        if rows <= 0 and self.chunked_req is None:
            return []
        self.policy.calc_priority(self.waiting)
        adder = PrefillAdder(
            self.page_size,
            self.tree_cache,
            self.allocator,
            self.running,
            self.new_token_ratio_tracker.current,
            MAX_PREFILL_TOKENS,
            self.chunk_size,
            len(self.running) if self.enable_mixed_chunk else 0,
            sliding_window_size=self.sliding_window_size,
        )
        if self.chunked_req is not None:
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            held = sum(r.kv.holds_kv for r in adder.can_run_list)
            if len(adder.can_run_list) >= rows + held:
                break  # no row left
            match_kv_cache(req, self.tree_cache)
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None)
            if res != AddReqResult.CONTINUE:
                break
        batch = adder.can_run_list
        admitted = [r for r in batch if not r.kv.holds_kv]
        if admitted:
            taken = set(map(id, admitted))
            self.waiting = [r for r in self.waiting if id(r) not in taken]
        for r in admitted:
            r.prefix_indices = self.tree_cache.path_device_indices(r.last_node)
            self.stats["prompt_tokens"] += len(r.tokens)
            self.stats["cached_tokens"] += r.prefix_len
            self.stats["loaded_back_tokens"] += r.host_loaded_length
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        return batch

    def update_running_batch(self) -> list[EngineReq]:
        """The decode batch of this step (SGLang's ``update_running_batch``): when its next
        tokens do not fit (``check_decode_mem``, which evicts from the prefix cache first),
        requests are retracted (``retract_decode``: fewest decoded tokens first, always keeping
        one) and ``new_token_ratio`` is raised to what the kept ones have decoded; otherwise it
        decays a step. When even one request does not fit, SGLang aborts it; memlab raises."""
        if not self.running:
            return []
        if self._decode_fits():
            self.new_token_ratio_tracker.decay_step()
            return self.running
        ps, free = self.page_size, self.allocator.available_size
        views = self._decode_views(self.running)
        by_rid = {r.rid: r for r in self.running}
        kept, _, fits = retract_decode(
            views,
            free,
            ps,
            release=lambda v: self._retract(by_rid[v.rid]),
            evict=self._evict,
        )
        if not fits:  # SGLang aborts the last request here
            raise RuntimeError(
                f"the pool ({self.allocator.size} slots) cannot hold one more token of a "
                "single request"
            )
        self.new_token_ratio_tracker.current = (
            NewTokenRatioTracker.estimate_new_token_ratio_after_retract(self.running)
        )
        return self.running

    # -- forward passes --------------------------------------------------------------------
    def _forward(
        self,
        ids,
        positions,
        rows,
        out_cache_loc,
        logits_rows=None,
        extend=None,
        lens=None,
    ):
        """Write each token's K/V to its slot, then let each token attend to its row up to itself.

        Triton: every token is a one-query decode through chapter 09's kernel (a prefill chunk
        too: causal by construction). Torch: a decode batch (``lens``: each request's length, a
        host tensor) gathers its keys once per step (``_decode_attention``); a prefill batch
        (``extend``: per request, its row, its first token in the batch, its token count and how
        many were already in the pool) attends request by request with a causal mask, SGLang's
        extend attention, so a prefill gathers each row once instead of once per token.
        """
        from memlab.common import attention

        if self.swa_layers:
            return self._forward_swa(
                ids, positions, rows, out_cache_loc, logits_rows, extend
            )
        loc = KVWriteLoc(out_cache_loc, physical=True)
        seq_lens = (positions + 1).to(torch.int32)
        table = self.req_to_token_pool.req_to_token
        first = 0 if extend is None else sum(e[2] for e in extend)
        if self.attention == "torch" and lens is not None:
            # every request's keys in one flat list (no padding to the longest), gathered once
            # per step for all layers; the lengths come from the host: nothing waits on the device
            tok_req, _, key_pos = extend_positions(torch.zeros_like(lens), lens)
            tok_req = tok_req.to(rows.device)
            slots = table[rows[first:][tok_req], key_pos.to(rows.device)].long()
        if self.attention == "torch" and extend is not None:
            segments = [self._extend_segment(*e) for e in extend]

        def attend(layer, q, k, v):
            self.kv_pool.set_kv_buffer(layer, loc, k, v)
            k_buf, v_buf = self.kv_pool.get_kv_buffer(layer)
            if self.attention == "triton":
                return attention.decode_attention_fwd(
                    q, k_buf, v_buf, table, rows, seq_lens
                )
            if extend is None:
                return self._decode_attention(q, k_buf, v_buf, slots, tok_req)
            if lens is None:
                return self._extend_attention(q, k_buf, v_buf, segments)
            # a mixed batch: the prefill tokens, then one query per decoding request
            out = torch.empty_like(q)
            out[:first] = self._extend_attention(q[:first], k_buf, v_buf, segments)
            out[first:] = self._decode_attention(
                q[first:], k_buf, v_buf, slots, tok_req
            )
            return out

        logits = self.last_logits = self.model.forward(
            ids, positions, attend, None if self.all_logits else logits_rows
        )
        return (
            logits[logits_rows]
            if self.all_logits and logits_rows is not None
            else logits
        )

    @staticmethod
    def _decode_attention(q, k_buf, v_buf, slots, tok_req):
        """One query per request over its keys, in float32 (``attention_over_slots``' result,
        chapter 09): the keys of all requests in one flat list (``slots``, each key's request in
        ``tok_req``), a softmax per request (its largest score, its sum, its weighted values
        added up by request), so a batch of short rows beside a long one costs what its keys
        cost; grouped query heads share their KV head through a view."""
        bs, h, d = q.shape
        kvh = k_buf.shape[1]
        k, v = k_buf[slots].float(), v_buf[slots].float()  # (keys, kv heads, d)
        # each key's query, viewed (keys, kv heads, group, d)
        qs = q.float().reshape(bs, kvh, h // kvh, d)[tok_req]
        s = (qs * k[:, :, None]).sum(-1) / math.sqrt(d)  # (keys, kv heads, group)
        idx = tok_req[:, None, None].expand_as(s)
        top = s.new_full((bs, *s.shape[1:]), float("-inf"))
        top = top.scatter_reduce(0, idx, s, "amax")
        e = (s - top[tok_req]).exp()
        z = e.new_zeros(top.shape).index_add_(0, tok_req, e)
        o = e.new_zeros((*top.shape, v.shape[-1]))
        o.index_add_(0, tok_req, e[..., None] * v[:, :, None])
        return (o / z[..., None]).reshape(bs, h, -1).to(q.dtype)

    def _forward_swa(self, ids, positions, rows, out_cache_loc, logits_rows, extend):
        """A model with sliding-window layers: the allocator's write location carries both
        sides' ids (translated once per batch, marked physical by the unified pool); each layer
        reads its own side (a full layer its slots, translated to physical ones by a unified
        pool; a sliding layer the SWA slots mapped from them) and a sliding layer masks what
        left its window. Every request goes through the extend path (a decode is an extend of
        one token)."""
        loc = self.allocator.write_loc(out_cache_loc)
        if extend is None:
            extend = [
                (row, i, 1, p)
                for i, (row, p) in enumerate(zip(rows.tolist(), positions.tolist()))
            ]
        alloc, window = self.allocator, self.model.cfg.sliding_window
        # only virtual ids need translating
        full_ids = getattr(alloc, "translate_kv_loc", lambda s: s)
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
        """One request of a prefill batch: its slots (what was in the pool and this chunk) and
        which keys each of its ``n`` queries must not see (key j is visible to query t iff
        j <= pre + t)."""
        dev = self.model.device
        slots = self.req_to_token_pool.req_to_token[row, : pre + n].to(torch.int64)
        future = (
            torch.arange(pre + n, device=dev)[None, :]
            > pre + torch.arange(n, device=dev)[:, None]
        )
        return off, n, slots, future

    @staticmethod
    def _extend_attention(q, k_buf, v_buf, segments):
        """Causal attention of each request's new queries over its slots, in float32: one fused
        ``scaled_dot_product_attention`` per request, grouped query heads sharing their KV
        head (``enable_gqa``), ``future`` the keys each query must not see."""
        out = torch.empty_like(q)
        for off, n, slots, future in segments:
            qs = q[off : off + n].float().transpose(0, 1)  # (heads, n, d)
            k = k_buf[slots].float().transpose(0, 1)  # (kv heads, keys, d)
            v = v_buf[slots].float().transpose(0, 1)
            o = F.scaled_dot_product_attention(
                qs, k, v, attn_mask=~future, enable_gqa=True
            )
            out[off : off + n] = o.transpose(0, 1).to(q.dtype)
        return out

    def _run_batch(self, batch: list[EngineReq], decoding: list[EngineReq]) -> None:
        """One forward pass: the prefill chunks of ``batch``, then one token of each request in
        ``decoding`` (a decode step, or the running batch mixed into a prefill when
        ``enable_mixed_chunk`` is on and its tokens fit after the prefill took its slots, as
        SGLang's ``mix_with_running``; otherwise it sits this pass out, nothing retracted)."""
        t0 = time.perf_counter()
        pre_list = [r.prefix_len for r in batch]  # where each chunk starts
        ext_list = [r.extend_end - p for r, p in zip(batch, pre_list)]
        outs = []
        if batch:
            # Rows for the new requests, slots for every chunk, all written into the request
            # table (after evicting from the prefix cache if the pool is short).
            outs.append(
                alloc_for_extend(
                    self.req_to_token_pool,
                    self.allocator,
                    batch,
                    ext_list,
                    [r.prefix_indices for r in batch],
                    self.tree_cache,
                )
            )
            if outs[-1] is None:
                raise RuntimeError(
                    "alloc_for_extend refused a batch the scheduler admitted"
                )
            if self.enable_mixed_chunk and self.running and self._decode_fits():
                decoding = self.running
        if decoding:
            outs.append(
                alloc_for_decode(
                    self.req_to_token_pool, self.allocator, decoding, self.tree_cache
                )
            )
            if outs[-1] is None:
                raise RuntimeError(
                    f"the pool ({self.allocator.size} slots) cannot hold one more token "
                    "of a single request"
                )
        t1 = time.perf_counter()
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        ids, positions, rows, logits_rows, extend, lens = self._batch_tensors(
            batch, pre_list, ext_list, decoding
        )
        logits = self._forward(
            ids, positions, rows, out, logits_rows, extend=extend, lens=lens
        )
        picks = logits.argmax(-1).tolist()
        t2 = time.perf_counter()
        self.stats["prefill_tokens"] += sum(ext_list)
        self.stats["decode_tokens"] += len(decoding)
        finished = 0
        for r, nxt in zip(decoding, picks[len(batch) :]):
            finished += self._append(r, nxt)
        if finished:
            self.running = [r for r in self.running if not r.finished]
        for r, nxt in zip(batch, picks):
            r.prefix_indices = None
            if r is self.chunked_req:  # a chunk of a longer prefill: the tree takes it
                checkpoint_kv_cache(r, self.tree_cache)
            elif not self._append(r, nxt):
                # prefill done: the tree takes it, decoding goes on
                checkpoint_kv_cache(r, self.tree_cache)
                self.running.append(r)
        self._time(t0, t1, t2)

    def _batch_tensors(self, batch, pre_list, ext_list, decoding):
        """The forward pass's inputs, the prefill tokens first: token ids, positions, rows,
        which rows' logits to keep (None: all), the prefill segments and the decode lengths."""
        dev = self.model.device
        ids, positions, rows, logits_rows, extend, lens = [], [], [], None, None, None
        if batch:
            pre, ext = (
                torch.tensor(pre_list, dtype=torch.int64),
                torch.tensor(ext_list, dtype=torch.int64),
            )
            tok_req, starts, pos = extend_positions(pre, ext)
            batch_rows = torch.tensor(
                [r.kv.req_pool_idx for r in batch], dtype=torch.int64
            )
            ids.append(
                torch.tensor(
                    [
                        t
                        for r, p, n in zip(batch, pre_list, ext_list)
                        for t in r.tokens[p : p + n]
                    ],
                    dtype=torch.int64,
                )
            )
            positions.append(pos)
            rows.append(batch_rows[tok_req])
            extend = [
                (r.kv.req_pool_idx, off, n, p)
                for r, off, n, p in zip(batch, starts.tolist(), ext_list, pre_list)
            ]
            logits_rows = starts + ext - 1
        if decoding:
            # one tensor from the host: each request's row, length and last token
            # each field contiguous: the Triton kernel reads plain arrays
            books = torch.tensor(
                [
                    (r.kv.req_pool_idx, r.kv.kv_allocated_len, r.output_ids[-1])
                    for r in decoding
                ],
                dtype=torch.int64,
            ).T.contiguous()
            lens = books[1]
            ids.append(books[2])
            positions.append(lens - 1)
            rows.append(books[0])
            if logits_rows is not None:
                first = int(ext.sum())
                logits_rows = torch.cat(
                    (logits_rows, first + torch.arange(len(decoding)))
                )
        # the SWA path: a decode is an extend of one token
        if self.swa_layers and decoding:
            first = sum(ext_list)
            extend = (extend or []) + [
                (r.kv.req_pool_idx, first + i, 1, r.kv.kv_allocated_len - 1)
                for i, r in enumerate(decoding)
            ]
            lens = None
        cat = (lambda xs: xs[0]) if len(ids) == 1 else torch.cat
        return (
            cat(ids).to(dev),
            cat(positions).to(dev),
            cat(rows).to(dev),
            None if logits_rows is None else logits_rows.to(dev),
            extend,
            lens,
        )

    def _time(self, t0: float, t1: float, t2: float) -> None:
        self.step_times["allocation"] += t1 - t0
        self.step_times["model"] += t2 - t1
        self.step_times["books"] += time.perf_counter() - t2

    def _decode_fits(self) -> bool:
        """Whether the running batch's next tokens fit (SGLang's ``check_decode_mem``, which
        evicts from the prefix cache when it must). A page per request is the most a step can
        need: when that many are free, the exact count is not worth a pass over the batch."""
        ps, free = self.page_size, self.allocator.available_size
        if free() >= len(self.running) * ps:
            return True
        views = self._decode_views(self.running)
        return check_decode_mem(views, free, ps, evict=self._evict)

    @staticmethod
    def _decode_views(decoding) -> list[RunningReq]:
        # seq_len is the committed length: every token but the newest, whose KV this step computes
        return [
            RunningReq(
                r.rid,
                len(r.origin_input_ids),
                len(r.output_ids) - 1,
                r.kv.kv_allocated_len,
            )
            for r in decoding
        ]

    def _evict(self, num_tokens: int) -> None:
        evict_from_tree_cache(self.tree_cache, num_tokens)

    def _append(self, r: EngineReq, token: int) -> bool:
        """The request's next token; True when it finished, and then its KV is released into the
        prefix cache (``release_kv_cache(..., checkpoint=True)``: the tree keeps what it can key,
        the rest goes back to the allocator, the row to the request table). The caller takes it
        out of the running batch."""
        r.output_ids.append(token)
        if len(r.output_ids) < r.max_new_tokens and token not in self.stop_token_ids:
            return False
        r.finished = True
        self.finished.append(r)
        release_kv_cache(r, self.tree_cache, checkpoint=True)
        return True

    def _retract(self, r: EngineReq) -> None:
        """Give back a running request's memory (the chunked prefill's too); the prefix cache
        keeps what earlier checkpoints gave it (its prompt, once prefilled). It joins the back
        of the waiting queue, as SGLang's ``_add_request_to_queue`` puts it, and computes its
        prompt and output again later."""
        if r is self.chunked_req:
            self.chunked_req = None
        else:
            self.running.remove(r)
        release_kv_cache(r, self.tree_cache, checkpoint=False)
        r.reset_for_retract()
        self.waiting.append(r)
        self.stats["retracted"] += 1

    # -- books -----------------------------------------------------------------------------
    def page_books(self) -> tuple[dict, set, dict]:
        """Who holds each page: (page -> rid for pages a running request owns, the pages the prefix
        cache holds, cached page -> how many running requests map it)."""
        ps, table = self.page_size, self.req_to_token_pool.req_to_token
        owned, shared = {}, Counter()
        holders = self.running + ([self.chunked_req] if self.chunked_req else [])
        for r in holders:
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
        # a composite keeps books per side: it checks them
        if not hasattr(self.allocator, "free_pages"):
            self.allocator.check_books()
            return
        owned, cached, shared = self.page_books()
        free = self.allocator.get_all_free_pages().tolist()
        both = cached & set(owned)
        assert not both, f"pages {sorted(both)} are cached and owned"
        used = set(free) & (cached | set(owned))
        assert not used, f"pages {sorted(used)} are free and in use"
        assert len(free) + len(cached) + len(owned) == self.allocator.num_pages, (
            f"{len(free)} free + {len(cached)} cached + {len(owned)} owned != "
            f"{self.allocator.num_pages} pages"
        )
        assert set(shared) <= cached, (
            f"prefix pages {sorted(set(shared) - cached)} are not in the cache"
        )
        if not self.running and self.chunked_req is None:
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
    if chunk_size % page_size:  # SGLang's server refuses it too: chunks end on pages
        raise ValueError(
            f"chunk_size ({chunk_size}) must be a multiple of page_size ({page_size})"
        )
    if attention not in ("triton", "torch"):
        raise ValueError(f"attention must be 'triton' or 'torch', got {attention!r}")
    if attention == "triton":
        _checks.on_kernel_device("attention", model.device)
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
