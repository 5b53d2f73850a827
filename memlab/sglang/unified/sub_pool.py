"""MultiEndedAllocator (sglang/srt/mem_cache/allocator/unified_sub_pool.py): one per sub-pool.

Virtual pages bound to physical ones.

Above the allocator every id is VIRTUAL: the request table, the radix tree and the scheduler hold
virtual token ids. ``alloc``, ``alloc_extend`` and ``alloc_decode`` are chapter 04-05's paged
allocator, run on a free list of virtual pages (``free_virtual_ids``): the same code path and the
same kernels, which compute ``page * page_size + offset`` without knowing what a page id stands
for. Each virtual page taken is then bound to a physical page at this sub-pool's growing end, in
two page tables, ``virtual_to_physical`` (v2p) and ``physical_to_virtual`` (p2v). Whatever touches
KV translates first: ``physical(t) = v2p[t // ps] * ps + t % ps`` (``translate_kv_loc``); an
unbound, negative or out-of-range id goes to 0, the padding sink. Freeing unbinds.

Capacity is counted in BYTES: a sub-pool can take the pages that fit between its frontier and its
neighbour's (``_current_gap_bytes() // entry_bytes_per_page``), within its own page numbers.
Virtual ids are plentiful (an owner has as many as if the whole buffer were its own).

Compaction: memlab keeps SGLang's EAGER mode (``SGLANG_DISABLE_LAZY_COMPACTION=1``). Every free
moves the live pages out of the band it vacates at once, so the pages in use always form one dense
run at the sub-pool's own end, and only v2p/p2v are rewritten: nothing above the allocator ever
saw a physical id. SGLang's default, lazy compaction, leaves holes and compacts on demand (an
urgent flush when a neighbour is short, an opportunistic one when the scheduler idles). Both
accept and refuse exactly the same requests (tests/engines/sglang/test_unified.py runs the
wheel's lazy allocator beside memlab's eager one and checks it); only where pages sit and how many
copies are made differ. memlab also leaves out the float middle pool, decode context parallelism
(one page size, ``translate_write_loc`` is ``translate_kv_loc``), the CUDA-stream and move gates
of overlap scheduling, PD disaggregation and HiCache, and the capacity memos (it recomputes).
"""

from __future__ import annotations

import torch

from memlab.common import _checks
from memlab.common.utils import ceil_div
from memlab.sglang.allocator import PagedTokenToKVPoolAllocator
from memlab.sglang.allocator.reference import num_new_pages, num_new_pages_decode
from memlab.sglang.unified.pool import UnifiedKVPool, UnifiedMHATokenToKVPool


def translate_token_ids(
    loc: torch.Tensor, v2p: torch.Tensor, page_size: int
) -> torch.Tensor:
    """Virtual token ids -> physical ones (SGLang's ``translate_token_ids`` off CUDA):
    ``v2p[t // ps] * ps + t % ps``; an id that is negative, past the table or unbound -> 0."""
    t = loc.to(torch.int64)
    page = t // page_size
    keep = (t >= 0) & (page < v2p.numel())
    ids = (v2p[torch.where(keep, page, 0)] * page_size + t % page_size).clamp_(min=0)
    return torch.where(keep, ids, 0)


class MultiEndedAllocator(PagedTokenToKVPoolAllocator):
    def __init__(
        self,
        *,
        kvcache,
        unified_buffer: UnifiedKVPool,
        sub_pool_name: str,
        device="cpu",
        is_id_owner: bool,
        virtual_num_pages: int | None = None,
        page_size: int = 1,
        debug_mode: bool = False,
        backend: str = "torch",
    ):
        _check_multi_ended_allocator(
            unified_buffer, sub_pool_name, is_id_owner, virtual_num_pages, page_size
        )
        spec = unified_buffer.spec(sub_pool_name)
        self.unified_buffer, self.sub_pool_name, self.spec = (
            unified_buffer,
            sub_pool_name,
            spec,
        )
        self.max_slots = unified_buffer.max_slots(sub_pool_name)
        self.grow_direction = spec.grow_direction
        self.entry_bytes = spec.entry_bytes()
        self.min_slot_index = unified_buffer.min_slot_index(sub_pool_name)
        self.is_id_owner = is_id_owner
        self._zero_pages_on_alloc = isinstance(kvcache, UnifiedMHATokenToKVPool)
        # Pages are page_size slots of THIS sub-pool; page 0 and the rest of the sink
        # floor are never used.
        self.min_page_index = ceil_div(self.min_slot_index, page_size)
        self.entry_bytes_per_page = self.entry_bytes * page_size
        # v2p is indexed by virtual page, p2v by physical page: a non-owner binds the owner's ids.
        self.num_virtual_ids = (
            self.max_slots // page_size
            if virtual_num_pages is None
            else virtual_num_pages
        )
        self.low_peer = self.high_peer = (
            None  # neighbours toward byte 0 / toward total_bytes
        )
        super().__init__(
            self.max_slots,
            page_size,
            spec.get_dtype(),
            device,
            kvcache,
            False,
            debug_mode,
            backend,
        )

    def bind_peer(self, peer: MultiEndedAllocator) -> None:
        """The other END is this one's growth-side neighbour: above a grow-up pool, below a
        grow-down one."""
        if self.grow_direction == "up":
            self.high_peer = peer
        else:
            self.low_peer = peer

    def clear(self) -> None:
        self.watermark_physical = (
            self.min_page_index if self.grow_direction == "up" else self.num_pages - 1
        )
        # Virtual page 0 <-> physical page 0 is the padding sink; the trailing row is a -1 sentinel.
        self.virtual_to_physical = torch.full(
            (self.num_virtual_ids + 1,), -1, dtype=torch.int64, device=self.device
        )
        self.physical_to_virtual = torch.full(
            (self.num_pages + 1,), -1, dtype=torch.int64, device=self.device
        )
        self.virtual_to_physical[0] = self.physical_to_virtual[0] = 0
        # a non-owner mints no ids
        first = self.min_page_index if self.is_id_owner else self.num_pages
        self.free_pages = torch.arange(
            first, self.num_pages, dtype=torch.int64, device=self.device
        )
        # eager compaction stages nothing
        self.staged_pages, self.num_staged_pages = ([], 0)
        self.free_group, self.free_page_ids_group = None, []
        self._held = None

    @property
    def free_virtual_ids(self) -> torch.Tensor:
        """SGLang's name for this allocator's free list: virtual page ids, taken from the head."""
        return self.free_pages

    def _ledger(self) -> torch.Tensor:
        """Debug mode's held virtual pages: the bound ones (a non-owner's free list is the
        owner's)."""
        if self._held is None:
            self._held = torch.zeros(self.num_virtual_ids + 1, dtype=torch.bool)
            self._held[:-1] = self.virtual_to_physical[:-1].cpu() > 0
        return self._held

    def page_id_range(self) -> tuple[int, int]:
        # A non-owner frees the owner's ids, whose sink floor may end below its own.
        return (
            self.min_page_index if self.is_id_owner else 1
        ), self.num_virtual_ids - 1

    # -- frontiers and capacity, in bytes ------------------------------------------------------
    def _allocated_pages(self) -> int:
        if self.grow_direction == "up":
            return max(0, self.watermark_physical - self.min_page_index)
        return max(0, self.num_pages - 1 - self.watermark_physical)

    def allocated_count(self) -> int:
        """Tokens in use (eager compaction: the watermark span holds live pages only)."""
        return self._allocated_pages() * self.page_size

    def used_page_range(self) -> tuple[int, int]:
        """The physical pages in use, ``[first, end)``: one dense run at this sub-pool's end."""
        if self.grow_direction == "up":
            return self.min_page_index, self.watermark_physical
        return self.watermark_physical + 1, self.num_pages

    def _byte_low_frontier(self) -> int:
        return self.used_page_range()[0] * self.entry_bytes_per_page

    def _byte_high_frontier(self) -> int:
        return self.used_page_range()[1] * self.entry_bytes_per_page

    def _current_gap_bytes(self) -> int:
        """The free band between this sub-pool's frontier and its neighbour's (the buffer's end
        when it has none): what both sides of the pair can still grow into."""
        if self.grow_direction == "up":
            above = (
                self.unified_buffer.total_bytes
                if self.high_peer is None
                else self.high_peer._byte_low_frontier()
            )
            return max(0, above - self._byte_high_frontier())
        below = 0 if self.low_peer is None else self.low_peer._byte_high_frontier()
        return max(0, self._byte_low_frontier() - below)

    def available_size(self) -> int:
        """Tokens allocatable now: whole pages of the gap, within this sub-pool's page numbers."""
        pages_by_bytes = self._current_gap_bytes() // self.entry_bytes_per_page
        pages_by_index_space = (
            self.num_pages - self.min_page_index - self._allocated_pages()
        )
        return min(pages_by_bytes, pages_by_index_space) * self.page_size

    def schedulable_available_size(self) -> int:
        """What a scheduler may count on: SGLang adds the neighbour's lazy holes, which a flush
        would turn into gap; with eager compaction there are none, so it is ``available_size``."""
        return self.available_size()

    # -- allocation: chapter 04-05's paged allocator in virtual space -------------------------
    def alloc(self, need_size: int) -> torch.Tensor | None:
        assert self.is_id_owner, (
            f"alloc on non-owner {self.sub_pool_name!r}: alloc_with_virtual"
        )
        need_size = _checks.alloc(self, need_size)
        if need_size > self.available_size():
            # SGLang's shortfall ladder first flushes the neighbour: nothing to flush when eager
            return None
        return super().alloc(need_size)

    def alloc_extend(
        self,
        prefix_lens,
        prefix_lens_cpu,
        seq_lens,
        seq_lens_cpu,
        last_loc,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Chapter 04's ``alloc_extend`` over the virtual free list (the kernel, or its references),
        after the byte capacity check; returns virtual token ids."""
        assert self.is_id_owner, f"alloc_extend on the non-owner {self.sub_pool_name!r}"
        _checks.alloc_extend(
            self,
            prefix_lens,
            prefix_lens_cpu,
            seq_lens,
            seq_lens_cpu,
            last_loc,
            extend_num_tokens,
        )
        if (
            num_new_pages(prefix_lens_cpu, seq_lens_cpu, self.page_size)
            * self.page_size
            > self.available_size()
        ):
            return None
        return super().alloc_extend(
            prefix_lens,
            prefix_lens_cpu,
            seq_lens,
            seq_lens_cpu,
            last_loc,
            extend_num_tokens,
        )

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc) -> torch.Tensor | None:
        assert self.is_id_owner, f"alloc_decode on the non-owner {self.sub_pool_name!r}"
        _checks.alloc_decode(self, seq_lens, seq_lens_cpu, last_loc)
        if (
            num_new_pages_decode(seq_lens_cpu, self.page_size) * self.page_size
            > self.available_size()
        ):
            return None
        return super().alloc_decode(seq_lens, seq_lens_cpu, last_loc)

    def _take(self, num_pages: int) -> torch.Tensor:
        """The paged allocator takes virtual pages from the head of the free list after its kernel
        ran; each is bound to a physical page here (unbound, it would translate to the sink)."""
        v_pages = super()._take(num_pages)
        self._alloc_bind(v_pages)
        return v_pages

    def alloc_with_virtual(self, virtual_pages: torch.Tensor) -> None:
        """Bind physical pages to virtual PAGE ids the owner just handed out (a non-owner: the
        SWA side of the composite). The composite has checked both sides' bytes."""
        if self.debug_mode:
            self._debug_take(virtual_pages)
        self._alloc_bind(virtual_pages)

    def _alloc_bind(self, v_pages: torch.Tensor) -> torch.Tensor:
        """Extend the watermark by ``N`` pages and bind ``v_pages[i]`` to the ``i``-th: an
        ascending run ``[start, start + N)`` in either direction (SGLang's eager fast path)."""
        n, wm = len(v_pages), self.watermark_physical
        if self.grow_direction == "up":
            start, self.watermark_physical = wm, wm + n
        else:
            start, self.watermark_physical = wm - n + 1, wm - n
        # the byte-capacity check, made first, keeps it inside the pages
        inside = self.min_page_index - 1 <= self.watermark_physical <= self.num_pages
        assert inside, f"[{self.sub_pool_name}] out of physical pages"
        phys = torch.arange(start, start + n, dtype=torch.int64, device=self.device)
        self.virtual_to_physical[v_pages] = phys
        self.physical_to_virtual[phys] = v_pages
        if self._zero_pages_on_alloc and n:
            self._kvcache.zero_physical_pages(phys)
        return phys

    # -- translation ---------------------------------------------------------------------------
    def translate_kv_loc(self, virt_tokens: torch.Tensor) -> torch.Tensor:
        """Virtual token ids -> physical token ids, the rows the per-layer views are indexed by
        (an id that is no one's reads the padding sink)."""
        _checks.index_tensor("loc", virt_tokens, self.device)
        return translate_token_ids(
            virt_tokens, self.virtual_to_physical, self.page_size
        )

    def translate_write_loc(self, loc: torch.Tensor) -> torch.Tensor:
        """The same for a batch's write locations (SGLang's differs only under decode context
        parallelism)."""
        return self.translate_kv_loc(loc)

    # -- freeing: unbind, then compact at once ------------------------------------------------
    def _release_page_ids(self, page_ids: torch.Tensor) -> None:
        """Every free of the base allocator (free, free_page_ids, free_segment, a free group's
        end) lands here with distinct virtual pages."""
        freed_p_pages = self.virtual_to_physical[page_ids]
        # SGLang's own check on every eager free (a sync)
        unbound = page_ids[freed_p_pages < 0]
        if len(unbound):
            raise AssertionError(
                f"[{self.sub_pool_name}] double free: {unbound.tolist()}"
            )
        if self.debug_mode:
            self._debug_release(page_ids)
        self.virtual_to_physical[page_ids] = -1
        # to the back (FIFO): where a page sits is the watermark's business, not the id's
        if self.is_id_owner:
            self.free_pages = torch.cat((self.free_pages, page_ids))
        self._compact_pending(freed_p_pages)
        if self.debug_mode:
            self.check_books()

    def _compact_pending(self, freed_physical_pages: torch.Tensor) -> None:
        """Eager compaction: the watermark retreats by the K pages freed; the live pages left in the
        band it gave up move into the freed pages below it (sources and holes both ascending)."""
        k, old_wm = freed_physical_pages.numel(), self.watermark_physical
        # in use: [min_page_index, old_wm) -> [min_page_index, new_wm)
        if self.grow_direction == "up":
            new_wm = old_wm - k
            band = torch.arange(new_wm, old_wm, device=self.device)
            holes = freed_physical_pages[freed_physical_pages < new_wm]
        else:  # in use: (old_wm, num_pages) -> (new_wm, num_pages)
            new_wm = old_wm + k
            band = torch.arange(old_wm + 1, new_wm + 1, device=self.device)
            holes = freed_physical_pages[freed_physical_pages > new_wm]
        src = band[~torch.isin(band, freed_physical_pages)]
        self.watermark_physical = new_wm
        if len(src):
            self._move_pages_and_rebind(src, torch.sort(holes).values)
        self.physical_to_virtual[band] = -1

    def _move_pages_and_rebind(
        self, src_pages: torch.Tensor, dst_pages: torch.Tensor
    ) -> None:
        """Copy whole pages src -> dst in the byte buffer and point their virtual pages at dst;
        the virtual ids, hence everything above the allocator, stay as they were."""
        v_moved = self.physical_to_virtual[src_pages].clone()
        if self._kvcache is not None:
            self._kvcache.move_physical_pages(dst_pages, src_pages, self.page_size)
        self.virtual_to_physical[v_moved] = dst_pages
        self.physical_to_virtual[dst_pages] = v_moved

    def check_books(self) -> None:
        """Debug mode: v2p and p2v agree, the pages in use are one dense run at this end, and
        (an owner) every virtual page is free or bound, once."""
        _check_multi_ended_books(self)


# -- argument checks (memlab's, at the boundary: the engine trusts its caller here) --------------


def _check_multi_ended_allocator(
    buffer, name, is_id_owner, virtual_num_pages, page_size
) -> None:
    if name not in buffer._specs_by_name:
        raise ValueError(
            f"no sub-pool {name!r} in this buffer (it has {sorted(buffer._specs_by_name)})"
        )
    _checks.integer("page_size", page_size, 1)
    if virtual_num_pages is not None and is_id_owner:
        raise ValueError(
            "only a non-owner allocator may use another pool's virtual-id space"
        )
    if virtual_num_pages is not None:
        _checks.integer("virtual_num_pages", virtual_num_pages, 1)


def _check_multi_ended_books(alloc) -> None:
    """Debug mode: the two page tables are inverse, the bound pages are exactly the dense run at
    this sub-pool's end, and (an owner) every virtual page is free or bound, once."""
    if not alloc.debug_mode:
        raise RuntimeError("check_books needs debug_mode=True")
    v2p, p2v = (
        alloc.virtual_to_physical[:-1].cpu(),
        alloc.physical_to_virtual[:-1].cpu(),
    )
    v = torch.nonzero(v2p > 0).flatten()  # page 0 <-> 0 is the sink
    name = alloc.sub_pool_name
    if not torch.equal(p2v[v2p[v]], v):
        raise AssertionError(f"[{name}] v2p and p2v disagree")
    lo, hi = alloc.used_page_range()
    if not torch.equal(torch.sort(v2p[v]).values, torch.arange(lo, hi)):
        raise AssertionError(
            f"[{name}] bound pages {sorted(v2p[v].tolist())} are not the run {lo}..{hi - 1}"
        )
    if int((p2v[1:] >= 0).sum()) != hi - lo:
        raise AssertionError(
            f"[{name}] p2v marks {int((p2v[1:] >= 0).sum())} pages used, the run holds {hi - lo}"
        )
    if alloc.is_id_owner:
        free = alloc.free_pages.cpu()
        if len(torch.unique(free)) != len(free) or bool(torch.isin(free, v).any()):
            raise AssertionError(
                f"[{name}] a virtual page is free twice, or free and bound"
            )
        if len(free) + len(v) != alloc.num_virtual_ids - alloc.min_page_index:
            raise AssertionError(
                f"[{name}] {len(free)} free + {len(v)} bound virtual pages != "
                f"{alloc.num_virtual_ids - alloc.min_page_index}"
            )
