"""What the first cell of every chapter calls once the repository is on ``sys.path``."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def fast() -> bool:
    """MEMLAB_FAST=1 (set by the notebook tests) asks the chapters for small sizes."""
    return os.environ.get("MEMLAB_FAST", "") not in ("", "0")


def start(chapter: str) -> bool:
    """Fix the kernel mode before anything imports Triton, say where kernels run; return fast()."""
    from memlab.env import ensure_kernel_mode, has_cuda

    root = Path(__file__).resolve().parents[2]
    # Shell cells (!python -m memlab.grade 04) start a new process: let it find memlab too.
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(root) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, paths)])
    try:
        mode = ensure_kernel_mode()
    except RuntimeError as exc:  # triton was imported first by something else
        mode = f"unavailable ({exc})"
    if mode == "gpu":
        import torch

        where = f"on the GPU ({torch.cuda.get_device_name()}), compiled"
    elif mode == "interpreter":
        where = "in the Triton interpreter on the CPU (slow but exact)"
        if not sys.platform.startswith("linux"):
            where += "; Triton has no wheels here, so kernel cells need Linux or Colab"
    else:
        where = mode
    flags = " · fast mode (small sizes)" if fast() else ""
    print(f"memlab chapter {chapter} · repository {root.name}/ · kernels run {where}{flags}")
    if not has_cuda() and "google.colab" in sys.modules:
        print("Colab without a GPU: Runtime > Change runtime type > T4 GPU runs the kernels compiled.")
    return fast()


def exercise(name: str):
    """Your exercise file (exercises/<name>.py, or the folder MEMLAB_EXERCISES names), freshly
    loaded through the grader's seam, so an edited file is picked up when the cell runs again."""
    from memlab.grading import loader

    path = (loader.source_dir() / f"{name}.py").resolve()
    loader._cache.pop(path, None)  # the grader caches per run; a notebook wants the latest edit
    return loader.load(name)

