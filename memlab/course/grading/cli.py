"""The grader's command line: ``python -m memlab.grade [chapter ...] [--exercise NAME] [--solutions |
--from DIR] [--results FILE]`` (memlab/grade.py is the entry point learners type; this is its body).
An exercise is named by its file (``ch04_alloc_extend``) or its id (``ch04.alloc_extend``).

It grades (memlab.course.grading.runner), prints the score table
(memlab.course.grading.report): points earned per exercise, the first failing check in
plain words, a CPU total and GPU-only points apart. ``--results`` writes Gradescope's
results.json; ``--gradescope-bundle out.zip`` writes a whole Gradescope autograder
(memlab.course.grading.gradescope)."""

from __future__ import annotations

import argparse
import os
import sys

from memlab.course.grading import catalog
from memlab.course.grading.report import format_catalog, format_table, write_results
from memlab.course.grading.runner import (
    DEFAULT_TIMEOUT,
    GradingError,
    TestResult,
    grade,
)


def _parse_chapter(text: str) -> int | None:
    t = text.lower().removeprefix("chapter").removeprefix("ch")
    if t in ("all", ""):
        return None
    last = max(e.chapter for e in catalog.EXERCISES)
    if not t.isdigit() or not 0 <= int(t) <= last:
        raise argparse.ArgumentTypeError(
            f"chapter must be 00..{last} or 'all', got {text!r}"
        )
    return int(t)


def main(argv: list[str] | None = None) -> int:
    """The command line, also callable in a notebook: ``main(["04"])`` returns the exit code
    (0 full marks, 1 points lost, 2 the grader could not run) and never calls sys.exit.
    The repository is found from memlab's own location, so any working folder will do."""
    try:
        return _main(argv)
    except (
        SystemExit
    ) as exc:  # argparse's --help and usage errors: a notebook cell must survive them
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)


def _main(argv: list[str] | None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m memlab.grade", description="Grade memlab's exercises."
    )
    p.add_argument(
        "chapters",
        nargs="*",
        type=_parse_chapter,
        help="chapters to grade, e.g. 04 (default: all); a chapter without exercises (00) grades nothing "
        "and says so (exit code 0)",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--solutions",
        action="store_true",
        help="grade solutions/ (the reference answers)",
    )
    g.add_argument(
        "--from", dest="source", metavar="DIR", help="grade the exercise files in DIR"
    )
    p.add_argument(
        "--exercise",
        action="append",
        metavar="NAME",
        help="only this exercise: its file (ch04_alloc_extend) or id (ch04.alloc_extend); repeatable",
    )
    p.add_argument(
        "--results", metavar="FILE", help="write Gradescope's results.json here"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds per test (default %(default)s)",
    )
    p.add_argument(
        "--seed",
        type=int,
        help="the seed of the random cases (default: a new one each run; the table prints it)",
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress counter (there is none without a terminal)",
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="list the exercises and their points, then stop",
    )
    p.add_argument(
        "--gradescope-bundle",
        metavar="ZIP",
        help="write a Gradescope autograder zip, then stop",
    )
    args = p.parse_args(argv)
    if args.gradescope_bundle:  # memlab.course.grading.gradescope says what is in it
        from memlab.course.grading.gradescope import build_bundle

        print(
            f"wrote {build_bundle(args.gradescope_bundle)}: upload it as a Gradescope autograder"
        )
        return 0
    if args.list:
        print(format_catalog())
        return 0
    chapters = [c for c in args.chapters if c is not None] or None
    if chapters:
        empty = [c for c in chapters if not catalog.for_chapter(c)]
        for c in empty:
            print(
                f"chapter {c:02d} has no exercises (the first are in chapter 01; python -m memlab.grade --list "
                "lists them all)"
            )
        chapters = [c for c in chapters if c not in empty]
        if not chapters:
            return 0
    exercises = None
    if args.exercise:
        try:
            exercises = [catalog.find(x).id for x in args.exercise]
        except ValueError as exc:
            p.error(str(exc))
    source = (
        "solutions"
        if args.solutions
        else (args.source or os.environ.get("MEMLAB_EXERCISES") or "exercises")
    )

    # A terminal shows a counter that the table then overwrites; a notebook or a log (not a tty)
    # gets the table alone, without stray progress characters.
    live = not args.quiet and sys.stdout.isatty()
    done = [0]

    def counter(t: TestResult) -> None:
        done[0] += 1
        print(f"\rmemlab grade: {done[0]} tests graded", end="", flush=True)

    try:
        report = grade(
            chapters,
            source,
            args.timeout,
            exercises,
            progress=counter if live else None,
            seed=args.seed,
        )
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
