"""What the allocators share (sglang/srt/mem_cache/allocator/base.py): free pages, staged frees, groups.

Ids are page ids; with page_size 1 a page is a slot. Page 0 is padding and never free.
Each public method hands its arguments to its validator in ``memlab.common._checks`` (the boundary),
then runs the algorithm as SGLang 0.5.23 does. In ``debug_mode`` a ledger of held pages catches
a page handed out twice or freed twice (SGLang's debug mode asserts that no page is free twice).
"""

from __future__ import annotations

import torch

from memlab.common import _checks
from memlab.common.env import resolve_device
from memlab.common.utils import ceil_div


class BaseTokenToKVPoolAllocator:
    prepend_on_free = False  # where released pages go: see the subclasses for why

    def __init__(self, size: int, page_size: int, dtype=torch.float16, device="cpu", kvcache=None,
                 need_sort: bool = False, debug_mode: bool = False):
        self.size, self.page_size = _checks.allocator(size, page_size)
        self.num_pages = self.size // self.page_size
        self.dtype, self.device = dtype, resolve_device(device)
        self._kvcache, self.need_sort, self.debug_mode = kvcache, need_sort, debug_mode
        self.clear()

    # -- the books -------------------------------------------------------------------------
    def clear(self) -> None:
        self.free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64, device=self.device)
        self.release_pages = torch.empty(0, dtype=torch.int64, device=self.device)
        self.free_group = None  # while a group is open: the raw slot tensors of its free() calls
        self.free_page_ids_group = []  # ... and the page ids of its free_page_ids()/free_segment() calls
        if self.debug_mode:
            self._held = torch.zeros(self.num_pages + 1, dtype=torch.bool)  # debug-only ledger

    def available_size(self) -> int:
        # Staged pages are free too; leaving them out would trigger needless merges.
        return (len(self.free_pages) + len(self.release_pages)) * self.page_size

    def get_kvcache(self):
        return self._kvcache

    def page_id_range(self) -> tuple[int, int]:
        """The first and last page id this allocator hands out (page 0 is padding)."""
        return 1, self.num_pages

    def merge_and_sort_free(self) -> None:
        """Fold staged frees into the free list and sort it, so later runs of pages are contiguous."""
        if len(self.release_pages):
            self.free_pages = torch.sort(torch.cat((self.free_pages, self.release_pages))).values
            self.release_pages = self.release_pages[:0]

    # -- taking pages ----------------------------------------------------------------------
    def _take(self, num_pages: int) -> torch.Tensor:
        pages, self.free_pages = self.free_pages[:num_pages], self.free_pages[num_pages:]
        if self.debug_mode:
            _checks.debug_taken(self, pages)
        return pages

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots in whole pages from the head of the free list, or None when short."""
        need_size = _checks.alloc(self, need_size)
        num_pages = need_size // self.page_size
        if num_pages > len(self.free_pages):
            self.merge_and_sort_free()  # staged pages may cover it (a no-op without need_sort)
        if num_pages > len(self.free_pages):
            return None
        pages = self._take(num_pages)
        if self.page_size == 1:
            return pages
        offs = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        return (pages[:, None] * self.page_size + offs).reshape(-1)

    # -- giving pages back -----------------------------------------------------------------
    def free(self, free_index: torch.Tensor) -> None:
        """Give back the pages under these slots; inside a free group, only queue the slots.

        A group queues the raw slots and removes duplicate pages once, at ``free_group_end``:
        two frees of one group that touch the same page (a request freed in two pieces) must
        release it once.
        """
        _checks.free(self, free_index)
        if free_index.numel() == 0:
            return
        if self.free_group is None:
            self._release_page_ids(self._pages_of(free_index))
        else:
            self.free_group.append(free_index.clone())  # the caller may reuse its buffer before the end

    def _pages_of(self, free_index: torch.Tensor) -> torch.Tensor:
        """The distinct pages under these slots."""
        raise NotImplementedError

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        """Release distinct page ids (the caller guarantees no duplicates); queued inside a group."""
        _checks.free_page_ids(self, page_ids)
        if page_ids.numel() == 0:
            return
        if self.free_group is None:
            self._release_page_ids(page_ids.to(torch.int64))
        else:
            self.free_page_ids_group.append(page_ids.to(torch.int64).clone())

    def free_segment(self, free_index: torch.Tensor, start_pos: int) -> None:
        """Free a contiguous run of a request's slots that starts on a page boundary, without the dedup.

        ``start_pos`` is the run's first token position in the request. Aligned and contiguous,
        every page_size-th slot is the first slot of a distinct page.
        """
        _checks.free_segment(self, free_index, start_pos)
        if free_index.numel() == 0:
            return
        self.free_page_ids(free_index[:: self.page_size].to(torch.int64) // self.page_size)

    def _release_page_ids(self, page_ids: torch.Tensor) -> None:
        if self.debug_mode:
            _checks.debug_released(self, page_ids)
        if self.need_sort:
            self.release_pages = torch.cat((self.release_pages, page_ids))
        elif self.prepend_on_free:
            self.free_pages = torch.cat((page_ids, self.free_pages))
        else:
            self.free_pages = torch.cat((self.free_pages, page_ids))
        if self.debug_mode:
            self.check_books()

    def free_group_begin(self) -> None:
        """Queue frees until free_group_end, then release them in one concatenation."""
        _checks.free_group_begin(self)
        self.free_group, self.free_page_ids_group = [], []

    def free_group_end(self) -> None:
        """Release the group: its slots' pages, deduplicated once over the whole group, then the
        page ids queued by ``free_page_ids``/``free_segment``. In debug mode a page freed twice
        within the group is caught here; the group is then closed with its pages not released
        (SGLang's debug assert fires at the same point: the books are suspect either way)."""
        _checks.free_group_end(self)
        group, page_ids = self.free_group, self.free_page_ids_group
        self.free_group, self.free_page_ids_group = None, []
        if group:
            self._release_page_ids(self._pages_of(torch.cat(group)))
        if page_ids:
            self._release_page_ids(torch.cat(page_ids))

    def check_books(self) -> None:
        """Debug mode: free + staged + held == capacity, no page listed twice, padding never free."""
        _checks.allocator_books(self)

    # -- the scheduler's questions (SGLang 0.5.23, allocator/base.py) ------------------------------
    # The scheduler asks these of any allocator, without branching on its type; composites (the
    # two-pool SWA allocator, the unified pool) answer them for all their pools at once. A single
    # pool of token slots answers in token counts.

    def request_slot_reserve(self, *, has_req_pool_slot: bool, prefill_tokens: int = 0) -> int:
        """Slots a request needs beyond its prefill (request-owned workspace): none for a KV pool."""
        return 0

    def max_new_tokens_for_memory(self, input_tokens: int, max_new_tokens: int, *, token_capacity: int,
                                  sliding_window_size: int | None, chunk_size: int | None) -> int | None:
        """``max_new_tokens`` clipped to what an empty pool of ``token_capacity`` slots could hold
        after the prompt (in whole pages, one page and one slot kept spare); None would mean the
        prompt alone cannot fit, which a single pool never says (it clips to 0)."""
        paged_input = ceil_div(input_tokens, self.page_size) * self.page_size
        return max(0, min(max_new_tokens, token_capacity - paged_input - self.page_size - 1))

    def prealloc_fits_assumes_reclaim(self) -> bool:
        """False: ``prealloc_fits`` answers about the pool as it stands."""
        return False

    def prealloc_ceiling_fits(self, full_tokens: int, swa_tokens: int) -> bool | None:
        """None: this pool has no ceiling of its own; the caller's token capacity is the bound."""
        return None

    def prealloc_fits(self, tree_cache, full_tokens: int, swa_tokens: int, *, full_budget_tokens: int,
                      swa_budget_tokens: int | None = None) -> bool:
        """Whether a demand this size fits the scheduler's budgets (what each side has left after its
        reserves, evictable cache included). Separate sides are checked each against its own
        budget; ``tree_cache`` is not read: what it could give back is inside the budget."""
        return full_tokens <= full_budget_tokens and (swa_budget_tokens is None or swa_tokens <= swa_budget_tokens)

    def evict_to_free_tokens(self, tree_cache, num_tokens: int) -> bool | None:
        """Evict unlocked prefix-cache entries until ``num_tokens`` slots are free or nothing
        evictable is left. Returns None: whether it fits is the caller's next question
        (``available_size``). (SGLang passes ``EvictParams(num_tokens=shortfall)`` to
        ``evict_for_alloc``; memlab's trees take the shortfall as ``evict(num_tokens)``.)"""
        if tree_cache is None or not tree_cache.supports_prefix_sharing():
            return None
        shortfall = num_tokens - self.available_size()
        if shortfall > 0:
            tree_cache.evict(shortfall)
        return None
