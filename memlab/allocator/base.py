"""What both allocators share: the free list of pages, staged frees, free groups, debug books.

Ids are page ids; with page_size 1 a page is a slot. Page 0 is padding and never free.
Each public method first validates its arguments (``_check_*``, the boundary), then runs the
algorithm as SGLang 0.5.23 does. Checks that must read id values run only where they cost no
host-device sync: range checks when the ids live on the CPU (or in debug mode), double-free
checks in debug mode.
"""

from __future__ import annotations

import torch

from memlab.env import resolve_device


def _check_int(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    return v


class BaseTokenToKVPoolAllocator:
    prepend_on_free = False  # where released pages go: see the subclasses for why

    def __init__(self, size: int, page_size: int, dtype=torch.float16, device="cpu", kvcache=None,
                 need_sort: bool = False, debug_mode: bool = False):
        self.size = _check_int("size", size, 1)
        self.page_size = _check_int("page_size", page_size, 1)
        self.num_pages = size // page_size
        if self.num_pages < 1:
            raise ValueError(f"size {size} holds no whole page of {page_size} slots")
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

    def merge_and_sort_free(self) -> None:
        """Fold staged frees into the free list and sort it, so later runs of pages are contiguous."""
        if len(self.release_pages):
            self.free_pages = torch.sort(torch.cat((self.free_pages, self.release_pages))).values
            self.release_pages = self.release_pages[:0]

    # -- taking pages ----------------------------------------------------------------------
    def _take(self, num_pages: int) -> torch.Tensor:
        pages, self.free_pages = self.free_pages[:num_pages], self.free_pages[num_pages:]
        if self.debug_mode:
            self._mark_held(pages)
        return pages

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots in whole pages from the head of the free list, or None when short."""
        self._check_alloc(need_size)
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
        self._check_slots("free_index", free_index)
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
        self._check_pages("page_ids", page_ids)
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
        self._check_segment(free_index, start_pos)
        if free_index.numel() == 0:
            return
        self.free_page_ids(free_index[:: self.page_size].to(torch.int64) // self.page_size)

    def _release_page_ids(self, page_ids: torch.Tensor) -> None:
        if self.debug_mode:
            self._check_not_free(page_ids)
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
        self._check_no_open_group()
        self.free_group, self.free_page_ids_group = [], []

    def free_group_end(self) -> None:
        """Release the group: its slots' pages, deduplicated once over the whole group, then the
        page ids queued by ``free_page_ids``/``free_segment``."""
        self._check_open_group()
        group, page_ids = self.free_group, self.free_page_ids_group
        self.free_group, self.free_page_ids_group = None, []
        if group:
            self._release_page_ids(self._pages_of(torch.cat(group)))
        if page_ids:
            self._release_page_ids(torch.cat(page_ids))

    # -- argument checks (the boundary) ----------------------------------------------------
    def _check_alloc(self, need_size) -> None:
        _check_int("need_size", need_size, 0)
        if need_size % self.page_size:
            raise ValueError(f"alloc needs whole pages: {need_size} is not a multiple of {self.page_size}")

    def _check_index(self, name: str, idx) -> None:
        if not isinstance(idx, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of ids, got {type(idx).__name__}")
        if idx.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must hold int32/int64 ids, got {idx.dtype}")
        if idx.device != self.device:
            raise ValueError(f"{name} is on {idx.device}, the allocator on {self.device}")

    def _check_page_range(self, lo: int, hi: int) -> None:
        if lo < 1 or hi > self.num_pages:
            raise ValueError(f"cannot free page {lo if lo < 1 else hi}: pages are 1..{self.num_pages} "
                             "(page 0 is padding)")

    def _check_pages(self, name: str, page_ids) -> None:
        self._check_index(name, page_ids)
        if page_ids.numel() and (self.debug_mode or page_ids.device.type == "cpu"):
            self._check_page_range(int(page_ids.min()), int(page_ids.max()))

    def _check_slots(self, name: str, free_index) -> None:
        # Checked on each call, so one bad id inside a group is refused at once, not at its end.
        self._check_index(name, free_index)
        if free_index.numel() and (self.debug_mode or free_index.device.type == "cpu"):
            self._check_page_range(int(free_index.min()) // self.page_size, int(free_index.max()) // self.page_size)

    def _check_segment(self, free_index, start_pos) -> None:
        self._check_slots("free_index", free_index)
        if start_pos % self.page_size:
            raise ValueError(f"free_segment needs a page-aligned start: position {start_pos} is not a "
                             f"multiple of page_size {self.page_size}; use free() for unaligned runs")
        firsts = free_index[:: self.page_size]
        if self.debug_mode and (firsts % self.page_size).any():
            bad = int(firsts[firsts % self.page_size != 0][0])
            raise ValueError(f"free_segment: slot {bad} should start a page but sits at offset "
                             f"{bad % self.page_size}: the run is not page-aligned in memory")

    def _check_no_open_group(self) -> None:
        if self.free_group is not None:
            raise RuntimeError("free groups do not nest: free_group_begin called inside an open group")

    def _check_open_group(self) -> None:
        if self.free_group is None:
            raise RuntimeError("free_group_end without free_group_begin")

    # -- debug mode ------------------------------------------------------------------------
    def _mark_held(self, pages: torch.Tensor) -> None:
        p = pages.cpu()
        bad = p[self._held[p] | (p == 0)]
        if len(bad):
            raise AssertionError(f"page {bad[0].item()} handed out while held (or padding): the free list is corrupt")
        self._held[p] = True

    def _check_not_free(self, page_ids: torch.Tensor) -> None:
        p = page_ids.cpu()
        uniq, counts = torch.unique(p, return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"double free: page {uniq[counts > 1][0].item()} is freed twice in one release")
        not_held = p[~self._held[p]]
        if len(not_held):
            raise ValueError(f"double free: page {not_held[0].item()} is already free")
        self._held[p] = False

    def check_books(self) -> None:
        """Debug mode: free + staged + held == capacity, no page listed twice, padding never free."""
        if not self.debug_mode:
            raise RuntimeError("check_books needs debug_mode=True")
        free = torch.cat((self.free_pages, self.release_pages)).cpu()
        if (free == 0).any():
            raise AssertionError("padding page 0 is on the free list")
        if len(torch.unique(free)) != len(free):
            raise AssertionError("a page is on the free list twice")
        held = int(self._held.sum())
        if len(free) + held != self.num_pages:
            raise AssertionError(f"books do not balance: {len(free)} free + {held} held != {self.num_pages} pages")
