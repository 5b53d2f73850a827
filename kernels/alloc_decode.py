"""alloc_decode: one slot per request for the token a decode step adds, one program per request
(SGLang's ``alloc_decode_kernel``, sglang/kernels/ops/memory/allocator.py).

A request needs a new page exactly when its new token opens one ((seq_len - 1) % page_size == 0,
i.e. seq_len % page_size == 1 for page_size > 1); otherwise the slot is last_loc + 1.
"""

import torch
import triton
import triton.language as tl


# As in alloc_extend: the re-sliced free list must not compile a variant per alignment, and the
# page size is a compile-time constant (one variant per pool; % by it is a mask or a multiply).
@triton.jit(do_not_specialize=["free_pages_ptr"])
def alloc_decode_kernel(
    seq_lens_ptr,
    last_loc_ptr,
    free_pages_ptr,
    out_ptr,
    page_size: tl.constexpr,
    BS_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    seq = tl.load(seq_lens_ptr + pid).to(tl.int64)

    # How many requests before me open a page: that is my index into the free list (a loop, where
    # SGLang loads next_power_of_2(bs) lengths at once: one variant serves every batch size).
    page_start = tl.zeros((), dtype=tl.int64)
    for i in range(0, pid, BS_BLOCK):
        offs = i + tl.arange(0, BS_BLOCK)
        m = offs < pid
        s = tl.load(seq_lens_ptr + offs, mask=m, other=0).to(tl.int64)
        page_start += tl.sum((((s - 1) % page_size == 0) & m).to(tl.int64), axis=0)

    opens = (seq - 1) % page_size == 0
    page = tl.load(free_pages_ptr + page_start, mask=opens, other=0)
    last = tl.load(last_loc_ptr + pid).to(tl.int64)
    tl.store(out_ptr + pid, tl.where(opens, page * page_size, last + 1))


def alloc_decode(
    seq_lens, last_loc, free_pages, page_size: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """seq_lens count the new token; last_loc may be int32 (SGLang reads it from req_to_token)."""
    if out is None:
        out = torch.empty(len(seq_lens), dtype=torch.int64, device=seq_lens.device)
    alloc_decode_kernel[(len(seq_lens),)](
        seq_lens, last_loc, free_pages, out, page_size, BS_BLOCK=128
    )
    return out
