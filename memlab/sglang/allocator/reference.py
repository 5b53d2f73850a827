"""References of the allocation kernels (alloc_*_naive of sglang/srt/mem_cache/allocator/paged.py).

Both take the free list as it is before the call and return the slot of every new token. A
request's new tokens come in three parts:
  (1) the rest of its last, partly filled page, continuing from ``last_loc + 1``;
  (2) whole new pages;
  (3) one new, partly filled page.
Requests take their new pages from the free list in batch order, so each request's first page
and first output position are prefix sums over the requests before it.
"""

from __future__ import annotations

import torch

from memlab.common.utils import ceil_div


def num_new_pages(prefix_lens, seq_lens, page_size: int):
    """Pages a batch needs: sum of ceil(seq / ps) - ceil(prefix / ps) (ints or tensors)."""
    n = ceil_div(seq_lens, page_size) - ceil_div(prefix_lens, page_size)
    return int(n.sum()) if isinstance(n, torch.Tensor) else n


def num_new_pages_decode(seq_lens, page_size: int) -> int:
    """Pages a decode step opens: requests whose new token starts a page. SGLang's
    ``get_num_new_pages(..., decode=True)`` counts ``seq_len % ps == 1``, the same for ps > 1; at
    page size 1 SGLang uses the token allocator, and this form stays right there too."""
    return int(((seq_lens - 1) % page_size == 0).sum())


def alloc_extend_python(
    prefix_lens, seq_lens, last_loc, free_pages, page_size: int
) -> list[int]:
    out, next_page = [], 0
    for pre, seq, last in zip(prefix_lens, seq_lens, last_loc):
        # where the last partial page ends
        old_page_end = ceil_div(pre, page_size) * page_size
        part1 = min(seq, old_page_end) - pre
        out += [last + 1 + i for i in range(part1)]
        pos = pre + part1
        while pos < seq:  # parts (2) and (3): fresh pages, filled from offset 0
            page = free_pages[next_page]
            next_page += 1
            take = min(page_size, seq - pos)
            out += [page * page_size + i for i in range(take)]
            pos += take
    return out


def alloc_decode_python(seq_lens, last_loc, free_pages, page_size: int) -> list[int]:
    out, next_page = [], 0
    for seq, last in zip(seq_lens, last_loc):
        if (seq - 1) % page_size == 0:  # the new token (position seq - 1) opens a page
            out.append(free_pages[next_page] * page_size)
            next_page += 1
        else:
            out.append(last + 1)
    return out


def _nonempty(free_pages: torch.Tensor) -> torch.Tensor:
    return free_pages if len(free_pages) else free_pages.new_zeros(1)


def alloc_extend_torch(
    prefix_lens,
    seq_lens,
    last_loc,
    free_pages,
    page_size: int,
    extend_num_tokens: int,
    num_new_pages: int | None = None,
) -> torch.Tensor:
    """One slot per new token, for all tokens at once (no loop over requests).

    The output is a run of segments of consecutive slots: per request the rest of its old page
    (from ``last_loc + 1``), then one segment per new page. The arithmetic is per segment (the
    batch's requests and new pages); the tokens take three passes: ``slot = output position +
    its segment's shift``. ``num_new_pages``: the batch's new pages, counted on the host by the
    caller (without it, counting them here syncs with a GPU).
    """
    bs, dev, ps = len(seq_lens), seq_lens.device, page_size
    old_page_end = ceil_div(prefix_lens, ps) * ps  # where each old partial page ends
    pages = ceil_div(seq_lens, ps) - old_page_end // ps
    if num_new_pages is None:
        num_new_pages = int(pages.sum())
    ext = seq_lens - prefix_lens
    out_start = torch.cumsum(ext, 0) - ext  # each request's first output position
    page_start = torch.cumsum(pages, 0) - pages  # and its first page on the free list
    # Page k of the batch: its request, and the first position it holds in that request.
    owner = torch.repeat_interleave(
        torch.arange(bs, device=dev), pages, output_size=num_new_pages
    )
    k = torch.arange(num_new_pages, device=dev)
    first_pos = (old_page_end - page_start * ps)[owner] + k * ps
    # Request r's segments: part (1) at r + page_start[r], its new pages right after.
    seg_count = torch.empty(bs + num_new_pages, dtype=torch.int64, device=dev)
    seg_shift = torch.empty_like(seg_count)
    part1, page_seg = torch.arange(bs, device=dev) + page_start, k + owner + 1
    seg_count[part1] = torch.minimum(seq_lens, old_page_end) - prefix_lens
    seg_shift[part1] = last_loc + 1 - out_start
    seg_count[page_seg] = torch.clamp(seq_lens[owner] - first_pos, max=ps)
    # position p of request r sits at output index out_start[r] + p - prefix_lens[r]
    seg_shift[page_seg] = (
        free_pages[:num_new_pages] * ps - (out_start - prefix_lens)[owner] - first_pos
    )
    return torch.arange(extend_num_tokens, device=dev) + torch.repeat_interleave(
        seg_shift, seg_count, output_size=extend_num_tokens
    )


def alloc_decode_torch(seq_lens, last_loc, free_pages, page_size: int) -> torch.Tensor:
    opens = (seq_lens - 1) % page_size == 0
    k = torch.cumsum(opens.to(torch.int64), 0) - 1  # which new page each opener takes
    free_pages = _nonempty(free_pages)
    fresh = free_pages[k.clamp(0, len(free_pages) - 1)] * page_size
    return torch.where(opens, fresh, last_loc + 1)
