"""Graded tests: they reach learner code only through memlab.course.grading.loader.load (the seam).

Which folder they grade: MEMLAB_EXERCISES ('exercises', 'solutions' or a path) when set, as the
grader (python -m memlab.grade) always sets it. In the plain test suite it is unset and these
tests grade solutions/, so the suite checks that every solution earns its points; a learner
grades their own work with ``./course grade`` (or sets MEMLAB_EXERCISES=exercises).
"""

import os

import pytest

from memlab.course.grading import loader, plugin

loader.set_default("solutions")


def pytest_configure(config):
    plugin.register_markers(config)


def pytest_report_header(config):
    return f"memlab graded tests: grading {loader.source_dir()} (MEMLAB_EXERCISES={os.environ.get(loader.ENV)})"


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("GPU-only check: needs a CUDA device")
