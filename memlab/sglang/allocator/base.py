"""What the allocators share (sglang/srt/mem_cache/allocator/base.py): books, groups, segments.

Ids are page ids; with page_size 1 a page is a slot. Page 0 is padding and never free. As in
SGLang, each subclass owns its free path (``token.py``, ``paged.py``); the base holds what both
use: capacity, free groups, segment frees and the debug-mode ledger.

``debug_mode`` is read on every call, as SGLang reads it: turning it on later works. memlab's
debug mode keeps a ledger of held pages (SGLang's asserts that no page is free twice and that
handed-out slots are unique; the ledger also names the page handed out twice or freed twice). It
is built from the free list the first time it is needed, so it costs nothing while debug mode is
off, and is dropped whenever debug mode is switched (a ledger kept across an off spell would be
stale).
"""

from __future__ import annotations

import torch

from memlab.common import _checks
from memlab.common.env import resolve_device
from memlab.common.utils import ceil_div


class BaseTokenToKVPoolAllocator:
    def __init__(
        self,
        size: int,
        page_size: int,
        dtype=torch.float16,
        device="cpu",
        kvcache=None,
        need_sort: bool = False,
        debug_mode: bool = False,
    ):
        self.size, self.page_size = _check_allocator(size, page_size)
        self.num_pages = self.size // self.page_size
        self.dtype, self.device = dtype, resolve_device(device)
        self._kvcache, self.need_sort, self.debug_mode = kvcache, need_sort, debug_mode
        self.free_group = (
            None  # None: free at once; a list: hold the frees until free_group_end()
        )

    @property
    def debug_mode(self) -> bool:
        return self._debug_mode

    @debug_mode.setter
    def debug_mode(self, on: bool) -> None:
        # the ledger is rebuilt on first use
        self._debug_mode, self._held = (bool(on), None)

    @property
    def size_full(self) -> int:
        return self.size

    def get_kvcache(self):
        return self._kvcache

    def get_all_free_pages(self) -> torch.Tensor:
        """The free list and the staged frees together (the debug census)."""
        return (
            torch.cat((self.free_pages, self.release_pages))
            if len(self.release_pages)
            else self.free_pages
        )

    def page_id_range(self) -> tuple[int, int]:
        """The first and last page id this allocator hands out (page 0 is padding)."""
        return 1, self.num_pages

    # -- free groups: hold the frees, release them at once -------------------------------------
    def free_group_begin(self) -> None:
        _checks.free_group_begin(self)
        self.free_group = []

    def free_group_end(self) -> None:
        _checks.free_group_end(self)
        pending, self.free_group = self.free_group, None
        if pending:
            self.free(torch.cat(pending))

    # -- segments of a request's row ---------------------------------------------------------
    def free_full(self, free_index: torch.Tensor) -> None:
        """Full-attention slots whose SWA partners are already back: one pool has no SWA side."""
        self.free(free_index)

    def free_segment(self, free_index: torch.Tensor, start_pos: int) -> None:
        """Free ``row[start_pos : start_pos + n]`` of one request; ``start_pos`` is page-aligned."""
        _checks.free_segment(self, free_index, start_pos)
        self.free(free_index)

    def free_full_segment(self, free_index: torch.Tensor, start_pos: int) -> None:
        _checks.free_segment(self, free_index, start_pos)
        self.free_full(free_index)

    def free_segments(self, segments) -> None:
        """Free several ``(slots, start_pos)`` segments of one request's row: ascending, each
        starting on a page boundary, no two sharing a page, so every page is released once."""
        for free_index, start_pos in self._page_disjoint(segments):
            self.free_segment(free_index, start_pos=start_pos)

    def free_full_segments(self, segments) -> None:
        for free_index, start_pos in self._page_disjoint(segments):
            self.free_full_segment(free_index, start_pos=start_pos)

    def _page_disjoint(self, segments) -> list:
        """The non-empty segments, each checked to start on a page past the previous one's last.
        All are checked before any is freed (SGLang checks each as it frees it)."""
        ps, prev_end, out = self.page_size, None, []
        for free_index, start_pos in _checks.segments(self, segments):
            if free_index.numel() == 0:
                continue
            apart = prev_end is None or start_pos // ps > (prev_end - 1) // ps
            assert apart, f"segment at {start_pos} shares a page with the one before"
            prev_end = start_pos + free_index.numel()
            out.append((free_index, start_pos))
        return out

    # -- debug mode: the ledger of held pages --------------------------------------------------
    def _ledger(self) -> torch.Tensor:
        """Which page ids are held: everything that is neither free nor padding."""
        if self._held is None:
            self._held = torch.ones(self.page_id_range()[1] + 1, dtype=torch.bool)
            self._held[0] = False
            self._held[self.get_all_free_pages().cpu()] = False
        return self._held

    def _debug_take(self, pages: torch.Tensor) -> None:
        held, p = self._ledger(), pages.cpu()
        bad = p[held[p] | (p == 0)]
        assert not len(bad), f"{_checks.unit(self)} {bad[0]} handed out while held"
        held[p] = True

    def _debug_release(self, page_ids: torch.Tensor, mark: bool = True) -> None:
        """Refuse a double free before anything changes, then mark the pages free (``mark``
        False: a free group queues them; the check runs now, the release at the group's end)."""
        held, p, unit = self._ledger(), page_ids.cpu(), _checks.unit(self)
        uniq, counts = torch.unique(p, return_counts=True)
        twice, free = uniq[counts > 1], p[~held[p]]
        first, why = (
            (twice, "freed twice in one release")
            if len(twice)
            else (free, "already free")
        )
        if len(first):
            raise ValueError(f"double free: {unit} {first[0]} is {why}")
        if mark:
            held[p] = False

    def check_books(self) -> None:
        """Debug mode: free + staged + held == capacity, no page listed twice, no padding free."""
        free, held = self.get_all_free_pages().cpu(), int(self._ledger().sum())
        dup = len(torch.unique(free)) != len(free)
        assert not dup and not (free == 0).any(), "books: a page free twice, or padding"
        assert len(free) + held == self.num_pages, f"books: {len(free)} + {held} pages"

    # -- the scheduler's questions (SGLang 0.5.23, allocator/base.py) ------------------------------
    # The scheduler asks these of any allocator, without branching on its type; composites (the
    # two-pool SWA allocator, the unified pool) answer them for all their pools at once. A single
    # pool of token slots answers in token counts.

    def request_slot_reserve(
        self, *, has_req_pool_slot: bool, prefill_tokens: int = 0
    ) -> int:
        """Slots a request needs beyond its prefill (its own workspace): none for a KV pool."""
        return 0

    def max_new_tokens_for_memory(
        self,
        input_tokens: int,
        max_new_tokens: int,
        *,
        token_capacity: int,
        sliding_window_size: int | None,
        chunk_size: int | None,
    ) -> int | None:
        """``max_new_tokens`` clipped to what an empty pool of ``token_capacity`` slots could hold
        after the prompt (in whole pages, one page and one slot kept spare); None would mean the
        prompt alone cannot fit, which a single pool never says (it clips to 0)."""
        _checks.token_question(
            input_tokens,
            max_new_tokens,
            token_capacity,
            sliding_window_size,
            chunk_size,
        )
        paged_input = ceil_div(input_tokens, self.page_size) * self.page_size
        return max(
            0, min(max_new_tokens, token_capacity - paged_input - self.page_size - 1)
        )

    def prealloc_fits_assumes_reclaim(self) -> bool:
        """False: ``prealloc_fits`` answers about the pool as it stands."""
        return False

    def prealloc_ceiling_fits(self, full_tokens: int, swa_tokens: int) -> bool | None:
        """None: this pool has no ceiling of its own; the caller's token capacity is the bound."""
        return None

    def prealloc_fits(
        self,
        tree_cache,
        full_tokens: int,
        swa_tokens: int,
        *,
        full_budget_tokens: int,
        swa_budget_tokens: int | None = None,
    ) -> bool:
        """Whether a demand this size fits the scheduler's budgets (what each side has left after
        its reserves, evictable cache included). Separate sides are checked each against its own
        budget; ``tree_cache`` is not read: what it could give back is inside the budget."""
        _checks.budgets(full_tokens, swa_tokens, full_budget_tokens, swa_budget_tokens)
        return full_tokens <= full_budget_tokens and (
            swa_budget_tokens is None or swa_tokens <= swa_budget_tokens
        )

    def evict_to_free_tokens(self, tree_cache, num_tokens: int) -> bool | None:
        """Evict unlocked prefix-cache entries until ``num_tokens`` slots are free or nothing
        evictable is left. Returns None: whether it fits is the caller's next question
        (``available_size``). (SGLang passes ``EvictParams(num_tokens=shortfall)`` to
        ``evict_for_alloc``; memlab's trees take the shortfall as ``evict(num_tokens)``.)"""
        _checks.counts(num_tokens=num_tokens)
        if tree_cache is None or not tree_cache.supports_prefix_sharing():
            return None
        shortfall = num_tokens - self.available_size()
        if shortfall > 0:
            tree_cache.evict(shortfall)
        return None


# -- argument checks (memlab's, at the boundary: the engine trusts its caller here) --------------


def _check_allocator(size, page_size) -> tuple[int, int]:
    size = _checks.integer("size", size, 1, _checks.INT32_MAX)
    return size, _checks.integer(
        "page_size (above size: no whole page)", page_size, 1, size
    )
