"""CI builds what a newcomer builds and loses no test: .ci/run makes both virtual environments
from nothing and prints the suite's time; with CI set, a skip is a failure and so is a test
over the time limit (tests/tools/ci_skips.py)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import pytest

def test_passes():
    pass

def test_would_skip_without_its_wheel():
    pytest.skip("no wheel")

@pytest.mark.gpu
def test_needs_a_gpu():
    pytest.skip("needs a CUDA device")

@pytest.mark.xfail(strict=True)
def test_a_known_gap():
    assert False
"""

CONFTEST = f"""
import runpy
runpy.run_path({str(ROOT / "tests" / "tools" / "loading.py")!r})["register"]()
from memlab_tests.tools.ci_skips import pytest_runtest_makereport  # noqa: F401
"""


def run_probe(tmp_path: Path, ci: bool, probe: str = PROBE, **env_extra: str) -> str:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_probe.py").write_text(probe)
    env = {k: v for k, v in os.environ.items() if k != "CI"} | (
        {"CI": "true"} if ci else {}
    )
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA"]
    r = subprocess.run(
        [*cmd, "-o", "markers=gpu"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env | env_extra,
        timeout=120,
    )
    return r.stdout + r.stderr


def test_a_skip_fails_in_ci_but_a_gpu_skip_and_an_xfail_do_not(tmp_path):
    out = run_probe(tmp_path, ci=True)
    assert "1 failed, 1 passed, 1 skipped, 1 xfailed" in out, out
    assert "FAILED test_probe.py::test_would_skip_without_its_wheel" in out, out
    assert "skipped in CI, which must run every test: Skipped: no wheel" in out, out


SLOW = """
import time

def test_quick():
    pass

def test_slow():
    time.sleep(1.2)
"""


def run_slow_probe(tmp_path: Path, ci: bool) -> str:
    return run_probe(tmp_path, ci, SLOW, MEMLAB_TEST_LIMIT_S="1")


def test_a_test_over_the_limit_fails_in_ci(tmp_path):
    out = run_slow_probe(tmp_path, ci=True)
    assert "1 failed, 1 passed" in out, out
    assert "FAILED test_probe.py::test_slow" in out, out
    assert re.search(r"call took 1\.\d s, over the 1 s a test may take", out), out


def test_outside_ci_a_slow_test_passes(tmp_path):
    assert "2 passed" in run_slow_probe(tmp_path, ci=False)


def test_outside_ci_a_skip_stays_a_skip(tmp_path):
    out = run_probe(tmp_path, ci=False)
    assert "1 passed, 2 skipped, 1 xfailed" in out, out


def test_ci_builds_both_environments_from_nothing_and_times_the_suite():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "MEMLAB_FRESH=1" in ci and "rm -rf .venv .venv-colab" in ci
    assert (
        ci.index("rm -rf .venv")
        < ci.index("./course doctor")
        < ci.index("tests/tools/engines/wheels.py")
        < ci.index("./course test")
    )
    assert "./course test" in ci and "./course pairing" in ci
    assert "memlab CI: set-up" in ci  # the suite's own time, printed at the end
