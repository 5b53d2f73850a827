"""Chapter 04 exercise (Triton): the whole-page part of the ``alloc_extend`` kernel.

The kernel below is complete except for one marked section, part 2. Fill it in, set
``PART2_WRITTEN = True``, and grade with ``./course grade 04``. It runs compiled on a GPU and in
the Triton interpreter on a CPU (memlab switches the interpreter on before this file loads).
"""

import torch
import triton
import triton.language as tl

# ===== EXERCISE 04b: set to True once part 2 below is written =====
# BEGIN SOLUTION (stub: PART2_WRITTEN = False)
PART2_WRITTEN = True
# END SOLUTION
# ===== END EXERCISE 04b =====


@triton.jit
def alloc_extend_kernel(
    prefix_lens_ptr,
    seq_lens_ptr,
    last_loc_ptr,
    free_pages_ptr,
    out_ptr,
    page_size,
    BS_BLOCK: tl.constexpr,
    PAGE_BLOCK: tl.constexpr,
    TOK_BLOCK: tl.constexpr,
):
    """One program per request: write the slots of its new tokens into ``out_ptr``."""
    pid = tl.program_id(0)
    pre = tl.load(prefix_lens_ptr + pid).to(tl.int64)
    seq = tl.load(seq_lens_ptr + pid).to(tl.int64)

    # Requests 0..pid-1 come first: sum their new tokens (where my output starts) and their new
    # pages (where my pages start in free_pages).
    out_start = tl.zeros((), dtype=tl.int64)
    page_start = tl.zeros((), dtype=tl.int64)
    for i in range(0, pid, BS_BLOCK):
        r = i + tl.arange(0, BS_BLOCK)
        live = r < pid
        p = tl.load(prefix_lens_ptr + r, mask=live, other=0).to(tl.int64)
        s = tl.load(seq_lens_ptr + r, mask=live, other=0).to(tl.int64)
        out_start += tl.sum(s - p, axis=0)
        page_start += tl.sum(
            (s + page_size - 1) // page_size - (p + page_size - 1) // page_size, axis=0
        )

    # end of the old, partly filled page
    old_end = (pre + page_size - 1) // page_size * page_size
    full_end = seq // page_size * page_size  # end of the last whole page

    # Part 1: the rest of the old page, from last_loc + 1.
    n1 = tl.minimum(seq, old_end) - pre
    last = tl.load(last_loc_ptr + pid).to(tl.int64)
    o = tl.arange(0, PAGE_BLOCK)
    tl.store(out_ptr + out_start + o, last + 1 + o, mask=o < n1)

    # Part 2: n2 tokens that fill whole new pages.
    n2 = tl.maximum(full_end - old_end, 0)
    # ===== EXERCISE 04b: part 2, the whole new pages =====
    # Token k of part 2 (k = 0 .. n2 - 1) lands on my new page number k // page_size, which is
    # free_pages[page_start + k // page_size], at offset k % page_size; its output position is
    # out_start + n1 + k. Write them TOK_BLOCK tokens at a time with a loop whose bound is the
    # runtime value n2 (for t in range(0, n2, TOK_BLOCK)), and mask every load and store.
    # BEGIN SOLUTION (stub: # YOUR CODE HERE)
    for t in range(0, n2, TOK_BLOCK):
        k = t + tl.arange(0, TOK_BLOCK)
        live = k < n2
        page = tl.load(free_pages_ptr + page_start + k // page_size, mask=live, other=0)
        tl.store(
            out_ptr + out_start + n1 + k, page * page_size + k % page_size, mask=live
        )
    # END SOLUTION
    # ===== END EXERCISE 04b =====

    # Part 3: the first n3 slots of one more new page, the one after the whole pages.
    n3 = tl.maximum(seq - tl.maximum(full_end, old_end), 0)
    page = tl.load(free_pages_ptr + page_start + n2 // page_size, mask=n3 > 0, other=0)
    tl.store(out_ptr + out_start + n1 + n2 + o, page * page_size + o, mask=o < n3)


def alloc_extend(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    page_size: int,
    extend_num_tokens: int,
    tok_block: int = 64,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch the kernel: the int64 slot of each of the batch's ``extend_num_tokens`` new tokens.

    All tensors on one device (the GPU, or the CPU in the interpreter). The caller has checked
    that ``free_pages`` holds enough pages; ``free_pages`` itself is only read. ``out``: where to
    write (a fresh tensor when None).
    """
    if not PART2_WRITTEN:
        raise NotImplementedError(
            "alloc_extend_kernel: write part 2 (EXERCISE 04b), then set PART2_WRITTEN = True"
        )
    if out is None:
        out = torch.empty(extend_num_tokens, dtype=torch.int64, device=seq_lens.device)
    alloc_extend_kernel[(len(seq_lens),)](
        prefix_lens,
        seq_lens,
        last_loc,
        free_pages,
        out,
        page_size,
        BS_BLOCK=64,
        PAGE_BLOCK=triton.next_power_of_2(page_size),
        TOK_BLOCK=tok_block,
    )
    return out
