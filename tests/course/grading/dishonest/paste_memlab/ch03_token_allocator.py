"""Dishonest: memlab's own token allocator (memlab/sglang/allocator/token.py) pasted into the
stub, its checks and debug mode cut, a few names changed."""

import torch


class TokenToKVPoolAllocator:
    def __init__(self, size: int, need_sort: bool = False):
        self.size = size
        self.need_sort = need_sort
        self.device = "cpu"
        self.clear()

    def clear(self) -> None:
        # The padded slot 0 is used for writing dummy outputs from padded tokens.
        self.free_pages = torch.arange(
            1, self.size + 1, dtype=torch.int64, device=self.device
        )
        self.free_group = None
        self.release_pages = torch.empty((0,), dtype=torch.int64, device=self.device)

    def get_all_free_pages(self):
        return torch.cat((self.free_pages, self.release_pages))

    def available_size(self) -> int:
        # Staged slots are free too; leaving them out would trigger needless merges.
        return len(self.free_pages) + len(self.release_pages)

    def merge_and_sort_free(self) -> None:
        if len(self.release_pages) > 0:
            self.free_pages = torch.sort(self.get_all_free_pages()).values
            self.release_pages = torch.empty(
                (0,), dtype=torch.int64, device=self.device
            )

    def alloc(self, wanted: int) -> torch.Tensor | None:
        if self.need_sort and wanted > len(self.free_pages):
            self.merge_and_sort_free()
        if wanted > len(self.free_pages):
            return None
        picked = self.free_pages[:wanted]
        self.free_pages = self.free_pages[wanted:]
        return picked

    def free(self, slots: torch.Tensor) -> None:
        if slots.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(slots.clone())
            return
        slots = slots.to(torch.int64)
        if self.need_sort:
            self.release_pages = torch.cat((self.release_pages, slots))
        else:
            self.free_pages = torch.cat((self.free_pages, slots))
