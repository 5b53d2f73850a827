"""Chapter 07 exercise: what a sliding-window request gives back, and the SWA side of a free.

Write ``swa_release_range`` and ``take_swa_slots``. Grade with ``./course grade 07``.
"""

import torch


def swa_release_range(
    seq_len: int,
    swa_evicted_len: int,
    sliding_window: int,
    page_size: int,
    cache_protected_len: int = 0,
) -> tuple[int, int]:
    """Positions ``[start, end)`` of a running request whose SWA pages can be released now.

    The next query (position ``seq_len``) reads at most the last ``sliding_window`` tokens, so
    positions below ``seq_len - sliding_window`` are dead on the SWA side. Release whole pages only:

    - ``start = max(swa_evicted_len, cache_protected_len rounded UP to a page)``: positions below
      ``swa_evicted_len`` were released before, and the first ``cache_protected_len`` belong to
      the prefix cache, which frees them itself;
    - ``end = (seq_len - sliding_window)`` rounded DOWN to a page;
    - when ``end <= start`` nothing is released: return ``(swa_evicted_len, swa_evicted_len)``.

    The caller frees those positions' SWA slots and sets ``swa_evicted_len = end``. Raise
    ValueError (naming it) when ``swa_evicted_len`` is not page-aligned, checked first (even when
    nothing would be released). See chapter 07 (out of the window).
    """
    # BEGIN SOLUTION
    ps = page_size
    if swa_evicted_len % ps:
        raise ValueError(
            f"swa_evicted_len {swa_evicted_len} is not a multiple of page_size {ps}"
        )
    start = max(swa_evicted_len, -(-cache_protected_len // ps) * ps)
    end = (seq_len - sliding_window) // ps * ps
    if end <= start:
        return swa_evicted_len, swa_evicted_len
    return start, end
    # END SOLUTION


def take_swa_slots(
    full_to_swa: torch.Tensor, full_indices: torch.Tensor, page_size: int
) -> torch.Tensor:
    """The SWA slots to free under the full-side slots ``full_indices``, and forget them.

    ``full_to_swa[s]`` is the SWA slot paired with full slot s; 0 means none (released out of
    the window before, or never mapped). Return ``full_to_swa[full_indices]`` without its zeros:
    0 is the SWA pool's padding slot and must never reach a free list. Then set the map to 0 for
    every slot of every PAGE touched by ``full_indices`` (pages of ``page_size`` slots: a paged
    free gives back whole pages, so a stale entry elsewhere in the page would later hand out an
    SWA slot someone else owns). The map's last entry (-1, read by ``last_loc = -1``) stays.
    (SGLang 0.5.23 reads the map over every slot of those pages, since a paged free gives back
    the whole page, and drops the zeros there; here only the slots asked for are returned.)
    See chapter 07 (two ledgers).
    """
    # BEGIN SOLUTION
    swa = full_to_swa[full_indices]
    swa = swa[swa > 0]
    # a page touched twice is cleared twice: cheaper than a unique (a sync)
    pages = full_indices // page_size
    full_to_swa[
        pages[:, None] * page_size + torch.arange(page_size, device=pages.device)
    ] = 0
    return swa
    # END SOLUTION
