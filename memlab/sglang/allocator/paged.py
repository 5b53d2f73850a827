"""The paged allocator (sglang/srt/mem_cache/allocator/paged.py): slot = page * page_size + offset."""

from __future__ import annotations

import torch

from memlab.common import _checks
from memlab.sglang.allocator import reference as ref
from memlab.sglang.allocator.base import BaseTokenToKVPoolAllocator

BACKENDS = ("torch", "triton", "python")


class PagedTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    # Freed pages go to the head (LIFO): the pages just released are the next handed out, so the
    # live set stays on few, recently touched pages and the tail of the list stays untouched.
    prepend_on_free = True

    def __init__(self, size: int, page_size: int, dtype=torch.float16, device="cpu", kvcache=None,
                 need_sort: bool = False, debug_mode: bool = False, backend: str = "torch"):
        _checks.backend(backend, BACKENDS)
        self.backend = backend
        super().__init__(size, page_size, dtype, device, kvcache, need_sort, debug_mode)

    def _pages_of(self, free_index: torch.Tensor) -> torch.Tensor:
        # A request's slots share pages: without the dedup a page would be freed page_size times
        # and later handed to several requests at once. unique sorts on the device (a sync).
        return torch.unique(free_index.to(torch.int64) // self.page_size)

    # -- allocation ------------------------------------------------------------------------
    def alloc_extend(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc,
                     extend_num_tokens: int) -> torch.Tensor | None:
        """Slots for ``seq_lens - prefix_lens`` new tokens per request, or None when pages are short.

        ``last_loc`` is each request's last slot (-1 for an empty prefix). Capacity is settled on
        the host from the CPU copies before anything is taken or launched.
        """
        _checks.alloc_extend(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens)
        bs, ps = len(prefix_lens), self.page_size
        # Room is settled before anything is launched or taken: launching first and counting after
        # would read past the end of the free list. The cheap upper bound (a request grows by fewer
        # than extend_len // ps + 1 pages) is integer arithmetic on numbers already at hand; it
        # proves room in the common case. When it fails, staged pages are merged first (need_sort:
        # SGLang merges here even when the call is then refused), and only then is the exact count
        # paid for, before the launch.
        max_new_pages = extend_num_tokens // ps + bs + 1
        if max_new_pages > len(self.free_pages):
            self.merge_and_sort_free()
        num_new_pages = None
        if max_new_pages > len(self.free_pages):
            num_new_pages = ref.num_new_pages(prefix_lens_cpu, seq_lens_cpu, ps)
            if num_new_pages > len(self.free_pages):
                return None
        if self.backend == "triton":
            from memlab.kernels import alloc_extend

            out = alloc_extend.alloc_extend(prefix_lens, seq_lens, last_loc, self.free_pages, ps, extend_num_tokens)
        elif self.backend == "torch":
            out = ref.alloc_extend_torch(prefix_lens, seq_lens, last_loc, self.free_pages, ps, extend_num_tokens)
        else:
            out = torch.tensor(ref.alloc_extend_python(prefix_lens.tolist(), seq_lens.tolist(), last_loc.tolist(),
                                                       self.free_pages.tolist(), ps), dtype=torch.int64,
                               device=self.device)
        if num_new_pages is None:  # the fast path counts after the launch, while the device works
            num_new_pages = ref.num_new_pages(prefix_lens_cpu, seq_lens_cpu, ps)
        self._take(num_new_pages)
        return out

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc) -> torch.Tensor | None:
        """One slot per request for its new token; ``seq_lens`` already count that token."""
        _checks.alloc_decode(self, seq_lens, seq_lens_cpu, last_loc)
        bs, ps = len(seq_lens), self.page_size
        if bs > len(self.free_pages):  # the cheap bound: at most one new page per request
            self.merge_and_sort_free()
        num_new_pages = ref.num_new_pages_decode(seq_lens_cpu, ps)
        if num_new_pages > len(self.free_pages):
            return None
        if self.backend == "triton":
            from memlab.kernels import alloc_decode

            out = alloc_decode.alloc_decode(seq_lens, last_loc, self.free_pages, ps)
        elif self.backend == "torch":
            out = ref.alloc_decode_torch(seq_lens, last_loc, self.free_pages, ps)
        else:
            out = torch.tensor(ref.alloc_decode_python(seq_lens.tolist(), last_loc.tolist(), self.free_pages.tolist(),
                                                       ps), dtype=torch.int64, device=self.device)
        self._take(num_new_pages)
        return out
