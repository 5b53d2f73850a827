"""What the grader prints and hands in: the score table, Gradescope's results.json, the catalog."""

from __future__ import annotations

import json
import os
from pathlib import Path

from memlab.course.grading import catalog
from memlab.course.grading.loader import ROOT
from memlab.course.grading.runner import GradeReport


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
            check = (
                f"not started: {where}/{s.exercise.file}.py raises NotImplementedError"
            )
        else:
            check = (
                "-" if fail is None else _clip(fail.message or fail.outcome, width - 41)
            )
        lines.append(f"{s.exercise.chapter:02d}  {s.exercise.id:<26} {pts:>7}  {check}")
    lines.append("-" * min(width, 100))
    lines.append(
        f"{'':>2}  {'total (CPU)':<26} {f'{report.earned}/{report.possible}':>7}"
    )
    if report.gpu_possible:
        if report.gpu_ran:
            lines.append(
                f"{'':>2}  {'GPU-only':<26} {f'{report.gpu_earned}/{report.gpu_possible}':>7}"
            )
        else:
            lines.append(
                f"    GPU-only checks ({report.gpu_possible} points) skipped: no CUDA device here "
                "(run the grader in Colab on a GPU for them)"
            )
    lines.append(
        f"    graded in {report.seconds:.1f} s; random cases from seed {report.seed} "
        f"(--seed {report.seed} draws the same cases again)"
    )
    tried = [s for s in report.scores if not s.not_started]
    idle = len(report.scores) - len(tried)
    if idle:
        lines.append(
            f"    {idle} exercise{'s' if idle != 1 else ''} not started yet: fill in a stub, then grade again"
        )
    failing = [t for s in tried for t in s.tests if t.outcome == "failed"]
    if failing:
        lines += ["", "What failed (fix the first one in each exercise first):"]
        for s in tried:
            if s.course_code:  # one reason for every test: say it once
                lines.append(
                    f"  {s.exercise.id} (all {s.possible} points): {_clip(s.course_code, 400)}"
                )
                continue
            for t in s.tests:
                if t.outcome == "failed":
                    lines.append(
                        f"  {t.exercise} · {t.name} ({t.points} pt{'s' if t.points != 1 else ''}): "
                        f"{_clip(t.message, 400)}"
                    )
            after = [t for t in s.tests if t.outcome == "skipped" and not t.gpu]
            if after:
                lines.append(
                    f"  {s.exercise.id} · {len(after)} more test{'s' if len(after) != 1 else ''}: "
                    f"{_clip(after[0].message, 300)}"
                )
        stuck = next(
            (
                s.exercise.file
                for s in tried
                if s.earned < s.possible and not s.course_code
            ),
            None,
        )
        if stuck:
            lines += [
                "",
                f"Stuck? ./course hint {stuck} shows a hint, one more each time (in a notebook: "
                f'from memlab.course.notebook import hint; hint("{stuck}")).',
            ]
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
        tests.append(
            {
                "name": f"{t.exercise} · {t.name}{' (GPU)' if t.gpu else ''}",
                "score": t.earned,
                "max_score": t.points,
                "status": "passed" if t.outcome == "passed" else "failed",
                "output": output[:8000],
                "visibility": "visible",
                "extra_data": {
                    "exercise": t.exercise,
                    "nodeid": t.nodeid,
                    "gpu_only": t.gpu,
                },
            }
        )
    score = report.earned + (report.gpu_earned if report.gpu_ran else 0)
    return {
        "score": score,
        "execution_time": round(report.seconds, 2),
        "output": table,
        "visibility": "visible",
        "tests": tests,
        "extra_data": {
            "seed": report.seed,
            "cpu": [report.earned, report.possible],
            "gpu_only": [report.gpu_earned, report.gpu_possible]
            if report.gpu_ran
            else None,
            "device": report.device,
        },
    }


def write_results(
    report: GradeReport, path: str | os.PathLike, table: str | None = None
) -> None:
    data = gradescope_results(
        report, table if table is not None else format_table(report)
    )
    Path(path).write_text(json.dumps(data, indent=1))


def format_catalog() -> str:
    lines = [f"{'ch':>2}  {'exercise':<26} {'points':>6}  {'file':<38} title"]
    for e in catalog.EXERCISES:
        pts = f"{e.points}" + (f"+{e.gpu_points}" if e.gpu_points else "")
        lines.append(
            f"{e.chapter:02d}  {e.id:<26} {pts:>6}  exercises/{e.file + '.py':<28} {e.title}"
        )
    cpu = sum(e.points for e in catalog.EXERCISES)
    gpu = sum(e.gpu_points for e in catalog.EXERCISES)
    lines.append(
        f"    {len(catalog.EXERCISES)} exercises, {cpu} points (+{gpu} GPU-only points)"
    )
    return "\n".join(lines)
