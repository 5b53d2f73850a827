"""The grader's engine: run the graded tests in a child pytest process and score them.

``grade()`` runs the graded tests (tests/exercises) of the chosen exercises against the learner's
folder (exercises/ by default), with a time limit per test, and returns a ``GradeReport``:
points earned per exercise, CPU points and GPU-only points apart.

The child pytest process is trusted: the learner's code runs in learner processes of its own
(memlab.course.grading.sandbox), which see neither the tests nor this log. A learner's endless
loop, crash (os._exit, a segfault) or exception costs that test's points and never stops the
grader: the child (memlab.course.grading.plugin) logs each test's start and end as it goes, over
a pipe; a test that hangs past the alarm and the watchdog is killed here, and after a kill or a
crash a new child grades the tests that are left. An exercise whose file imports or reads the
course's own implementation earns nothing (``ExerciseScore.course_code``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from memlab.course.grading import catalog
from memlab.course.grading.loader import ROOT, source_dir
from memlab.course.grading.sandbox import BLOCK_ENV

DEFAULT_TIMEOUT = (
    30.0  # seconds per test; kernels in the interpreter take a few at most
)
WATCHDOG_GRACE = 3.0  # extra seconds before a test that ignores the alarm is killed


class GradingError(RuntimeError):
    """The grader itself could not run the tests (not a learner's mistake)."""


@dataclass
class TestResult:
    nodeid: str
    exercise: str
    points: int
    gpu: bool
    outcome: str = "failed"  # passed | failed | skipped
    message: str = ""
    output: str = ""
    exc_type: str | None = None
    duration: float = 0.0

    @property
    def name(self) -> str:
        return self.nodeid.split("::", 1)[-1]

    @property
    def earned(self) -> int:
        return self.points if self.outcome == "passed" else 0


@dataclass
class ExerciseScore:
    exercise: catalog.Exercise
    tests: list[TestResult] = field(default_factory=list)

    def _pick(self, gpu: bool) -> list[TestResult]:
        return [t for t in self.tests if t.gpu == gpu]

    # CPU and GPU-only points are kept apart: a laptop cannot earn (nor lose) the GPU ones.
    earned = property(lambda self: sum(t.earned for t in self._pick(False)))
    possible = property(lambda self: sum(t.points for t in self._pick(False)))
    gpu_earned = property(lambda self: sum(t.earned for t in self._pick(True)))
    gpu_possible = property(lambda self: sum(t.points for t in self._pick(True)))
    gpu_ran = property(
        lambda self: any(t.outcome != "skipped" for t in self._pick(True))
    )

    @property
    def first_failure(self) -> TestResult | None:
        return next((t for t in self.tests if t.outcome == "failed"), None)

    @property
    def course_code(self) -> str | None:
        """Why the exercise earns nothing: its file uses the course's own code (None if it does not)."""
        return next(
            (t.message for t in self.tests if t.exc_type == "CourseCodeUsed"), None
        )

    @property
    def not_started(self) -> bool:
        """Every CPU test stopped at a NotImplementedError: the stub is untouched (or nearly)."""
        cpu = self._pick(False)
        return bool(cpu) and all(
            t.outcome == "failed" and t.exc_type == "NotImplementedError" for t in cpu
        )


@dataclass
class GradeReport:
    source: Path
    scores: list[ExerciseScore]
    seconds: float
    device: str

    @property
    def tests(self) -> list[TestResult]:
        return [t for s in self.scores for t in s.tests]

    earned = property(lambda self: sum(s.earned for s in self.scores))
    possible = property(lambda self: sum(s.possible for s in self.scores))
    gpu_earned = property(lambda self: sum(s.gpu_earned for s in self.scores))
    gpu_possible = property(lambda self: sum(s.gpu_possible for s in self.scores))
    gpu_ran = property(lambda self: any(s.gpu_ran for s in self.scores))


# -- running the child ------------------------------------------------------------------------


class _Log:
    """The read end of the event pipe: whole JSON lines, as they come."""

    def __init__(self):
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        self.rest = b""

    def read(self) -> list[dict]:
        chunks = [self.rest]
        while True:
            try:
                data = os.read(self.r, 1 << 16)
            except BlockingIOError:
                break
            if not data:
                break
            chunks.append(data)
        data = b"".join(chunks)
        end = data.rfind(b"\n") + 1  # a half-written last line is read next time
        self.rest = data[end:]
        return [json.loads(line) for line in data[:end].splitlines() if line.strip()]

    def close(self):
        for fd in (self.r, self.w):
            try:
                os.close(fd)
            except OSError:
                pass


def _crash_message(returncode: int, output: str, src: Path) -> str:
    if returncode < 0:
        try:
            how = f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"signal {-returncode}"
    else:
        how = f"exit code {returncode}"
    where = ""
    for m in re.finditer(r'File "([^"]+)", line (\d+)', output):
        if os.path.abspath(m.group(1)).startswith(str(src)):
            where = f", last seen at {Path(m.group(1)).name}:{m.group(2)}"
            break  # faulthandler prints the innermost frame first
    return (
        f"the test process died ({how}) during this test{where}: os._exit, a segfault or "
        "another crash in your code"
    )


def _child_command(files: list[str]) -> list[str]:
    # Plugins the graded tests do not use cost seconds at start-up (pytest rewrites their modules).
    off = [
        a
        for p in (
            "cacheprovider",
            "xdist",
            "randomly",
            "hypothesispytest",
            "anyio",
            "platformdirs",
        )
        for a in ("-p", f"no:{p}")
    ]
    return [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "memlab.course.grading.plugin",
        *off,
        "-o",
        "addopts=",
        "-q",
        "--tb=no",
        "--show-capture=no",
        "--no-header",
        "--continue-on-collection-errors",
        "-W",
        "ignore::DeprecationWarning",
        *files,
    ]


def run_tests(
    files: list[str],
    src: Path,
    timeout: float,
    only: list[str] | None = None,
    progress=None,
    tests: list[str] | None = None,
) -> tuple[list[dict], dict[str, TestResult], str]:
    """Run the graded tests in ``files`` against the folder ``src``; survive hangs and crashes."""
    from memlab.course.grading.plugin import (
        skip_after_timeout,
    )  # imports pytest, which grade() checked for

    work = Path(tempfile.mkdtemp(prefix="memlab-grade-"))
    log, skip, out = _Log(), work / "skip.txt", work / "child.out"
    path = [
        str(ROOT),
        *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p),
    ]
    blocked = [
        str(work),
        *(p for p in os.environ.get(BLOCK_ENV, "").split(os.pathsep) if p),
    ]
    env = dict(
        os.environ,
        MEMLAB_EXERCISES=str(src),
        MEMLAB_GRADE_LOG_FD=str(log.w),
        MEMLAB_GRADE_TIMEOUT=str(timeout),
        MEMLAB_GRADE_SKIP=str(skip),
        PYTHONDONTWRITEBYTECODE="1",
        MPLBACKEND="Agg",
        PYTHONPATH=os.pathsep.join(path),
        **{BLOCK_ENV: os.pathsep.join(blocked)},
    )
    if only:
        env["MEMLAB_GRADE_ONLY"] = ",".join(only)
    if tests:
        env["MEMLAB_GRADE_TESTS"] = ",".join(tests)
    collected: list[dict] = []
    device = "?"
    results: dict[str, TestResult] = {}
    meta: dict[str, dict] = {}
    try:
        while True:
            skip.write_text("\n".join(results))
            timed_out = {
                r.exercise: r.name
                for r in results.values()
                if r.exc_type in ("GradeTimeout", "Timeout")
            }
            env["MEMLAB_GRADE_TIMED_OUT"] = ",".join(
                f"{e}={t}" for e, t in timed_out.items()
            )
            with open(out, "wb") as out_f:
                child = subprocess.Popen(
                    _child_command(files),
                    cwd=ROOT,
                    env=env,
                    stdout=out_f,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=[log.w],
                )
                running, started, killed = None, 0.0, False
                while True:
                    rc = child.poll()
                    events = log.read()
                    for ev in events:
                        kind = ev["event"]
                        if kind == "collected" and not collected:
                            collected, device = ev["tests"], ev.get("device", "?")
                            meta = {t["nodeid"]: t for t in collected}
                        elif kind == "start":
                            running, started = ev["nodeid"], time.monotonic()
                        elif kind == "end":
                            m = meta[ev["nodeid"]]
                            results[ev["nodeid"]] = TestResult(
                                ev["nodeid"],
                                m["exercise"],
                                m["points"],
                                m["gpu"],
                                ev["outcome"],
                                ev["message"],
                                ev["output"],
                                ev["exc_type"],
                                ev["duration"],
                            )
                            running = None
                            if progress:
                                progress(results[ev["nodeid"]])
                    if rc is not None:
                        break
                    if (
                        running
                        and time.monotonic() - started > timeout + WATCHDOG_GRACE
                    ):
                        os.killpg(
                            child.pid, signal.SIGKILL
                        )  # the child and anything it started
                        child.wait()
                        killed = True
                    else:
                        time.sleep(0.05)
            if running is None:
                break
            # A test started and never ended: it hung past the watchdog or took the process down.
            m = meta[running]
            text = out.read_text(errors="replace")
            message = (
                f"timed out after {timeout:g} s and ignored the alarm (an endless loop that catches "
                "every exception?)"
                if killed
                else _crash_message(child.returncode, text, src)
            )
            results[running] = TestResult(
                running,
                m["exercise"],
                m["points"],
                m["gpu"],
                "failed",
                message,
                text[-2000:],
                "Crash" if not killed else "Timeout",
                timeout,
            )
            if progress:
                progress(results[running])
            if killed:  # the exercise's other tests would hang the same way: skip them
                for t in collected:
                    if t["exercise"] == m["exercise"] and t["nodeid"] not in results:
                        results[t["nodeid"]] = TestResult(
                            t["nodeid"],
                            t["exercise"],
                            t["points"],
                            t["gpu"],
                            "skipped",
                            skip_after_timeout(results[running].name),
                        )
                        if progress:
                            progress(results[t["nodeid"]])
        if not collected and not results:
            raise GradingError(
                "pytest collected no graded tests; its output ends with:\n"
                + out.read_text(errors="replace")[-3000:]
            )
        for (
            t
        ) in collected:  # collected but never reported: the child stopped between tests
            if t["nodeid"] not in results:
                results[t["nodeid"]] = TestResult(
                    t["nodeid"],
                    t["exercise"],
                    t["points"],
                    t["gpu"],
                    "failed",
                    "not run: the test process stopped before this test",
                )
        return collected, results, device
    finally:
        log.close()
        shutil.rmtree(work, ignore_errors=True)


# -- grading ----------------------------------------------------------------------------------


def check_checkout() -> Path:
    """The repository root, above the memlab package; it must hold the graded tests and exercises."""
    missing = [
        d
        for d in ("exercises", "solutions", "tests/exercises")
        if not (ROOT / d).is_dir()
    ]
    if missing:
        raise GradingError(
            f"memlab was imported from {ROOT / 'memlab'}, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not next to it: grade from a clone of the "
            "course repository (pip install -e . there)"
        )
    return ROOT


def grade(
    chapters: list[int] | None = None,
    source: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    exercises: list[str] | None = None,
    progress=None,
    tests: list[str] | None = None,
) -> GradeReport:
    """Grade the chosen chapters (all when None) of the learner's folder; see the module doc.
    ``tests``: only the graded tests of these names (the points of the others are not counted)."""
    if importlib.util.find_spec("pytest") is None:
        raise GradingError(
            "the grader runs the tests with pytest, which is not installed: pip install pytest"
        )
    check_checkout()
    src = source_dir(source)
    if exercises:
        exercises = [catalog.find(x).id for x in exercises]  # a file's name will do too
    chosen = [
        e
        for e in catalog.EXERCISES
        if (not chapters or e.chapter in chapters)
        and (not exercises or e.id in exercises)
    ]
    if not chosen:
        raise GradingError(
            f"no exercise matches chapters={chapters} exercises={exercises}"
        )
    files = sorted({str(ROOT / e.test_file) for e in chosen})
    t0 = time.monotonic()
    _, results, device = run_tests(
        files, src, timeout, only=[e.id for e in chosen], progress=progress, tests=tests
    )
    scores = []
    only_tests = tests
    for e in chosen:
        tests = [r for r in results.values() if r.exercise == e.id]
        missing = e.points - sum(t.points for t in tests if not t.gpu)
        if (
            missing > 0 and not only_tests
        ):  # a test file that failed to import: its points are still at stake
            tests.append(
                TestResult(
                    f"{e.test_file}::collection",
                    e.id,
                    missing,
                    False,
                    "failed",
                    f"{missing} points of tests could not be collected (a broken test file?)",
                )
            )
        score = ExerciseScore(e, tests)
        why = score.course_code
        if why:  # the course's own code did the work (or was read): no test of the exercise counts
            for t in tests:
                if t.outcome != "skipped":
                    t.outcome, t.message, t.exc_type = "failed", why, "CourseCodeUsed"
        scores.append(score)
    return GradeReport(src, scores, time.monotonic() - t0, device)
