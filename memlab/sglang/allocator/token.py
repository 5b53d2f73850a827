"""The token allocator, page size 1, one slot per token (sglang/srt/mem_cache/allocator/token.py)."""

from __future__ import annotations

import torch

from memlab.sglang.allocator.base import BaseTokenToKVPoolAllocator


class TokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    # Freed slots join the tail (FIFO): the oldest free slots go out first. With one slot per
    # token there is no page to keep warm, and every slot is as good as any other.
    prepend_on_free = False

    def __init__(self, size: int, dtype=torch.float16, device="cpu", kvcache=None, need_sort: bool = False,
                 debug_mode: bool = False):
        super().__init__(size, 1, dtype, device, kvcache, need_sort, debug_mode)

    def _pages_of(self, free_index: torch.Tensor) -> torch.Tensor:
        return free_index.to(torch.int64)  # a slot is its own page: nothing to dedup

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        self.free(page_ids)  # page ids are slot ids; inside a group they queue with the other frees

    # memlab's convenience: SGLang's TokenToKVPoolAllocator has no alloc_extend / alloc_decode; its
    # scheduler calls alloc(extend_num_tokens) and alloc(batch size) at page size 1. These two do the
    # same under the paged allocator's names, so the chapters can drive either one.
    def alloc_extend(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens):
        """Page size 1 needs no continuation of a partial page: any free slots will do."""
        return self.alloc(extend_num_tokens)

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc):
        return self.alloc(len(seq_lens))
