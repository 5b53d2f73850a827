"""page_copy: kernel == torch reference == Python reference on random batches of pages, MHA and
MLA row shapes, page sizes 1, 16 and 64, fp16/fp32/uint8 (fp8 storage), with guard bands; the
staged device <-> host paths of transfer_pages; on a GPU, a real device <-> pinned host copy."""

import pytest
import torch

from memlab.common.env import kernel_device
from memlab.sglang.page_copy import copy_pages_python, copy_pages_torch, transfer_pages

GUARD = 3  # guard rows around each buffer
# one token's row: (heads, head_dim) / (1, r + d_r)
LAYOUTS = {"mha": (2, 8), "mla": (1, 24)}


def random_buffer(rows, row_shape, dtype, gen):
    if dtype == torch.uint8:
        return torch.randint(
            0, 256, (rows, *row_shape), dtype=torch.uint8, generator=gen
        )
    return torch.randn((rows, *row_shape), generator=gen).to(dtype)


def guarded(rows, row_shape, dtype, dev, fill):
    """A buffer of ``rows`` rows as a view inside a bigger one whose guard rows hold ``fill``."""
    big = torch.full((rows + 2 * GUARD, *row_shape), fill, dtype=dtype, device=dev)
    return big[GUARD : GUARD + rows], big


def random_batch(gen, n, src_pages, dst_pages):
    """n distinct destination pages (a scatter must not write one page twice) and any sources."""
    dst = torch.randperm(dst_pages, generator=gen)[:n]
    src = torch.randint(0, src_pages, (n,), generator=gen)
    return src, dst


@pytest.mark.kernel
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.uint8])
@pytest.mark.parametrize(
    "page_size,src_pages,dst_pages,n", [(1, 40, 30, 17), (16, 6, 9, 5), (64, 3, 4, 3)]
)
def test_kernel_equals_references(layout, dtype, page_size, src_pages, dst_pages, n):
    from memlab.kernels import page_copy

    dev = kernel_device()
    gen = torch.Generator().manual_seed(page_size * 31 + n)
    row = LAYOUTS[layout]
    src = random_buffer(src_pages * page_size, row, dtype, gen).to(dev)
    sp, dp = random_batch(gen, n, src_pages, dst_pages)
    before = random_buffer(dst_pages * page_size, row, dtype, gen)
    sentinel = 77 if dtype == torch.uint8 else -7.0
    results = []
    for name in ("python", "torch", "kernel"):
        dst, big = guarded(dst_pages * page_size, row, dtype, dev, sentinel)
        dst.copy_(before)
        if name == "python":
            copy_pages_python(src, dst, sp, dp, page_size)
        elif name == "torch":
            copy_pages_torch(src, dst, sp.to(dev), dp.to(dev), page_size)
        else:
            page_copy.copy_pages(src, dst, sp.to(dev), dp.to(dev), page_size)
        assert (big[:GUARD] == sentinel).all() and (big[-GUARD:] == sentinel).all(), (
            f"{name} wrote outside dst"
        )
        results.append(dst.cpu())
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])
    # and the result is what a copy means: the copied pages equal their sources, the
    # rest is untouched
    want = before.clone()
    for s, d in zip(sp.tolist(), dp.tolist()):
        want[d * page_size : (d + 1) * page_size] = src[
            s * page_size : (s + 1) * page_size
        ].cpu()
    assert torch.equal(results[2], want)


@pytest.mark.kernel
def test_kernel_masks_page_ids_outside_either_buffer():
    """Called directly with bad page ids, the kernel still touches nothing outside its buffers
    (the interpreter would not catch an out-of-bounds access)."""
    from memlab.kernels import page_copy

    dev = kernel_device()
    # 4 pages of 2 rows
    src = torch.arange(4 * 2 * 3, dtype=torch.float32, device=dev).reshape(8, 1, 3)
    dst, big = guarded(6, (1, 3), torch.float32, dev, -1.0)  # 3 pages
    dst.zero_()
    sp = torch.tensor([0, 4, -1, 3, 1], device=dev)
    # only (0 -> 2) is inside both buffers
    dp = torch.tensor([2, 0, 1, 3, -2], device=dev)
    page_copy.copy_pages(src, dst, sp, dp, 2)
    assert (big[:GUARD] == -1).all() and (big[-GUARD:] == -1).all()
    assert torch.equal(dst[4:6].cpu(), src[0:2].cpu()) and (dst[:4] == 0).all()


@pytest.mark.kernel
@pytest.mark.parametrize("path", ["same_device", "device_to_host", "host_to_device"])
@pytest.mark.parametrize("backend", ["triton", "torch", "python"])
def test_transfer_paths_agree(path, backend):
    """The staged paths (gather, one bulk copy, scatter) give the same pages as a direct copy."""
    dev = kernel_device()
    gen = torch.Generator().manual_seed(5)
    src = random_buffer(12 * 4, (2, 4), torch.float16, gen).to(dev)
    dst = torch.zeros(10 * 4, 2, 4, dtype=torch.float16, device=dev)
    sp, dp = torch.tensor([3, 11, 0, 7]), torch.tensor([9, 1, 4, 2])
    transfer_pages(src, dst, sp, dp, 4, backend, path=path)
    want = torch.zeros_like(dst)
    copy_pages_torch(src, want, sp.to(dev), dp.to(dev), 4)
    assert torch.equal(dst, want)


@pytest.mark.gpu
@pytest.mark.kernel
def test_device_and_pinned_host_round_trip_on_a_gpu():
    """A GPU page pool -> pinned host pool -> other GPU pages: every byte comes back."""
    gen = torch.Generator().manual_seed(9)
    dev_buf = random_buffer(32 * 16, (4, 32), torch.float16, gen).cuda()
    host_buf = torch.zeros(20 * 16, 4, 32, dtype=torch.float16, pin_memory=True)
    out = torch.zeros_like(dev_buf)
    sp, hp, dp = (
        torch.tensor([5, 30, 2]),
        torch.tensor([19, 0, 7]),
        torch.tensor([1, 2, 3]),
    )
    # device -> host: staged through the GPU
    transfer_pages(dev_buf, host_buf, sp, hp, 16)
    transfer_pages(host_buf, out, hp, dp, 16)
    torch.cuda.synchronize()
    for s, d in zip(sp.tolist(), dp.tolist()):
        assert torch.equal(out[d * 16 : (d + 1) * 16], dev_buf[s * 16 : (s + 1) * 16])
