"""The autograder: ``python -m memlab.grade [chapter ...] [--solutions | --from DIR] [--results FILE]``.

It runs the graded tests (tests/exercises) in a child pytest process against the learner's
folder (exercises/ by default), with a time limit per test, and prints a score table: points
earned per exercise, the first failing check in plain words, a CPU total, and GPU-only points
apart. ``--results`` writes Gradescope's results.json; ``--gradescope-bundle out.zip`` writes a
whole Gradescope autograder (memlab.grading.gradescope).

A learner's endless loop, crash (os._exit, a segfault) or exception costs that test's points and
never stops the grader: the child logs each test's start and end as it goes; a test that hangs
past the alarm is killed by a watchdog here, and after a kill or a crash a new child grades the
tests that are left.
"""

from __future__ import annotations

import argparse
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

from memlab.grading import catalog
from memlab.grading.loader import ROOT, source_dir

DEFAULT_TIMEOUT = 30.0  # seconds per test; kernels in the interpreter take a few at most
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
    gpu_ran = property(lambda self: any(t.outcome != "skipped" for t in self._pick(True)))

    @property
    def first_failure(self) -> TestResult | None:
        return next((t for t in self.tests if t.outcome == "failed"), None)

    @property
    def not_started(self) -> bool:
        """Every CPU test stopped at a NotImplementedError: the stub is untouched (or nearly)."""
        cpu = self._pick(False)
        return bool(cpu) and all(t.outcome == "failed" and t.exc_type == "NotImplementedError" for t in cpu)


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

def _read_events(path: Path, offset: int) -> tuple[list[dict], int]:
    if not path.exists():
        return [], offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1  # a half-written last line is read next time
    events = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return events, offset + end


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
    return (f"the test process died ({how}) during this test{where}: os._exit, a segfault or "
            "another crash in your code")


def _child_command(files: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "memlab.grading.plugin", "-p", "no:cacheprovider",
            "-p", "no:xdist", "-p", "no:randomly", "-o", "addopts=", "-q", "--tb=no", "--show-capture=no",
            "--no-header", "--continue-on-collection-errors", "-W", "ignore::DeprecationWarning", *files]


def run_tests(files: list[str], src: Path, timeout: float, only: list[str] | None = None,
              progress=None, tests: list[str] | None = None) -> tuple[list[dict], dict[str, TestResult], str]:
    """Run the graded tests in ``files`` against the folder ``src``; survive hangs and crashes."""
    from memlab.grading.plugin import skip_after_timeout  # imports pytest, which grade() checked for
    work = Path(tempfile.mkdtemp(prefix="memlab-grade-"))
    log, skip, out = work / "log.jsonl", work / "skip.txt", work / "child.out"
    path = [str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env = dict(os.environ, MEMLAB_EXERCISES=str(src), MEMLAB_GRADE_LOG=str(log),
               MEMLAB_GRADE_TIMEOUT=str(timeout), MEMLAB_GRADE_SKIP=str(skip), PYTHONDONTWRITEBYTECODE="1",
               MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join(path))
    if only:
        env["MEMLAB_GRADE_ONLY"] = ",".join(only)
    if tests:
        env["MEMLAB_GRADE_TESTS"] = ",".join(tests)
    collected: list[dict] = []
    device = "?"
    results: dict[str, TestResult] = {}
    meta: dict[str, dict] = {}
    offset = 0
    try:
        while True:
            skip.write_text("\n".join(results))
            timed_out = {r.exercise: r.name for r in results.values() if r.exc_type in ("GradeTimeout", "Timeout")}
            env["MEMLAB_GRADE_TIMED_OUT"] = ",".join(f"{e}={t}" for e, t in timed_out.items())
            with open(out, "wb") as out_f:
                child = subprocess.Popen(_child_command(files), cwd=ROOT, env=env, stdout=out_f,
                                         stderr=subprocess.STDOUT, start_new_session=True)
                running, started, killed = None, 0.0, False
                while True:
                    rc = child.poll()
                    events, offset = _read_events(log, offset)
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
                                ev["nodeid"], m["exercise"], m["points"], m["gpu"], ev["outcome"], ev["message"],
                                ev["output"], ev["exc_type"], ev["duration"])
                            running = None
                            if progress:
                                progress(results[ev["nodeid"]])
                    if rc is not None:
                        break
                    if running and time.monotonic() - started > timeout + WATCHDOG_GRACE:
                        os.killpg(child.pid, signal.SIGKILL)  # the child and anything it started
                        child.wait()
                        killed = True
                    else:
                        time.sleep(0.05)
            if running is None:
                break
            # A test started and never ended: it hung past the watchdog or took the process down.
            m = meta[running]
            text = out.read_text(errors="replace")
            message = (f"timed out after {timeout:g} s and ignored the alarm (an endless loop that catches "
                       "every exception?)" if killed else _crash_message(child.returncode, text, src))
            results[running] = TestResult(running, m["exercise"], m["points"], m["gpu"], "failed", message,
                                          text[-2000:], "Crash" if not killed else "Timeout", timeout)
            if progress:
                progress(results[running])
            if killed:  # the exercise's other tests would hang the same way: skip them
                for t in collected:
                    if t["exercise"] == m["exercise"] and t["nodeid"] not in results:
                        results[t["nodeid"]] = TestResult(t["nodeid"], t["exercise"], t["points"], t["gpu"],
                                                          "skipped", skip_after_timeout(results[running].name))
                        if progress:
                            progress(results[t["nodeid"]])
        if not collected and not results:
            raise GradingError("pytest collected no graded tests; its output ends with:\n"
                               + out.read_text(errors="replace")[-3000:])
        for t in collected:  # collected but never reported: the child stopped between tests
            if t["nodeid"] not in results:
                results[t["nodeid"]] = TestResult(t["nodeid"], t["exercise"], t["points"], t["gpu"], "failed",
                                                  "not run: the test process stopped before this test")
        return collected, results, device
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- grading ----------------------------------------------------------------------------------

def check_checkout() -> Path:
    """The repository root, above the memlab package; it must hold the graded tests and exercises."""
    missing = [d for d in ("exercises", "solutions", "tests/exercises") if not (ROOT / d).is_dir()]
    if missing:
        raise GradingError(f"memlab was imported from {ROOT / 'memlab'}, but {', '.join(missing)} "
                           f"{'is' if len(missing) == 1 else 'are'} not next to it: grade from a clone of the "
                           "course repository (pip install -e . there)")
    return ROOT


def grade(chapters: list[int] | None = None, source: str | None = None, timeout: float = DEFAULT_TIMEOUT,
          exercises: list[str] | None = None, progress=None, tests: list[str] | None = None) -> GradeReport:
    """Grade the chosen chapters (all when None) of the learner's folder; see the module doc.
    ``tests``: only the graded tests of these names (the points of the others are not counted)."""
    if importlib.util.find_spec("pytest") is None:
        raise GradingError("the grader runs the tests with pytest, which is not installed: pip install pytest")
    check_checkout()
    src = source_dir(source)
    chosen = [e for e in catalog.EXERCISES
              if (not chapters or e.chapter in chapters) and (not exercises or e.id in exercises)]
    if not chosen:
        raise GradingError(f"no exercise matches chapters={chapters} exercises={exercises}")
    files = sorted({str(ROOT / e.test_file) for e in chosen})
    t0 = time.monotonic()
    _, results, device = run_tests(files, src, timeout, only=[e.id for e in chosen], progress=progress, tests=tests)
    scores = []
    only_tests = tests
    for e in chosen:
        tests = [r for r in results.values() if r.exercise == e.id]
        missing = e.points - sum(t.points for t in tests if not t.gpu)
        if missing > 0 and not only_tests:  # a test file that failed to import: its points are still at stake
            tests.append(TestResult(f"{e.test_file}::collection", e.id, missing, False, "failed",
                                    f"{missing} points of tests could not be collected (a broken test file?)"))
        scores.append(ExerciseScore(e, tests))
    return GradeReport(src, scores, time.monotonic() - t0, device)


# -- reporting ---------------------------------------------------------------------------------

def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def format_table(report: GradeReport, width: int = 118) -> str:
    try:
        where = report.source.relative_to(ROOT)
    except ValueError:
        where = report.source
    lines = [f"memlab grade: {where}/ on {report.device}", ""]
    head = f"{'ch':>2}  {'exercise':<26} {'points':>7}  first failing check"
    lines += [head, "-" * min(width, 100)]
    for s in report.scores:
        fail = s.first_failure
        pts = f"{s.earned}/{s.possible}"
        if s.not_started:
            check = f"not started: {where}/{s.exercise.file}.py raises NotImplementedError"
        else:
            check = "-" if fail is None else _clip(fail.message or fail.outcome, width - 41)
        lines.append(f"{s.exercise.chapter:02d}  {s.exercise.id:<26} {pts:>7}  {check}")
    lines.append("-" * min(width, 100))
    lines.append(f"{'':>2}  {'total (CPU)':<26} {f'{report.earned}/{report.possible}':>7}")
    if report.gpu_possible:
        if report.gpu_ran:
            lines.append(f"{'':>2}  {'GPU-only':<26} {f'{report.gpu_earned}/{report.gpu_possible}':>7}")
        else:
            lines.append(f"    GPU-only checks ({report.gpu_possible} points) skipped: no CUDA device here "
                         "(run the grader in Colab on a GPU for them)")
    lines.append(f"    graded in {report.seconds:.1f} s")
    tried = [s for s in report.scores if not s.not_started]
    idle = len(report.scores) - len(tried)
    if idle:
        lines.append(f"    {idle} exercise{'s' if idle != 1 else ''} not started yet: fill in a stub, then grade again")
    failing = [t for s in tried for t in s.tests if t.outcome == "failed"]
    if failing:
        lines += ["", "What failed (fix the first one in each exercise first):"]
        for s in tried:
            for t in s.tests:
                if t.outcome == "failed":
                    lines.append(f"  {t.exercise} · {t.name} ({t.points} pt{'s' if t.points != 1 else ''}): "
                                 f"{_clip(t.message, 400)}")
            after = [t for t in s.tests if t.outcome == "skipped" and not t.gpu]
            if after:
                lines.append(f"  {s.exercise.id} · {len(after)} more test{'s' if len(after) != 1 else ''}: "
                             f"{_clip(after[0].message, 300)}")
    return "\n".join(lines)


def gradescope_results(report: GradeReport, table: str) -> dict:
    """Gradescope's results.json: one entry per graded test; GPU-only tests only where they ran."""
    tests = []
    for t in report.tests:
        if t.gpu and t.outcome == "skipped":
            continue  # not run on this machine: neither earned nor lost
        output = t.message if t.outcome != "passed" else "passed"
        if t.output and t.outcome == "failed":
            output += "\n\nyour code printed:\n" + t.output
        tests.append({"name": f"{t.exercise} · {t.name}{' (GPU)' if t.gpu else ''}", "score": t.earned,
                      "max_score": t.points, "status": "passed" if t.outcome == "passed" else "failed",
                      "output": output[:8000], "visibility": "visible",
                      "extra_data": {"exercise": t.exercise, "nodeid": t.nodeid, "gpu_only": t.gpu}})
    score = report.earned + (report.gpu_earned if report.gpu_ran else 0)
    return {"score": score, "execution_time": round(report.seconds, 2), "output": table,
            "visibility": "visible", "stdout_visibility": "visible", "tests": tests,
            "extra_data": {"cpu": [report.earned, report.possible],
                           "gpu_only": [report.gpu_earned, report.gpu_possible] if report.gpu_ran else None,
                           "device": report.device}}


def write_results(report: GradeReport, path: str | os.PathLike, table: str | None = None) -> None:
    data = gradescope_results(report, table if table is not None else format_table(report))
    Path(path).write_text(json.dumps(data, indent=1))


def format_catalog() -> str:
    lines = [f"{'ch':>2}  {'exercise':<26} {'points':>6}  {'file':<38} title"]
    for e in catalog.EXERCISES:
        pts = f"{e.points}" + (f"+{e.gpu_points}" if e.gpu_points else "")
        lines.append(f"{e.chapter:02d}  {e.id:<26} {pts:>6}  exercises/{e.file + '.py':<28} {e.title}")
    cpu = sum(e.points for e in catalog.EXERCISES)
    gpu = sum(e.gpu_points for e in catalog.EXERCISES)
    lines.append(f"    {len(catalog.EXERCISES)} exercises, {cpu} points (+{gpu} GPU-only points)")
    return "\n".join(lines)


def _parse_chapter(text: str) -> int | None:
    t = text.lower().removeprefix("ch").removeprefix("chapter")
    if t in ("all", ""):
        return None
    last = max(e.chapter for e in catalog.EXERCISES)
    if not t.isdigit() or not 1 <= int(t) <= last:
        raise argparse.ArgumentTypeError(f"chapter must be 01..{last} or 'all', got {text!r}")
    return int(t)


def main(argv: list[str] | None = None) -> int:
    """The command line, also callable in a notebook: ``main(["04"])`` returns the exit code
    (0 full marks, 1 points lost, 2 the grader could not run) and never calls sys.exit.
    The repository is found from memlab's own location, so any working folder will do."""
    try:
        return _main(argv)
    except SystemExit as exc:  # argparse's --help and usage errors: a notebook cell must survive them
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)


def _main(argv: list[str] | None) -> int:
    p = argparse.ArgumentParser(prog="python -m memlab.grade", description="Grade memlab's exercises.")
    p.add_argument("chapters", nargs="*", type=_parse_chapter, help="chapters to grade, e.g. 04 (default: all)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--solutions", action="store_true", help="grade solutions/ (the reference answers)")
    g.add_argument("--from", dest="source", metavar="DIR", help="grade the exercise files in DIR")
    p.add_argument("--exercise", action="append", metavar="ID", help="only this exercise id (repeatable)")
    p.add_argument("--results", metavar="FILE", help="write Gradescope's results.json here")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per test (default %(default)s)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress counter (there is none without a terminal)")
    p.add_argument("--list", action="store_true", help="list the exercises and their points, then stop")
    p.add_argument("--gradescope-bundle", metavar="ZIP", help="write a Gradescope autograder zip, then stop")
    args = p.parse_args(argv)
    if args.gradescope_bundle:  # memlab.grading.gradescope says what is in it
        from memlab.grading.gradescope import build_bundle

        print(f"wrote {build_bundle(args.gradescope_bundle)}: upload it as a Gradescope autograder")
        return 0
    if args.list:
        print(format_catalog())
        return 0
    chapters = [c for c in args.chapters if c is not None] or None
    if args.exercise:
        unknown = [x for x in args.exercise if x not in catalog.BY_ID]
        if unknown:
            p.error(f"unknown exercise {unknown[0]!r}; known: {', '.join(catalog.BY_ID)}")
    source = "solutions" if args.solutions else (args.source or os.environ.get("MEMLAB_EXERCISES") or "exercises")

    # A terminal shows a counter that the table then overwrites; a notebook or a log (not a tty)
    # gets the table alone, without stray progress characters.
    live = not args.quiet and sys.stdout.isatty()
    done = [0]

    def counter(t: TestResult) -> None:
        done[0] += 1
        print(f"\rmemlab grade: {done[0]} tests graded", end="", flush=True)

    try:
        report = grade(chapters, source, args.timeout, args.exercise, progress=counter if live else None)
    except (GradingError, FileNotFoundError) as exc:
        print(("\n" if done[0] else "") + f"memlab grade: {exc}", file=sys.stderr)
        return 2
    if done[0]:
        print("\r" + " " * 40 + "\r", end="", flush=True)
    table = format_table(report)
    print(table)
    if args.results:
        write_results(report, args.results, table)
        print(f"    wrote {args.results}")
    return 0 if report.earned == report.possible else 1


if __name__ == "__main__":
    sys.exit(main())
