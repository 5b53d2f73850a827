"""alloc_extend: the slot of every new token of a prefill batch, one program per request.

Each program finds where its output and its new pages start (prefix sums over the requests
before it), then writes its three parts: the rest of the old partial page (from last_loc + 1),
whole new pages, and a new partial page. Every loop bound is a runtime value, so one compilation
serves every batch size and extend length for a given page size. (SGLang's kernel loads
next_power_of_2(batch size) lengths at once and takes the page size as a compile-time constant;
the slots it writes are the same.)
"""

import torch
import triton
import triton.language as tl


@triton.jit
def alloc_extend_kernel(prefix_lens_ptr, seq_lens_ptr, last_loc_ptr, free_pages_ptr, out_ptr, page_size,
                        BS_BLOCK: tl.constexpr, PAGE_BLOCK: tl.constexpr, TOK_BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    pre = tl.load(prefix_lens_ptr + pid).to(tl.int64)
    seq = tl.load(seq_lens_ptr + pid).to(tl.int64)

    # Prefix sums over requests 0..pid-1: my first output position and my first new page.
    out_start = tl.zeros((), dtype=tl.int64)
    page_start = tl.zeros((), dtype=tl.int64)
    for i in range(0, pid, BS_BLOCK):
        offs = i + tl.arange(0, BS_BLOCK)
        m = offs < pid
        p = tl.load(prefix_lens_ptr + offs, mask=m, other=0).to(tl.int64)
        s = tl.load(seq_lens_ptr + offs, mask=m, other=0).to(tl.int64)
        out_start += tl.sum(s - p, axis=0)
        page_start += tl.sum((s + page_size - 1) // page_size - (p + page_size - 1) // page_size, axis=0)

    old_page_end = (pre + page_size - 1) // page_size * page_size
    full_end = seq // page_size * page_size

    # Part 1: continue the old partial page right after the last token's slot.
    n1 = tl.minimum(seq, old_page_end) - pre
    last = tl.load(last_loc_ptr + pid).to(tl.int64)
    o = tl.arange(0, PAGE_BLOCK)
    tl.store(out_ptr + out_start + o, last + 1 + o, mask=o < n1)

    # Part 2: whole new pages, TOK_BLOCK tokens at a time.
    n2 = tl.maximum(full_end - old_page_end, 0)
    for t in range(0, n2, TOK_BLOCK):
        k = t + tl.arange(0, TOK_BLOCK)
        m = k < n2
        page = tl.load(free_pages_ptr + page_start + k // page_size, mask=m, other=0)
        tl.store(out_ptr + out_start + n1 + k, page * page_size + k % page_size, mask=m)

    # Part 3: the first tokens of one more new page.
    n3 = tl.maximum(seq - tl.maximum(full_end, old_page_end), 0)
    page = tl.load(free_pages_ptr + page_start + n2 // page_size, mask=n3 > 0, other=0)
    tl.store(out_ptr + out_start + n1 + n2 + o, page * page_size + o, mask=o < n3)


def alloc_extend(prefix_lens, seq_lens, last_loc, free_pages, page_size: int, extend_num_tokens: int,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch one program per request; the caller has checked that the free list is deep enough."""
    if out is None:
        out = torch.empty(extend_num_tokens, dtype=torch.int64, device=seq_lens.device)
    alloc_extend_kernel[(len(seq_lens),)](prefix_lens, seq_lens, last_loc, free_pages, out, page_size,
                                          BS_BLOCK=128, PAGE_BLOCK=triton.next_power_of_2(page_size), TOK_BLOCK=256)
    return out
