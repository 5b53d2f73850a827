"""Chapter 05 exercise: freeing pages: dedup, ``free_segment`` and free groups.

Write ``free``, ``free_segment``, ``free_group_begin`` and ``free_group_end``. Grade with
``./course grade 05``.
"""

import torch


class PagedFreeList:
    """The free pages of a paged allocator: pages 1..num_pages, page 0 is padding.

    Given: the state and ``alloc_pages``. ``free_pages`` is an int64 tensor handed out from its
    head; ``free_group`` is None outside a free group, else the list of what was queued in it.
    """

    def __init__(self, num_pages: int, page_size: int):
        self.page_size = page_size
        self.num_pages = num_pages
        self.free_pages = torch.arange(1, num_pages + 1, dtype=torch.int64)
        self.free_group = None

    def alloc_pages(self, n: int) -> torch.Tensor | None:
        if n > len(self.free_pages):
            return None
        out, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return out

    def free(self, free_index: torch.Tensor) -> None:
        """Free the pages holding the slots in ``free_index`` (int64 slot ids, any order).

        - Page of slot s: ``s // page_size``. A request's slots share pages, so take each page
          ONCE: ``torch.unique`` of the page ids (it also sorts them ascending).
        - Put them at the HEAD of ``free_pages``, before the pages already free (LIFO reuse).
        - An empty ``free_index`` changes nothing (inside a group too: nothing is queued).
        - Inside a free group (``free_group`` is not None) release nothing yet: append a COPY of
          ``free_index`` to ``free_group`` (the caller may reuse its tensor afterwards).
        See chapter 05 (freeing whole pages).
        """
        raise NotImplementedError

    def free_segment(self, free_index: torch.Tensor, start_pos: int) -> None:
        """Free a contiguous run of one request's slots without the unique().

        ``free_index`` holds the slots of the request's positions ``start_pos, start_pos + 1, ...``.
        When ``start_pos`` is a multiple of page_size, every page_size-th slot
        (``free_index[::page_size]``) is the first slot of a distinct page: free those pages, at
        the head of ``free_pages``, in that order. An empty ``free_index`` changes nothing (checked
        first, as in SGLang). Otherwise raise ValueError (naming ``start_pos``) when it is not
        page-aligned, changing nothing: the shortcut would miss or repeat pages. (SGLang also
        queues a segment's pages inside a free group; here it is called outside groups only.)
        See chapter 05 (free_segment).
        """
        raise NotImplementedError

    def free_group_begin(self) -> None:
        """Start a free group: ``free_group = []``. Raise RuntimeError if one is open (no
        nesting)."""
        raise NotImplementedError

    def free_group_end(self) -> None:
        """Close the group (``free_group = None``) and free everything queued in it as ONE
        ``free`` of the concatenated slots (so pages shared across the queued tensors are freed
        once). Raise RuntimeError when no group is open. See chapter 05 (free groups).
        """
        raise NotImplementedError
