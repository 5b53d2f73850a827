"""Chapter 03 exercise: the token allocator (page size 1) and its staged frees.

Write ``available_size``, ``alloc``, ``free`` and ``merge_and_sort_free``. Grade with
``./course grade 03``.
"""

import torch


class TokenToKVPoolAllocator:
    """Slots 1..size, one token each; slot 0 is padding and never handed out.

    Given: the state. ``free_pages`` is an int64 tensor of free slots, handed out from its head;
    with ``need_sort``, freed slots wait in ``release_pages`` until an allocation runs short.
    """

    def __init__(self, size: int, need_sort: bool = False):
        self.size = size
        self.need_sort = need_sort
        self.clear()

    def clear(self) -> None:
        self.free_pages = torch.arange(1, self.size + 1, dtype=torch.int64)
        self.release_pages = torch.empty(0, dtype=torch.int64)

    def available_size(self) -> int:
        """Free slots, the staged ones in ``release_pages`` included. See chapter 03 (staged
        frees)."""
        # BEGIN SOLUTION
        return len(self.free_pages) + len(self.release_pages)
        # END SOLUTION

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Hand out the first ``need_size`` slots of ``free_pages`` (an int64 tensor), or None.

        - With ``need_sort``, when ``free_pages`` holds fewer than ``need_size`` slots, first call
          ``merge_and_sort_free()`` (and only then: merging costs a sort).
        - Still short: return None. Without ``need_sort`` nothing has changed; with it the merge
          stays done, as in SGLang (the staged slots were free all along).
        - ``need_size == 0`` returns an empty int64 tensor.
        See chapter 03 (allocation takes the head).
        """
        # BEGIN SOLUTION
        if self.need_sort and need_size > len(self.free_pages):
            self.merge_and_sort_free()
        if need_size > len(self.free_pages):
            return None
        out = self.free_pages[:need_size]
        self.free_pages = self.free_pages[need_size:]
        return out
        # END SOLUTION

    def free(self, free_index: torch.Tensor) -> None:
        """Give slots back. An empty tensor changes nothing.

        Without ``need_sort`` append them to the TAIL of ``free_pages`` (FIFO reuse: a freed slot
        comes back after every slot that was already free); with ``need_sort`` append them to
        ``release_pages`` instead. Keep no reference to ``free_index`` itself: the caller may reuse
        that tensor afterwards (``torch.cat`` makes a new one). See chapter 03 (FIFO reuse).
        """
        # BEGIN SOLUTION
        if free_index.numel() == 0:
            return
        if self.need_sort:
            self.release_pages = torch.cat((self.release_pages, free_index))
        else:
            self.free_pages = torch.cat((self.free_pages, free_index))
        # END SOLUTION

    def merge_and_sort_free(self) -> None:
        """Move the staged slots into ``free_pages`` and sort it ascending; empty ``release_pages``
        (an empty int64 tensor). With nothing staged, change nothing (no sort).

        Sorted, the next allocations get runs of neighbouring slots. See chapter 03
        (merge and sort).
        """
        # BEGIN SOLUTION
        if len(self.release_pages) == 0:
            return
        self.free_pages = torch.sort(
            torch.cat((self.free_pages, self.release_pages))
        ).values
        self.release_pages = torch.empty(0, dtype=torch.int64)
        # END SOLUTION
