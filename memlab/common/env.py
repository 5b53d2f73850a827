"""Device policy: where kernels run, and the kernel mode fixed before any kernel exists.

memlab runs kernels compiled on a CUDA device when there is one; otherwise in the Triton
interpreter, which must be switched on (TRITON_INTERPRET=1) before the first kernel module is
imported, because triton.jit reads it when a kernel is defined. This module is the floor of
the library: it imports nothing of memlab (memlab.kernels imports it; the environment report,
which runs a kernel, is memlab.course.doctor).
"""

from __future__ import annotations

import os
import sys

_mode: str | None = None


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def resolve_device(device):
    """A torch.device with its index filled in: tensors report 'cuda:0', and
    torch.device('cuda') != torch.device('cuda:0'), so books keep the resolved form."""
    import torch

    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"device must be a str or a torch.device, got {type(device).__name__} {device!r}"
        )
    try:
        d = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device {device!r} is no torch device: {exc}") from None
    # torch's own error would come later, mid-build
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {device!r}: this machine has no CUDA device; use device='cpu'"
        )
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def ensure_kernel_mode() -> str:
    """Pick 'gpu' or 'interpreter' once, before any kernel module is imported, and return it."""
    global _mode
    if _mode is None:
        if os.environ.get("TRITON_INTERPRET") == "1" or not has_cuda():
            if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
                # Kernels defined before this point were built for a GPU that is not there.
                raise RuntimeError(
                    "triton was imported before memlab could set TRITON_INTERPRET=1; "
                    "import memlab.kernels (or memlab.common.env.ensure_kernel_mode()) first"
                )
            os.environ["TRITON_INTERPRET"] = "1"
            _mode = "interpreter"
        else:
            _mode = "gpu"
    return _mode


def kernel_device() -> str:
    """The torch device kernels run on: 'cuda' on a GPU, 'cpu' in the interpreter."""
    return "cuda" if ensure_kernel_mode() == "gpu" else "cpu"
