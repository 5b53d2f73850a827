"""In CI a skip is a failure (a pytest hook, used by tests/conftest.py).

A differential test without the engines' wheels, or a browser test without Chromium or
Playwright, must not vanish unnoticed where the course is checked. Only the tests marked ``gpu``
skip there (CI has no GPU; ``scripts/gpu_check.sh`` runs them on one). Outside CI a skip stays a
skip: a learner's laptop without Chromium still runs everything else.
"""

import os

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (
        os.environ.get("CI")
        and report.skipped
        and not hasattr(report, "wasxfail")
        and item.get_closest_marker("gpu") is None
    ):
        reason = (
            report.longrepr[2]
            if isinstance(report.longrepr, tuple)
            else report.longrepr
        )
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which must run every test: {reason}"
