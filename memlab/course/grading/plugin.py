"""The grader's pytest plugin: points markers, a time limit per test, and a log of every test.

``python -m memlab.grade`` runs pytest in a child process with ``-p memlab.course.grading.plugin``.
That process is trusted: the learner's code runs in learner processes of its own
(memlab.course.grading.sandbox), never here. Its environment variables:

- MEMLAB_GRADE_LOG_FD: the write end of a pipe (inherited; no file a learner process could find);
  the plugin writes JSON lines: "collected", then "start" and "end" for each test, at once, so
  the parent knows which test was running if this process dies or hangs past the watchdog.
- MEMLAB_GRADE_TIMEOUT: seconds per test; SIGALRM raises ``GradeTimeout`` in the test (also while
  it waits for the learner's process, which is then stopped).
- MEMLAB_GRADE_SKIP: a file of node ids already graded by an earlier child (after a crash).
- MEMLAB_GRADE_ONLY / MEMLAB_GRADE_TESTS: comma-separated exercise ids / test names to grade (all
  when unset).
- MEMLAB_GRADE_TIMED_OUT: ``exercise=test,...``: exercises a test of which timed out in an earlier
  child; their remaining tests are skipped.

Only tests that carry a ``points`` marker are graded; the others are deselected. After a test
times out, the exercise's remaining tests are skipped with a message: a loop that hangs one test
usually hangs them all, and each would cost the full time limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
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
    return int(n), mark.kwargs.get("exercise") or (
        mark.args[1] if len(mark.args) > 1 else "?"
    )


def skip_after_timeout(test: str) -> str:
    return (
        f"not run: {test} of this exercise timed out (an endless loop?); fix that first, its other tests "
        "would only wait for the same loop"
    )


def truncate(text: str, limit: int = OUTPUT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters cut] ...\n{text[-half:]}"


def _learner_frame(tb, learner_dir: str | None):
    """The deepest traceback frame in the learner's folder (else the deepest frame at all)."""
    best = last = None
    while tb is not None:
        last = tb
        if learner_dir and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(
            learner_dir
        ):
            best = tb
        tb = tb.tb_next
    return best or last


def describe(excinfo, learner_dir: str | None) -> str:
    """The first failing check, in plain words."""
    exc = excinfo.value
    where = getattr(
        exc, "where", ""
    )  # the learner's line, told by the learner's process
    if not where and not isinstance(exc, (sandbox.LearnerError, GradeTimeout)):
        frame = _learner_frame(excinfo.tb, learner_dir)
        if frame is not None:
            code = frame.tb_frame.f_code
            where = f"{Path(code.co_filename).name}:{frame.tb_lineno} in {code.co_name}"
    if isinstance(exc, GradeTimeout):
        return f"timed out after {exc.args[0]:g} s (an endless loop?)" + (
            f", at {where}" if where else ""
        )
    if isinstance(exc, sandbox.SandboxFailure):
        return str(exc)
    if isinstance(exc, NotImplementedError):
        return f"not written yet: {where or 'your code'} raises NotImplementedError"
    if isinstance(exc, AssertionError):
        text = str(exc).strip()
        if type(exc).__name__ == "CheckFailed":
            return text
        if isinstance(exc, sandbox.LearnerError):  # an assert in the learner's own code
            return f"your code's assert failed at {where}" + (
                f": {text.splitlines()[0]}" if text else ""
            )
        first = text.split("\n")[0] if text else ""
        return (
            f"check failed at {where}: {first}" if first else f"check failed at {where}"
        )
    if isinstance(exc, SyntaxError):
        return f"your file does not compile: {exc.msg} at {Path(exc.filename or '?').name}:{exc.lineno}"
    if isinstance(exc, pytest.skip.Exception):
        return f"skipped: {exc}"
    return f"your code raised {type(exc).__name__}: {str(exc).strip()[:300]}" + (
        f" (at {where})" if where else ""
    )


def _device() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"GPU ({torch.cuda.get_device_name()}), compiled kernels"
    except Exception:  # no torch: the tests will say so
        pass
    return "CPU, kernels in the Triton interpreter"


class Recorder:
    def __init__(
        self,
        log_fd: int,
        timeout: float,
        skip: set[str],
        only: set[str] | None = None,
        names: set[str] | None = None,
    ):
        self.log_fd = log_fd
        self.only = only
        self.names = names
        self.timeout = timeout
        self.skip = skip
        self.learner_dir = (
            os.path.abspath(os.environ.get("MEMLAB_EXERCISES", "")) or None
        )
        self.deadline = None
        self.current: dict | None = None
        self.timed_out: dict[str, str] = {}  # exercise id -> the test that timed out

    def write(self, **event) -> None:
        data = (json.dumps(event) + "\n").encode()
        while data:  # unbuffered: the parent must see it even if this process dies on the next line
            data = data[os.write(self.log_fd, data) :]

    # -- which tests ------------------------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        graded, keep, drop = [], [], []
        for item in items:
            pts = points_of(item)
            if (
                pts is None
                or (self.only and pts[1] not in self.only)
                or (self.names and item.name not in self.names)
            ):
                drop.append(item)
                continue
            graded.append(
                {
                    "nodeid": item.nodeid,
                    "points": pts[0],
                    "exercise": pts[1],
                    "gpu": item.get_closest_marker("gpu") is not None,
                }
            )
            (drop if item.nodeid in self.skip else keep).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep
        self.write(event="collected", tests=graded, device=_device())

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session):
        # The zygote finishes importing torch before the first test's clock starts.
        sandbox.ready()

    # -- one test ---------------------------------------------------------------------------
    def _on_alarm(self, signum, frame):
        raise GradeTimeout(self.timeout)

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise GradeTimeout(self.timeout)
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, left)

    @staticmethod
    def _disarm() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        pts = points_of(item)
        if (
            pts and pts[1] in self.timed_out
        ):  # the skipping plugin reads the mark at setup
            item.add_marker(
                pytest.mark.skip(reason=skip_after_timeout(self.timed_out[pts[1]]))
            )
        self.current = {
            "nodeid": item.nodeid,
            "outcome": "passed",
            "message": "",
            "exc_type": None,
            "output": "",
            "t0": time.monotonic(),
            "exercise": pts[1] if pts else None,
        }
        self.deadline = time.monotonic() + self.timeout
        self.write(event="start", nodeid=item.nodeid)
        yield
        cur = self.current
        self.write(
            event="end",
            nodeid=cur["nodeid"],
            outcome=cur["outcome"],
            message=cur["message"],
            exc_type=cur["exc_type"],
            output=truncate(cur["output"]),
            duration=round(time.monotonic() - cur["t0"], 3),
        )
        self.current = None

    @contextlib.contextmanager
    def _alarm(self):
        self._arm()
        try:
            yield
        finally:
            self._disarm()

    # The alarm covers the setup (fixtures run learner code too) and the test, one
    # deadline for both.
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        with self._alarm():
            yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        with self._alarm():
            yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        cur = self.current
        if cur is None or cur["outcome"] != "passed":
            return  # the first failure of a test is the one worth reading
        if report.failed or report.skipped:
            cur["outcome"] = "failed" if report.failed else "skipped"
            if call.excinfo is not None:
                exc = call.excinfo.value
                cur["exc_type"] = (
                    exc.kind
                    if isinstance(exc, sandbox.SandboxFailure)
                    else call.excinfo.typename
                )
                if isinstance(call.excinfo.value, GradeTimeout) and cur["exercise"]:
                    self.timed_out.setdefault(cur["exercise"], item.name)
                if report.skipped:
                    reason = (
                        report.longrepr[2]
                        if isinstance(report.longrepr, tuple)
                        else str(report.longrepr)
                    )
                    cur["message"] = reason.removeprefix("Skipped: ")
                else:
                    cur["message"] = describe(call.excinfo, self.learner_dir)

    def pytest_runtest_logreport(self, report):
        cur = self.current
        if cur is not None and report.when == "call":
            text = (report.capstdout or "") + (report.capstderr or "")
            cur["output"] = truncate(text, 4 * OUTPUT_LIMIT)  # cut again when logged


def pytest_configure(config):
    register_markers(config)
    log = os.environ.get("MEMLAB_GRADE_LOG_FD")
    if log:
        only = set(os.environ.get("MEMLAB_GRADE_ONLY", "").split(",")) - {""}
        src = Path(os.environ.get("MEMLAB_EXERCISES", "."))
        from memlab.course.grading import catalog

        files = [
            src / f"{e.file}.py" for e in catalog.EXERCISES if not only or e.id in only
        ]
        sandbox.warm(files)  # the zygote imports torch while pytest collects the tests
        skip_file = os.environ.get("MEMLAB_GRADE_SKIP")
        skip = (
            set(Path(skip_file).read_text().split("\n")) - {""}
            if skip_file and os.path.exists(skip_file)
            else set()
        )
        timeout = float(os.environ.get("MEMLAB_GRADE_TIMEOUT", "30"))
        names = set(os.environ.get("MEMLAB_GRADE_TESTS", "").split(",")) - {""}
        recorder = Recorder(int(log), timeout, skip, only or None, names or None)
        # Exercises that timed out in an earlier child (the parent passes them on after a crash).
        for pair in os.environ.get("MEMLAB_GRADE_TIMED_OUT", "").split(","):
            if "=" in pair:
                exercise, test = pair.split("=", 1)
                recorder.timed_out[exercise] = test
        config.pluginmanager.register(recorder, "memlab-grade-recorder")
