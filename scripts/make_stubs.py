"""Write the exercise stubs from the solutions (memlab.course.grading.stubs says how).

    python scripts/make_stubs.py                  write exercises/<file>.py for every exercise
    python scripts/make_stubs.py ch04_alloc_extend   ... for the exercises named
    python scripts/make_stubs.py --check          exit 1 if an exercise is not in step

A solution marks what the learner writes with ``# BEGIN SOLUTION`` / ``# END SOLUTION``; edit the
solution, then run this script and commit both. It overwrites exercises/, so an author runs it,
never a learner with work in exercises/ (``--check`` reads git's history and counts a learner's
edits as in step when a commit since the solution's last change holds the generated stub).
"""

from __future__ import annotations

import argparse
import sys

from memlab.course.grading import catalog, stubs
from memlab.course.grading.loader import ROOT


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "exercises", nargs="*", help="exercise files or ids (all when none)"
    )
    ap.add_argument(
        "--check", action="store_true", help="write nothing: exit 1 when not in step"
    )
    args = ap.parse_args(argv)
    chosen = [catalog.find(n) for n in args.exercises] or list(catalog.EXERCISES)
    bad = 0
    for e in chosen:
        if args.check:
            ok, where = stubs.in_step(e.file)
            bad += not ok
            print(f"{e.file}: {'in step' if ok else 'NOT in step'} ({where})")
            continue
        text, _ = stubs.course_stub(e.file)
        path = ROOT / "exercises" / f"{e.file}.py"
        changed = not path.is_file() or path.read_text() != text
        path.write_text(text)
        print(f"{e.file}: {'written' if changed else 'unchanged'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
