"""UnifiedSWATokenToKVPoolAllocator (sglang/srt/mem_cache/allocator/unified_hybrid_swa.py).

Full and sliding-window KV in one buffer, one id.

Chapter 07's two-pool SWA allocator hands out a full-side id and an SWA-side id per token and keeps
``full_to_swa_index_mapping`` between them, with each pool's size fixed at start-up. Here both
sub-pools live in one UnifiedKVPool and share ONE virtual id: the full side owns the ids (a
grow-down END), the SWA side binds the same virtual pages to physical pages of its own (a grow-up
END, built with the full side's virtual page count). So the SWA side's v2p table IS the full -> SWA
map, and the mapping table disappears. The price: the allocator must manage both pools' byte
budgets. A token costs ``e_full + e_swa`` bytes of the shared gap, a token that has left the window
only ``e_full``, and the split between the two floats with the load instead of being fixed.

Where memlab is smaller: eager compaction only (see ``sub_pool``), so ``ensure_capacity`` never
flushes; no ``can_reserve`` / ``reclaim_plan`` (the eviction planner), no PD-decode
``alloc_extend_swa_tail``, no move gates; the ``*_segment`` frees take the general path (the same
pages for a page-aligned run).
"""

from __future__ import annotations

import torch

from memlab.common import _checks
from memlab.common.utils import ceil_div
from memlab.sglang.allocator import BaseTokenToKVPoolAllocator
from memlab.sglang.allocator.reference import num_new_pages, num_new_pages_decode
from memlab.sglang.sizing import estimate_swa_kv_tokens
from memlab.sglang.swa import SWATokenToKVPoolAllocator
from memlab.sglang.unified.pool import UnifiedKVPool
from memlab.sglang.unified.sub_pool import MultiEndedAllocator
from memlab.sglang.write_loc import KVWriteLoc


class UnifiedSWATokenToKVPoolAllocator(SWATokenToKVPoolAllocator):
    """Chapter 07's SWA allocator over one buffer. As SGLang's (``UnifiedSWAAllocatorBase``), it
    derives from the two-pool ``SWATokenToKVPoolAllocator`` for its contract and its inherited
    answers (``size``, ``release_out_of_window``, the free-segment loops) without running its
    ``__init__``: both sides are ``MultiEndedAllocator``s and one virtual id replaces the map."""

    def __init__(
        self,
        *,
        unified_buffer: UnifiedKVPool,
        kvcache=None,
        device="cpu",
        page_size: int = 1,
        debug_mode: bool = False,
        backend: str = "torch",
    ):
        self.unified_buffer, self._kvcache, self.page_size = (
            unified_buffer,
            kvcache,
            page_size,
        )
        self.need_sort = False
        kw = dict(
            unified_buffer=unified_buffer,
            device=device,
            page_size=page_size,
            debug_mode=debug_mode,
            backend=backend,
        )
        self.full_attn_allocator = MultiEndedAllocator(
            kvcache=None if kvcache is None else kvcache.full_kv_pool,
            sub_pool_name="full",
            is_id_owner=True,
            **kw,
        )
        # The SWA side binds the virtual pages the full side mints, so it spans the full
        # side's id space.
        self.swa_attn_allocator = MultiEndedAllocator(
            kvcache=None if kvcache is None else kvcache.swa_kv_pool,
            sub_pool_name="swa",
            is_id_owner=False,
            virtual_num_pages=self.full_attn_allocator.num_virtual_ids,
            **kw,
        )
        self.full_attn_allocator.bind_peer(self.swa_attn_allocator)
        self.swa_attn_allocator.bind_peer(self.full_attn_allocator)
        self.device, self.debug_mode = self.full_attn_allocator.device, debug_mode
        self.dtype = self.full_attn_allocator.dtype
        self._empty_shared_gap_bytes = self.full_attn_allocator._current_gap_bytes()
        # What each side could take alone, from the empty buffer (the SWA side: at most
        # one page per virtual page).
        self._size_full = self.full_attn_allocator.available_size()
        self._size_swa = min(
            self.swa_attn_allocator.available_size(),
            len(self.full_attn_allocator.free_virtual_ids) * page_size,
        )
        self.free_group, self.full_free_group = None, []

    # -- sizes: one byte budget for both sides (size, size_full, size_swa: the parent's) ---------
    def available_size(self) -> int:
        """Tokens an ``alloc`` can still take: each needs a full page AND an SWA page (one virtual
        id), so it costs both entry sizes of the shared gap."""
        fa, sa = self.full_attn_allocator, self.swa_attn_allocator
        gap_bytes = fa._current_gap_bytes()
        room_full = fa.num_pages - fa.min_page_index - fa._allocated_pages()
        room_swa = sa.num_pages - sa.min_page_index - sa._allocated_pages()
        pages_by_bytes = gap_bytes // (
            fa.entry_bytes_per_page + sa.entry_bytes_per_page
        )
        return min(pages_by_bytes, room_full, room_swa) * self.page_size

    def full_available_size(self) -> int:
        """Full-side tokens alone (the SWA side lending its bytes), within the full side's size."""
        return min(
            self._size_full - self.full_attn_allocator.allocated_count(),
            self.full_attn_allocator.schedulable_available_size(),
        )

    def swa_available_size(self) -> int:
        return min(
            self._size_swa - self.swa_attn_allocator.allocated_count(),
            self.swa_attn_allocator.schedulable_available_size(),
        )

    def clear(self) -> None:
        self.full_attn_allocator.clear()
        self.swa_attn_allocator.clear()
        self.free_group, self.full_free_group = None, []

    # -- the byte envelope ---------------------------------------------------------------------
    def _fits_page_demand(self, num_full_pages: int, num_swa_pages: int) -> bool:
        """Both sides' new pages against their page numbers and, together, against the gap.
        (SGLang's check also counts lazy holes and virtual ids; eagerly compacted, the holes are
        gap already and the free virtual ids are exactly the full side's unused page numbers.)"""
        fa, sa, ps = self.full_attn_allocator, self.swa_attn_allocator, self.page_size
        virtual_page_capacity = fa.num_virtual_ids - fa.min_page_index
        full_page_capacity = min(
            virtual_page_capacity, fa.num_pages - fa.min_page_index
        )
        swa_page_capacity = min(virtual_page_capacity, sa.num_pages - sa.min_page_index)
        if fa.allocated_count() // ps + num_full_pages > full_page_capacity:
            return False
        if sa.allocated_count() // ps + num_swa_pages > swa_page_capacity:
            return False
        return (
            num_full_pages * fa.entry_bytes_per_page
            + num_swa_pages * sa.entry_bytes_per_page
            <= fa._current_gap_bytes()
        )

    def ensure_capacity(self, full_tokens: int, swa_tokens: int) -> bool:
        """Whether ``full_tokens`` full-side and ``swa_tokens`` SWA-side tokens fit now. (SGLang's
        lazy mode then tries once more after compacting both sides; eager has nothing to
        compact.)"""
        if full_tokens < 0 or swa_tokens < 0:
            return False
        if full_tokens == 0 and swa_tokens == 0:
            return True
        return self._fits_page_demand(
            ceil_div(full_tokens, self.page_size), ceil_div(swa_tokens, self.page_size)
        )

    # -- allocation: the full side's paged kernels, the SWA side binds the same pages --------
    def alloc(self, need_size: int) -> torch.Tensor | None:
        fa = self.full_attn_allocator
        need_size = _checks.alloc(fa, need_size)
        if not self.ensure_capacity(need_size, need_size):
            return None
        # rebound, never changed in place
        new_virtual_pages = fa.free_virtual_ids[: need_size // self.page_size]
        v_tokens = fa.alloc(need_size)
        assert v_tokens is not None, "full.alloc refused after the joint check passed"
        self.swa_attn_allocator.alloc_with_virtual(new_virtual_pages)
        return v_tokens

    def alloc_extend(
        self,
        prefix_lens,
        prefix_lens_cpu,
        seq_lens,
        seq_lens_cpu,
        last_loc,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        fa = self.full_attn_allocator
        _checks.alloc_extend(
            fa,
            prefix_lens,
            prefix_lens_cpu,
            seq_lens,
            seq_lens_cpu,
            last_loc,
            extend_num_tokens,
        )
        need_tokens = (
            num_new_pages(prefix_lens_cpu, seq_lens_cpu, self.page_size)
            * self.page_size
        )
        if not self.ensure_capacity(need_tokens, need_tokens):
            return None
        new_virtual_pages = fa.free_virtual_ids[: need_tokens // self.page_size]
        out = fa.alloc_extend(
            prefix_lens,
            prefix_lens_cpu,
            seq_lens,
            seq_lens_cpu,
            last_loc,
            extend_num_tokens,
        )
        assert out is not None, "full.alloc_extend refused after the joint check passed"
        self.swa_attn_allocator.alloc_with_virtual(new_virtual_pages)
        return out

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc) -> torch.Tensor | None:
        fa = self.full_attn_allocator
        _checks.alloc_decode(fa, seq_lens, seq_lens_cpu, last_loc)
        need_tokens = (
            num_new_pages_decode(seq_lens_cpu, self.page_size) * self.page_size
        )
        if not self.ensure_capacity(need_tokens, need_tokens):
            return None
        new_virtual_pages = fa.free_virtual_ids[: need_tokens // self.page_size]
        out = fa.alloc_decode(seq_lens, seq_lens_cpu, last_loc)
        assert out is not None, "full.alloc_decode refused after the joint check passed"
        self.swa_attn_allocator.alloc_with_virtual(new_virtual_pages)
        return out

    # -- translation: one virtual id, two physical slots ----------------------------------------
    def translate_kv_loc(self, loc: torch.Tensor) -> torch.Tensor:
        """Full layers read here: virtual token ids -> the full sub-pool's physical slots."""
        return self.full_attn_allocator.translate_kv_loc(loc)

    def translate_loc_from_full_to_swa(self, loc: torch.Tensor) -> torch.Tensor:
        """SWA layers read here: the same virtual ids -> the SWA sub-pool's physical slots
        (0, the sink, once a token has left the window)."""
        return self.swa_attn_allocator.translate_kv_loc(loc)

    def translate_write_loc(self, loc: torch.Tensor) -> torch.Tensor:
        return self.full_attn_allocator.translate_write_loc(loc)

    def write_loc(
        self, out_cache_loc: torch.Tensor, req_pool_indices=None, positions=None
    ) -> KVWriteLoc:
        """The batch's write location, translated once and marked physical: what SGLang's per-batch
        plan binds (``KVLocPlan.bind``: ``out_cache_loc`` becomes physical, the virtual ids stay in
        ``out_cache_loc_virtual``). Chapter 07's allocator has the same method, unmarked."""
        return KVWriteLoc.for_batch(
            self.translate_write_loc(out_cache_loc),
            physical=True,
            swa_loc=self.translate_loc_from_full_to_swa(out_cache_loc),
        )

    # -- freeing ---------------------------------------------------------------------------------
    def _swa_live(self, free_index: torch.Tensor) -> torch.Tensor:
        # > 0: -1 is a token whose SWA page already went (out of the window), 0 the sink page.
        v = free_index.to(torch.int64)
        return v[self.swa_attn_allocator.virtual_to_physical[v // self.page_size] > 0]

    def free(self, free_index: torch.Tensor) -> None:
        """Both sides: the SWA pages still bound, then the full pages (they return the ids)."""
        _checks.free(self.full_attn_allocator, free_index)
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(free_index.clone())
            return
        live = self._swa_live(free_index)
        if live.numel():
            self.swa_attn_allocator.free(live)
        self.full_attn_allocator.free(free_index.to(torch.int64))

    def free_swa(self, free_index: torch.Tensor) -> None:
        """A sliding window moved on: give back the SWA pages under these ids, keep the virtual ids
        and the full pages. The SWA v2p entry becoming -1 is the whole tombstone."""
        _checks.free(self.full_attn_allocator, free_index)
        live = self._swa_live(free_index)
        if live.numel():
            self.swa_attn_allocator.free(live)

    def free_full(self, free_index: torch.Tensor) -> None:
        """The full side of tokens whose SWA pages already went (a finished request's old part);
        inside a free group, queued for the group's end, as SGLang's."""
        _checks.free(self.full_attn_allocator, free_index)
        if self.free_group is not None:
            self.full_free_group.append(free_index.clone())
            return
        self.full_attn_allocator.free(free_index.to(torch.int64))

    def free_segment(self, free_index: torch.Tensor, start_pos: int) -> None:
        _checks.free_segment(self.full_attn_allocator, free_index, start_pos)
        self.free(free_index)

    def free_swa_segment(self, free_index: torch.Tensor, start_pos: int) -> None:
        _checks.free_segment(self.full_attn_allocator, free_index, start_pos)
        self.free_swa(free_index)

    def free_full_segment(self, free_index: torch.Tensor, start_pos: int) -> None:
        _checks.free_segment(self.full_attn_allocator, free_index, start_pos)
        self.free_full(free_index)

    # Not the two-pool parent's group: that one opens the full side's own group, and this
    # composite queues its frees itself (the base allocator's group, as SGLang's).
    def free_group_begin(self) -> None:
        BaseTokenToKVPoolAllocator.free_group_begin(self)
        self.full_free_group = []

    def free_group_end(self) -> None:
        full_free_group, self.full_free_group = self.full_free_group, []
        BaseTokenToKVPoolAllocator.free_group_end(self)
        if full_free_group:
            self.full_attn_allocator.free(torch.cat(full_free_group).to(torch.int64))

    # The window's release is chapter 07's (inherited), through this class's free_swa_segment:
    # the SWA v2p entries of the released pages become -1, the full side keeps them.

    def check_books(self) -> None:
        """Debug mode: each side's books; and no SWA page without a full page under the same id."""
        fa, sa = self.full_attn_allocator, self.swa_attn_allocator
        fa.check_books()
        sa.check_books()
        _check_unified_swa_books(fa.virtual_to_physical, sa.virtual_to_physical)

    # -- the scheduler's questions (SGLang 0.5.23, allocator/unified_hybrid_swa.py) ---------
    # Both sides are cut from one buffer, so no per-side token budget can say what fits: each
    # question is priced in bytes against the shared gap, both sides together.

    def _fits_pages_after(
        self,
        num_full_pages: int,
        num_swa_pages: int,
        *,
        full_reclaim_pages: int = 0,
        swa_reclaim_pages: int = 0,
        empty_pool: bool = False,
    ) -> bool:
        """Whether new pages fit once ``*_reclaim_pages`` live pages are given back (or from an
        empty pool): the wheel's ``_fits_page_demand`` on a compacted snapshot, which is what
        memlab's eager pool always is (live pages at each end, the rest of the buffer is gap)."""
        if min(num_full_pages, num_swa_pages) < 0:
            return False
        fa, sa, ps = self.full_attn_allocator, self.swa_attn_allocator, self.page_size
        full_live = swa_live = 0
        if not empty_pool:
            full_live, swa_live = fa.allocated_count() // ps, sa.allocated_count() // ps
            full_live -= min(full_live, max(0, int(full_reclaim_pages)))
            swa_live -= min(swa_live, max(0, int(swa_reclaim_pages)))
        virtual_page_capacity = fa.num_virtual_ids - fa.min_page_index
        full_page_capacity = min(
            virtual_page_capacity, fa.num_pages - fa.min_page_index
        )
        swa_page_capacity = min(virtual_page_capacity, sa.num_pages - sa.min_page_index)
        if (
            full_live + num_full_pages > full_page_capacity
            or swa_live + num_swa_pages > swa_page_capacity
        ):
            return False
        gap_bytes = (
            self._empty_shared_gap_bytes
            - full_live * fa.entry_bytes_per_page
            - swa_live * sa.entry_bytes_per_page
        )
        return (
            num_full_pages * fa.entry_bytes_per_page
            + num_swa_pages * sa.entry_bytes_per_page
            <= max(0, gap_bytes)
        )

    def reclaim_plan(
        self,
        full_tokens: int,
        swa_tokens: int,
        *,
        full_evictable_tokens: int = 0,
        swa_evictable_tokens: int = 0,
        empty_pool: bool = False,
    ) -> tuple[int, int] | None:
        """How many tokens each side must evict for the demand to fit, or None if even evicting all
        that is evictable is not enough. Least SWA reclaim first (with all evictable full pages
        given), then the least full reclaim with that SWA reclaim, as the wheel's default."""
        if full_tokens < 0 or swa_tokens < 0:
            return None
        ps = self.page_size
        full_pages, swa_pages = (
            ceil_div(int(full_tokens), ps),
            ceil_div(int(swa_tokens), ps),
        )

        def fits(full_reclaim: int, swa_reclaim: int) -> bool:
            return self._fits_pages_after(
                full_pages,
                swa_pages,
                full_reclaim_pages=full_reclaim,
                swa_reclaim_pages=swa_reclaim,
                empty_pool=empty_pool,
            )

        if fits(0, 0):
            return (0, 0)
        if empty_pool:
            return None
        max_full = min(
            self.full_attn_allocator.allocated_count() // ps,
            max(0, int(full_evictable_tokens)) // ps,
        )
        max_swa = min(
            self.swa_attn_allocator.allocated_count() // ps,
            max(0, int(swa_evictable_tokens)) // ps,
        )
        if not fits(max_full, max_swa):
            return None

        # the least value in [0, high] that ok accepts (ok(high) holds)
        def first_fit(high: int, ok) -> int:
            low = 0
            while low < high:
                mid = (low + high) // 2
                if ok(mid):
                    high = mid
                else:
                    low = mid + 1
            return low

        swa_reclaim = first_fit(max_swa, lambda v: fits(max_full, v))
        full_reclaim = first_fit(max_full, lambda v: fits(v, swa_reclaim))
        return (full_reclaim * ps, swa_reclaim * ps)

    def can_reserve(
        self,
        full_tokens: int,
        swa_tokens: int,
        *,
        full_evictable_tokens: int = 0,
        swa_evictable_tokens: int = 0,
        empty_pool: bool = False,
        require_token_slack: bool = False,
    ) -> bool:
        """Whether a full/SWA demand fits the shared byte envelope, after reclaiming what is
        evictable; ``require_token_slack``: the scheduler's one-token strict slack at an empty
        pool."""
        if full_tokens < 0 or swa_tokens < 0:
            return False
        if require_token_slack and (
            full_tokens >= self.size_full or swa_tokens >= self.size_swa
        ):
            return False
        return (
            self.reclaim_plan(
                full_tokens,
                swa_tokens,
                full_evictable_tokens=full_evictable_tokens,
                swa_evictable_tokens=swa_evictable_tokens,
                empty_pool=empty_pool,
            )
            is not None
        )

    def max_new_tokens_for_memory(
        self,
        input_tokens: int,
        max_new_tokens: int,
        *,
        token_capacity: int,
        sliding_window_size: int | None,
        chunk_size: int | None,
    ) -> int | None:
        """The most new tokens (up to ``max_new_tokens``) an empty pool could hold with the prompt,
        both sides priced in bytes (the SWA side keeps about a window); None: the prompt alone does
        not fit. ``token_capacity`` is not read: the buffer's bytes are the bound."""
        _checks.token_question(
            input_tokens,
            max_new_tokens,
            token_capacity,
            sliding_window_size,
            chunk_size,
        )

        def fits(candidate: int) -> bool:
            swa = estimate_swa_kv_tokens(
                input_tokens,
                candidate,
                sliding_window_size=sliding_window_size,
                page_size=self.page_size,
                allocation_limit=chunk_size,
            )
            return self.can_reserve(
                input_tokens + candidate + self.page_size,
                swa,
                empty_pool=True,
                require_token_slack=True,
            )

        if not fits(0):
            return None
        if fits(max_new_tokens):
            return max_new_tokens
        # fits(lo) holds, fits(hi) does not: the largest that fits
        lo, hi = (0, max_new_tokens)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def prealloc_fits_assumes_reclaim(self) -> bool:
        """True: ``prealloc_fits`` answers about the pool after the evictable pages are reclaimed,
        so admitting on it still owes that reclaim (``evict_to_free_tokens``)."""
        return True

    def prealloc_ceiling_fits(self, full_tokens: int, swa_tokens: int) -> bool | None:
        """Whether a demand this size could ever fit: priced against the empty buffer."""
        return self.can_reserve(full_tokens, swa_tokens, empty_pool=True)

    def prealloc_fits(
        self,
        tree_cache,
        full_tokens: int,
        swa_tokens: int,
        *,
        full_budget_tokens: int,
        swa_budget_tokens: int | None = None,
    ) -> bool:
        """Both sides against the shared envelope: what each side's budget holds back from what it
        could hand out now (evictable included) is added to the demand, then the whole
        is priced. (SGLang reads ``full_evictable_size`` / ``swa_evictable_size``;
        memlab's trees free a node on
        both sides, so ``evictable_size`` stands for both.)"""
        _checks.budgets(full_tokens, swa_tokens, full_budget_tokens, swa_budget_tokens)
        evictable = tree_cache.evictable_size()
        full_tokens += self.full_available_size() + evictable - full_budget_tokens
        if swa_budget_tokens is not None:
            swa_tokens += self.swa_available_size() + evictable - swa_budget_tokens
        return self.can_reserve(
            full_tokens,
            swa_tokens,
            full_evictable_tokens=evictable,
            swa_evictable_tokens=evictable,
        )

    def evict_to_free_tokens(
        self, tree_cache, num_tokens: int, *, swa_num_tokens: int | None = None
    ) -> bool | None:
        """Evict what the reclaim plan says both sides need, then answer whether the demand fits
        (None: no prefix sharing, or even evicting everything is not enough). memlab's trees free a
        node on both sides, so they are asked for the larger of the two reclaims."""
        _checks.counts(num_tokens=num_tokens, **{"swa_num_tokens?": swa_num_tokens})
        if tree_cache is None or not tree_cache.supports_prefix_sharing():
            return None
        required_swa = num_tokens if swa_num_tokens is None else swa_num_tokens
        evictable = tree_cache.evictable_size()
        plan = self.reclaim_plan(
            num_tokens,
            required_swa,
            full_evictable_tokens=evictable,
            swa_evictable_tokens=evictable,
        )
        if plan is None:
            return None
        if plan != (0, 0):
            # The wheel's tree takes each side's share; a memlab tree frees a node on both sides,
            # so it is asked for the fewest tokens that, freed on both sides, make the demand fit.
            tree_cache.evict(
                self._both_sides_reclaim(num_tokens, required_swa, evictable)
            )
        return self.ensure_capacity(num_tokens, required_swa)

    def _both_sides_reclaim(
        self, full_tokens: int, swa_tokens: int, evictable: int
    ) -> int:
        ps = self.page_size
        full_pages, swa_pages = ceil_div(full_tokens, ps), ceil_div(swa_tokens, ps)
        low, high = 0, evictable // ps  # fits at high: reclaim_plan said so
        while low < high:
            mid = (low + high) // 2
            if self._fits_pages_after(
                full_pages, swa_pages, full_reclaim_pages=mid, swa_reclaim_pages=mid
            ):
                high = mid
            else:
                low = mid + 1
        return low * ps


# -- argument checks (memlab's, at the boundary: the engine trusts its caller here) --------------


def _check_unified_swa_books(full_v2p: torch.Tensor, swa_v2p: torch.Tensor) -> None:
    orphan = torch.nonzero((swa_v2p[:-1] > 0) & (full_v2p[:-1] <= 0)).flatten()
    if len(orphan):
        raise AssertionError(
            f"virtual page {orphan[0].item()} holds an SWA page but no full page"
        )
