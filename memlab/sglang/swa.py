"""Sliding-window attention, two pools and one map (sglang/srt/mem_cache/swa_memory_pool.py).

Full-attention layers need every token's KV; sliding-window layers only the last
``sliding_window`` tokens. So the SWA layers get a pool of their own (usually much smaller), with
an allocator of its own: the two hand out ids independently. The request table stores full-side
ids; ``full_to_swa_index_mapping[full_id]`` gives the same token's SWA-side id (0 = none).
Tokens that fall out of the window give their SWA pages back while the request keeps running.

Per-request ring mode: each request row owns a fixed ring of SWA slots, so SWA capacity is counted
in request rows, not tokens, and a token's SWA slot is ``ring_start(row) + position % ring``.
"""

from __future__ import annotations

import torch

from memlab.common import _checks
from memlab.common.env import resolve_device
from memlab.common.utils import ceil_align
from memlab.sglang.allocator import (
    BaseTokenToKVPoolAllocator,
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from memlab.sglang.allocator.reference import num_new_pages, num_new_pages_decode
from memlab.sglang.kv_pool import MHATokenToKVPool, total_kv_size_bytes
from memlab.sglang.write_loc import KVWriteLoc, unwrap_write_loc


class SWAKVPool:
    """A full-attention pool for the full layers and a sliding-window pool for the SWA layers.

    Layers keep their model ids; ``layers_mapping[layer_id] = (index in its sub-pool, is_swa)``.
    With ``swa_req_ring_size`` the SWA pool holds one ring per request row (``num_req_rows``)
    instead of ``size_swa`` free-standing slots.
    """

    # Its ids are physical by allocation, so it needs no "physical" mark; only the unified pools
    # (virtual ids, translated per batch) demand one. What it needs is the SWA-side ids.
    requires_physical_write_loc = False

    def __init__(
        self,
        size: int,
        size_swa: int | None,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        full_attention_layer_ids,
        swa_attention_layer_ids,
        device="cpu",
        v_head_dim: int | None = None,
        swa_req_ring_size: int | None = None,
        num_req_rows: int | None = None,
    ):
        full_ids = _checks.int_list(
            "full_attention_layer_ids", full_attention_layer_ids
        )
        swa_ids = _checks.int_list("swa_attention_layer_ids", swa_attention_layer_ids)
        _checks.swa_kv_pool(
            full_ids, swa_ids, size_swa, swa_req_ring_size, num_req_rows
        )
        self.page_size = page_size
        self.swa_req_ring_size = swa_req_ring_size
        if swa_req_ring_size is not None:
            self.swa_ring_cost = ceil_align(swa_req_ring_size, page_size)
            size_swa = num_req_rows * self.swa_ring_cost
        self.size, self.size_swa = size, size_swa
        self.full_kv_pool = MHATokenToKVPool(
            size,
            page_size,
            dtype,
            head_num,
            head_dim,
            len(full_ids),
            device,
            v_head_dim,
        )
        self.swa_kv_pool = MHATokenToKVPool(
            size_swa,
            page_size,
            dtype,
            head_num,
            head_dim,
            len(swa_ids),
            device,
            v_head_dim,
        )
        self.layers_mapping = {lid: (i, False) for i, lid in enumerate(full_ids)}
        self.layers_mapping.update({lid: (i, True) for i, lid in enumerate(swa_ids)})
        self.dtype, self.device = dtype, self.full_kv_pool.device

    def _layer(self, layer_id: int):
        _check_swa_layer(self, layer_id)
        i, is_swa = self.layers_mapping[layer_id]
        return (self.swa_kv_pool if is_swa else self.full_kv_pool), i, is_swa

    def is_swa_layer(self, layer_id: int) -> bool:
        return self._layer(layer_id)[2]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        pool, i, _ = self._layer(layer_id)
        return pool.get_key_buffer(i)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        pool, i, _ = self._layer(layer_id)
        return pool.get_value_buffer(i)

    def get_kv_buffer(self, layer_id: int):
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(
        self, layer_id, loc, cache_k, cache_v, k_scale=None, v_scale=None
    ) -> None:
        """Full layers write at ``loc``; SWA layers at the write loc's ``swa_loc``, translated once
        per batch (``allocator.write_loc(out_cache_loc)``): the pool never translates."""
        loc, swa_loc, _ = unwrap_write_loc(loc)
        pool, i, is_swa = self._layer(getattr(layer_id, "layer_id", layer_id))
        if is_swa:
            _checks.swa_write(layer_id, swa_loc)
            loc = swa_loc
        pool.set_kv_buffer(i, loc, cache_k, cache_v, k_scale, v_scale)

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """Both sub-pools' ``(K bytes, V bytes)``, added side by side (SGLang's)."""
        (k, v), (k_swa, v_swa) = (
            self.full_kv_pool.get_kv_size_bytes(),
            self.swa_kv_pool.get_kv_size_bytes(),
        )
        return k + k_swa, v + v_swa

    def kv_size_bytes(self) -> int:
        """Deprecated, memlab's old name: the total of ``get_kv_size_bytes()``."""
        return total_kv_size_bytes(self)


class SWATokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Full and SWA sub-allocators (token or paged) that hand out slots in lockstep.

    Every new token gets a full-side slot (returned; it goes into the request table) and a
    SWA-side slot (recorded in ``full_to_swa_index_mapping``). Capacity is the smaller side, and
    it is settled for both sides before either takes anything: a refusal changes nothing.

    As SGLang's, it derives from ``BaseTokenToKVPoolAllocator`` without running its
    ``__init__``: the free lists are the two sub-allocators'. ``size`` is ``min(full, swa)``, as
    SGLang's; ``size_full`` and ``size_swa`` give each side.
    """

    # Per-request ring mode. A class default, as SGLang's: the unified subclass skips __init__.
    _swa_req_ring = False

    def __init__(
        self,
        size: int,
        size_swa: int | None,
        page_size: int,
        dtype=torch.float16,
        device="cpu",
        kvcache: SWAKVPool | None = None,
        need_sort: bool = False,
        debug_mode: bool = False,
        req_to_token_pool=None,
        swa_req_ring_size: int | None = None,
        backend: str = "torch",
    ):
        _check_swa_allocator(
            kvcache,
            SWAKVPool,
            page_size,
            size_swa,
            swa_req_ring_size,
            req_to_token_pool,
        )
        if kvcache is not None and swa_req_ring_size is None:
            # the pool's ring, unless one is asked for
            swa_req_ring_size = kvcache.swa_req_ring_size
        self.page_size, self.device = page_size, resolve_device(device)
        self.dtype, self.need_sort = dtype, need_sort
        self._kvcache, self.debug_mode = kvcache, debug_mode
        full_pool = kvcache.full_kv_pool if kvcache is not None else None
        swa_pool = kvcache.swa_kv_pool if kvcache is not None else None

        def make(n, pool):
            if page_size == 1:
                return TokenToKVPoolAllocator(
                    n, dtype, device, pool, need_sort, debug_mode
                )
            return PagedTokenToKVPoolAllocator(
                n, page_size, dtype, device, pool, need_sort, debug_mode, backend
            )

        self.full_attn_allocator = make(size, full_pool)
        self._size_full = size
        self._swa_req_ring = swa_req_ring_size is not None
        if self._swa_req_ring:
            # Each request row owns one ring: SWA capacity is rows, not tokens; no SWA
            # ids to hand out.
            self._req_to_token_pool = req_to_token_pool
            self.swa_ring_cost = ceil_align(swa_req_ring_size, page_size)
            self._size_swa = req_to_token_pool.size * self.swa_ring_cost
            self.swa_attn_allocator = None
        else:
            self.swa_attn_allocator = make(size_swa, swa_pool)
            self._size_swa = size_swa
        if kvcache is not None:
            _check_swa_kvcache_sizes(self, kvcache)
        # size + page_size rows (as in the KV buffers) and a trailing -1: a request with no prefix
        # has last_loc = -1, and mapping[-1] = -1 hands the SWA side the same "no prefix" mark.
        self.full_to_swa_index_mapping = torch.cat(
            (
                torch.zeros(size + page_size, dtype=torch.int64, device=self.device),
                torch.tensor([-1], dtype=torch.int64, device=self.device),
            )
        )
        # The free lists are the sub-allocators' (get_all_free_pages() is None); the SWA side's
        # frees queue here in a group.
        self.free_group = None
        self.swa_free_group, self.swa_page_ids_group = [], []

    # -- sizes ------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return min(self._size_full, self._size_swa)

    @property
    def size_full(self) -> int:
        return self._size_full

    @property
    def size_swa(self) -> int:
        return self._size_swa

    def full_available_size(self) -> int:
        return self.full_attn_allocator.available_size()

    def get_all_free_pages(self) -> None:
        """None, as SGLang's: the free lists are each side's (``full_attn_allocator``,
        ``swa_attn_allocator``)."""
        return None

    def page_id_range(self) -> tuple[int, int]:
        """The ids callers hold are the full side's."""
        return self.full_attn_allocator.page_id_range()

    def _ledger(self) -> torch.Tensor:
        """Debug mode: the pages held on the full side, whose ids the request table holds."""
        return self.full_attn_allocator._ledger()

    def swa_available_size(self) -> int:
        if self._swa_req_ring:
            return self._req_to_token_pool.available_size() * self.swa_ring_cost
        return self.swa_attn_allocator.available_size()

    def available_size(self) -> int:
        if self._swa_req_ring:  # the request table already gates rows, hence rings
            return self.full_available_size()
        return min(self.full_available_size(), self.swa_available_size())

    def get_kvcache(self):
        return self._kvcache

    def clear(self) -> None:
        self.full_attn_allocator.clear()
        if self.swa_attn_allocator is not None:
            self.swa_attn_allocator.clear()
        self.full_to_swa_index_mapping[:-1] = 0
        self.free_group = None
        self.swa_free_group, self.swa_page_ids_group = [], []

    # -- allocation -------------------------------------------------------------------------
    def _fits(self, need_tokens: int) -> bool:
        if need_tokens > self.full_available_size():
            return False
        return self._swa_req_ring or need_tokens <= self.swa_available_size()

    def alloc(self, need_size: int) -> torch.Tensor | None:
        need_size = _checks.alloc(self, need_size)
        if not self._fits(need_size):
            return None
        full = self.full_attn_allocator.alloc(need_size)
        if full is not None and not self._swa_req_ring:
            self.full_to_swa_index_mapping[full] = self.swa_attn_allocator.alloc(
                need_size
            )
        return full

    def alloc_extend(
        self,
        prefix_lens,
        prefix_lens_cpu,
        seq_lens,
        seq_lens_cpu,
        last_loc,
        extend_num_tokens,
    ):
        _checks.alloc_extend(
            self.full_attn_allocator,
            prefix_lens,
            prefix_lens_cpu,
            seq_lens,
            seq_lens_cpu,
            last_loc,
            extend_num_tokens,
        )
        ps = self.page_size
        if ps == 1:
            need, pages = extend_num_tokens, {}
        else:  # counted once on the host, for the check and both sides (SGLang passes it on)
            count = num_new_pages(prefix_lens_cpu, seq_lens_cpu, ps)
            need, pages = count * ps, {"num_new_pages": count}
        if not self._fits(need):
            return None
        full = self.full_attn_allocator.alloc_extend(
            prefix_lens,
            prefix_lens_cpu,
            seq_lens,
            seq_lens_cpu,
            last_loc,
            extend_num_tokens,
            **pages,
        )
        if full is None or self._swa_req_ring:
            return full
        # -1 stays -1 (the trailing entry)
        swa_last_loc = self.full_to_swa_index_mapping[last_loc]
        swa = self.swa_attn_allocator.alloc_extend(
            prefix_lens,
            prefix_lens_cpu,
            seq_lens,
            seq_lens_cpu,
            swa_last_loc,
            extend_num_tokens,
            **pages,
        )
        assert swa is not None, "SWA side refused after its capacity was checked"
        self.full_to_swa_index_mapping[full] = swa
        return full

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc):
        _checks.alloc_decode(self.full_attn_allocator, seq_lens, seq_lens_cpu, last_loc)
        ps = self.page_size
        need = num_new_pages_decode(seq_lens_cpu, ps) * ps
        # memlab differs here on purpose: SGLang 0.5.23 lets the full side take its pages and then
        # returns None if the SWA side is short (its scheduler checks capacity first, so it never
        # is); memlab settles both sides before either takes anything.
        if not self._fits(need):
            return None
        full = self.full_attn_allocator.alloc_decode(seq_lens, seq_lens_cpu, last_loc)
        if full is None or self._swa_req_ring:
            return full
        swa = self.swa_attn_allocator.alloc_decode(
            seq_lens, seq_lens_cpu, self.full_to_swa_index_mapping[last_loc]
        )
        assert swa is not None, "SWA side refused after its capacity was checked"
        self.full_to_swa_index_mapping[full] = swa
        return full

    # -- ids for the pools ------------------------------------------------------------------
    def translate_loc_from_full_to_swa(self, full_loc: torch.Tensor) -> torch.Tensor:
        _check_swa_ids(self, full_loc)
        if self._swa_req_ring:
            raise ValueError(
                "ring mode: SWA ids come from rows and positions: use ring_loc()"
            )
        return self.full_to_swa_index_mapping[full_loc]

    def ring_loc(
        self, req_pool_indices: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Ring mode: the SWA slot of each (row, position); the first page is padding, and padded
        batch entries (row 0) land there, not in another row's ring."""
        if not self._swa_req_ring:
            raise ValueError("ring_loc needs the per-request ring mode")
        _check_swa_ring_write_loc(req_pool_indices, positions)
        c, ps = self.swa_ring_cost, self.page_size
        row, pos = req_pool_indices.to(torch.int64), positions.to(torch.int64)
        return torch.where(row == 0, pos % ps, ps + (row - 1) * c + pos % c)

    def write_loc(
        self, out_cache_loc: torch.Tensor, req_pool_indices=None, positions=None
    ) -> KVWriteLoc:
        """The batch's write location with its SWA-side ids (SGLang's attention backend builds it
        once per batch: ``KVWriteLoc.for_batch(forward_batch, swa_loc=...)``)."""
        if self._swa_req_ring:
            swa = self.ring_loc(req_pool_indices, positions)
        else:
            swa = self.translate_loc_from_full_to_swa(out_cache_loc)
        return KVWriteLoc(out_cache_loc, swa_loc=swa)

    # -- freeing ----------------------------------------------------------------------------
    def _clear_mapping(self, free_index: torch.Tensor) -> None:
        # A paged free gives back whole pages, so forget the whole pages: a stale entry for a slot
        # of a released page would later hand out an SWA slot someone else owns.
        # No dedup (torch.unique would sync with the device): writing 0 twice is harmless.
        ps = self.page_size
        if ps == 1:
            self.full_to_swa_index_mapping[free_index] = 0
            return
        starts = free_index.to(torch.int64) // ps * ps
        offs = torch.arange(ps, dtype=torch.int64, device=starts.device)
        self.full_to_swa_index_mapping[(starts[:, None] + offs).reshape(-1)] = 0

    def free_swa(self, free_index: torch.Tensor) -> None:
        """Give back the SWA slots under these full-side slots; the full side keeps them.

        Inside a free group the SWA ids are resolved (and the map cleared) now, and released at
        the group's end: a later step of the group may map the same full slots anew.
        """
        _check_swa_free(self, free_index)
        if self._swa_req_ring or free_index.numel() == 0:
            return  # a ring is freed with its row
        swa = self.full_to_swa_index_mapping[free_index]
        self._clear_mapping(free_index)
        if self.page_size == 1:
            # An SWA slot is its own page: SGLang takes the page-id path here. It leaves slots the
            # window already released to free_full (their map reads 0, the padding id); memlab
            # skips them instead, at the price of a sync for the filter.
            self._free_swa_page_ids(swa[swa > 0])
        elif self.free_group is not None:
            self.swa_free_group.append(swa)
        else:
            self._release_swa(swa)

    def _release_swa(self, swa: torch.Tensor) -> None:
        # 0 means "no SWA slot" (released out of window, or never mapped): never the padding id 0.
        self.swa_attn_allocator.free(swa[swa > 0])

    def free_swa_segment(self, free_index: torch.Tensor, start_pos: int) -> None:
        """``free_swa`` for a page-aligned run of one request's slots (positions from
        ``start_pos``): one slot per page names the SWA page, no dedup."""
        _check_swa_segment(self, start_pos)
        if self._swa_req_ring or free_index.numel() == 0:
            return
        ps = self.page_size
        firsts = free_index[::ps].to(torch.int64)
        swa_pages = self.full_to_swa_index_mapping[firsts] // ps
        self._clear_mapping(firsts)
        self._free_swa_page_ids(swa_pages)

    def _free_swa_page_ids(self, swa_pages: torch.Tensor) -> None:
        if self.free_group is not None:
            self.swa_page_ids_group.append(swa_pages)
        else:
            self.swa_attn_allocator.free_page_ids(swa_pages)

    def free(self, free_index: torch.Tensor) -> None:
        """Free both sides: SWA first (it reads the map), then full. A double free is refused in
        debug mode only (before either side changes), as SGLang asserts it."""
        _check_swa_free(self, free_index)
        if free_index.numel() == 0:
            return
        self.free_swa(free_index)
        self.full_attn_allocator.free(free_index)

    def free_segment(self, free_index: torch.Tensor, start_pos: int) -> None:
        """``free`` for a page-aligned run of one request's slots: both sides without a dedup."""
        _check_swa_free(self, free_index)
        # before either side changes
        _checks.free_segment(self.full_attn_allocator, free_index, start_pos)
        self.free_swa_segment(free_index, start_pos)
        self.full_attn_allocator.free_segment(free_index, start_pos)

    def free_full(self, free_index: torch.Tensor) -> None:
        """Free full-side slots whose SWA peers are already gone (released out of window)."""
        _check_swa_free(self, free_index)
        self.full_attn_allocator.free(free_index)

    def free_full_segment(self, free_index: torch.Tensor, start_pos: int) -> None:
        """``free_full`` for a page-aligned run: a finished request's out-of-window part."""
        _check_swa_free(self, free_index)
        self.full_attn_allocator.free_segment(free_index, start_pos)

    def free_group_begin(self) -> None:
        """The SWA side's frees queue here, the full side's in its own group, as SGLang's do."""
        super().free_group_begin()
        self.swa_free_group, self.swa_page_ids_group = [], []
        self.full_attn_allocator.free_group_begin()

    def free_group_end(self) -> None:
        """SWA page ids first, then the SWA slots (one dedup for the group), then the full side."""
        super().free_group_end()
        swa_slots, swa_pages = self.swa_free_group, self.swa_page_ids_group
        self.swa_free_group, self.swa_page_ids_group = [], []
        if swa_pages:
            self.swa_attn_allocator.free_page_ids(torch.cat(swa_pages))
        if swa_slots:
            self._release_swa(torch.cat(swa_slots))
        self.full_attn_allocator.free_group_end()

    def release_out_of_window(
        self,
        req_to_token: torch.Tensor,
        req_pool_idx: int,
        pre_len: int,
        swa_evicted_len: int,
        sliding_window: int,
        cache_protected_len: int = 0,
        supports_prefix_sharing: bool = False,
    ) -> int:
        """Free the SWA pages of a running request that lie wholly before its window (SGLang's
        ``free_swa_out_of_window_slots``); returns the new ``swa_evicted_len``.

        SGLang's convention: ``sliding_window`` leaves the query out (config.sliding_window - 1),
        so the next query (position ``pre_len``) reads positions ``pre_len - sliding_window`` ..
        ``pre_len - 1``; those before are dead on the SWA side. The first ``cache_protected_len``
        tokens (page-aligned) belong to the prefix cache, which frees them itself. With a
        prefix-sharing cache the kept tail is ``max(window, page_size)`` rounded up to whole pages,
        so that a cached key ending at the last page boundary still has a whole window of live
        SWA. The released run ends on a page boundary.
        """
        _check_swa_release(
            self,
            req_to_token,
            req_pool_idx,
            pre_len,
            swa_evicted_len,
            sliding_window,
            cache_protected_len,
        )
        ps = self.page_size
        if pre_len - sliding_window < swa_evicted_len + 1:
            return swa_evicted_len  # nothing new is out of the window
        evicted = max(swa_evicted_len, cache_protected_len)
        if supports_prefix_sharing:
            threshold = pre_len - ceil_align(max(sliding_window, ps), ps)
        else:
            threshold = pre_len - sliding_window
        new_evicted = max(evicted, threshold) // ps * ps
        if new_evicted > evicted:
            self.free_swa_segment(
                req_to_token[req_pool_idx, evicted:new_evicted].to(torch.int64), evicted
            )
            return new_evicted
        return evicted

    def check_books(self) -> None:
        self.full_attn_allocator.check_books()
        if self.swa_attn_allocator is not None:
            self.swa_attn_allocator.check_books()

    # -- the scheduler's questions (SGLang 0.5.23, allocator/base.py and swa.py) ------------
    # SGLang's SWA allocator inherits the base allocator's answers and overrides only eviction:
    # each side is its own buffer, so the scheduler's per-side budgets already price it.

    def evict_to_free_tokens(self, tree_cache, num_tokens: int) -> None:
        """Evict until both sides can serve ``num_tokens``. SGLang asks its SWA tree for each side's
        shortfall (``EvictParams(num_tokens=full, swa_num_tokens=swa)``); memlab's trees free a
        node's slots on both sides at once, so they are asked for the larger shortfall."""
        _checks.counts(num_tokens=num_tokens)
        if tree_cache is None or not tree_cache.supports_prefix_sharing():
            return None
        full_shortfall = max(0, num_tokens - self.full_available_size())
        swa_shortfall = max(0, num_tokens - self.swa_available_size())
        if full_shortfall or swa_shortfall:
            tree_cache.evict(max(full_shortfall, swa_shortfall))
        return None


# -- argument checks (memlab's, at the boundary: the engine trusts its caller here) --------------


def _check_swa_layer(pool, layer_id) -> None:
    if _checks.integer("layer_id", layer_id) not in pool.layers_mapping:
        raise _checks.RangeError(
            f"layer {layer_id} is in neither sub-pool (layers: {sorted(pool.layers_mapping)})"
        )


def _check_swa_allocator(
    kvcache, pool_type, page_size, size_swa, swa_req_ring_size, req_to_token_pool
) -> None:
    _checks.integer("page_size", page_size, 1)
    if kvcache is not None and not isinstance(kvcache, pool_type):
        raise TypeError(f"kvcache must be an SWAKVPool, got {type(kvcache).__name__}")
    if kvcache is not None and swa_req_ring_size is None:
        swa_req_ring_size = kvcache.swa_req_ring_size
    if kvcache is not None and swa_req_ring_size != kvcache.swa_req_ring_size:
        raise ValueError(
            f"SWA ring size {swa_req_ring_size}: the SWAKVPool's is ring size "
            f"{kvcache.swa_req_ring_size}"
        )
    # a per-request ring counts capacity in request rows
    if swa_req_ring_size is not None and req_to_token_pool is None:
        raise ValueError("per-request SWA ring: req_to_token_pool is required")
    if swa_req_ring_size is None and size_swa is None:
        raise ValueError("size_swa is required unless a per-request ring is used")


def _check_swa_kvcache_sizes(alloc, kvcache) -> None:
    """The pool sizes its buffers on its own (ring mode: from num_req_rows); an allocator that
    counts more slots than the buffers hold would hand out ids past their end."""
    if kvcache.page_size != alloc.page_size:
        raise ValueError(
            f"the SWAKVPool's page_size {kvcache.page_size} is not the allocator's "
            f"page_size {alloc.page_size}"
        )
    for side, pool_n, own_n in (
        ("full", kvcache.size, alloc.size_full),
        ("SWA", kvcache.size_swa, alloc.size_swa),
    ):
        if pool_n != own_n:
            raise ValueError(
                f"the {side} pool holds {pool_n} slots, the allocator's {side} side {own_n}"
            )


def _check_swa_ring_write_loc(req_pool_indices, positions) -> None:
    if req_pool_indices is None or positions is None:
        raise ValueError("ring mode: the SWA ids need req_pool_indices and positions")
    _checks.index_tensor("req_pool_indices", req_pool_indices, ndim=1)
    _checks.index_tensor(
        "positions", positions, positions.device, req_pool_indices.dim()
    )
    if positions.shape != req_pool_indices.shape:
        raise ValueError("ring mode: one row per position")


def _check_swa_free(alloc, free_index) -> None:
    """Full-side slots to free. In debug mode the full side's double-free check runs here, before
    the SWA side gives anything back: a refused free must change neither side."""
    full = alloc.full_attn_allocator
    _checks.free(full, free_index)
    # checked, not marked: the full side frees them
    if alloc.debug_mode and free_index.numel():
        full._debug_release(torch.unique(free_index.cpu() // alloc.page_size), False)


def _check_swa_segment(alloc, start_pos) -> None:
    if _checks.integer("start_pos", start_pos) % alloc.page_size:
        raise ValueError(
            f"free_swa_segment: start_pos {start_pos} is not a multiple of page_size "
            f"{alloc.page_size}"
        )


def _check_swa_release(
    alloc, req_to_token, row, pre_len, swa_evicted_len, window, cache_protected_len
) -> None:
    """The request's row of the table, its lengths (whole pages where the window releases), and
    the window, before anything is read."""
    _checks.index_tensor("req_to_token", req_to_token, alloc.device, ndim=2)
    _checks.integer("req_pool_idx", row, 0, req_to_token.shape[0] - 1)
    window = _checks.integer("sliding_window", window)
    # the next query's position: what it leaves behind the window lies inside the row
    _checks.integer("pre_len", pre_len, 0, req_to_token.shape[1] + window)
    for name, v in (
        ("swa_evicted_len", swa_evicted_len),
        ("cache_protected_len", cache_protected_len),
    ):
        if _checks.integer(name, v, 0, req_to_token.shape[1]) % alloc.page_size:
            raise ValueError(
                f"{name} {v} is not page-aligned (page_size {alloc.page_size})"
            )


def _check_swa_ids(alloc, full_loc) -> None:
    """Full-side slot ids, 1-D, on the allocator's device (read only on the CPU or in debug
    mode: inside the pool)."""
    _checks.index_tensor("full_loc", full_loc, alloc.device, ndim=1)
    if _checks.can_read_values(alloc.debug_mode, full_loc):
        _checks.values_in(
            "full_loc", full_loc, -1, alloc.size_full + alloc.page_size - 1
        )
