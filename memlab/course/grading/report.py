"""What the grader prints and hands in: the score table, Gradescope's results.json, the catalog."""

from __future__ import annotations

import json
import os
from pathlib import Path

from memlab.course.grading import catalog
from memlab.course.grading.fuzz import PASTE
from memlab.course.grading.loader import ROOT
from memlab.course.grading.runner import GradeReport


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _s(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def format_table(report: GradeReport) -> str:
    where = report.source
    if where.is_relative_to(ROOT):
        where = where.relative_to(ROOT)
    rule = "-" * 100
    lines = [f"memlab grade: {where}/ on {report.device}", ""]
    lines += [f"ch  {'exercise':<26} {'points':>7}  first failing check", rule]
    for s in report.scores:
        fail, e = s.first_failure, s.exercise
        check = "-" if fail is None else _clip(fail.message or fail.outcome, 77)
        if s.not_started:
            check = f"not started: {where}/{e.file}.py raises NotImplementedError"
        lines.append(
            f"{e.chapter:02d}  {e.id:<26} {f'{s.earned}/{s.possible}':>7}  {check}"
        )
    lines += [
        rule,
        f"    {'total (CPU)':<26} {f'{report.earned}/{report.possible}':>7}",
    ]
    if report.gpu_ran:
        lines.append(
            f"    {'GPU-only':<26} {f'{report.gpu_earned}/{report.gpu_possible}':>7}"
        )
    elif report.gpu_possible:
        lines.append(
            f"    GPU-only checks ({report.gpu_possible} points) skipped: no CUDA device here "
            "(run the grader in Colab on a GPU for them)"
        )
    lines.append(
        f"    graded in {report.seconds:.1f} s; random cases from seed {report.seed} "
        f"(--seed {report.seed} draws the same cases again)"
    )
    tried = [s for s in report.scores if not s.not_started]
    if len(tried) < len(report.scores):
        idle = _s(len(report.scores) - len(tried), "exercise")
        lines.append(f"    {idle} not started yet: fill in a stub, then grade again")
    if not any(t.outcome == "failed" for s in tried for t in s.tests):
        return "\n".join(lines)
    lines += ["", "What failed (fix the first one in each exercise first):"]
    for s in tried:
        if s.course_code:  # one reason for every test: said once
            lines.append(
                f"  {s.exercise.id} (all {s.possible} points): {_clip(s.course_code, 400)}"
            )
            continue
        for t in s.tests:
            if t.outcome == "failed":
                pts = _s(t.points, "pt")
                # a case to paste into a cell keeps its line breaks, uncut (a shrunk case is small)
                said, mark, case = t.message.partition(PASTE)
                case, _, rest = case.partition("\n(")
                lines.append(f"  {t.exercise} · {t.name} ({pts}): {_clip(said, 400)}")
                if mark:
                    lines += [f"    {mark.strip()}", case]
                    lines += [f"    {_clip('(' + rest, 300)}"] if rest else []
        after = [t for t in s.tests if t.outcome == "skipped" and not t.gpu]
        if after:
            more = _s(len(after), "more test")
            lines.append(f"  {s.exercise.id} · {more}: {_clip(after[0].message, 300)}")
    stuck = [
        s.exercise.file for s in tried if s.earned < s.possible and not s.course_code
    ]
    if stuck:
        lines += [
            "",
            f"Stuck? ./course hint {stuck[0]} shows a hint, one more each time (in a notebook: "
            f'from memlab.course.notebook import hint; hint("{stuck[0]}")).',
        ]
    return "\n".join(lines)


def gradescope_results(report: GradeReport, table: str) -> dict:
    """Gradescope's results.json: one entry per graded test, GPU-only ones where they ran."""
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
    gpu = [report.gpu_earned, report.gpu_possible] if report.gpu_ran else None
    return {
        "score": report.earned + (report.gpu_earned if report.gpu_ran else 0),
        "execution_time": round(report.seconds, 2),
        "output": table,
        "visibility": "visible",
        "tests": tests,
        "extra_data": dict(
            seed=report.seed,
            cpu=[report.earned, report.possible],
            gpu_only=gpu,
            device=report.device,
        ),
    }


def write_results(report: GradeReport, path: str | os.PathLike) -> None:
    data = gradescope_results(report, format_table(report))
    Path(path).write_text(json.dumps(data, indent=1))


def format_catalog() -> str:
    lines = [f"ch  {'exercise':<26} {'points':>6}  {'file':<38} title"]
    for e in catalog.EXERCISES:
        pts = f"{e.points}" + (f"+{e.gpu_points}" if e.gpu_points else "")
        file = f"exercises/{e.file}.py"
        lines.append(f"{e.chapter:02d}  {e.id:<26} {pts:>6}  {file:<38} {e.title}")
    cpu = sum(e.points for e in catalog.EXERCISES)
    gpu = sum(e.gpu_points for e in catalog.EXERCISES)
    lines.append(
        f"    {len(catalog.EXERCISES)} exercises, {cpu} points (+{gpu} GPU-only points)"
    )
    return "\n".join(lines)
