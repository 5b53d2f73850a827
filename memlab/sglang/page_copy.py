"""Moving pages between KV buffers, as HiCache does (sglang/kernels/ops/kvcache/hicache.py).

The references of kernels/page_copy.py, and HiCache's transfer between a device pool and a host
pool built on them.

``copy_pages_*(src, dst, src_pages, dst_pages, page_size)`` copy page ``src_pages[i]`` of
``src`` to page ``dst_pages[i]`` of ``dst`` (a page is ``page_size`` consecutive rows); page ids
outside a buffer copy nothing (the kernel masks them; the references skip them the same way).
``copy_pages``, the entry point, refuses them where reading the ids costs no sync (CPU ids); on a
GPU it trusts its caller, as SGLang's transfers do, and the kernel's mask keeps memory safe.

``transfer_pages`` is what a HiCache transfer does with one layer's buffer:
- both buffers on one device (the Triton interpreter: everything is on the CPU): one
  gather-scatter, straight from ``src`` to ``dst``;
- device and host apart (a GPU): the kernel only ever touches device memory. Device to host:
  the kernel gathers the pages into a contiguous device staging buffer, one bulk copy moves it to
  a pinned host buffer, and the host scatters it into the host pool's pages. Host to device: the
  host gathers, one bulk copy, the kernel scatters. SGLang's ``kernel`` io backend instead lets its
  CUDA kernels read and write pinned host memory directly (zero copy through unified addressing);
  memlab stages, because every step of the staged path also runs, and is tested, without a GPU,
  and a bulk copy of pinned memory runs at full PCIe speed on a Colab T4 too.
"""

from __future__ import annotations

import torch

from memlab.common import _checks

BACKENDS = ("triton", "torch", "python")


def page_rows(pages: torch.Tensor, page_size: int) -> torch.Tensor:
    """The rows of these pages, page after page."""
    offs = torch.arange(page_size, dtype=torch.int64, device=pages.device)
    return (pages.to(torch.int64)[:, None] * page_size + offs).reshape(-1)


def copy_pages_torch(src, dst, src_pages, dst_pages, page_size: int) -> None:
    num_src, num_dst = src.shape[0] // page_size, dst.shape[0] // page_size
    ok = (
        (src_pages >= 0)
        & (src_pages < num_src)
        & (dst_pages >= 0)
        & (dst_pages < num_dst)
    )
    src_pages, dst_pages = src_pages[ok], dst_pages[ok]
    dst[page_rows(dst_pages, page_size).to(dst.device)] = src[
        page_rows(src_pages, page_size).to(src.device)
    ].to(dst.device)


def copy_pages_python(src, dst, src_pages, dst_pages, page_size: int) -> None:
    """Element by element over Python lists: the slow, obvious reference."""
    rows = src.shape[0]
    row_elems = src[0].numel()
    flat_src, flat_dst = src.reshape(-1).tolist(), dst.reshape(-1).tolist()
    for s, d in zip(src_pages.tolist(), dst_pages.tolist()):
        if not (0 <= s < rows // page_size and 0 <= d < dst.shape[0] // page_size):
            continue
        for k in range(page_size * row_elems):
            flat_dst[d * page_size * row_elems + k] = flat_src[
                s * page_size * row_elems + k
            ]
    dst.copy_(torch.tensor(flat_dst, dtype=dst.dtype).reshape(dst.shape))


def copy_pages(
    src, dst, src_pages, dst_pages, page_size: int, backend: str = "triton"
) -> None:
    """One gather-scatter between two buffers on the same device."""
    _check_copy(src, dst, src_pages, dst_pages, page_size, backend)
    if backend == "triton":
        from memlab.kernels import page_copy

        page_copy.copy_pages(src, dst, src_pages, dst_pages, page_size)
    elif backend == "torch":
        copy_pages_torch(src, dst, src_pages, dst_pages, page_size)
    else:
        copy_pages_python(src, dst, src_pages, dst_pages, page_size)


def transfer_pages(
    src,
    dst,
    src_pages,
    dst_pages,
    page_size: int,
    backend: str = "triton",
    path: str | None = None,
) -> None:
    """Copy pages from ``src`` to ``dst`` wherever the two live (see the module's docstring).

    ``path``: "same_device", "device_to_host" or "host_to_device"; by default the buffers'
    devices decide. Naming a staged path on one device tests it without a GPU.
    """
    _check_transfer(src, dst, src_pages, dst_pages, page_size, path)
    if path is None:
        path = (
            "same_device"
            if src.device == dst.device
            else "device_to_host"
            if dst.device.type == "cpu"
            else "host_to_device"
        )
    n = len(src_pages)
    if path == "same_device":
        copy_pages(
            src,
            dst,
            src_pages.to(src.device),
            dst_pages.to(dst.device),
            page_size,
            backend,
        )
    elif path == "device_to_host":
        # the kernel gathers the pages on the device, one bulk copy, the host scatters them
        stage = torch.empty(
            (n * page_size, *src.shape[1:]), dtype=src.dtype, device=src.device
        )
        copy_pages(
            src,
            stage,
            src_pages.to(src.device),
            torch.arange(n, device=src.device),
            page_size,
            backend,
        )
        copy_pages_torch(
            stage.to(dst.device), dst, torch.arange(n), dst_pages.cpu(), page_size
        )
    else:
        # the host gathers the pages, one bulk copy, the kernel scatters them on the device
        stage = torch.empty(
            (n * page_size, *src.shape[1:]),
            dtype=src.dtype,
            pin_memory=dst.device.type == "cuda",
        )
        copy_pages_torch(src, stage, src_pages.cpu(), torch.arange(n), page_size)
        stage = stage.to(dst.device, non_blocking=True)
        copy_pages(
            stage,
            dst,
            torch.arange(n, device=dst.device),
            dst_pages.to(dst.device),
            page_size,
            backend,
        )


# -- argument checks (memlab's, at the boundary: SGLang's transfers trust their caller) ----------


def _check_transfer(src, dst, src_pages, dst_pages, page_size, path) -> None:
    """Two buffers of one row shape and dtype, one page id per page each way (each read where
    its buffer lives: the copy checks them again, on its own device)."""
    _checks.one_of(
        "path", path, (None, "same_device", "device_to_host", "host_to_device")
    )
    _checks.integer("page_size", page_size, 1, _checks.INT32_MAX)
    _checks.tensor("src", src)
    _checks.tensor("dst", dst, (src.dtype,), like=" like src")
    for name, t in (
        ("src", src),
        ("dst", dst),
        ("src_pages", src_pages),
        ("dst_pages", dst_pages),
    ):
        if name.endswith("pages"):
            _checks.index_tensor(name, t, ndim=1)
        if t.device.type == "meta":
            raise ValueError(f"{name} is on the meta device: it holds no data")
    if len(src_pages) != len(dst_pages) or src.shape[1:] != dst.shape[1:]:
        raise ValueError(
            f"src ({len(src_pages)} pages of rows {tuple(src.shape[1:])}) and dst "
            f"({len(dst_pages)} pages of rows {tuple(dst.shape[1:])}) must match"
        )


def _check_copy(src, dst, src_pages, dst_pages, page_size, backend) -> None:
    _checks.one_of("backend", backend, BACKENDS)
    page_size = _checks.integer("page_size", page_size, 1)
    _checks.tensor("src", src)
    _checks.tensor("dst", dst, (src.dtype,), shape=None, like=" like src")
    if src.shape[1:] != dst.shape[1:]:
        raise ValueError(
            f"src rows {tuple(src.shape[1:])} and dst rows {tuple(dst.shape[1:])}"
        )
    for name, pages, buf in (
        ("src_pages", src_pages, src),
        ("dst_pages", dst_pages, dst),
    ):
        _checks.index_tensor(
            name, pages, buf.device, ndim=1, owner=f"{name[:3]} buffer"
        )
        # on a GPU reading the ids would sync: there the kernel masks them
        if pages.device.type == "cpu":
            _checks.values_in(
                f"{name} (page ids of a buffer of {buf.shape[0] // page_size} pages)",
                pages,
                0,
                buf.shape[0] // page_size - 1,
            )
    if len(src_pages) != len(dst_pages):
        raise ValueError(
            f"src_pages has {len(src_pages)} pages, dst_pages {len(dst_pages)}: one each way"
        )
