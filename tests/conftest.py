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

# The plain suite grades solutions/ wherever a test loads learner code without naming a folder
# (python -m memlab.grade and ./course grade set MEMLAB_EXERCISES instead).
from memlab.course.grading import loader

loader.set_default("solutions")


def pytest_configure(config):
    from memlab.course.grading import fuzz

    fuzz.grade_seed()  # drawn now, before any worker process starts: they inherit it


def pytest_report_header(config):
    from memlab.course.grading import fuzz

    seed = fuzz.grade_seed()
    return [
        f"memlab graded tests: grading {loader.source_dir()} "
        f"(MEMLAB_EXERCISES={os.environ.get(loader.ENV)})",
        f"memlab graded tests: random cases of seed {seed} (MEMLAB_GRADE_SEED={seed} draws "
        "them again)" + ("; Gradescope's hidden cases too" if fuzz.hidden() else ""),
    ]


LEAKS = ("MEMLAB_EXERCISES", "MEMLAB_GRADE_SEED", "PYTHONPATH", "TRITON_INTERPRET")


@pytest.fixture(autouse=True)
def _no_leak_into_the_next_test(request):
    """A test that changes which exercise files the next test grades (or how it imports) fails,
    naming what it left: once, a leaked MEMLAB_EXERCISES made every later graded test grade the
    stubs."""
    before = [os.environ.get(k) for k in LEAKS], loader._default
    yield
    after = [os.environ.get(k) for k in LEAKS], loader._default
    if after != before:
        changed = [
            f"{k}: {b!r} -> {a!r}"
            for k, b, a in zip(LEAKS, before[0], after[0], strict=True)
            if a != b
        ]
        if after[1] != before[1]:
            changed.append(
                f"the grader's default folder: {before[1]!r} -> {after[1]!r}"
            )
        pytest.fail(
            f"{request.node.nodeid} left {'; '.join(changed)} for the tests after it "
            "(use monkeypatch, set before it is changed)"
        )


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
