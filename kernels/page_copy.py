"""page_copy: copy whole pages between two KV buffers, page ``src_pages[i]`` of ``src`` to page
``dst_pages[i]`` of ``dst`` (HiCache's transfer between the device pool and the host pool).

A buffer is one layer's tensor ``(rows, *row_shape)`` with contiguous rows (MHA's K or V
``(rows, H, d)``, MLA's latent ``(rows, 1, r + d_r)``); page p is rows ``p * page_size ..
p * page_size + page_size - 1``, one contiguous run of ``page_size * row_elems`` elements. One
program copies one BLOCK-sized chunk of one page: grid ``(num_pages, cdiv(page_elems, BLOCK))``.
A page id outside either buffer (or negative) copies nothing: the kernel never touches memory
outside its two buffers, whatever the host passed. It moves elements without looking at them, so
any dtype works (fp8 pools store uint8).

Both buffers must be reachable from where the kernel runs: on a GPU both live in device memory
(memlab.sglang.page_copy stages the host side, see there); in the interpreter both are CPU tensors.
References: memlab.sglang.page_copy.copy_pages_torch / copy_pages_python.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _page_copy_kernel(
    src_ptr,
    dst_ptr,
    src_pages_ptr,
    dst_pages_ptr,
    src_num_pages,
    dst_num_pages,
    page_elems,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1).to(tl.int64)
    src_page = tl.load(src_pages_ptr + i).to(tl.int64)
    dst_page = tl.load(dst_pages_ptr + i).to(tl.int64)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    # The page ids are broadcast to vectors first: the interpreter rejects a scalar-and-vector mask.
    s = tl.zeros([BLOCK], dtype=tl.int64) + src_page
    d = tl.zeros([BLOCK], dtype=tl.int64) + dst_page
    mask = (
        (offs < page_elems)
        & (s >= 0)
        & (s < src_num_pages)
        & (d >= 0)
        & (d < dst_num_pages)
    )
    x = tl.load(src_ptr + s * page_elems + offs, mask=mask)
    tl.store(dst_ptr + d * page_elems + offs, x, mask=mask)


def copy_pages(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_pages: torch.Tensor,
    dst_pages: torch.Tensor,
    page_size: int,
    BLOCK: int = 1024,
) -> None:
    """dst page ``dst_pages[i]`` = src page ``src_pages[i]``, for every i (in place)."""
    n = src_pages.numel()
    if n == 0:
        return
    row_elems = src[0].numel()
    page_elems = page_size * row_elems
    _page_copy_kernel[(n, triton.cdiv(page_elems, BLOCK))](
        src,
        dst,
        src_pages,
        dst_pages,
        src.shape[0] // page_size,
        dst.shape[0] // page_size,
        page_elems,
        BLOCK=BLOCK,
    )
