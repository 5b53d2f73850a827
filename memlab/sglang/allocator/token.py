"""The token allocator, one slot per token (sglang/srt/mem_cache/allocator/token.py)."""

from __future__ import annotations

import torch

from memlab.common import _checks
from memlab.sglang.allocator.base import BaseTokenToKVPoolAllocator


class TokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """An allocator of single slots: ``free_pages`` holds slot ids, ``release_pages`` the staged
    frees (``need_sort``), as SGLang's token allocator names them."""

    def __init__(
        self,
        size: int,
        dtype=torch.float16,
        device="cpu",
        kvcache=None,
        need_sort: bool = False,
        debug_mode: bool = False,
    ):
        super().__init__(size, 1, dtype, device, kvcache, need_sort, debug_mode)
        self.clear()

    def clear(self) -> None:
        # The padded slot 0 is used for writing dummy outputs from padded tokens.
        self.free_pages = torch.arange(
            1, self.size + 1, dtype=torch.int64, device=self.device
        )
        self.free_group = None
        self.release_pages = torch.empty((0,), dtype=torch.int64, device=self.device)
        self._held = None

    def available_size(self) -> int:
        # Staged slots are free too; leaving them out would trigger needless merges.
        return len(self.free_pages) + len(self.release_pages)

    def merge_and_sort_free(self) -> None:
        """Fold the staged frees into the free list and sort it, so later runs are contiguous."""
        if len(self.release_pages) > 0:
            self.free_pages = torch.sort(self.get_all_free_pages()).values
            self.release_pages = torch.empty(
                (0,), dtype=torch.int64, device=self.device
            )

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots from the head of the free list, or None when short."""
        need_size = _checks.alloc(self, need_size)
        if self.need_sort and need_size > len(self.free_pages):
            self.merge_and_sort_free()
        if need_size > len(self.free_pages):
            return None
        select_index = self.free_pages[:need_size]
        if self.debug_mode:
            # before the cut: a ledger built now must see these slots free
            self._debug_take(select_index)
        self.free_pages = self.free_pages[need_size:]
        return select_index

    def free(self, free_index: torch.Tensor) -> None:
        """Give the slots back, to the tail (FIFO: with one slot per token there is no page to
        keep warm); with ``need_sort`` they are staged; inside a free group only queued. A slot
        freed twice is refused in debug mode only, as SGLang asserts it (see the paged free)."""
        _checks.free(self, free_index)
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            if self.debug_mode:  # a double free is refused now, not at the group's end
                self._debug_release(
                    torch.cat([*self.free_group, free_index]).cpu(), False
                )
            # the caller may reuse its buffer before the end
            self.free_group.append(free_index.clone())
            return
        free_index = free_index.to(torch.int64)
        if self.debug_mode:
            self._debug_release(free_index)
        if self.need_sort:
            self.release_pages = torch.cat((self.release_pages, free_index))
        else:
            self.free_pages = torch.cat((self.free_pages, free_index))
        if self.debug_mode:
            self.check_books()

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        _checks.free(self, page_ids, "page_ids")
        # page_size == 1: page ids are slot ids; in a group they queue with the rest
        self.free(page_ids)

    # memlab's convenience: SGLang's TokenToKVPoolAllocator has no alloc_extend /
    # alloc_decode; its scheduler calls alloc(extend_num_tokens) and alloc(batch size)
    # at page size 1. These two do the same under the paged allocator's names, so the
    # chapters can drive either one.
    def alloc_extend(
        self,
        prefix_lens,
        prefix_lens_cpu,
        seq_lens,
        seq_lens_cpu,
        last_loc,
        extend_num_tokens,
    ):
        """Page size 1 needs no continuation of a partial page: any free slots will do."""
        _checks.alloc_extend(
            self,
            prefix_lens,
            prefix_lens_cpu,
            seq_lens,
            seq_lens_cpu,
            last_loc,
            extend_num_tokens,
        )
        return self.alloc(extend_num_tokens)

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc):
        _checks.alloc_decode(self, seq_lens, seq_lens_cpu, last_loc)
        return self.alloc(len(seq_lens))
