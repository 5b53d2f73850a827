"""Chapter 12 exercise: one sub-pool's books in a unified buffer: translation, capacity in
bytes, compaction.

Write ``translate``, ``available_tokens`` and ``compact_after_free``. Grade with
``./course grade 12``."""

import torch


def translate(loc: torch.Tensor, v2p: torch.Tensor, page_size: int) -> torch.Tensor:
    """The physical token ids of the virtual token ids ``loc``: ``v2p[t // page_size] * page_size
    + t % page_size``.

    ``v2p`` is the sub-pool's page table (int64): ``v2p[v]`` is the physical page bound to virtual
    page ``v``, -1 when none is; ``v2p[0] = 0`` is the padding sink and the last entry is always
    -1. An id that is negative, whose page is past the end of ``v2p``, or whose page is unbound
    translates to 0, the sink (a write there harms nobody). Return a new int64 tensor as long as
    ``loc``; change neither input. See chapter 12 (virtual ids and their translation).
    """
    raise NotImplementedError


def available_tokens(
    grow_direction: str,
    watermark: int,
    num_pages: int,
    min_page_index: int,
    entry_bytes_per_page: int,
    page_size: int,
    neighbour_frontier_bytes: int,
) -> int:
    """How many tokens an END sub-pool can allocate now, counted in bytes.

    ``"up"``: its pages in use are ``[min_page_index, watermark)``, its frontier is at byte
    ``watermark * entry_bytes_per_page`` and the neighbour above starts at
    ``neighbour_frontier_bytes``. ``"down"``: its pages in use are ``(watermark, num_pages)``, its
    frontier is at byte ``(watermark + 1) * entry_bytes_per_page`` and the neighbour below ends at
    ``neighbour_frontier_bytes``. The gap is the distance between the two frontiers (0 if they
    have crossed). The answer is ``min(gap // entry_bytes_per_page, pages it has never used)``
    whole pages, where its own page numbers run ``min_page_index .. num_pages - 1``; in tokens.
    See chapter 12 (capacity in bytes).
    """
    raise NotImplementedError


def compact_after_free(
    grow_direction: str,
    watermark: int,
    freed_pages: list[int],
    v2p: torch.Tensor,
    p2v: torch.Tensor,
) -> tuple[int, list[int], list[int]]:
    """Eager compaction after a free, on the page tables only (the caller copies the bytes).

    ``freed_pages``: distinct physical pages that were in use and are free now (their virtual pages
    already unbound in ``v2p``). With K of them the watermark retreats by K: ``"up"``: new =
    watermark - K, the band given up is ``[new, watermark)``; ``"down"``: new = watermark + K, the
    band is ``(watermark, new]``. The pages of the band that were not freed (the sources, ascending)
    move into the freed pages outside the band (the holes, ascending): source i into hole i, so
    ``v2p[p2v[src]] = dst`` and ``p2v[dst] = p2v[src]``. Then every page of the band is unused:
    ``p2v[band] = -1``. Change ``v2p`` and ``p2v`` in place (not ``freed_pages``); return
    ``(new watermark, sources, holes)`` as an int and two lists of ints. See chapter 12 (a free
    compacts at once).
    """
    raise NotImplementedError
