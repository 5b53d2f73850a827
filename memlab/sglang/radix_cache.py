"""Above the allocator: SGLang's radix prefix cache (sglang/srt/mem_cache/radix_cache.py).

A radix tree over token ids. Each node holds the edge's tokens (``key``) and the KV slots of
those tokens (``value``, slot indices handed out by the allocator). A new request walks the tree
with its prompt (``match_prefix``) and reuses the slots of the longest match; a finished request
``insert``s its tokens and slots, and the tree keeps the part it did not have. Nodes that running
requests use are locked (``inc_lock_ref``/``dec_lock_ref``: the whole path to the root); the tree
``evict``s unlocked leaves, least recently used first, and gives their slots back to the allocator.

With ``page_size > 1`` keys are cut to whole pages (``page_aligned``) and compared page by page:
the tree only ever holds whole pages, so every value is a run of page-aligned slots.

Three counters keep the books: ``evictable_size`` (tokens the tree holds and could free),
``protected_size`` (tokens locked by running requests), and, outside the tree, the allocator's
``available_size``. With no request running, SGLang's scheduler checks that they add up to the
pool (``check_idle``).

Where memlab differs from SGLang 0.5.23: keys are plain sequences of token ids (SGLang wraps them
in a ``RadixKey`` that also carries a LoRA/salt namespace and a bigram view for EAGLE); the LRU
clock is a counter (SGLang reads ``time.monotonic()``: the same order, but reproducible); only the
LRU policy; no KV events or metrics.
"""

from __future__ import annotations

import heapq
import itertools
from typing import NamedTuple, Sequence

import torch


class TreeNode:
    """One edge of the tree and the node below it. ``value`` is None once the node is evicted
    from the device (only HiCache keeps such nodes, with their KV in ``host_value``)."""

    __slots__ = ("id", "children", "parent", "key", "value", "host_value", "lock_ref", "host_lock_ref",
                 "last_access_time", "hit_count")

    def __init__(self, id: int, last_access_time: int):
        self.id = id
        self.children: dict = {}  # child_key (first token, or first page as a tuple) -> TreeNode
        self.parent: TreeNode | None = None
        self.key: tuple = ()
        self.value: torch.Tensor | None = None  # device slot indices, one per token of key
        self.host_value: torch.Tensor | None = None  # HiCache: host slot indices of the same tokens
        self.lock_ref = 0  # running requests whose prefix runs through this node
        self.host_lock_ref = 0  # HiCache: load-backs reading host_value right now
        self.last_access_time = last_access_time
        self.hit_count = 0

    @property
    def evicted(self) -> bool:
        return self.value is None

    @property
    def backuped(self) -> bool:
        return self.host_value is not None

    def __lt__(self, other: "TreeNode") -> bool:
        return self.last_access_time < other.last_access_time

    def __repr__(self) -> str:
        where = "host" if self.evicted else "device" + ("+host" if self.backuped else "")
        return f"TreeNode(id={self.id}, key={self.key[:8]}{'...' if len(self.key) > 8 else ''}, len={len(self.key)}, " \
               f"lock_ref={self.lock_ref}, {where})"


class MatchResult(NamedTuple):
    device_prefix_len: int  # tokens matched whose KV is on the device
    last_device_node: TreeNode  # where the device part of the match ends (lock this one)
    last_host_node: TreeNode  # where the whole match ends (the same without HiCache)
    host_hit_length: int = 0  # HiCache: matched tokens whose KV lives only on the host


def match_and_lock(tree_cache, key) -> tuple:
    """What a scheduler does with a new request's prompt: match it, load a host-only part back to
    the device first (HiCache), lock the node the device part ends at. Returns (the matched slots,
    that node, how many tokens came back from the host). Any of the course's prefix caches."""
    m = tree_cache.match_prefix(key)
    node, loaded = m.last_device_node, 0
    if m.host_hit_length:  # the load-back locks what it needs meanwhile
        indices, node = tree_cache.init_load_back(m.last_host_node, m.host_hit_length)
        loaded = len(indices)
    tree_cache.inc_lock_ref(node)
    return tree_cache.path_device_indices(node), node, loaded


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

    def __init__(self, token_to_kv_pool_allocator, page_size: int | None = None, disable: bool = False,
                 debug_mode: bool = False):
        _validate_init(token_to_kv_pool_allocator, page_size)
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = token_to_kv_pool_allocator.page_size if page_size is None else page_size
        self.device = token_to_kv_pool_allocator.device
        self.disable = disable
        self.debug_mode = debug_mode
        self._clock = itertools.count()  # the LRU clock: one tick per access or new node
        self._ids = itertools.count()
        self.evictable_leaves: set[TreeNode] = set()
        self.num_evicted_tokens = 0  # SGLang's eviction metric: tokens evict() freed from the device
        self.reset()

    # -- public API --------------------------------------------------------------------------

    def reset(self) -> None:
        """An empty tree. The root holds nothing and stays locked, so it is never evicted."""
        self.root_node = self._new_node()
        self.root_node.value = torch.empty(0, dtype=torch.int64, device=self.device)
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.evictable_leaves.clear()

    def page_aligned(self, key: Sequence[int]) -> tuple:
        """The key cut to whole pages: a partial last page is never cached or matched."""
        key = tuple(key)
        return key[: len(key) // self.page_size * self.page_size] if self.page_size > 1 else key

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

    def insert(self, key: Sequence[int], value: torch.Tensor | None = None) -> InsertResult:
        """Add ``key`` with its slots ``value``; the tree keeps the part it did not have.

        Returns ``prefix_len``: how many leading tokens the tree already held. The caller's slots
        for them are duplicates, and freeing them is the caller's job (SGLang frees
        ``kv_indices[cache_protected_len:prefix_len]`` right after the insert).
        """
        if self.disable:
            return InsertResult(0, self.root_node)
        key = self.page_aligned(key)
        _validate_insert(key, value)
        if value is None:  # SGLang's test fallback: the token ids stand in for slots
            value = torch.tensor(key, dtype=torch.int64, device=self.device)
        prefix_len, last_node = self._insert_helper(self.root_node, key, value[: len(key)])
        if self.debug_mode:
            self._check_tree()
        return InsertResult(prefix_len, last_node)

    def evict(self, num_tokens: int) -> EvictResult:
        """Free at least ``num_tokens`` (when the tree holds that many unlocked), least recently
        used leaves first; a parent whose last child went becomes a leaf and may go next."""
        if self.disable:
            return EvictResult(0)
        eviction_heap = [(node.last_access_time, node.id, node) for node in self.evictable_leaves]
        heapq.heapify(eviction_heap)
        num_evicted = 0
        while num_evicted < num_tokens and eviction_heap:
            _, _, x = heapq.heappop(eviction_heap)
            # A node's value is whole pages, page-aligned: freed as a segment, without the dedup.
            self.token_to_kv_pool_allocator.free_segment(x.value, start_pos=0)
            num_evicted += len(x.value)
            self._delete_leaf(x)
            if len(x.parent.children) == 0 and x.parent.lock_ref == 0:
                heapq.heappush(eviction_heap, (x.parent.last_access_time, x.parent.id, x.parent))
        self.num_evicted_tokens += num_evicted
        if self.debug_mode:
            self._check_tree()
        return EvictResult(num_evicted)

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

    def cache_finished_req(self, token_ids: Sequence[int], kv_indices: torch.Tensor, cache_protected_len: int,
                           last_node: TreeNode) -> InsertResult:
        """A finished request hands its KV to the tree; what the tree does not keep goes back.

        ``kv_indices``: the request's row (a slot per token with KV); ``cache_protected_len``:
        the prefix it matched and locked at ``last_node`` (those slots are the tree's). SGLang
        0.5.23 spells this ``release_kv_cache(req, tree, checkpoint=True)``: ``checkpoint``
        inserts and frees the duplicates, then the rest of the row (the partial last page) is
        freed and the lock dropped.
        """
        key = self.page_aligned(token_ids[: len(kv_indices)])
        result = self.insert(key, kv_indices[: len(key)].to(torch.int64))
        self.token_to_kv_pool_allocator.free_segment(kv_indices[cache_protected_len:result.prefix_len],
                                                     start_pos=cache_protected_len)
        self.token_to_kv_pool_allocator.free(kv_indices[len(key):])  # the partial last page
        self.dec_lock_ref(last_node)
        return result

    def check_idle(self, total: int) -> None:
        """SGLang's idle check, valid when no request runs: every slot of the pool (``total``) is
        free, or held by the tree (evictable), or locked (protected). A leak shows up here."""
        available = self.token_to_kv_pool_allocator.available_size()
        if available + self.evictable_size_ + self.protected_size_ != total:
            raise AssertionError(f"idle check failed: available {available} + evictable {self.evictable_size_} + "
                                 f"protected {self.protected_size_} != total {total}")

    # -- the tree ----------------------------------------------------------------------------

    def _new_node(self) -> TreeNode:
        return TreeNode(next(self._ids), next(self._clock))

    def _child_key(self, key: tuple, offset: int = 0):
        """Children are found by their first token (their first page with pages)."""
        return key[offset] if self.page_size == 1 else key[offset: offset + self.page_size]

    def _key_match(self, node_key: tuple, key: tuple, offset: int) -> int:
        """Tokens ``node_key`` shares with ``key[offset:]``, in whole pages."""
        n = min(len(node_key), len(key) - offset)
        if node_key[:n] == key[offset: offset + n]:  # the common case, compared in C
            return n
        ps, i = self.page_size, 0
        while i < n and node_key[i: i + ps] == key[offset + i: offset + i + ps]:
            i += ps
        return i

    def _match_prefix_helper(self, node: TreeNode, key: tuple):
        access_time = next(self._clock)
        node.last_access_time = access_time
        value, offset = [], 0
        while offset < len(key) and (child := node.children.get(self._child_key(key, offset))) is not None:
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
        new_node.hit_count = child.hit_count
        new_node.parent = child.parent
        new_node.lock_ref = child.lock_ref
        new_node.key = child.key[:split_len]
        new_node.children = {self._child_key(child.key, split_len): child}
        if child.value is not None:
            new_node.value, child.value = child.value[:split_len].clone(), child.value[split_len:].clone()
        if child.host_value is not None:
            new_node.host_value, child.host_value = child.host_value[:split_len].clone(), child.host_value[split_len:].clone()
        child.parent = new_node
        child.key = child.key[split_len:]
        new_node.parent.children[self._child_key(new_node.key)] = new_node
        return new_node

    def _insert_helper(self, node: TreeNode, key: tuple, value: torch.Tensor):
        access_time = next(self._clock)
        node.last_access_time = access_time
        total_prefix_length = 0
        while total_prefix_length < len(key) and \
                (child := node.children.get(self._child_key(key, total_prefix_length))) is not None:
            node = child
            node.last_access_time = access_time
            prefix_len = self._key_match(node.key, key, total_prefix_length)
            total_prefix_length += prefix_len
            if prefix_len < len(node.key):
                node = self._split_node(node, prefix_len)
            self._inc_hit_count(node)
        if total_prefix_length < len(key):
            node = self._add_leaf(node, key[total_prefix_length:], value[total_prefix_length:].clone())
            self._inc_hit_count(node)
        return total_prefix_length, node

    def _add_leaf(self, parent: TreeNode, key: tuple, value: torch.Tensor) -> TreeNode:
        new_node = self._new_node()
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
        if node.evicted or node.lock_ref > 0 or any(not c.evicted for c in node.children.values()):
            self.evictable_leaves.discard(node)
        else:
            self.evictable_leaves.add(node)

    # -- debug mode: scans of the whole tree -------------------------------------------------

    def _check_unlock(self, node: TreeNode) -> None:
        n = node
        while n is not self.root_node:
            assert n.lock_ref > 0, f"dec_lock_ref on {n} which nobody locks: a lock released twice"
            n = n.parent

    def _check_tree(self) -> None:
        """Recount the books from the tree and compare them with the counters."""
        evictable = protected = 0
        leaves, stack = set(), list(self.root_node.children.values())
        ps = self.page_size
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            assert node.parent.children.get(self._child_key(node.key)) is node, f"{node} is lost by its parent"
            assert len(node.key) > 0 and len(node.key) % ps == 0, f"{node}: key of {len(node.key)} tokens, page {ps}"
            assert node.lock_ref <= node.parent.lock_ref or node.parent is self.root_node, \
                f"{node} is locked more often than its parent"
            self._check_node_values(node)
            if node.evicted:
                continue
            if node.lock_ref > 0:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            if node.lock_ref == 0 and all(c.evicted for c in node.children.values()):
                leaves.add(node)
        assert (evictable, protected) == (self.evictable_size_, self.protected_size_), \
            f"counters say evictable {self.evictable_size_} protected {self.protected_size_}, " \
            f"the tree holds {evictable} and {protected}"
        assert leaves == self.evictable_leaves, "evictable_leaves is out of date"

    def _check_node_values(self, node: TreeNode) -> None:
        for v in (node.value, node.host_value):
            if v is not None:
                assert len(v) == len(node.key), f"{node}: {len(v)} slots for {len(node.key)} tokens"
                if self.page_size > 1:
                    runs = v.view(-1, self.page_size)
                    assert (runs[:, 0] % self.page_size == 0).all() and \
                        (runs - runs[:, :1] == torch.arange(self.page_size, device=v.device)).all(), \
                        f"{node}: slots are not whole pages"


# -- argument checks at the boundary (the algorithm above trusts its inputs, as SGLang's does) ----

def _validate_init(allocator, page_size) -> None:
    if page_size is not None and page_size != getattr(allocator, "page_size", page_size):
        raise ValueError(f"page_size {page_size} differs from the allocator's {allocator.page_size}: the tree "
                         "would cut keys to pages the allocator does not hand out")


def _validate_insert(key: tuple, value) -> None:
    if value is not None and len(value) < len(key):
        raise ValueError(f"insert of {len(key)} tokens (after cutting to whole pages) with only {len(value)} slots")
