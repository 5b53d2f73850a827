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

Where memlab differs from SGLang 0.5.23: keys are plain sequences of token ids (SGLang wraps them
in a ``RadixKey`` that also carries a LoRA/salt namespace and a bigram view for EAGLE); the LRU
clock is a counter (SGLang reads ``time.monotonic()``: the same order, but reproducible); only the
LRU policy, so a node's ``priority`` is kept but never read (SGLang's ``priority`` policy reads
it); ties in access time go to the older node (SGLang's heap breaks them by its set's order); no
KV events or metrics.
"""

from __future__ import annotations

import heapq
import itertools
import sys
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import torch

from memlab.common import _checks
from memlab.sglang.allocation import free_kv_row

_INT64_MAX = torch.iinfo(torch.int64).max


class TreeNode:
    """One edge of the tree and the node below it. ``value`` is None once the node is evicted
    from the device (only HiCache keeps such nodes, with their KV in ``host_value``)."""

    __slots__ = (
        "id",
        "children",
        "parent",
        "key",
        "value",
        "host_value",
        "lock_ref",
        "host_lock_ref",
        "last_access_time",
        "hit_count",
        "priority",
    )

    def __init__(self, id: int, last_access_time: int, priority: int = 0):
        self.id = id
        self.children: dict = {}  # child_key (first token, or first page as a tuple) -> TreeNode
        self.parent: TreeNode | None = None
        self.key: tuple = ()
        self.value: torch.Tensor | None = (
            None  # device slot indices, one per token of key
        )
        self.host_value: torch.Tensor | None = (
            None  # HiCache: host slot indices of the same tokens
        )
        self.lock_ref = 0  # running requests whose prefix runs through this node
        self.host_lock_ref = 0  # HiCache: load-backs reading host_value right now
        self.last_access_time = last_access_time
        self.hit_count = 0  # inserts that reached it, once per request (HiCache's write-through reads it)
        self.priority = (
            priority  # the highest priority of the requests that inserted it
        )

    @property
    def evicted(self) -> bool:
        return self.value is None

    @property
    def backuped(self) -> bool:
        return self.host_value is not None

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access_time < other.last_access_time

    def __repr__(self) -> str:
        where = (
            "host" if self.evicted else "device" + ("+host" if self.backuped else "")
        )
        return (
            f"TreeNode(id={self.id}, key={self.key[:8]}{'...' if len(self.key) > 8 else ''}, len={len(self.key)}, "
            f"lock_ref={self.lock_ref}, {where})"
        )


class MatchResult(NamedTuple):
    device_prefix_len: int  # tokens matched whose KV is on the device
    last_device_node: (
        TreeNode  # where the device part of the match ends (lock this one)
    )
    last_host_node: TreeNode  # where the whole match ends (the same without HiCache)
    host_hit_length: int = 0  # HiCache: matched tokens whose KV lives only on the host


class TreeLock(NamedTuple):
    """One holder's lock on the path root -> ``node`` (SGLang's ``TreeLock``): ``unlock`` gives back
    exactly this one. A request keeps its own in ``req.lock``."""

    node: TreeNode


def match_and_lock(tree_cache, req) -> tuple:
    """Moved: the scheduler's step lives with the scheduler,
    ``memlab.sglang.schedule_policy.match_and_lock``. This alias stays until its callers move."""
    warnings.warn(
        "memlab.sglang.radix_cache.match_and_lock moved to "
        "memlab.sglang.schedule_policy.match_and_lock",
        DeprecationWarning,
        stacklevel=2,
    )
    from memlab.sglang.schedule_policy import match_and_lock as moved

    return moved(tree_cache, req)


class InsertResult(NamedTuple):
    prefix_len: int  # tokens the tree already held on the device: the caller's copies are duplicates
    last_device_node: TreeNode


class EvictResult(NamedTuple):
    num_tokens_evicted: int


class IncLockRefResult(NamedTuple):
    delta: int  # change of evictable_size (<= 0)


class DecLockRefResult(NamedTuple):
    delta: int  # change of evictable_size (>= 0)


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
        self._clock = (
            itertools.count()
        )  # the LRU clock: one tick per access or new node
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

    def page_aligned(self, key: Sequence[int]) -> tuple:
        """The key cut to whole pages: a partial last page is never cached or matched."""
        key = key if type(key) is tuple else tuple(_validate_key(key))
        return (
            key[: len(key) // self.page_size * self.page_size]
            if len(key) % self.page_size
            else key
        )

    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """The longest cached prefix of ``key``. A match that ends inside a node splits it, so the
        match always ends exactly on a node: the one to lock. Refreshes the path's access time."""
        key = self.page_aligned(key)
        if self.disable or len(key) == 0:
            return MatchResult(0, self.root_node, self.root_node)
        value, last_node = self._match_prefix_helper(self.root_node, key)
        if self.debug_mode:
            self._check_tree()
        return MatchResult(sum(len(v) for v in value), last_node, last_node)

    def touch_prefix(self, key: Sequence[int]) -> None:
        """Refresh the access time of ``key``'s cached prefix, as a match does (it may split a
        node too), returning nothing. SGLang's scheduler touches the waiting requests' prompts
        every 32nd scheduling round, so queued prompts are evicted last."""
        key = self.page_aligned(key)
        if self.disable or len(key) == 0:
            return
        self._match_prefix_helper(self.root_node, key)

    def insert(
        self,
        key: Sequence[int],
        value: torch.Tensor | None = None,
        *,
        priority: int | None = 0,
        inserted_len: int = 0,
    ) -> InsertResult:
        """Add ``key`` with its slots ``value``; the tree keeps the part it did not have.

        Returns ``prefix_len``: how many leading tokens the tree already held. The caller's slots
        for them are duplicates, and freeing them is the caller's job (a checkpoint frees
        ``kv_indices[cache_protected_len:prefix_len]`` right after the insert). Every node on the
        path takes at least ``priority``; a node ending past ``inserted_len`` (what this request
        inserted before) counts a hit.
        """
        if self.disable:
            return InsertResult(0, self.root_node)
        key = self.page_aligned(key)
        _validate_insert(self, key, value)
        if value is None:  # SGLang's test fallback: the token ids stand in for slots
            value = torch.tensor(key, dtype=torch.int64, device=self.device)
        prefix_len, last_node = self._insert_helper(
            self.root_node, key, value[: len(key)], priority, inserted_len
        )
        if self.debug_mode:
            self._check_tree()
        return InsertResult(prefix_len, last_node)

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
        radix_key = self.page_aligned(token_ids)
        if key_limit is not None:
            radix_key = radix_key[:key_limit]
        key_len = len(radix_key)
        values = kv_indices[:key_len].to(self.device, torch.int64)
        priority = req.priority or 0
        result = self.insert(
            radix_key, values, priority=priority, inserted_len=kv.cache_inserted_len
        )
        kv.cache_inserted_len = max(kv.cache_inserted_len, key_len)
        if split_prompt:
            # Split the leaf at the prompt's last whole page, so eviction can drop the output
            # without the prompt; re-inserting a prefix only changes the tree's shape.
            prompt_key = self.page_aligned(token_ids[: len(req.origin_input_ids)])
            if 0 < len(prompt_key) < key_len:
                self.insert(
                    prompt_key,
                    values[: len(prompt_key)],
                    priority=min(priority + 1, _INT64_MAX),
                    inserted_len=len(prompt_key),
                )
        cpl = kv.cache_protected_len
        if (
            result.prefix_len > cpl
        ):  # the request computed what the tree held already: its copies go
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
        radix_key, _, prefix_len = self._insert_cache(
            req, req.full_untruncated_fill_ids[:up_to], split_prompt=True
        )
        new_last_node = self.match_prefix(
            radix_key
        ).last_device_node  # its slots may be the tree's now
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
        if (
            req.lock is None or req.lock.node is not new_last_node
        ):  # the same node: the lock stays as it is
            self.unlock(req.lock)
            req.lock = self.lock(new_last_node)
        req.last_node = new_last_node

    def free_kv_row(self, kv, ranges) -> None:
        """Give back row positions ``ranges`` (ascending, disjoint, half-open) of ``kv``'s row; the
        part the sliding window already released (``kv.swa_evicted_seqlen``) on the full side only."""
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

    def evict(self, num_tokens: int) -> EvictResult:
        """Free at least ``num_tokens`` (when the tree holds that many unlocked), least recently
        used leaves first; a parent whose last child went becomes a leaf and may go next."""
        num_tokens = _checks.integer("num_tokens", num_tokens)
        if self.disable:
            return EvictResult(0)
        eviction_heap = [
            (node.last_access_time, node.id, node) for node in self.evictable_leaves
        ]
        heapq.heapify(eviction_heap)
        num_evicted = 0
        while num_evicted < num_tokens and eviction_heap:
            _, _, x = heapq.heappop(eviction_heap)
            # A node's value is whole pages, page-aligned: freed as a segment, without the dedup.
            self.token_to_kv_pool_allocator.free_segment(x.value, start_pos=0)
            num_evicted += len(x.value)
            self._delete_leaf(x)
            if len(x.parent.children) == 0 and x.parent.lock_ref == 0:
                heapq.heappush(
                    eviction_heap, (x.parent.last_access_time, x.parent.id, x.parent)
                )
        self.num_evicted_tokens += num_evicted
        if self.debug_mode:
            self._check_tree()
        return EvictResult(num_evicted)

    def lock(self, node: TreeNode) -> TreeLock:
        """Take one lock on the path root -> ``node`` for one holder."""
        _checks.instance(
            "node", node, TreeNode, "a TreeNode (match_prefix(...).last_device_node)"
        )
        self.inc_lock_ref(node)
        return TreeLock(node)

    def unlock(self, lock: TreeLock | None) -> None:
        if lock is not None:
            self.dec_lock_ref(lock.node)

    def inc_lock_ref(self, node: TreeNode) -> IncLockRefResult:
        """Lock the path from ``node`` to the root: its tokens move from evictable to protected."""
        if self.disable:
            return IncLockRefResult(0)
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            self._update_leaf_status(node)
            node = node.parent
        return IncLockRefResult(delta)

    def dec_lock_ref(self, node: TreeNode) -> DecLockRefResult:
        """Undo one ``inc_lock_ref(node)``; a node nobody locks is evictable again."""
        if self.disable:
            return DecLockRefResult(0)
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
        return DecLockRefResult(delta)

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
        if child.value is not None:
            new_node.value, child.value = (
                child.value[:split_len].clone(),
                child.value[split_len:].clone(),
            )
        if child.host_value is not None:
            new_node.host_value, child.host_value = (
                child.host_value[:split_len].clone(),
                child.host_value[split_len:].clone(),
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
        total_prefix_length = 0
        while (
            total_prefix_length < len(key)
            and (child := node.children.get(self._child_key(key, total_prefix_length)))
            is not None
        ):
            node = child
            node.last_access_time = access_time
            prefix_len = self._key_match(node.key, key, total_prefix_length)
            total_prefix_length += prefix_len
            if prefix_len < len(node.key):
                node = self._split_node(node, prefix_len)
            node.priority = max(node.priority, priority)
            if (
                total_prefix_length > inserted_len
            ):  # nodes this request inserted were counted then
                self._inc_hit_count(node)
        if total_prefix_length < len(key):
            node = self._add_leaf(
                node,
                key[total_prefix_length:],
                value[total_prefix_length:].clone(),
                priority,
            )
            if len(key) > inserted_len:
                self._inc_hit_count(node)
        return total_prefix_length, node

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
        node.hit_count += 1  # HiCache's write-through counts these

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

    def _check_unlock(self, node: TreeNode) -> None:
        n = node
        while n is not self.root_node:
            if n.lock_ref <= 0:
                raise ValueError(
                    f"dec_lock_ref on {n} which nobody locks: a lock released twice"
                )
            n = n.parent

    def _check_tree(self) -> None:
        """Recount the books from the tree and compare them with the counters."""
        evictable = protected = 0
        leaves, stack = set(), list(self.root_node.children.values())
        ps = self.page_size
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            assert node.parent.children.get(self._child_key(node.key)) is node, (
                f"{node} is lost by its parent"
            )
            assert len(node.key) > 0 and len(node.key) % ps == 0, (
                f"{node}: key of {len(node.key)} tokens, page {ps}"
            )
            assert (
                node.lock_ref <= node.parent.lock_ref or node.parent is self.root_node
            ), f"{node} is locked more often than its parent"
            self._check_node_values(node)
            if node.evicted:
                continue
            if node.lock_ref > 0:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            if node.lock_ref == 0 and all(c.evicted for c in node.children.values()):
                leaves.add(node)
        assert (evictable, protected) == (self.evictable_size_, self.protected_size_), (
            f"counters say evictable {self.evictable_size_} protected {self.protected_size_}, "
            f"the tree holds {evictable} and {protected}"
        )
        assert leaves == self.evictable_leaves, "evictable_leaves is out of date"

    def _check_node_values(self, node: TreeNode) -> None:
        for v in (node.value, node.host_value):
            if v is not None:
                assert len(v) == len(node.key), (
                    f"{node}: {len(v)} slots for {len(node.key)} tokens"
                )
                if self.page_size > 1:
                    runs = v.view(-1, self.page_size)
                    assert (runs[:, 0] % self.page_size == 0).all() and (
                        runs - runs[:, :1]
                        == torch.arange(self.page_size, device=v.device)
                    ).all(), f"{node}: slots are not whole pages"


# -- argument checks at the boundary (the algorithm above trusts its inputs, as SGLang's does) ----


def _validate_init(allocator, page_size, sliding_window_size) -> None:
    if not all(
        hasattr(allocator, a)
        for a in ("free_segment", "available_size", "page_size", "device")
    ):
        raise TypeError(
            f"token_to_kv_pool_allocator must be an allocator, got {type(allocator).__name__}"
        )
    if sliding_window_size is not None:
        _checks.integer("sliding_window_size", sliding_window_size, 1)
    if page_size is not None and page_size != getattr(
        allocator, "page_size", page_size
    ):
        raise ValueError(
            f"page_size {page_size} differs from the allocator's {allocator.page_size}: the tree "
            "would cut keys to pages the allocator does not hand out"
        )


def _validate_key(key):
    """A key is token ids: a list, tuple or range of them, or a 1-D tensor (the ids themselves are
    trusted, as SGLang trusts them: reading each one would cost a Python step per token)."""
    if isinstance(key, torch.Tensor):
        _checks.index_tensor("key", key, ndim=1)
    elif not isinstance(key, (list, tuple, range)):
        raise TypeError(
            f"key must be a sequence of token ids, got {type(key).__name__}"
        )
    return key


def _validate_insert(tree, key: tuple, value) -> None:
    """Slots for every token of the key (debug mode: slots the allocator holds, not free ones)."""
    if value is None:
        return
    _checks.index_tensor("value", value, tree.device, ndim=1, owner="tree")
    alloc = tree.token_to_kv_pool_allocator
    if (
        tree.debug_mode
        and getattr(alloc, "debug_mode", False)
        and hasattr(alloc, "_ledger")
        and len(key)
    ):
        _checks.held_slots(alloc, "value", value[: len(key)])
    if len(value) < len(key):
        raise ValueError(
            f"insert of {len(key)} key tokens (after cutting to whole pages) with a value of only {len(value)} slots"
        )
