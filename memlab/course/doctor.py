"""The environment report: ``python -m memlab doctor`` (``./course doctor``, chapter 00).

Versions, the device, the kernel mode and the canary: a tiny kernel whose answer is known, run
before any chapter trusts a kernel (some Triton/NumPy pairings return zeros in the interpreter).
It sits above memlab.common.env and memlab.kernels: it is the one module that needs both.
"""

from __future__ import annotations

import importlib
import platform
import sys

from memlab.common import env


def run_canary() -> None:
    """Raise unless a tiny kernel returns real numbers (some Triton/NumPy pairs return zeros)."""
    import torch

    from memlab.kernels import canary

    x = torch.arange(1, 11, dtype=torch.int64, device=env.kernel_device())
    got = canary.axpb(x, a=3, b=2).cpu().tolist()
    want = [3 * v + 2 for v in range(1, 11)]
    if got != want:
        raise RuntimeError(
            f"Triton canary returned {got}, expected {want}: this Triton "
            f"({_version('triton')}) / NumPy ({_version('numpy')}) pairing is broken"
        )


def _version(name: str) -> str:
    try:
        return getattr(importlib.import_module(name), "__version__", "?")
    except Exception as exc:  # a missing or broken package is part of the report
        return f"missing ({type(exc).__name__})"


def report() -> list[tuple[str, str]]:
    try:
        env.ensure_kernel_mode()  # before the version probe below imports triton
    except RuntimeError:
        pass
    rows = [("python", sys.version.split()[0]), ("platform", platform.platform())]
    rows += [
        (n, _version(n))
        for n in ("torch", "triton", "numpy", "ipywidgets", "matplotlib")
    ]
    if env.has_cuda():
        import torch

        cap = torch.cuda.get_device_capability()
        rows += [
            ("device", torch.cuda.get_device_name()),
            ("compute capability", f"{cap[0]}.{cap[1]}"),
        ]
    else:
        rows += [("device", "cpu (no CUDA device)"), ("compute capability", "-")]
    mode = "unavailable"
    try:
        mode = env.ensure_kernel_mode()
        run_canary()
        rows += [("kernel mode", mode), ("canary", "OK: kernels return real numbers")]
    except Exception as exc:
        rows += [("kernel mode", mode), ("canary", f"FAIL: {exc}")]
    return rows


def doctor() -> int:
    rows = report()
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:>{width}}  {v}")
    return (
        0 if rows[-1][1].startswith("OK") or not sys.platform.startswith("linux") else 1
    )
