"""HiCache's host tier, below the allocator (sglang/srt/mem_cache/pool_host/).

The device pool is small and fast; host memory is large. HiCache keeps a second KV pool in host
memory and lets the radix tree's nodes live on the device, on the host, or both:

- ``device_pool.host_pool_decls()`` is the declaration a device pool makes of the host pool it
  needs: its per-layer buffers' row shapes and dtypes. ``HostKVCache`` builds the host pool from
  it, so the host pool's shape follows the device pool's (MHA: K and V per layer; MLA: one latent
  buffer per layer). Its capacity is counted in tokens, and it has its own page allocator.
- ``HiCacheController`` moves KV: ``write`` (device -> host: take host pages, copy) and ``load``
  (host -> device: take device pages FIRST, then copy back into them). The slot ids go
  through the device pool's ``host_transfer_translate`` before the copy, as in SGLang
  0.5.23's L2 transfers (None, so the identity, for memlab's static pools; unified pools
  with virtual ids set it).
- ``HiRadixCache`` is the radix tree over both tiers. A node evicted from the device keeps its
  KV on the host (``host_value``; ``value`` is None): a later match still finds it
  (``host_hit_length``) and ``load_back`` brings it back to new device pages. Two write policies:
  ``write_through`` backs every inserted node up at once (eviction then only drops the device
  copy), ``write_back`` copies a node to the host only when it is evicted from the device.

Where memlab differs from SGLang 0.5.23: transfers run synchronously (SGLang queues them on
copy streams, acknowledges them later and keeps the nodes locked meanwhile); one device pool and
one host pool (SGLang assembles several: SWA, Mamba, index keys); no storage tier (L3). The
names and the order of operations follow SGLang 0.5.23's UnifiedRadixCache (with HiCache
enabled by ``init_hicache``), HiCacheController and HostKVCache; ``HiRadixCache`` is the name older
SGLang releases gave the tree with a host tier.
"""

from __future__ import annotations

import heapq

import torch

from memlab.common import _checks
from memlab.sglang.allocator import make_allocator

# the declaration lives with the device pool
from memlab.sglang.kv_pool import HostPoolDecl
from memlab.sglang.page_copy import transfer_pages
from memlab.sglang.radix_cache import (
    MatchResult,
    RadixCache,
    TreeNode,
    _check_node,
    _validate_init,
)

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")


def transfer_indices(device_pool, device_indices: torch.Tensor) -> torch.Tensor:
    """Slot ids as a copy addresses the device pool's buffers: the pool's
    ``host_transfer_translate`` when it has one (virtual ids), else the ids themselves."""
    translate = getattr(device_pool, "host_transfer_translate", None)
    return device_indices if translate is None else translate(device_indices)


class HostKVCache:
    """The host pool: ``size`` tokens in whole pages, a page allocator, and per layer one host
    tensor for each device buffer the declaration names. Rows are laid out like the device
    pool's (``size + page_size`` rows, page 0 never handed out), so a page is a page on both sides.
    Pinned when a GPU is present, so a bulk copy from or to it runs at full speed."""

    def __init__(
        self,
        decl: HostPoolDecl,
        size: int,
        page_size: int,
        pin_memory: bool | None = None,
        debug_mode: bool = False,
    ):
        _check_host_kv_cache(decl, size, page_size)
        self.decl, self.page_size, self.layer_num = decl, page_size, decl.layer_num
        self.size = size // page_size * page_size
        pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        rows = self.size + page_size
        self.buffers = {
            b.name: [
                torch.zeros((rows, *b.row_shape), dtype=b.dtype, pin_memory=pin)
                for _ in range(self.layer_num)
            ]
            for b in decl.buffers
        }
        self.size_per_token = (
            sum(
                b.dtype.itemsize * torch.Size(b.row_shape).numel() for b in decl.buffers
            )
            * self.layer_num
        )
        self.allocator = make_allocator(
            self.size, page_size, device="cpu", debug_mode=debug_mode
        )

    def alloc(self, need_size: int) -> torch.Tensor | None:
        return self.allocator.alloc(need_size)

    def free(self, indices: torch.Tensor) -> int:
        self.allocator.free(indices)
        return len(indices)

    def available_size(self) -> int:
        return self.allocator.available_size()

    def clear(self) -> None:
        self.allocator.clear()

    def backup_from_device_all_layer(
        self, device_pool, host_indices, device_indices, backend: str = "triton"
    ) -> None:
        """Device -> host, every layer, every buffer (a page-aligned run of slots on each side)."""
        for name, host_layers in self.buffers.items():
            for layer, host_buf in enumerate(host_layers):
                transfer_pages(
                    getattr(device_pool, name)[layer],
                    host_buf,
                    self._pages(device_indices),
                    self._pages(host_indices),
                    self.page_size,
                    backend,
                )

    def load_to_device_per_layer(
        self,
        device_pool,
        host_indices,
        device_indices,
        layer_id: int,
        backend: str = "triton",
    ) -> None:
        """Host -> device for one layer (SGLang loads layer by layer, so layer i's attention can
        start while layer i + 1 is still on the way)."""
        for name, host_layers in self.buffers.items():
            transfer_pages(
                host_layers[layer_id],
                getattr(device_pool, name)[layer_id],
                self._pages(host_indices),
                self._pages(device_indices),
                self.page_size,
                backend,
            )

    def _pages(self, indices: torch.Tensor) -> torch.Tensor:
        """The pages under a run of whole pages of slots: every page_size-th slot, divided."""
        return indices[:: self.page_size] // self.page_size


class HiCacheController:
    """Moves KV between the device pool and the host pool (SGLang's HiCacheController, run
    synchronously: SGLang queues the copies on their own streams and acknowledges them later)."""

    def __init__(
        self,
        token_to_kv_pool_allocator,
        mem_pool_host: HostKVCache,
        page_size: int,
        write_policy: str = "write_through",
        io_backend: str = "triton",
    ):
        if write_policy not in WRITE_POLICIES:
            raise ValueError(
                f"Invalid write policy: {write_policy!r}; choose one of {WRITE_POLICIES}"
            )
        self.mem_pool_device_allocator = token_to_kv_pool_allocator
        self.mem_pool_device = token_to_kv_pool_allocator.get_kvcache()
        if io_backend == "triton":
            _checks.on_kernel_device("io_backend", self.mem_pool_device.device)
        self.mem_pool_host = mem_pool_host
        self.page_size = page_size
        self.write_policy = write_policy
        self.io_backend = io_backend

    def write(self, device_indices: torch.Tensor) -> torch.Tensor | None:
        """Back device slots up to the host: host pages first (None when short), then the copy."""
        host_indices = self.mem_pool_host.alloc(len(device_indices))
        if host_indices is None:
            return None
        device_indices = transfer_indices(self.mem_pool_device, device_indices)
        self.mem_pool_host.backup_from_device_all_layer(
            self.mem_pool_device, host_indices, device_indices, self.io_backend
        )
        return host_indices

    def load(self, host_indices: torch.Tensor) -> torch.Tensor | None:
        """Bring host slots back: device pages first (None when short), then the copy, per layer."""
        device_indices = self.mem_pool_device_allocator.alloc(len(host_indices))
        if device_indices is None:
            return None
        indices = transfer_indices(self.mem_pool_device, device_indices)
        for layer_id in range(self.mem_pool_host.layer_num):
            self.mem_pool_host.load_to_device_per_layer(
                self.mem_pool_device, host_indices, indices, layer_id, self.io_backend
            )
        return device_indices

    def evict_host(self, host_indices: torch.Tensor) -> int:
        return self.mem_pool_host.free(host_indices)


class HiTreeNode(TreeNode):
    """A node of the tree over both tiers: the base node's fields, and its host copy
    (``host_value``, host slots of the same tokens) with the load-backs reading it now
    (``host_lock_ref``)."""

    __slots__ = ("host_value", "host_lock_ref")

    def __init__(self, id: int, last_access_time: int, priority: int = 0):
        super().__init__(id, last_access_time, priority)
        self.host_value: torch.Tensor | None = None
        self.host_lock_ref = 0

    @property
    def backuped(self) -> bool:
        return self.host_value is not None

    def _where(self) -> str:
        return "host" if self.evicted else "device" + ("+host" if self.backuped else "")


class HiRadixCache(RadixCache):
    """A radix tree whose nodes may hold their KV on the device, on the host, or both.

    Invariants: a node evicted from the device has a host copy, and so has every node below it;
    device eviction goes leaf first (a node whose children are all off the device), host
    eviction drops whole host-only leaves.
    """

    def __init__(
        self,
        token_to_kv_pool_allocator,
        token_to_kv_pool_host: HostKVCache,
        write_policy: str = "write_through",
        io_backend: str = "triton",
        load_back_threshold: int = 10,
        debug_mode: bool = False,
        req_to_token_pool=None,
    ):
        _validate_init(token_to_kv_pool_allocator, None, None)
        _checks.instance("token_to_kv_pool_host", token_to_kv_pool_host, HostKVCache)
        _checks.integer("load_back_threshold", load_back_threshold)
        self.token_to_kv_pool_host = token_to_kv_pool_host
        self.cache_controller = HiCacheController(
            token_to_kv_pool_allocator,
            token_to_kv_pool_host,
            token_to_kv_pool_allocator.page_size,
            write_policy,
            io_backend,
        )
        self.is_write_back = write_policy == "write_back"
        # write_through backs a node up the first time it is inserted; "selective" waits for a
        # second hit, so KV nobody reuses never crosses PCIe.
        self.write_through_threshold = 1 if write_policy == "write_through" else 2
        self.load_back_threshold = (
            load_back_threshold  # fewer host tokens are recomputed instead
        )
        super().__init__(
            token_to_kv_pool_allocator,
            debug_mode=debug_mode,
            req_to_token_pool=req_to_token_pool,
        )

    def reset(self) -> None:
        super().reset()
        self.token_to_kv_pool_host.clear()

    # -- the tree's nodes carry a host copy -------------------------------------------------

    def _new_node(self) -> HiTreeNode:
        return HiTreeNode(next(self._ids), next(self._clock))

    def _split_node(self, child: HiTreeNode, split_len: int) -> HiTreeNode:
        """As RadixCache's, and the host copy splits at the same token."""
        host = child.host_value
        new_node = super()._split_node(child, split_len)
        if host is not None:
            new_node.host_value = host[:split_len].clone()
            child.host_value = host[split_len:].clone()
        return new_node

    # -- match: walk through host-only nodes too ----------------------------------------------

    def _match_result(self, value: list, last_node: HiTreeNode) -> MatchResult:
        """The walk went on through nodes that live only on the host: ``last_host_node`` ends
        the whole match, ``last_device_node`` its device part, and ``host_hit_length`` counts
        the tokens between them (to load back, or to recompute)."""
        host_hit_length, last_device_node = 0, last_node
        while last_device_node.evicted:
            host_hit_length += len(last_device_node.host_value)
            last_device_node = last_device_node.parent
        return MatchResult(
            sum(len(v) for v in value if v is not None),
            last_device_node,
            last_node,
            last_node,
            host_hit_length,
        )

    # -- insert: revive host-only nodes, back new nodes up ----------------------------------

    def _insert_matched(self, node, value, offset, prefix_len, inserted_len) -> int:
        """A node on the device counts as RadixCache's. A node that lives only on the host adopts
        the request's device slots: the request recomputed KV the tree had on the host only, so
        those slots are no duplicates (they do not count in ``prefix_len``)."""
        if not node.evicted:
            return super()._insert_matched(
                node, value, offset, prefix_len, inserted_len
            )
        node.value = value[offset : offset + prefix_len].clone()
        self.evictable_size_ += len(node.value)
        self._update_leaf_status(node)
        self._update_leaf_status(node.parent)
        return 0

    def _inc_hit_count(self, node: TreeNode) -> None:
        """Count a hit; write-through backs the node up once it reaches the threshold."""
        if self.is_write_back or node.evicted:
            return
        node.hit_count += 1
        if not node.backuped and node.hit_count >= self.write_through_threshold:
            self.write_backup(node)

    def write_backup(self, node: TreeNode, write_back: bool = False) -> int:
        """Copy a device node to the host; returns the tokens backed up (0: the host is full).

        Write-through backs up the node's unbacked ancestors in the same copy, ancestors first,
        so a node on the host never hangs below a node that is nowhere but the device.
        """
        _checks.instance("node", node, HiTreeNode)
        if node.evicted or node is self.root_node:
            raise ValueError(f"write_backup: {node!r} holds no device slots to back up")
        chain = [node]
        while (
            not write_back
            and chain[-1].parent is not self.root_node
            and not chain[-1].parent.backuped
        ):
            chain.append(chain[-1].parent)
        chain.reverse()
        device_indices = torch.cat([n.value for n in chain])
        host_indices = self.cache_controller.write(device_indices)
        if host_indices is None:
            self.evict_host(len(device_indices))
            host_indices = self.cache_controller.write(device_indices)
        if host_indices is None:
            return 0
        offset = 0
        for n in chain:
            n.host_value = host_indices[offset : offset + len(n.value)].clone()
            offset += len(n.value)
        return len(host_indices)

    # -- device eviction: demote to the host, or drop ----------------------------------------

    def _evict_leaf(self, x: HiTreeNode) -> int:
        """A leaf with a host copy is demoted (its device slots go, the node stays on the host);
        write-back first makes that copy; a leaf that cannot get one is dropped with everything
        below it. ``evict`` is RadixCache's: least recently used leaves first."""
        if x.backuped or (self.is_write_back and self.write_backup(x, write_back=True)):
            return self._evict_backuped(x)
        return self._evict_regular(x)

    def _evict_backuped(self, node: TreeNode) -> int:
        """Demote: free the device slots, keep the node with its host copy."""
        num_evicted = len(node.value)
        self.token_to_kv_pool_allocator.free_segment(node.value, start_pos=0)
        node.value = None
        self.evictable_size_ -= num_evicted
        self.evictable_leaves.discard(node)
        self._update_leaf_status(node.parent)
        return num_evicted

    def _evict_regular(self, node: TreeNode) -> int:
        """Drop a leaf that has no host copy, with the host-only nodes below it (SGLang's
        ``drop_subtree_no_host``: without the node, nothing could reach them)."""
        stack = list(node.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            self.cache_controller.evict_host(n.host_value)
        node.children = {}
        num_evicted = len(node.value)
        self.token_to_kv_pool_allocator.free_segment(node.value, start_pos=0)
        self._delete_leaf(node)
        return num_evicted

    # -- host eviction -----------------------------------------------------------------------

    def evict_host(self, num_tokens: int) -> int:
        """Free ``num_tokens`` of host slots: host-only leaves, least recently used first.
        Nodes still on the device keep their host copy (it makes their next eviction free)."""
        _checks.integer("num_tokens", num_tokens)
        leaves = [
            n
            for n in self._all_nodes()
            if n.evicted and not n.children and n.host_lock_ref == 0
        ]
        eviction_heap = [(n.last_access_time, n.id, n) for n in leaves]
        heapq.heapify(eviction_heap)
        num_evicted = 0
        while num_evicted < num_tokens and eviction_heap:
            _, _, x = heapq.heappop(eviction_heap)
            num_evicted += self.cache_controller.evict_host(x.host_value)
            parent = x.parent
            del parent.children[self._child_key(x.key)]
            if parent.evicted and not parent.children and parent.host_lock_ref == 0:
                heapq.heappush(
                    eviction_heap, (parent.last_access_time, parent.id, parent)
                )
            else:
                self._update_leaf_status(parent)
        return num_evicted

    def _all_nodes(self) -> list[TreeNode]:
        nodes, stack = [], list(self.root_node.children.values())
        while stack:
            n = stack.pop()
            nodes.append(n)
            stack.extend(n.children.values())
        return nodes

    # -- load back ---------------------------------------------------------------------------

    def load_back(self, node: TreeNode) -> torch.Tensor | None:
        """Bring the host-only nodes on the path to ``node`` back to the device; returns their new
        device slots (in path order) or None (too few tokens to bother, or no room even after
        evicting). Order: lock the device ancestors, take device pages (evicting if short), copy
        host -> device into them, then re-point the nodes at their new slots."""
        _check_node(self, node, on_host=True)
        nodes_to_load = []
        while node.evicted:
            nodes_to_load.append(node)
            node = node.parent
        nodes_to_load.reverse()
        ancestor = node
        host_indices = torch.cat([n.host_value for n in nodes_to_load])
        if len(host_indices) < max(1, self.load_back_threshold):
            return None
        # The ancestors must not be evicted while room is made, nor these host copies dropped by
        # a write-back's host eviction.
        self.inc_lock_ref(ancestor)
        for n in nodes_to_load:
            n.host_lock_ref += 1
        available = self.token_to_kv_pool_allocator.available_size()
        if available < len(host_indices):
            self.evict(len(host_indices) - available)
        # device pages first, then the copy
        device_indices = self.cache_controller.load(host_indices)
        for n in nodes_to_load:
            n.host_lock_ref -= 1
        self.dec_lock_ref(ancestor)
        if device_indices is None:
            return None
        offset = 0
        for n in nodes_to_load:  # re-point the nodes at their new device slots
            n.value = device_indices[offset : offset + len(n.host_value)].clone()
            offset += len(n.value)
            self.evictable_size_ += len(n.value)
        # bottom up: only the deepest can be a leaf
        for n in [*reversed(nodes_to_load), ancestor]:
            self._update_leaf_status(n)
        if self.debug_mode:
            self._check_tree()
        return device_indices

    def init_load_back(self, last_node: TreeNode, host_hit_length: int):
        """At admission: load the host part of a match back. Returns (the loaded device slots, the
        node to lock). When loading is refused (fewer host tokens than ``load_back_threshold``, or
        no room even after evicting): an empty tensor and the last node of the match's device part,
        which the caller then locks; the host part is recomputed."""
        _checks.integer("host_hit_length", host_hit_length)
        _checks.instance("last_node", last_node, HiTreeNode)
        if last_node.evicted:
            loading_values = self.load_back(last_node)
            if loading_values is not None:
                return loading_values, last_node
            while last_node.evicted:
                last_node = last_node.parent
        return torch.empty(0, dtype=torch.int64, device=self.device), last_node

    # -- debug mode ----------------------------------------------------------------------------

    def _node_values(self, node: HiTreeNode) -> tuple:
        return node.value, node.host_value

    def _check_tree(self) -> None:
        super()._check_tree()
        for n in self._all_nodes():
            if n.evicted:
                assert n.backuped, f"{n} is on neither tier"
                assert n.lock_ref == 0, f"{n} is locked but not on the device"
                assert all(c.evicted for c in n.children.values()), (
                    f"{n} is on the host above a device node"
                )


# -- argument checks at the boundary -------------------------------------------------------------


def _check_host_kv_cache(decl, size, page_size) -> None:
    _checks.instance("decl", decl, HostPoolDecl, "a device pool's host_pool_decls()[i]")
    page_size = _checks.integer("page_size", page_size, 1)
    _checks.integer(
        "size (host tokens, a page at least)", size, page_size, _checks.INT32_MAX
    )
