"""In CI a skip is a failure, and so is a test that runs over a minute (a pytest hook, used by
tests/conftest.py).

A differential test without the engines' wheels, or a browser test without Chromium or
Playwright, must not vanish unnoticed where the course is checked. Only the tests marked ``gpu``
skip there (CI has no GPU; ``scripts/gpu_check.sh`` runs them on one). Outside CI a skip stays a
skip: a learner's laptop without Chromium still runs everything else.

The suite must stay minutes on a 2-core machine, so in CI each phase of a test (its set-up, its
call) gets at most ``MEMLAB_TEST_LIMIT_S`` seconds (60); the slowest measured is about 32 s. A
learner's slower laptop is not held to it.
"""

import os

import pytest

LIMIT_S = float(os.environ.get("MEMLAB_TEST_LIMIT_S", "60"))


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
    elif os.environ.get("CI") and report.passed and report.duration > LIMIT_S:
        report.outcome = "failed"
        report.longrepr = (
            f"{report.when} took {report.duration:.1f} s, over the {LIMIT_S:g} s a test may take "
            "(make it cheaper or share its set-up: the suite must stay under 10 minutes)"
        )
