"""The grader's engine: run the graded tests in a child pytest process and score them.

``grade()`` runs the graded tests (tests/exercises) of the chosen exercises against the learner's
folder (exercises/ by default), with a time limit per test, and returns a ``GradeReport``:
points per exercise, CPU and GPU-only points apart, and the seed its random cases came from.

The child pytest is trusted; the learner's code runs in learner processes of its own
(memlab.course.grading.sandbox). The child starts from a private folder holding only a link to
the ``memlab`` package (no folder of the repository on its path) and logs each test's start and
end on a pipe (memlab.course.grading.plugin). The runner takes only the events of the test that
is running: a test that hangs past the alarm and a grace period is killed, a child that dies or
breaks the log's order fails the running test, and a new child, started once the course's files
are checked unchanged, grades the tests that are left. An exercise whose file imports or reads
the course's own implementation earns nothing (``ExerciseScore.course_code``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import select
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

DEFAULT_TIMEOUT = (
    30.0  # seconds per test; kernels in the interpreter take a few at most
)
WATCHDOG_GRACE = 3.0  # extra seconds before a test that ignores the alarm is killed
SEED_ENV = "MEMLAB_GRADE_SEED"


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
        """Why the exercise earns nothing: its file uses the course's own code (else None)."""
        used = (t.message for t in self.tests if t.exc_type == "CourseCodeUsed")
        return next(used, None)

    @property
    def not_started(self) -> bool:
        """Every CPU test stopped at a NotImplementedError: the stub is untouched (or nearly)."""
        cpu = self._pick(False)
        nie = [
            t.outcome == "failed" and t.exc_type == "NotImplementedError" for t in cpu
        ]
        return bool(cpu) and all(nie)


@dataclass
class GradeReport:
    source: Path
    scores: list[ExerciseScore]
    seconds: float
    device: str
    seed: int = 0

    @property
    def tests(self) -> list[TestResult]:
        return [t for s in self.scores for t in s.tests]

    earned = property(lambda self: sum(s.earned for s in self.scores))
    possible = property(lambda self: sum(s.possible for s in self.scores))
    gpu_earned = property(lambda self: sum(s.gpu_earned for s in self.scores))
    gpu_possible = property(lambda self: sum(s.gpu_possible for s in self.scores))
    gpu_ran = property(lambda self: any(s.gpu_ran for s in self.scores))


# -- the child ------------------------------------------------------------------------------


def course_digest() -> str:
    """A digest of the course's code that the child imports: it must not change while grading
    (a child started after a crash runs exactly what the first one ran)."""
    h = hashlib.sha256()
    files = [
        *sorted((ROOT / "memlab").rglob("*.py")),
        *sorted((ROOT / "kernels").glob("*.py")),
    ]
    files += [
        *sorted((ROOT / "tests" / "exercises").glob("*.py")),
        ROOT / "tests" / "conftest.py",
    ]
    for f in files:
        h.update(str(f).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _child(files, env, work: Path) -> subprocess.Popen:
    # Plugins the graded tests do not use cost seconds at start-up (pytest rewrites them).
    off = (
        "cacheprovider",
        "xdist",
        "randomly",
        "hypothesispytest",
        "anyio",
        "benchmark",
    )
    args = [sys.executable, "-s", "-m", "pytest", "-p", "memlab.course.grading.plugin"]
    args += [a for p in off for a in ("-p", f"no:{p}")]
    args += ["-o", "addopts=", "--import-mode=importlib", "--rootdir", str(ROOT), "-q"]
    args += ["--tb=no", "--no-header", "--continue-on-collection-errors"]
    args += ["-W", "ignore::DeprecationWarning", *files]
    with open(work / "child.out", "ab") as out:
        return subprocess.Popen(
            args,
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, which the runner may kill
            pass_fds=[int(env["MEMLAB_GRADE_LOG_FD"])],
        )


def _how(rc: int) -> str:
    try:
        return f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
    except ValueError:
        return f"signal {-rc}"


class _Events:
    """The child's log, read line by line, taking only what may come next: "collected" first,
    then "start" of a test not graded yet and the "end" of that same test."""

    def __init__(self, fd: int):
        self.fd, self.rest = fd, b""

    def read(self, timeout: float) -> list[dict] | None:
        """The whole lines that arrived (None: the log says something it may not)."""
        if not select.select([self.fd], [], [], timeout)[0]:
            return []
        data = self.rest + os.read(self.fd, 1 << 20)
        *lines, self.rest = data.split(b"\n")
        if len(self.rest) > 8 << 20:
            return None
        try:
            return [json.loads(line) for line in lines]
        except ValueError:
            return None


def run_tests(files, src: Path, timeout: float, env: dict, progress=None):
    """Run the graded tests in ``files`` against ``src``: (collected, results, device)."""
    base = env.get("MEMLAB_SANDBOX_DIR") or None  # on Gradescope root's, not /tmp
    work = Path(tempfile.mkdtemp(prefix="memlab-grade-", dir=base))  # cwd, import path
    (work / "memlab").symlink_to(ROOT / "memlab", target_is_directory=True)
    r, w = os.pipe()
    path = [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not _in_root(p)
    ]
    env = dict(env, PYTHONPATH=os.pathsep.join([str(work), *path]))
    env.update(MEMLAB_EXERCISES=str(src), MEMLAB_GRADE_LOG_FD=str(w))
    # the zygote's folder goes with this one
    env.setdefault("MEMLAB_SANDBOX_DIR", str(work))
    env.update(
        MEMLAB_GRADE_TIMEOUT=str(timeout), PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg"
    )
    collected, results, device, meta = [], {}, "?", {}
    digest = course_digest()

    def record(t, outcome, message, exc_type=None, output="", duration=0.0):
        m = meta[t]
        res = TestResult(t, m["exercise"], m["points"], m["gpu"], outcome, message)
        res.output, res.exc_type, res.duration = output, exc_type, duration
        results[t] = res
        if progress:
            progress(res)

    try:
        while True:
            late = [
                v for v in results.values() if v.exc_type in ("Timeout", "GradeTimeout")
            ]
            env["MEMLAB_GRADE_TIMED_OUT"] = ",".join(
                f"{v.exercise}={v.name}" for v in late
            )
            env["MEMLAB_GRADE_DONE"] = "\n".join(results)
            child, events = _child(files, env, work), _Events(r)
            running, started, how, first = None, 0.0, None, True
            while how is None:
                exited = child.poll() is not None
                got = events.read(0 if exited else 0.05)
                for ev in got or ():
                    kind = ev.get("event") if isinstance(ev, dict) else None
                    nodeid = ev.get("nodeid") if kind else None
                    if kind == "collected" and first:
                        if ev.get("seed") != env[SEED_ENV]:
                            child.kill()
                            raise GradingError(
                                "the tests' process did not get the seed"
                            )
                        if not collected:
                            collected, device = ev["tests"], str(ev.get("device", "?"))
                            meta = {t["nodeid"]: t for t in collected}
                    elif kind == "start" and running is None and nodeid in meta:
                        if nodeid in results:
                            got = None
                            break
                        running, started = nodeid, time.monotonic()
                    elif kind == "end" and running is not None and nodeid == running:
                        record(running, *_end(ev))
                        running = None
                    else:
                        got = None
                        break
                    first = False
                if got is None:
                    how = "broke"
                elif running and time.monotonic() - started > timeout + WATCHDOG_GRACE:
                    how = "hung"
                elif exited and not got:
                    how = "ended"
            if child.poll() is None:  # hung, or broke the log: it and all it started
                os.killpg(child.pid, signal.SIGKILL)  # our own child, not reaped yet
            rc = child.wait()
            if running is None:
                break
            if how == "hung":
                why = (
                    f"timed out after {timeout:g} s and ignored the alarm (an endless loop "
                    "that catches every exception?)"
                )
                record(running, "failed", why, "Timeout", duration=timeout)
                after = _skip_after(results[running])  # its other tests: the same loop
            else:
                why = (
                    f"the grader's test process died ({_how(rc)}) during this test"
                    if how == "ended"
                    else "the grader's test process broke the order of its log in this test"
                )
                tail = (work / "child.out").read_text(errors="replace")[-2000:]
                record(running, "failed", why, "Crash", output=tail)
                after = f"not run: {why} ({results[running].name})"
            for t in collected:  # a loop or a grader killed once would be met again
                if (
                    t["exercise"] == meta[running]["exercise"]
                    and t["nodeid"] not in results
                ):
                    record(t["nodeid"], "skipped" if how == "hung" else "failed", after)
            if course_digest() != digest:
                raise GradingError(
                    "the course's own files changed while it was grading"
                )
        if not collected:
            tail = (work / "child.out").read_text(errors="replace")[-3000:]
            raise GradingError(
                f"pytest collected no graded tests; its output ends with:\n{tail}"
            )
        for t in collected:  # collected but never run: the child stopped between tests
            if t["nodeid"] not in results:
                record(
                    t["nodeid"], "failed", "not run: the test process stopped before it"
                )
        return collected, results, device
    finally:
        os.close(r)
        os.close(w)
        shutil.rmtree(work, ignore_errors=True)


def _end(ev) -> tuple:
    """(outcome, message, exc_type, output, duration) of an "end" event, as plain values."""
    outcome = (
        ev.get("outcome") if ev.get("outcome") in ("passed", "skipped") else "failed"
    )
    exc = ev.get("exc_type")
    duration = ev.get("duration")
    duration = float(duration) if isinstance(duration, (int, float)) else 0.0
    text = [str(ev.get(k) or "") for k in ("message", "output")]
    return outcome, text[0], None if exc is None else str(exc), text[1], duration


def _skip_after(t: TestResult) -> str:
    from memlab.course.grading.plugin import skip_after_timeout

    return skip_after_timeout(t.name)


def _in_root(p: str) -> bool:
    real, root = os.path.realpath(p), os.path.realpath(ROOT)
    return real == root or real.startswith(root + os.sep)


# -- grading ------------------------------------------------------------------------------


def check_checkout() -> Path:
    """The repository root, above the memlab package: it holds the tests and the exercises."""
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


def draw_seed(seed: int | None = None) -> int:
    """The seed of this run's random cases: given (``--seed``) or drawn afresh."""
    return int.from_bytes(os.urandom(4), "big") if seed is None else int(seed)


def grade(
    chapters: list[int] | None = None,
    source: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    exercises: list[str] | None = None,
    progress=None,
    tests: list[str] | None = None,
    seed: int | None = None,
    env: dict | None = None,
) -> GradeReport:
    """Grade the chosen chapters (all when None) of the learner's folder; see the module doc.
    ``tests``: only the graded tests of these names (the others' points are not counted);
    ``seed``: the random cases' seed (drawn when None); ``env``: the child's environment."""
    if importlib.util.find_spec("pytest") is None:
        raise GradingError("the grader runs the tests with pytest: pip install pytest")
    check_checkout()
    src = source_dir(source)
    ids = [catalog.find(x).id for x in exercises or ()]  # a file's name will do too
    chosen = [
        e
        for e in catalog.EXERCISES
        if (not chapters or e.chapter in chapters) and (not ids or e.id in ids)
    ]
    if not chosen:
        raise GradingError(
            f"no exercise matches chapters={chapters} exercises={exercises}"
        )
    seed = draw_seed(seed)
    env = dict(os.environ if env is None else env, **{SEED_ENV: str(seed)})
    # the suite's "a skip fails in CI" is not the grader's: a skip is 0
    env.pop("CI", None)
    env["MEMLAB_GRADE_ONLY"] = ",".join(e.id for e in chosen)
    env["MEMLAB_GRADE_TESTS"] = ",".join(tests or ())
    files = sorted({str(ROOT / e.test_file) for e in chosen})
    t0 = time.monotonic()
    _, results, device = run_tests(files, src, timeout, env, progress)
    scores = []
    for e in chosen:
        got = [r for r in results.values() if r.exercise == e.id]
        missing = e.points - sum(t.points for t in got if not t.gpu)
        # a test file that did not import: its points count
        if missing > 0 and not tests:
            why = f"{missing} points of tests could not be collected (a broken test file?)"
            got.append(
                TestResult(
                    f"{e.test_file}::collection", e.id, missing, False, message=why
                )
            )
        score = ExerciseScore(e, got)
        why = score.course_code
        for t in got if why else ():  # the course's code did the work: no test counts
            if t.outcome != "skipped":
                t.outcome, t.message, t.exc_type = "failed", why, "CourseCodeUsed"
        scores.append(score)
    return GradeReport(src, scores, time.monotonic() - t0, device, seed)
