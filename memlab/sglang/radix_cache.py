"""Above the allocator: SGLang's radix prefix cache (sglang/srt/mem_cache/radix_cache.py).

A radix tree over token ids. Each node holds the edge's tokens (``key``) and the KV slots of
those tokens (``value``, slot indices handed out by the allocator). A new request walks the tree
with its prompt (``match_prefix``) and reuses the slots of the longest match. Nodes that running
requests use are locked (``lock``/``unlock``, over ``inc_lock_ref``/``dec_lock_ref``: the whole
path to the root); the tree ``evict``s unlocked leaves, least recently used first, and gives their
slots back to the allocator.

A request meets the tree through ``checkpoint(req, up_to=...)``: after each prefill chunk
(``allocation.checkpoint_kv_cache``) and once more when it finishes
(``allocation.release_kv_cache(req, tree, checkpoint=True)``). A checkpoint inserts the request's
page-aligned tokens with their slots (the tree keeps the part it did not have), frees the
request's copies of what the tree already held and points its row at the tree's, moves the
request's lock to the new last node and advances ``req.kv.cache_protected_len`` (the tree owns the
row up to there). The insert splits the leaf at the page-aligned prompt (the prompt gets
priority + 1), so a finished request's output can be evicted without its prompt.

With ``page_size > 1`` keys are cut to whole pages (``page_aligned``) and compared page by page:
the tree only ever holds whole pages, so every value is a run of page-aligned slots.

Three counters keep the books: ``evictable_size`` (tokens the tree holds and could free),
``protected_size`` (tokens locked by running requests), and, outside the tree, the allocator's
``available_size``. With no request running, SGLang's scheduler checks that they add up to the
pool (``check_idle``).

0.5.23's scheduler builds ``UnifiedRadixCache`` by default (a disabled cache included);
``RadixCache``, the class memlab mirrors, is its reference class (what ``PureSWARadixCache`` and
SGLang's tests build), with the same checkpoint protocol.

The calls take SGLang's parameter objects (``match_prefix(MatchPrefixParams(key=RadixKey(...)))``,
``insert(InsertParams(...))``, ``evict(EvictParams(num_tokens=...))``, which SGLang keeps in
``base_prefix_cache.py``). An insert brings its slots (SGLang's simulated trees may let the token
ids stand in for them; memlab's trees sit on a real allocator and refuse that). memlab's short
calls are a convenience on top, for the chapters: the key
alone (a ``RadixKey`` or plain token ids), ``insert(key, value, priority=..., inserted_len=...)``
and ``evict(num_tokens)`` build the same objects.

Where memlab differs from SGLang 0.5.23: a node's key is a tuple of token ids, and the tree keeps
one namespace: a ``RadixKey`` that asks for a LoRA/salt namespace (``extra_key``, ``cache_salt``)
or EAGLE's bigram view is refused; the LRU clock is a counter (SGLang reads
``time.monotonic()``: the same order, but reproducible); only the LRU policy, so a node's
``priority`` is kept but never read (SGLang's ``priority`` policy reads it); ties in access time
go to the older node (SGLang's heap breaks them by its set's order); no KV events or metrics.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import sys
from array import array
from collections.abc import Sequence
from typing import NamedTuple

import torch

from memlab.common import _checks
from memlab.common.utils import ceil_align
from memlab.sglang.allocation import free_kv_row

_INT64_MAX = torch.iinfo(torch.int64).max


class RadixKey:
    """SGLang's key: token ids, the namespace they live in (``extra_key``: a LoRA adapter;
    ``cache_salt``: a per-user salt), EAGLE's bigram view (``is_bigram``) and an optional cap on
    the tokens read (``limit``: as if ``token_ids[:limit]``, without the copy). memlab's tree
    reads the token ids and the cap, and keeps one namespace and no bigram view."""

    __slots__ = ("token_ids", "extra_key", "cache_salt", "is_bigram", "limit")

    def __init__(
        self,
        token_ids,
        extra_key: str | None = None,
        is_bigram: bool = False,
        limit: int | None = None,
        cache_salt: str | None = None,
    ):
        self.token_ids = token_ids
        self.extra_key = extra_key
        self.cache_salt = cache_salt or None
        self.is_bigram = is_bigram
        self.limit = limit

    def raw_token_ids(self):
        """``token_ids`` honouring ``limit`` (a copy only when capped)."""
        t, n = self.token_ids, self.limit
        return t if n is None or n >= len(t) else t[:n]

    def __len__(self) -> int:
        return len(self.raw_token_ids())

    def __getitem__(self, idx: slice) -> RadixKey:
        return RadixKey(
            self.raw_token_ids()[idx], self.extra_key, cache_salt=self.cache_salt
        )

    def page_aligned(self, page_size: int) -> RadixKey:
        return self if page_size == 1 else self[: len(self) // page_size * page_size]

    def __repr__(self) -> str:
        return (
            f"RadixKey(token_ids={list(self.raw_token_ids())[:10]}, "
            f"extra_key={self.extra_key!r}, cache_salt={self.cache_salt!r})"
        )


# The parameter objects and results of SGLang's base_prefix_cache.py, with the fields memlab's
# trees read (SGLang's also carry Mamba, SWA and session fields for its other trees).
@dataclasses.dataclass
class MatchPrefixParams:
    key: RadixKey


@dataclasses.dataclass
class InsertParams:
    key: RadixKey | None = None
    value: torch.Tensor | None = None
    # The inserting request already inserted [0, here): only nodes past it count a hit.
    inserted_len: int = 0
    priority: int = 0


@dataclasses.dataclass
class EvictParams:
    num_tokens: int = 0
    swa_num_tokens: int = 0
    mamba_num: int = 0


class TreeNode:
    """One edge of the tree and the node below it. ``value`` is None once the node is evicted
    from the device (only HiCache's nodes, ``hicache.HiTreeNode``, live on after that)."""

    __slots__ = (
        "id",
        "children",
        "parent",
        "key",
        "value",
        "lock_ref",
        "last_access_time",
        "hit_count",
        "priority",
    )
    # A plain tree's node has no host copy. Transitional: the chapter-11 pictures read it from
    # every node; the field itself is HiTreeNode's.
    host_value = None

    def __init__(self, id: int, last_access_time: int, priority: int = 0):
        self.id = id
        self.children: dict = {}  # child_key (first token, or first page as a tuple) -> TreeNode
        self.parent: TreeNode | None = None
        self.key: tuple = ()
        self.value: torch.Tensor | None = None  # device slots, one per token of key
        self.lock_ref = 0  # running requests whose prefix runs through this node
        self.last_access_time = last_access_time
        self.hit_count = 0  # inserts that reached it, once per request
        self.priority = (
            priority  # the highest priority of the requests that inserted it
        )

    @property
    def evicted(self) -> bool:
        return self.value is None

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access_time < other.last_access_time

    def _where(self) -> str:
        return "host" if self.evicted else "device"

    def __repr__(self) -> str:
        more = "..." if len(self.key) > 8 else ""
        return (
            f"TreeNode(id={self.id}, key={self.key[:8]}{more}, len={len(self.key)}, "
            f"lock_ref={self.lock_ref}, {self._where()})"
        )


class MatchResult(NamedTuple):
    device_prefix_len: int  # tokens matched whose KV is on the device
    last_device_node: (
        TreeNode  # where the device part of the match ends (lock this one)
    )
    last_host_node: TreeNode  # where the whole match ends (the same without HiCache)
    best_match_node: TreeNode | None = (
        None  # SGLang's load-back anchor: the last host node
    )
    host_hit_length: int = 0  # HiCache: matched tokens whose KV lives only on the host


class TreeLock(NamedTuple):
    """One holder's lock on the path root -> ``node`` (SGLang's ``TreeLock``): ``unlock`` gives back
    exactly this one. A request keeps its own in ``req.lock``."""

    node: TreeNode


@dataclasses.dataclass
class InsertResult:
    # tokens the tree already held on the device: the caller's copies are duplicates
    prefix_len: int
    total_len: int = 0  # SGLang's field for its other trees; RadixCache leaves it 0
    last_device_node: TreeNode | None = None


@dataclasses.dataclass
class EvictResult:
    num_tokens_evicted: int = 0
    swa_num_tokens_evicted: int = 0
    mamba_num_evicted: int = 0


@dataclasses.dataclass
class IncLockRefResult:
    delta: int | None = None  # change of evictable_size (<= 0)


@dataclasses.dataclass
class DecLockRefResult:
    delta: int | None = None  # change of evictable_size (>= 0)


class RadixCache:
    """SGLang's RadixCache over a memlab allocator (``free``, ``free_segment``, ``available_size``,
    ``page_size``, ``device``): a node's slots are whole pages, so they go back as segments."""

    def __init__(
        self,
        token_to_kv_pool_allocator,
        page_size: int | None = None,
        disable: bool = False,
        debug_mode: bool = False,
        req_to_token_pool=None,
        sliding_window_size: int | None = None,
    ):
        _validate_init(token_to_kv_pool_allocator, page_size, sliding_window_size)
        self.req_to_token_pool = (
            req_to_token_pool  # the request table checkpoints read and rewrite
        )
        # SGLang's convention: the positions a query reads before its own
        # (config.sliding_window - 1)
        self.sliding_window_size = sliding_window_size
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = (
            token_to_kv_pool_allocator.page_size if page_size is None else page_size
        )
        self.device = token_to_kv_pool_allocator.device
        self.disable = disable
        self.debug_mode = debug_mode
        # the LRU clock: one tick per access or new node
        self._clock = itertools.count()
        self._ids = itertools.count()
        self.evictable_leaves: set[TreeNode] = set()
        self.num_evicted_tokens = (
            0  # SGLang's eviction metric: tokens evict() freed from the device
        )
        self.reset()

    # -- public API --------------------------------------------------------------------------

    def reset(self) -> None:
        """An empty tree. The root holds nothing and stays locked, so it is never evicted."""
        self.root_node = self._new_node()
        self.root_node.value = torch.empty(0, dtype=torch.int64, device=self.device)
        self.root_node.lock_ref = 1
        self.root_node.priority = -sys.maxsize
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.evictable_leaves.clear()

    def page_aligned(self, key) -> tuple:
        """The key's token ids cut to whole pages: a partial last page is never cached or matched
        (``key``: a RadixKey, or token ids)."""
        key = key if type(key) is tuple else _validate_key(key)
        return key[: len(key) // self.page_size * self.page_size]

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """The longest cached prefix of ``params.key``. A match that ends inside a node splits it,
        so the match always ends exactly on a node: the one to lock. Refreshes the path's access
        time. (memlab's short call: the key alone.)"""
        key = self.page_aligned(_match_params(params).key)
        if self.disable or len(key) == 0:
            return MatchResult(0, self.root_node, self.root_node, self.root_node)
        value, last_node = self._match_prefix_helper(self.root_node, key)
        if self.debug_mode:
            self._check_tree()
        return self._match_result(value, last_node)

    def touch_prefix(self, key) -> None:
        """Refresh the access time of ``key``'s cached prefix, as a match does (it may split a
        node too), returning nothing. SGLang's scheduler touches the waiting requests' prompts
        every 32nd scheduling round, so queued prompts are evicted last."""
        key = self.page_aligned(key)
        if self.disable or len(key) == 0:
            return
        self._match_prefix_helper(self.root_node, key)

    def insert(
        self,
        params: InsertParams,
        value: torch.Tensor | None = None,
        *,
        priority: int | None = 0,
        inserted_len: int = 0,
    ) -> InsertResult:
        """Add ``params.key`` with its slots ``params.value``; the tree keeps the part it did not
        have. (memlab's short call: ``insert(key, value, priority=..., inserted_len=...)``.)

        Returns ``prefix_len``: how many leading tokens the tree already held. The caller's slots
        for them are duplicates, and freeing them is the caller's job (a checkpoint frees
        ``kv_indices[cache_protected_len:prefix_len]`` right after the insert). Every node on the
        path takes at least ``priority``; a node ending past ``inserted_len`` (what this request
        inserted before) counts a hit.

        The slots are the request's, and SGLang trusts them: so does memlab (it reads their range
        on the CPU); debug mode also refuses slots that are not whole pages, that the allocator
        does not hold, or that the tree holds already past the key's shared part.
        """
        params = _insert_params(params, value, priority, inserted_len)
        if self.disable:
            return InsertResult(prefix_len=0)
        key = self.page_aligned(params.key)
        _validate_insert(self, key, params.value)
        value = params.value
        prefix_len, last_node = self._insert_helper(
            self.root_node, key, value[: len(key)], params.priority, params.inserted_len
        )
        if self.debug_mode:
            self._check_tree()
        return InsertResult(prefix_len=prefix_len, last_device_node=last_node)

    def _insert_cache(
        self,
        req,
        token_ids: Sequence[int],
        *,
        key_limit: int | None = None,
        split_prompt: bool = False,
    ):
        """Insert the page-aligned key of ``token_ids`` (cut at ``key_limit``) with the request's
        slots, and free the request's copies of what the tree already held. Returns (the key,
        the row's slots, the prefix the tree held)."""
        kv = req.kv
        kv_indices = self.req_to_token_pool.req_to_token[
            kv.req_pool_idx, : len(token_ids)
        ]
        radix_key = RadixKey(token_ids).page_aligned(self.page_size)
        if key_limit is not None:
            radix_key = radix_key[:key_limit]
        key_len = len(radix_key)
        values = kv_indices[:key_len].to(self.device, torch.int64)
        priority = req.priority or 0
        result = self.insert(
            InsertParams(
                key=radix_key,
                value=values,
                inserted_len=kv.cache_inserted_len,
                priority=priority,
            )
        )
        kv.cache_inserted_len = max(kv.cache_inserted_len, key_len)
        if split_prompt:
            # Split the leaf at the prompt's last whole page, so eviction can drop the output
            # without the prompt; re-inserting a prefix only changes the tree's shape.
            prompt_key = RadixKey(token_ids[: len(req.origin_input_ids)]).page_aligned(
                self.page_size
            )
            if 0 < len(prompt_key) < key_len:
                self.insert(
                    InsertParams(
                        key=prompt_key,
                        value=values[: len(prompt_key)],
                        inserted_len=len(prompt_key),
                        priority=min(priority + 1, _INT64_MAX),
                    )
                )
        cpl = kv.cache_protected_len
        if result.prefix_len > cpl:
            # the request computed what the tree held already: its copies go
            self.token_to_kv_pool_allocator.free_segment(
                values[cpl : result.prefix_len], start_pos=cpl
            )
        return radix_key, kv_indices, result.prefix_len

    def checkpoint(self, req, *, up_to: int) -> None:
        """The tree takes the request's KV up to row position ``up_to``: insert (freeing the
        request's duplicates), point the row at the tree's slots, move the request's lock to the
        new last node and advance ``req.kv.cache_protected_len`` to the inserted, page-aligned
        length. Frees nothing of the request's own tail: ``release_kv_cache`` does."""
        if self.disable:
            return
        token_ids = req.full_untruncated_fill_ids[:up_to]
        # SGLang keys no token its prefill-aware window released: the tree stops at the floor.
        swa_evict_floor = req.kv.swa_evict_floor
        key_limit = (
            ceil_align(swa_evict_floor, self.page_size) if swa_evict_floor > 0 else None
        )
        radix_key, _, prefix_len = self._insert_cache(
            req, token_ids, key_limit=key_limit, split_prompt=True
        )
        # its slots may be the tree's now
        match_result = self.match_prefix(MatchPrefixParams(key=radix_key))
        new_last_node = match_result.last_device_node
        new_indices = self.path_device_indices(new_last_node)
        assert len(new_indices) == len(radix_key), (
            f"{len(new_indices)=}, {len(radix_key)=}"
        )
        kv = req.kv
        cpl = kv.cache_protected_len
        if prefix_len > cpl:
            # The row points at the tree's slots from here on. SGLang writes [cpl,
            # len(new_indices)); past the old prefix the tree took the row's own slots,
            # so only this part changes.
            self.req_to_token_pool.write(
                (kv.req_pool_idx, slice(cpl, prefix_len)),
                new_indices[cpl:prefix_len].to(torch.int32),
            )
        # With page_size > 1 the partial last page stays in the row, not in the tree: the
        # request still owns it, and the next checkpoint or release_kv_cache frees it.
        kv.cache_protected_len = len(new_indices)
        # the same node: the lock stays as it is
        if req.lock is None or req.lock.node is not new_last_node:
            self.unlock(req.lock)
            req.lock = self.lock(new_last_node)
        req.last_node = new_last_node

    def free_kv_row(self, kv, ranges) -> None:
        """Give back row positions ``ranges`` (ascending, disjoint, half-open) of ``kv``'s row; the
        part the sliding window already released (``kv.swa_evicted_seqlen``) on the full side
        only."""
        free_kv_row(
            self.req_to_token_pool,
            self.token_to_kv_pool_allocator,
            kv,
            ranges,
            kv.swa_evicted_seqlen,
        )

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    def supports_swa(self) -> bool:
        """Does the scheduler slide running requests' windows (``maybe_evict_swa``)? In SGLang
        0.5.23 a hybrid model's tree (``UnifiedRadixCache`` with an SWA component) always does, and
        tombstones the SWA side of shared nodes. memlab's tree has no SWA component: a node it
        shares keeps its SWA slots until it is evicted, so only a disabled tree, which shares
        nothing, releases out-of-window slots."""
        return self.disable and self.sliding_window_size is not None

    def evict(self, params: EvictParams) -> EvictResult:
        """Free at least ``params.num_tokens`` (when the tree holds that many unlocked), least
        recently used leaves first; a parent whose last child went becomes a leaf and may go
        next. (memlab's short call: ``evict(num_tokens)``. memlab's tree frees a node on both
        sides of an SWA allocator at once, so it reads the larger of ``num_tokens`` and
        ``swa_num_tokens``; SGLang's RadixCache reads ``num_tokens`` only.)"""
        params = _evict_params(params)
        num_tokens = max(params.num_tokens, params.swa_num_tokens)
        if self.disable:
            return EvictResult()
        eviction_heap = [
            (node.last_access_time, node.id, node) for node in self.evictable_leaves
        ]
        heapq.heapify(eviction_heap)
        num_evicted = 0
        while num_evicted < num_tokens and eviction_heap:
            _, _, x = heapq.heappop(eviction_heap)
            num_evicted += self._evict_leaf(x)
            # SGLang: the parent has no child left and no lock (HiCache: no child on the device)
            if x.parent in self.evictable_leaves:
                heapq.heappush(
                    eviction_heap, (x.parent.last_access_time, x.parent.id, x.parent)
                )
        self.num_evicted_tokens += num_evicted
        if self.debug_mode:
            self._check_tree()
        return EvictResult(num_tokens_evicted=num_evicted)

    def _evict_leaf(self, x: TreeNode) -> int:
        """A leaf leaves the device: its slots go back (a node's value is whole pages,
        page-aligned: freed as a segment, without the dedup) and it leaves the tree."""
        self.token_to_kv_pool_allocator.free_segment(x.value, start_pos=0)
        self._delete_leaf(x)
        return len(x.value)

    def lock(self, node: TreeNode) -> TreeLock:
        """Take one lock on the path root -> ``node`` for one holder."""
        self.inc_lock_ref(node)
        return TreeLock(node)

    def unlock(self, lock: TreeLock | None) -> None:
        if lock is not None:
            self.dec_lock_ref(lock.node)

    def inc_lock_ref(self, node: TreeNode) -> IncLockRefResult:
        """Lock the path from ``node`` to the root: its tokens move from evictable to protected."""
        _check_node(self, node)
        if self.disable:
            return IncLockRefResult(delta=0)
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            self._update_leaf_status(node)
            node = node.parent
        return IncLockRefResult(delta=delta)

    def dec_lock_ref(self, node: TreeNode) -> DecLockRefResult:
        """Undo one ``inc_lock_ref(node)``; a node nobody locks is evictable again. A lock released
        twice is the caller's error, as in SGLang: debug mode refuses it; without it the counts
        go wrong."""
        _check_node(self, node)
        if self.disable:
            return DecLockRefResult(delta=0)
        if self.debug_mode:
            self._check_unlock(node)
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
                delta += len(node.key)
            node.lock_ref -= 1
            self._update_leaf_status(node)
            node = node.parent
        return DecLockRefResult(delta=delta)

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def total_size(self) -> int:
        """Tokens the tree holds on the device (a walk over the tree)."""
        total, stack = 0, [self.root_node]
        while stack:
            node = stack.pop()
            total += len(node.value)
            stack.extend(c for c in node.children.values() if not c.evicted)
        return total

    def device_pages(self) -> set:
        """Every page the tree holds on the device (a walk over the tree: for books checks)."""
        pages, stack = set(), list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if not node.evicted:
                pages.update((node.value // self.page_size).tolist())
        return pages

    def path_device_indices(self, node: TreeNode) -> torch.Tensor:
        """The slots of the path root -> ``node``: a request's prefix, ready for its row."""
        _check_node(self, node)
        values = []
        while node is not self.root_node:
            values.append(node.value)
            node = node.parent
        if not values:
            return self.root_node.value
        return torch.cat(values[::-1])

    def check_idle(self, total: int) -> None:
        """SGLang's idle check, valid when no request runs: every slot of the pool (``total``) is
        free, or held by the tree (evictable), or locked (protected). A leak shows up here."""
        _checks.integer("total", total)
        available = self.token_to_kv_pool_allocator.available_size()
        if available + self.evictable_size_ + self.protected_size_ != total:
            raise AssertionError(
                f"idle check failed: available {available} + evictable {self.evictable_size_} + "
                f"protected {self.protected_size_} != total {total}"
            )

    # -- the tree ----------------------------------------------------------------------------

    def _new_node(self) -> TreeNode:
        return TreeNode(next(self._ids), next(self._clock))

    def _child_key(self, key: tuple, offset: int = 0):
        """Children are found by their first token (their first page with pages)."""
        return (
            key[offset]
            if self.page_size == 1
            else key[offset : offset + self.page_size]
        )

    def _key_match(self, node_key: tuple, key: tuple, offset: int) -> int:
        """Tokens ``node_key`` shares with ``key[offset:]``, in whole pages."""
        n = min(len(node_key), len(key) - offset)
        if node_key[:n] == key[offset : offset + n]:  # the common case, compared in C
            return n
        ps, i = self.page_size, 0
        while i < n and node_key[i : i + ps] == key[offset + i : offset + i + ps]:
            i += ps
        return i

    def _match_prefix_helper(self, node: TreeNode, key: tuple):
        access_time = next(self._clock)
        node.last_access_time = access_time
        value, offset = [], 0
        while (
            offset < len(key)
            and (child := node.children.get(self._child_key(key, offset))) is not None
        ):
            child.last_access_time = access_time
            prefix_len = self._key_match(child.key, key, offset)
            if prefix_len < len(child.key):
                new_node = self._split_node(child, prefix_len)
                value.append(new_node.value)
                node = new_node
                break
            value.append(child.value)
            node = child
            offset += prefix_len
        return value, node

    def _match_result(self, value: list, last_node: TreeNode) -> MatchResult:
        """A match on the device alone: the last node is where both its parts end."""
        return MatchResult(sum(len(v) for v in value), last_node, last_node, last_node)

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut ``child`` after ``split_len`` tokens: a new node takes the first part and becomes
        ``child``'s parent. It inherits the locks (the same requests run through both parts)."""
        new_node = self._new_node()
        new_node.priority = child.priority  # the shared prefix
        new_node.hit_count = child.hit_count
        new_node.parent = child.parent
        new_node.lock_ref = child.lock_ref
        new_node.key = child.key[:split_len]
        new_node.children = {self._child_key(child.key, split_len): child}
        if child.value is not None:  # HiCache's host-only nodes have none
            new_node.value, child.value = (
                child.value[:split_len].clone(),
                child.value[split_len:].clone(),
            )
        child.parent = new_node
        child.key = child.key[split_len:]
        new_node.parent.children[self._child_key(new_node.key)] = new_node
        return new_node

    def _insert_helper(
        self,
        node: TreeNode,
        key: tuple,
        value: torch.Tensor,
        priority: int | None = 0,
        inserted_len: int = 0,
    ):
        priority = priority or 0
        access_time = next(self._clock)
        node.last_access_time = access_time
        node.priority = max(node.priority, priority)
        total_prefix_length = offset = 0
        while (
            offset < len(key)
            and (child := node.children.get(self._child_key(key, offset))) is not None
        ):
            node = child
            node.last_access_time = access_time
            prefix_len = self._key_match(node.key, key, offset)
            if prefix_len < len(node.key):
                node = self._split_node(node, prefix_len)
            node.priority = max(node.priority, priority)
            total_prefix_length += self._insert_matched(
                node, value, offset, prefix_len, inserted_len
            )
            offset += prefix_len
        if offset < len(key):
            node = self._add_leaf(node, key[offset:], value[offset:].clone(), priority)
            if len(key) > inserted_len:
                self._inc_hit_count(node)
        return total_prefix_length, node

    def _insert_matched(self, node, value, offset, prefix_len, inserted_len) -> int:
        """A node the insert walked through: the tree held its ``prefix_len`` tokens, so they
        count in ``prefix_len`` and the caller's slots for them are duplicates. Nodes this
        request inserted before (ending within ``inserted_len``) were counted a hit back then."""
        if offset + prefix_len > inserted_len:
            self._inc_hit_count(node)
        return prefix_len

    def _add_leaf(
        self, parent: TreeNode, key: tuple, value: torch.Tensor, priority: int = 0
    ) -> TreeNode:
        new_node = self._new_node()
        new_node.priority = priority
        new_node.parent, new_node.key, new_node.value = parent, key, value
        parent.children[self._child_key(key)] = new_node
        self.evictable_size_ += len(key)
        self._update_leaf_status(parent)
        self._update_leaf_status(new_node)
        return new_node

    def _inc_hit_count(self, node: TreeNode) -> None:
        node.hit_count += 1

    def _delete_leaf(self, node: TreeNode) -> None:
        del node.parent.children[self._child_key(node.key)]
        self.evictable_size_ -= len(node.key)
        self.evictable_leaves.discard(node)
        self._update_leaf_status(node.parent)

    def _update_leaf_status(self, node: TreeNode) -> None:
        """An evictable leaf: on the device, unlocked, and no child on the device."""
        if (
            node.evicted
            or node.lock_ref > 0
            or any(not c.evicted for c in node.children.values())
        ):
            self.evictable_leaves.discard(node)
        else:
            self.evictable_leaves.add(node)

    # -- debug mode: scans of the whole tree -------------------------------------------------

    def _node_values(self, node: TreeNode) -> tuple:
        """The slot runs a node holds: its device slots (HiCache: and its host slots)."""
        return (node.value,)

    def _check_unlock(self, node: TreeNode) -> None:
        n = node
        while n is not self.root_node:
            if n.lock_ref <= 0:
                raise ValueError(
                    f"dec_lock_ref on {n}, which nobody locks: released twice"
                )
            n = n.parent

    def _check_tree(self) -> None:
        """Recount the books from the tree and compare them with the counters."""
        evictable = protected = 0
        leaves, stack = set(), list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            parent = node.parent
            assert parent.children.get(self._child_key(node.key)) is node, (
                f"{node}: lost"
            )
            assert len(node.key) and len(node.key) % self.page_size == 0, f"{node}: key"
            lock_ok = node.lock_ref <= parent.lock_ref or parent is self.root_node
            assert lock_ok, f"{node} is locked more often than its parent"
            for v in self._node_values(node):
                assert v is None or len(v) == len(node.key), f"{node}: slots per token"
                _whole_pages(f"{node}", v, self.page_size, AssertionError)
            if node.evicted:
                continue
            if node.lock_ref > 0:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            if node.lock_ref == 0 and all(c.evicted for c in node.children.values()):
                leaves.add(node)
        books = (self.evictable_size_, self.protected_size_)
        assert (evictable, protected) == books, (
            f"counters {books}, tree {evictable, protected}"
        )
        assert leaves == self.evictable_leaves, "evictable_leaves is out of date"


# -- argument checks at the boundary (the algorithm above trusts its inputs, as SGLang's does) ----


ALLOCATOR = (("free_segment", "available_size", "page_size", "device"), "an allocator")


def _validate_init(allocator, page_size, sliding_window_size) -> None:
    _checks.duck("token_to_kv_pool_allocator", allocator, *ALLOCATOR)
    if sliding_window_size is not None:
        _checks.integer("sliding_window_size", sliding_window_size, 1)
    # the tree would cut keys to pages the allocator does not hand out
    if page_size is not None and _checks.integer("page_size", page_size, 1) != (
        allocator.page_size
    ):
        raise ValueError(
            f"page_size {page_size} is not the allocator's {allocator.page_size}"
        )


def _validate_key(key) -> tuple:
    """A key's token ids as a tuple. A key is a RadixKey in the tree's one namespace, or token
    ids: a list, tuple, range or array of ints, or a 1-D integer tensor. The ids are read into an
    int64 array on the way (in C: a float, None or a huge id is refused without a Python step per
    token)."""
    # extra_key, cache_salt: LoRA, salts; is_bigram: EAGLE
    if isinstance(key, RadixKey):
        if key.extra_key is not None or key.cache_salt is not None or key.is_bigram:
            raise ValueError(
                f"{key!r}: the tree keeps one namespace and no bigram view"
            )
        if key.limit is not None:
            _checks.integer("key.limit", key.limit)
        key = key.raw_token_ids()
    if isinstance(key, torch.Tensor):
        _checks.index_tensor("key", key, ndim=1)
        return tuple(key.tolist())
    _checks.instance("key", key, (list, tuple, range, array), "a RadixKey or token ids")
    try:
        return tuple(array("q", key))
    except (TypeError, OverflowError):
        bad = next(t for t in key if type(t) is not int or not -(2**63) <= t < 2**63)
        raise TypeError(f"key must hold token ids (ints), got {bad!r}") from None


def _match_params(params) -> MatchPrefixParams:
    """memlab's short call: a bare key becomes the parameter object SGLang passes."""
    if isinstance(params, MatchPrefixParams):
        return params
    return MatchPrefixParams(key=params)


def _insert_params(params, value, priority, inserted_len) -> InsertParams:
    """SGLang's ``InsertParams``, or memlab's short call (``insert(key, value, ...)``) made one."""
    if not isinstance(params, InsertParams):
        params = InsertParams(params, value, inserted_len, priority or 0)
    elif value is not None or priority or inserted_len:  # they belong in the params
        raise TypeError(
            "insert takes an InsertParams or the short call's arguments, not both"
        )
    _checks.integer("inserted_len", params.inserted_len)
    if params.priority is not None:
        _checks.integer("priority", params.priority, -sys.maxsize - 1, _INT64_MAX)
    return params


def _evict_params(params) -> EvictParams:
    """SGLang's ``EvictParams``, or memlab's short call (``evict(num_tokens)``) made one."""
    if not isinstance(params, EvictParams):
        params = EvictParams(num_tokens=_checks.integer("num_tokens", params))
    for name in ("num_tokens", "swa_num_tokens", "mamba_num"):
        _checks.integer(f"EvictParams.{name}", getattr(params, name))
    return params


def _validate_insert(tree, key: tuple, value) -> None:
    """Slots for every token of the key, inside the pool (read on the CPU). Debug mode: whole
    pages, slots the allocator holds and, past the part of the key the tree has, none of the
    tree's own (a slot in two nodes would be freed twice)."""
    _checks.index_tensor("value", value, tree.device, ndim=1, owner="tree")
    if len(value) < len(key):  # the key is cut to whole pages first
        raise ValueError(f"insert of {len(key)} key tokens with {len(value)} slots")
    alloc, value = tree.token_to_kv_pool_allocator, value[: len(key)]
    if _checks.can_read_values(tree.debug_mode, value) and hasattr(
        alloc, "page_id_range"
    ):
        _checks.values_in("value", value // tree.page_size, *alloc.page_id_range())
    if tree.debug_mode and len(key):
        _whole_pages("insert: value", value, tree.page_size, ValueError)
        if getattr(alloc, "debug_mode", False) and hasattr(alloc, "_ledger"):
            _checks.held_slots(alloc, "value", value)
        new = value[_tree_prefix_len(tree, key) :].cpu() // tree.page_size
        if set(new.tolist()) & tree.device_pages():
            raise ValueError("insert: value holds slots of the tree's own nodes")


def _whole_pages(what: str, slots, page_size: int, error) -> None:
    """Debug mode: ``slots`` are runs of whole pages (each run a page's slots, in order)."""
    runs = slots.cpu().view(-1, page_size) if slots is not None else None
    if (
        runs is not None
        and (
            (runs[:, 0] % page_size != 0)
            | (runs != runs[:, :1] + torch.arange(page_size)).any(1)
        ).any()
    ):
        raise error(f"{what}: slots are not whole pages")


def _tree_prefix_len(tree, key: tuple) -> int:
    """Debug mode: how much of ``key`` the tree holds on the device, read without a split."""
    node, offset = tree.root_node, 0
    while offset < len(key):
        child = node.children.get(tree._child_key(key, offset))
        if child is None or child.evicted:
            break
        n = tree._key_match(child.key, key, offset)
        offset += n
        if n < len(child.key):
            break
        node = child
    return offset


def _check_node(tree, node, on_host: bool = False) -> None:
    """A node of this tree, on the device (``on_host``: on the host only): an evicted node, one of
    another tree or of the tree before a reset is no one's to lock. A walk to the root, as the
    lock's own."""
    _checks.instance("node", node, TreeNode, "a TreeNode (from match_prefix)")
    n = node
    while n is not tree.root_node:
        attached = (
            n.parent is not None and n.parent.children.get(tree._child_key(n.key)) is n
        )
        if not attached:
            raise ValueError(
                f"{node!r} is not in this tree (evicted, or another tree's)"
            )
        if (n.evicted != on_host and n is node) or (n.evicted and not on_host):
            where = "on the host only" if n.evicted else "on the device"
            raise ValueError(
                f"{node!r}: its KV is {where}, not where this call needs it"
            )
        n = n.parent
