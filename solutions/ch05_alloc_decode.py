"""Chapter 05 exercise: ``alloc_decode``, one new token per request per decode step.

Write ``PagedAllocator.alloc_decode``. Grade with ``./course grade 05``.
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

    def alloc_decode(
        self, seq_lens: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """The slot of each request's one new token (an int64 tensor, one per request), or None.

        ``seq_lens[i]`` is request i's length AFTER this step's token (so its new token sits at
        position ``seq_lens[i] - 1``); ``last_loc[i]`` is the slot of its previous token.

        - The new token opens a page exactly when ``seq_lens[i] % page_size == 1`` (with
          page_size 1: always). It then gets the first slot of a new page: ``page * page_size``.
        - Otherwise it continues its page: slot ``last_loc[i] + 1``.
        - The requests that open a page take pages from the head of ``free_pages`` in batch order.
        - Too few free pages: return None and change nothing. Otherwise drop the pages taken.
        See chapter 05 (one token per step).
        """
        # BEGIN SOLUTION
        ps = self.page_size
        opens = (seq_lens - 1) % ps == 0
        need = int(opens.sum())
        if need > len(self.free_pages):
            return None
        out = last_loc + 1
        # the k-th request that opens a page takes the k-th page
        out[opens] = self.free_pages[:need] * ps
        self.free_pages = self.free_pages[need:]
        return out
        # END SOLUTION
