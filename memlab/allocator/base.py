"""What both allocators share: the free list of pages, staged frees, free groups, debug books.

Ids are page ids; with page_size 1 a page is a slot. Page 0 is padding and never free.
Checks that must read id values run only where they cost no host-device sync: range checks when
the ids live on the CPU (or in debug mode), double-free checks in debug mode.
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
        self.free_group = None  # a list while a free group is open
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
    def _make_room(self, num_pages: int) -> bool:
        """True when ``num_pages`` can be taken from the head of the free list (merging if need be)."""
        if num_pages > len(self.free_pages) + len(self.release_pages):
            return False  # refused before the merge: a refusal leaves even the order untouched
        if num_pages > len(self.free_pages):
            self.merge_and_sort_free()
        return True

    def _take(self, num_pages: int) -> torch.Tensor:
        pages, self.free_pages = self.free_pages[:num_pages], self.free_pages[num_pages:]
        if self.debug_mode:
            self._mark_held(pages)
        return pages

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots in whole pages from the head of the free list, or None when short."""
        _check_int("need_size", need_size, 0)
        if need_size % self.page_size:
            raise ValueError(f"alloc needs whole pages: {need_size} is not a multiple of {self.page_size}")
        n = need_size // self.page_size
        if not self._make_room(n):
            return None
        pages = self._take(n)
        if self.page_size == 1:
            return pages
        offs = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        return (pages[:, None] * self.page_size + offs).reshape(-1)

    # -- giving pages back -----------------------------------------------------------------
    def _check_index(self, name: str, idx) -> None:
        if not isinstance(idx, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of ids, got {type(idx).__name__}")
        if idx.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must hold int32/int64 ids, got {idx.dtype}")
        if idx.device != self.device:
            raise ValueError(f"{name} is on {idx.device}, the allocator on {self.device}")

    def free(self, free_index: torch.Tensor) -> None:
        """Give back the pages under these slots; inside a free group, only queue them."""
        self._check_index("free_index", free_index)
        if free_index.numel() == 0:
            return
        pages = self._pages_of(free_index)
        if self.free_group is not None:
            self._check_range(pages)  # now, not at the group's end, where one bad id would sink the group
            if pages.untyped_storage().data_ptr() == free_index.untyped_storage().data_ptr():
                pages = pages.clone()  # the caller may reuse its buffer before the group ends
            self.free_group.append(pages)
        else:
            self.free_page_ids(pages)

    def _pages_of(self, free_index: torch.Tensor) -> torch.Tensor:
        """The distinct pages under these slots."""
        raise NotImplementedError

    def _check_range(self, page_ids: torch.Tensor) -> None:
        if page_ids.numel() and (self.debug_mode or page_ids.device.type == "cpu"):
            lo, hi = page_ids.min().item(), page_ids.max().item()
            if lo < 1 or hi > self.num_pages:
                raise ValueError(f"cannot free page {lo if lo < 1 else hi}: pages are 1..{self.num_pages} "
                                 "(page 0 is padding)")

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        """Release distinct page ids (the caller guarantees no duplicates)."""
        self._check_index("page_ids", page_ids)
        if page_ids.numel() == 0:
            return
        page_ids = page_ids.to(torch.int64)
        self._check_range(page_ids)
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
        if self.free_group is not None:
            raise RuntimeError("free groups do not nest: free_group_begin called inside an open group")
        self.free_group = []

    def free_group_end(self) -> None:
        if self.free_group is None:
            raise RuntimeError("free_group_end without free_group_begin")
        group, self.free_group = self.free_group, None
        if group:
            # One release for the group; in debug mode a page freed by two calls is caught here,
            # and the refused group stays open with its pages, so nothing is lost.
            try:
                self.free_page_ids(torch.cat(group))
            except ValueError:
                self.free_group = group
                raise

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
