"""The grader's pytest plugin: points markers, a time limit per test, and a log of every test.

The runner (memlab.course.grading.runner) starts pytest with ``-p memlab.course.grading.plugin``
in a child process of its own. That process is trusted: the learner's code runs in learner
processes (memlab.course.grading.sandbox), never here. Its environment:

- MEMLAB_GRADE_LOG_FD: the write end of a pipe; the plugin writes JSON lines, "collected" first,
  then "start" and "end" for each test at once, so the runner knows which test was running if
  this process dies or hangs;
- MEMLAB_GRADE_TIMEOUT: seconds per test; SIGALRM raises ``GradeTimeout`` in the test (also while
  it waits for the learner's process, which is then stopped);
- MEMLAB_GRADE_DONE: node ids an earlier child already graded (one per line; after a crash);
- MEMLAB_GRADE_ONLY / MEMLAB_GRADE_TESTS: exercise ids / test names to grade (all when unset);
- MEMLAB_GRADE_TIMED_OUT: ``exercise=test,...``: exercises whose test timed out in an earlier
  child; their other tests are skipped (each would wait for the same loop).

Only tests with a ``points`` marker are graded; the others are deselected.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from memlab.course.grading import sandbox

MARKERS = (
    "points(n, exercise): this test is worth n points of the exercise with that catalog id",
    "gpu: needs a CUDA device; skipped without one",
    "kernel: runs a Triton kernel (interpreter on CPU, compiled on a GPU)",
)
OUTPUT_LIMIT = 3000  # characters of a test's captured output kept in the log


class GradeTimeout(BaseException):
    """Raised by the per-test alarm; a BaseException so ``except Exception`` cannot swallow it."""


def register_markers(config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)


def points_of(item) -> tuple[int, str] | None:
    """(points, exercise id) of a graded test, or None."""
    mark = item.get_closest_marker("points")
    if mark is None:
        return None
    n = mark.args[0] if mark.args else mark.kwargs["n"]
    ex = mark.kwargs.get("exercise") or (mark.args[1] if len(mark.args) > 1 else "?")
    return int(n), ex


def skip_after_timeout(test: str) -> str:
    return (
        f"not run: {test} of this exercise timed out (an endless loop?); fix that first, "
        "its other tests would only wait for the same loop"
    )


def truncate(text: str, limit: int = OUTPUT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    cut = len(text) - 2 * half
    return f"{text[:half]}\n... [{cut} characters cut] ...\n{text[-half:]}"


def describe(excinfo) -> str:
    """The first failing check, in plain words."""
    exc = excinfo.value
    where = getattr(exc, "where", "")  # the learner's line, told by its process
    text = str(exc).strip()
    if isinstance(exc, GradeTimeout):
        at = f", at {where}" if where else ""
        return f"timed out after {exc.args[0]:g} s (an endless loop?){at}"
    if isinstance(exc, (sandbox.SandboxFailure, sandbox.NotPlainValue)):
        return text
    if isinstance(exc, pytest.skip.Exception):
        return f"skipped: {exc}"
    if type(exc).__name__ == "CheckFailed":
        return text
    if not isinstance(exc, sandbox.LearnerError):  # the test's own assert or error
        tb = excinfo.traceback[-1]
        first = text.split("\n")[0]
        at = f"check failed at {Path(str(tb.path)).name}:{tb.lineno + 1}"
        return at + (f": {first}" if first else "")
    if isinstance(exc, NotImplementedError):
        return f"not written yet: {where or 'your code'} raises NotImplementedError"
    if isinstance(exc, AssertionError):
        first = f": {text.splitlines()[0]}" if text else ""
        return f"your code's assert failed at {where}{first}"
    if isinstance(exc, SyntaxError):
        return f"your file does not compile: {text}"
    at = f" (at {where})" if where else ""
    return f"your code raised {type(exc).__name__}: {text[:300]}{at}"


def _device() -> str:
    import torch

    if torch.cuda.is_available():
        return f"GPU ({torch.cuda.get_device_name()}), compiled kernels"
    return "CPU, kernels in the Triton interpreter"


class Recorder:
    def __init__(self, log_fd: int, timeout: float, done: set[str], only, names):
        self.log_fd, self.timeout, self.done = log_fd, timeout, done
        self.only, self.names = only, names
        self.deadline = 0.0
        self.current: dict | None = None
        self.timed_out: dict[str, str] = {}  # exercise id -> the test that timed out

    def write(self, **event) -> None:
        data = (json.dumps(event) + "\n").encode()
        while data:  # unbuffered: the runner must see it even if this process dies next
            data = data[os.write(self.log_fd, data) :]

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        graded, keep, drop = [], [], []
        for item in items:
            pts = points_of(item)
            wanted = pts and (not self.only or pts[1] in self.only)
            if not wanted or (self.names and item.name not in self.names):
                drop.append(item)
                continue
            gpu = item.get_closest_marker("gpu") is not None
            graded.append(
                dict(nodeid=item.nodeid, points=pts[0], exercise=pts[1], gpu=gpu)
            )
            (drop if item.nodeid in self.done else keep).append(item)
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
        seed = os.environ.get("MEMLAB_GRADE_SEED", "")  # the runner checks it arrived
        self.write(event="collected", tests=graded, device=_device(), seed=seed)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session):
        sandbox.ready()  # the zygote has imported torch before the first test's clock starts

    def _on_alarm(self, signum, frame):
        raise GradeTimeout(self.timeout)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        pts = points_of(item)
        # the skipping plugin reads the mark at setup
        if pts and pts[1] in self.timed_out:
            item.add_marker(
                pytest.mark.skip(reason=skip_after_timeout(self.timed_out[pts[1]]))
            )
        self.current = dict(
            nodeid=item.nodeid, outcome="passed", message="", exc_type=None
        )
        self.current.update(output="", exercise=pts[1] if pts else None)
        t0 = time.monotonic()
        self.deadline = t0 + self.timeout
        self.write(event="start", nodeid=item.nodeid)
        yield
        cur, self.current = self.current, None
        cur.update(
            output=truncate(cur["output"]), duration=round(time.monotonic() - t0, 3)
        )
        del cur["exercise"]
        self.write(event="end", **cur)

    # One deadline for the setup (fixtures run learner code too) and the test itself.
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._alarm()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._alarm()

    def _alarm(self):
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(
            signal.ITIMER_REAL, max(1e-3, self.deadline - time.monotonic())
        )
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = (yield).get_result()
        cur = self.current
        if cur is None or cur["outcome"] != "passed" or report.passed:
            return  # the first failure of a test is the one worth reading
        cur["outcome"] = "failed" if report.failed else "skipped"
        if call.excinfo is None:
            return
        exc = call.excinfo.value
        cur["exc_type"] = getattr(exc, "kind", None) or call.excinfo.typename
        if isinstance(exc, GradeTimeout) and cur["exercise"]:
            self.timed_out.setdefault(cur["exercise"], item.name)
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
            cur["message"] = str(reason).removeprefix("Skipped: ")
        else:
            cur["message"] = describe(call.excinfo)

    def pytest_runtest_logreport(self, report):
        if self.current is not None and report.when == "call":
            text = (report.capstdout or "") + (report.capstderr or "")
            self.current["output"] = truncate(text, 4 * OUTPUT_LIMIT)


def _register_tests_package(root: Path) -> None:
    """The tests folder as the package memlab_tests, which the graded tests import from (as
    tests/tools/loading.py makes it for the suite): never a folder on sys.path."""
    if "memlab_tests" not in sys.modules:
        spec = importlib.machinery.ModuleSpec("memlab_tests", None, is_package=True)
        spec.submodule_search_locations = [str(root / "tests")]
        sys.modules["memlab_tests"] = importlib.util.module_from_spec(spec)


def pytest_configure(config):
    register_markers(config)
    log = os.environ.get("MEMLAB_GRADE_LOG_FD")
    if not log:
        return
    # no process of this user may open /proc/<this>/fd
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    sandbox.warm()  # the zygote imports torch while pytest collects the tests
    _register_tests_package(sandbox.ROOT)
    env = os.environ.get

    def names(key, sep=","):
        return set(env(key, "").split(sep)) - {""}

    recorder = Recorder(
        int(log),
        float(env("MEMLAB_GRADE_TIMEOUT", "30")),
        names("MEMLAB_GRADE_DONE", "\n"),
        names("MEMLAB_GRADE_ONLY"),
        names("MEMLAB_GRADE_TESTS"),
    )
    for pair in names("MEMLAB_GRADE_TIMED_OUT"):
        exercise, _, test = pair.partition("=")
        recorder.timed_out[exercise] = test
    config.pluginmanager.register(recorder, "memlab-grade-recorder")
