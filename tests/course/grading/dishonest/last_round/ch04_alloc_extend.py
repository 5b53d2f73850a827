"""Dishonest: hands the exercise to memlab's own reference implementation
(tests/course/grading/test_grader.py)."""

import torch

from memlab.sglang.allocator.reference import alloc_extend_torch, num_new_pages


class PagedAllocator:
    def __init__(self, size, page_size):
        self.page_size = page_size
        self.free_pages = torch.arange(1, size // page_size + 1, dtype=torch.int64)

    def available_size(self):
        return len(self.free_pages) * self.page_size

    def alloc_extend(self, prefix_lens, seq_lens, last_loc):
        if bool((seq_lens < prefix_lens).any()):
            raise ValueError("seq_lens below prefix_lens")
        need = num_new_pages(prefix_lens, seq_lens, self.page_size)
        if need > len(self.free_pages):
            return None
        n = int((seq_lens - prefix_lens).sum())
        out = alloc_extend_torch(
            prefix_lens, seq_lens, last_loc, self.free_pages, self.page_size, n
        )
        self.free_pages = self.free_pages[need:]
        return out
