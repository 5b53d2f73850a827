import os

import pytest

# Fix the kernel mode before any test module imports triton (directly or through a kernel).
from memlab.common.env import ensure_kernel_mode, has_cuda

ensure_kernel_mode()
os.environ.setdefault("MPLBACKEND", "Agg")
# One thread per test worker: pytest-xdist already runs one worker per core, and more threads
# than cores make small torch ops wait on each other.
import torch

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
