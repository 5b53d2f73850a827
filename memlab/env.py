"""Device policy and the environment report (``python -m memlab doctor``).

memlab runs kernels compiled on a CUDA device when there is one; otherwise in the Triton
interpreter, which must be switched on (TRITON_INTERPRET=1) before the first kernel module is
imported, because triton.jit reads it when a kernel is defined.
"""

from __future__ import annotations

import importlib
import os
import platform
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

    d = torch.device(device)
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
                raise RuntimeError("triton was imported before memlab could set TRITON_INTERPRET=1; "
                                   "import memlab.kernels (or memlab.env.ensure_kernel_mode()) first")
            os.environ["TRITON_INTERPRET"] = "1"
            _mode = "interpreter"
        else:
            _mode = "gpu"
    return _mode


def kernel_device() -> str:
    """The torch device kernels run on: 'cuda' on a GPU, 'cpu' in the interpreter."""
    return "cuda" if ensure_kernel_mode() == "gpu" else "cpu"


def run_canary() -> None:
    """Raise unless a tiny kernel returns real numbers (some Triton/NumPy pairs return zeros)."""
    import torch
    from memlab.kernels import canary

    x = torch.arange(1, 11, dtype=torch.int64, device=kernel_device())
    got = canary.axpb(x, a=3, b=2).cpu().tolist()
    want = [3 * v + 2 for v in range(1, 11)]
    if got != want:
        raise RuntimeError(f"Triton canary returned {got}, expected {want}: this Triton "
                           f"({_version('triton')}) / NumPy ({_version('numpy')}) pairing is broken")


def _version(name: str) -> str:
    try:
        return getattr(importlib.import_module(name), "__version__", "?")
    except Exception as exc:  # a missing or broken package is part of the report
        return f"missing ({type(exc).__name__})"


def report() -> list[tuple[str, str]]:
    try:
        ensure_kernel_mode()  # before the version probe below imports triton
    except RuntimeError:
        pass
    rows = [("python", sys.version.split()[0]), ("platform", platform.platform())]
    rows += [(n, _version(n)) for n in ("torch", "triton", "numpy", "ipywidgets", "matplotlib")]
    if has_cuda():
        import torch

        cap = torch.cuda.get_device_capability()
        rows += [("device", torch.cuda.get_device_name()), ("compute capability", f"{cap[0]}.{cap[1]}")]
    else:
        rows += [("device", "cpu (no CUDA device)"), ("compute capability", "-")]
    try:
        mode = ensure_kernel_mode()
        run_canary()
        rows += [("kernel mode", mode), ("canary", "OK: kernels return real numbers")]
    except Exception as exc:
        rows += [("kernel mode", _mode or "unavailable"), ("canary", f"FAIL: {exc}")]
    return rows


def doctor() -> int:
    rows = report()
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:>{width}}  {v}")
    return 0 if rows[-1][1].startswith("OK") or not sys.platform.startswith("linux") else 1
