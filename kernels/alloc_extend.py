"""alloc_extend: the slot of every new token of a prefill batch, one program per request
(SGLang's ``alloc_extend_kernel``, sglang/kernels/ops/memory/allocator.py).

Each program finds where its output and its new pages start (prefix sums over the requests
before it), then writes its three parts: the rest of the old partial page (from last_loc + 1),
whole new pages, and a new partial page. The slots are SGLang's; each choice that would show only
compiled is decided below, where it shows: the free list's alignment, the page size, the prefix
sums, the whole-page block.
"""

import torch
import triton
import triton.language as tl


# do_not_specialize, as in SGLang: the allocator re-slices its free list after every allocation
# (free_pages[n:] moves the pointer 8 bytes a page), so its 16-byte alignment flips between calls
# and Triton would compile a second variant for it; the kernel reads only a few pages through it.
# page_size is a constexpr, as in SGLang: a pool's page size never changes (one variant per pool),
# and // and % by a constant are shifts and masks (a multiply for 3, 5, 6...), not 64-bit divisions.
@triton.jit(do_not_specialize=["free_pages_ptr"])
def alloc_extend_kernel(
    prefix_lens_ptr,
    seq_lens_ptr,
    last_loc_ptr,
    free_pages_ptr,
    out_ptr,
    page_size: tl.constexpr,
    BS_BLOCK: tl.constexpr,
    PAGE_BLOCK: tl.constexpr,
    TOK_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    pre = tl.load(prefix_lens_ptr + pid).to(tl.int64)
    seq = tl.load(seq_lens_ptr + pid).to(tl.int64)

    # Prefix sums over requests 0..pid-1: my first output position and my first new page, BS_BLOCK
    # requests a trip. SGLang loads next_power_of_2(bs) at once, a constexpr: a variant per power
    # of two of the batch size; this loop serves every batch with one.
    out_start = tl.zeros((), dtype=tl.int64)
    page_start = tl.zeros((), dtype=tl.int64)
    for i in range(0, pid, BS_BLOCK):
        offs = i + tl.arange(0, BS_BLOCK)
        m = offs < pid
        p = tl.load(prefix_lens_ptr + offs, mask=m, other=0).to(tl.int64)
        s = tl.load(seq_lens_ptr + offs, mask=m, other=0).to(tl.int64)
        out_start += tl.sum(s - p, axis=0)
        page_start += tl.sum(
            (s + page_size - 1) // page_size - (p + page_size - 1) // page_size, axis=0
        )

    old_page_end = (pre + page_size - 1) // page_size * page_size
    full_end = seq // page_size * page_size

    # Part 1: continue the old partial page right after the last token's slot. PAGE_BLOCK is the
    # page size's next power of two, masked, so any page size works (SGLang's tl.arange(0,
    # page_size) compiles for powers of two only).
    n1 = tl.minimum(seq, old_page_end) - pre
    last = tl.load(last_loc_ptr + pid).to(tl.int64)
    o = tl.arange(0, PAGE_BLOCK)
    tl.store(out_ptr + out_start + o, last + 1 + o, mask=o < n1)

    # Part 2: whole new pages, TOK_BLOCK tokens a trip. The course keeps 256 (SGLang:
    # 4096): 28-40 registers a thread instead of 156-254 (the sm_75 and sm_90 builds), 8
    # programs per T4 SM instead of 2, for more trips only in prefills of thousands of
    # tokens (bench_kernels times both).
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


def alloc_extend(
    prefix_lens,
    seq_lens,
    last_loc,
    free_pages,
    page_size: int,
    extend_num_tokens: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch one program per request; the caller has checked that the free list is deep enough."""
    if out is None:
        out = torch.empty(extend_num_tokens, dtype=torch.int64, device=seq_lens.device)
    alloc_extend_kernel[(len(seq_lens),)](
        prefix_lens,
        seq_lens,
        last_loc,
        free_pages,
        out,
        page_size,
        BS_BLOCK=128,
        PAGE_BLOCK=triton.next_power_of_2(page_size),
        TOK_BLOCK=256,
    )
    return out
