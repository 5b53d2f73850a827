"""Chapter 04 exercise: paged ``alloc_extend`` in torch, for a whole prefill batch at once.

Write ``PagedAllocator.alloc_extend``. Grade with ``./course grade 04``.
"""

import torch


class PagedAllocator:
    """Pages 1..size // page_size; page 0 is padding. Slot = page * page_size + offset.

    Given: the state. ``free_pages`` is an int64 tensor of free page ids, handed out from its head.
    """

    def __init__(self, size: int, page_size: int):
        self.page_size = page_size
        self.num_pages = size // page_size
        self.free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64)

    def available_size(self) -> int:
        return len(self.free_pages) * self.page_size

    def alloc_extend(
        self, prefix_lens: torch.Tensor, seq_lens: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """The slot of every new token of a batch, or None when there are too few free pages.

        Inputs are int64 tensors of one entry per request: request i already holds
        ``prefix_lens[i]`` tokens and grows to ``seq_lens[i]``; ``last_loc[i]`` is the slot of
        its last held token (-1 when it holds none). Return an int64 tensor of
        ``sum(seq_lens - prefix_lens)`` slots: request 0's new tokens in position order, then
        request 1's, and so on. Request i's new tokens come in three parts:

        1. the rest of its last, partly filled page: slots ``last_loc[i] + 1, last_loc[i] + 2, ...``
           up to that page's end (none when ``prefix_lens[i]`` is a multiple of page_size);
        2. whole new pages; 3. one new, partly filled page.

        Request i needs ``ceil(seq/ps) - ceil(prefix/ps)`` new pages. The batch takes them from the
        head of ``free_pages``: request 0's first, then request 1's, each request's in order.
        Decide capacity BEFORE taking anything: when short, return None and leave ``free_pages``
        as it was. Otherwise drop the pages taken from ``free_pages``. Raise ValueError when a
        ``seq_lens`` entry is below its ``prefix_lens`` entry, before anything else: an invalid
        batch raises even when it is also short of pages (memlab's allocator checks its
        arguments before its capacity test). See chapter 04 (three parts).
        """
        # BEGIN SOLUTION
        ps = self.page_size
        if bool((seq_lens < prefix_lens).any()):
            raise ValueError(
                f"seq_lens {seq_lens.tolist()} must not be below prefix_lens {prefix_lens.tolist()}"
            )
        new_pages = (seq_lens + ps - 1) // ps - (prefix_lens + ps - 1) // ps
        num_pages = int(new_pages.sum())
        if num_pages > len(self.free_pages):
            return None
        ext = seq_lens - prefix_lens
        n = int(ext.sum())
        req = torch.repeat_interleave(torch.arange(len(seq_lens)), ext, output_size=n)
        pos = prefix_lens[req] + torch.arange(n) - (torch.cumsum(ext, 0) - ext)[req]
        # where the old partial page ends
        old_end = ((prefix_lens + ps - 1) // ps * ps)[req]
        if num_pages:
            # the request's first new page
            first = (torch.cumsum(new_pages, 0) - new_pages)[req]
            k = (first + (pos - old_end).clamp_min(0) // ps).clamp_max(num_pages - 1)
            fresh = self.free_pages[k] * ps + pos % ps
        else:
            fresh = torch.zeros_like(pos)
        out = torch.where(
            pos < old_end, last_loc[req] + 1 + (pos - prefix_lens[req]), fresh
        )
        self.free_pages = self.free_pages[num_pages:]
        return out
        # END SOLUTION
