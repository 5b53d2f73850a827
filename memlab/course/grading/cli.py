"""The grader's command line, ``python -m memlab.grade`` (memlab/grade.py is the entry point
learners type; this is its body). It grades (memlab.course.grading.runner) and prints the score
table (memlab.course.grading.report): points per exercise, the first failing check in plain
words, a CPU total and GPU-only points apart, the seed of the random cases. ``--results``
writes Gradescope's results.json; ``--gradescope-bundle out.zip`` writes a whole Gradescope
autograder (memlab.course.grading.gradescope)."""

from __future__ import annotations

import argparse
import os
import sys

from memlab.course.grading import catalog
from memlab.course.grading.report import format_catalog, format_table, write_results
from memlab.course.grading.runner import DEFAULT_TIMEOUT, GradingError, grade


def _chapter(text: str) -> int | None:
    t = text.lower().removeprefix("chapter").removeprefix("ch")
    last = max(e.chapter for e in catalog.EXERCISES)
    if t in ("all", ""):
        return None
    if not t.isdigit() or not 0 <= int(t) <= last:
        raise argparse.ArgumentTypeError(
            f"chapter must be 00..{last} or 'all', got {text!r}"
        )
    return int(t)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m memlab.grade", description="Grade memlab's exercises."
    )
    add = p.add_argument
    add(
        "chapters",
        nargs="*",
        type=_chapter,
        help="chapters to grade, e.g. 04 (default: all)",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--solutions", action="store_true", help="grade solutions/ (the answers)"
    )
    g.add_argument(
        "--from", dest="source", metavar="DIR", help="grade the files in DIR"
    )
    add("--exercise", action="append", metavar="NAME", help="only this exercise (repeatable): "
        "its file (ch04_alloc_extend) or id (ch04.alloc_extend)")  # fmt: skip
    add("--results", metavar="FILE", help="write Gradescope's results.json here")
    add(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds per test (%(default)s)",
    )
    add(
        "--seed",
        type=int,
        help="the random cases' seed (default: a new one, which is printed)",
    )
    add("-q", "--quiet", action="store_true", help="no progress counter")
    add("--list", action="store_true", help="list the exercises and their points")
    add("--gradescope-bundle", metavar="ZIP", help="write a Gradescope autograder zip")
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line, also callable in a notebook: ``main(["04"])`` returns the exit code
    (0 full marks, 1 points lost, 2 the grader could not run) and never calls sys.exit. The
    repository is found from memlab's own location, so any working folder will do."""
    try:
        return _main(parser().parse_args(argv))
    # --help and usage errors: a notebook cell must survive them
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)


def _main(args) -> int:
    if args.gradescope_bundle:
        from memlab.course.grading.gradescope import build_bundle

        print(
            f"wrote {build_bundle(args.gradescope_bundle)}: upload it as a Gradescope autograder"
        )
        return 0
    if args.list:
        print(format_catalog())
        return 0
    chapters = [c for c in args.chapters if c is not None]
    for c in [c for c in chapters if not catalog.for_chapter(c)]:
        chapters.remove(c)
        print(
            f"chapter {c:02d} has no exercises (python -m memlab.grade --list lists them)"
        )
        if not chapters:
            return 0
    try:
        exercises = [catalog.find(x).id for x in args.exercise or ()]
    except ValueError as exc:
        print(f"memlab grade: {exc}", file=sys.stderr)
        return 2
    source = (
        "solutions"
        if args.solutions
        else args.source or os.environ.get("MEMLAB_EXERCISES")
    )
    # A terminal shows a counter that the table then overwrites; a notebook or a log gets the
    # table alone, without stray progress characters.
    live = not args.quiet and sys.stdout.isatty()
    done = [0]

    def counter(t) -> None:
        done[0] += 1
        print(f"\rmemlab grade: {done[0]} tests graded", end="", flush=True)

    try:
        report = grade(
            chapters or None,
            source or "exercises",
            args.timeout,
            exercises or None,
            progress=counter if live else None,
            seed=args.seed,
        )
    except (GradingError, FileNotFoundError) as exc:
        print(("\n" if done[0] else "") + f"memlab grade: {exc}", file=sys.stderr)
        return 2
    print(("\r" + " " * 40 + "\r" if done[0] else "") + format_table(report))
    if args.results:
        write_results(report, args.results)
        print(f"    wrote {args.results}")
    return 0 if report.earned == report.possible else 1
