import importlib.util
import os
import sys
from pathlib import Path

import pytest

# `python -m pytest` run from the repository puts the repository first on sys.path, where its
# kernels/ folder (a package) would hide an installed `kernels` (Hugging Face's, which
# transformers imports): take it out before anything is imported from there.
_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != _ROOT]

# The tests' own machinery as the package memlab_tests (tests/tools/loading.py says why).
_spec = importlib.util.spec_from_file_location(
    "_memlab_tests_loading", Path(__file__).parent / "tools" / "loading.py"
)
_loading = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_loading)
_loading.register()

# Fix the kernel mode before any test module imports triton (directly or through a kernel).
from memlab.common.env import ensure_kernel_mode, has_cuda
from memlab_tests.tools.ci_skips import pytest_runtest_makereport  # noqa: F401

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
