"""memlab's exercises as a Gradescope autograder: ``python -m memlab.grade --gradescope-bundle out.zip``.

Gradescope (https://gradescope-autograders.readthedocs.io/en/latest/specs/) takes a zip with
``setup.sh`` and ``run_autograder`` at its root, unpacks it into ``/autograder/source``, runs
``setup.sh`` once as root when it builds the grading image, then for every submission puts the
student's files in ``/autograder/submission``, runs ``run_autograder`` from ``/autograder`` and
reads ``/autograder/results/results.json``.

The bundle holds the course without its solutions (a student's code runs in the same container,
so they must not be there): ``memlab/`` (its ``kernels`` link written as files), ``kernels/``,
the stubs in ``exercises/`` (as committed: memlab.course.grading.stubs), the graded tests and
``pyproject.toml``. ``setup.sh`` makes a virtual environment with a CPU torch and the rest of
pyproject's dependencies plus pytest, and the unprivileged user the student's code runs as
(``student``); ``run_autograder`` calls ``run()`` below, which grades the stubs overlaid with the
submitted ``chNN_*.py`` files (found anywhere in the submission, never under a ``solutions``
folder) and writes results.json, also when grading itself fails (score 0, the reason in ``output``).
Gradescope's machines have no GPU: the GPU-only points are then not run, and the output says
which maximum applies.

The student's code runs in learner processes of its own (memlab.course.grading.sandbox), as the
user ``student``, with time, memory and file-size limits: ``run_autograder`` first makes the
grader's files (``source``: the tests, the grader; ``submission``; ``results``) readable by root
only. A file that imports or reads the course's own implementation earns nothing, and the
output lists it for the instructor (``extra_data.course_code_used`` too).

``MEMLAB_AUTOGRADER_ROOT`` replaces ``/autograder`` (the tests unpack the bundle into a temp
folder); ``MEMLAB_PYTHON`` replaces the setup's virtual environment; ``MEMLAB_SANDBOX_USER``
replaces ``student`` (empty: the student's code runs as the grader's user, without the limits).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
import traceback
import zipfile
from pathlib import Path

from memlab.course.grading import catalog
from memlab.course.grading.loader import ROOT
from memlab.course.grading.report import format_table, gradescope_results
from memlab.course.grading.runner import DEFAULT_TIMEOUT, GradingError, grade
from memlab.course.grading.stubs import course_stub

ROOT_ENV = "MEMLAB_AUTOGRADER_ROOT"
DEFAULT_ROOT = "/autograder"
BUNDLE_DIRS = ("memlab", "kernels", "tests/exercises")
BUNDLE_FILES = ("tests/conftest.py", "pyproject.toml", "LICENSE", "exercises/README.md")
SKIP = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache"}
OUTPUT_LIMIT = 60_000  # characters of the whole-submission output kept in results.json

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the grading image (Ubuntu).
# A virtual environment with a CPU torch (Gradescope's graders have no GPU) and the rest of what
# grading needs; the Triton kernels of the exercises run in Triton's interpreter.
set -euo pipefail
AG=${MEMLAB_AUTOGRADER_ROOT:-/autograder}
cd "$(dirname "$0")"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq python3 python3-venv python3-pip >/dev/null
python3 -m venv "$AG/venv"
"$AG/venv/bin/pip" install -q --upgrade pip
"$AG/venv/bin/pip" install -q --index-url https://download.pytorch.org/whl/cpu "__TORCH__"
"$AG/venv/bin/pip" install -q -r requirements.txt
chmod -R go+rX "$AG/venv"
# The student's code runs as this user, which can read none of the grader's files.
id -u student >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin student
# Prove the image can grade: the environment report, then the stubs (every check fails, none crashes).
PYTHONPATH="$PWD" "$AG/venv/bin/python" -m memlab doctor
PYTHONPATH="$PWD" "$AG/venv/bin/python" -m memlab.grade --quiet >/dev/null || [ $? -eq 1 ]
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission, from /autograder: grade the submitted exercise files
# and write /autograder/results/results.json (always, even when grading fails).
AG=${MEMLAB_AUTOGRADER_ROOT:-/autograder}
PY=${MEMLAB_PYTHON:-}
if [ -z "$PY" ]; then PY=$AG/venv/bin/python; [ -x "$PY" ] || PY=python3; fi
mkdir -p "$AG/results"
rm -f "$AG/results/results.json"
# The student's code runs as an unprivileged user that cannot read the tests, the grader, the
# submission or the results, with limits (memlab.course.grading.sandbox); only root reads them.
USER_=${MEMLAB_SANDBOX_USER-student}
if [ -n "$USER_" ] && [ "$(id -u)" = 0 ] && id -u "$USER_" >/dev/null 2>&1; then
  chmod 711 "$AG"
  chmod -R go-rwx "$AG/source" "$AG/submission" "$AG/results"
  [ ! -d "$AG/venv" ] || chmod -R go+rX "$AG/venv"
  export MEMLAB_SANDBOX_USER=$USER_
  export MEMLAB_SANDBOX_LIMITS=${MEMLAB_SANDBOX_LIMITS-memory=4G,cpu=900,fsize=256M,nofile=1024,nproc=128}
else
  export MEMLAB_SANDBOX_USER=
fi
export MEMLAB_SANDBOX_BLOCK=$AG${MEMLAB_SANDBOX_BLOCK:+:$MEMLAB_SANDBOX_BLOCK}
cd "$AG/source" && PYTHONPATH="$AG/source" "$PY" -m memlab.course.grading.gradescope run --root "$AG"
rc=$?
if [ ! -s "$AG/results/results.json" ]; then  # Python itself did not run: still hand in a result
  printf '%s\\n' "{\\"score\\": 0, \\"output\\": \\"The memlab autograder could not start (exit code $rc, \
python: $PY). Nothing was graded; please tell your instructor.\\", \\"tests\\": []}" > "$AG/results/results.json"
fi
exit 0
"""


# -- the bundle -------------------------------------------------------------------------------


def _requirements() -> tuple[str, list[str]]:
    """(torch's requirement, everything else grading needs) from pyproject.toml."""
    import tomllib  # Python 3.11+: only the instructor's side builds bundles; graders run on 3.10 too

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = list(meta["dependencies"])
    torch = next(d for d in deps if d.split(">")[0].split("=")[0].strip() == "torch")
    pytest = [
        d for d in meta["optional-dependencies"]["test"] if d.startswith("pytest>")
    ]
    return torch, [d for d in deps if d != torch] + pytest


def bundle_files() -> list[Path]:
    """Repository files the autograder needs (relative paths), solutions never among them; the
    stubs come apart, as the course ships them (``build_bundle``)."""
    out = []
    for d in (
        BUNDLE_DIRS
    ):  # through links: memlab/kernels (a link to kernels/) goes in as files
        for folder, dirs, files in os.walk(ROOT / d, followlinks=True):
            dirs[:] = sorted(x for x in dirs if x not in SKIP)
            rel = Path(folder).relative_to(ROOT)
            out += [rel / f for f in sorted(files) if not f.endswith(".pyc")]
    out += [Path(f) for f in BUNDLE_FILES if (ROOT / f).is_file()]
    return out


def build_bundle(out: str | os.PathLike) -> Path:
    """Write Gradescope's autograder zip to ``out`` and return its path."""
    torch, reqs = _requirements()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fixed = (2020, 1, 1, 0, 0, 0)  # the same files give the same zip

    def add(z, name, data, mode=0o644):
        info = zipfile.ZipInfo(name, fixed)
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(info, data)

    with zipfile.ZipFile(out, "w") as z:
        add(z, "setup.sh", SETUP_SH.replace("__TORCH__", torch), 0o755)
        add(z, "run_autograder", RUN_AUTOGRADER, 0o755)
        add(z, "requirements.txt", "\n".join(reqs) + "\n")
        # The grader wants a solutions/ folder next to exercises/; the answers stay out
        # of the bundle.
        add(
            z,
            "solutions/README.md",
            "The reference solutions are not part of the autograder.\n",
        )
        files = {rel.as_posix(): (ROOT / rel).read_bytes() for rel in bundle_files()}
        for e in (
            catalog.EXERCISES
        ):  # the stubs as committed, whatever this checkout's exercises/ holds
            got = course_stub(e.file)
            if got is None:
                raise GradingError(
                    f"exercises/{e.file}.py is not the course's stub, and git's history has none: "
                    "build the bundle from a checkout of the course"
                )
            files[f"exercises/{e.file}.py"] = got[0].encode()
        for name in sorted(files):
            add(z, name, files[name])
    return out


# -- grading one submission -------------------------------------------------------------------


def find_submitted(submission: Path) -> tuple[dict[str, Path], list[str]]:
    """Each exercise file found in the submission (at any depth, preferring an exercises/
    folder, never a solutions/ one), and the exercise files not found."""
    found, missing = {}, []
    for e in catalog.EXERCISES:
        name = f"{e.file}.py"
        hits = [
            p
            for p in submission.rglob(name)
            if p.is_file()
            and not {"solutions", "__MACOSX"} & set(p.relative_to(submission).parts)
        ]
        if hits:
            found[name] = min(
                hits, key=lambda p: (p.parent.name != "exercises", len(p.parts), str(p))
            )
        else:
            missing.append(name)
    return found, missing


def _gpu_note(report) -> tuple[str, list[dict]]:
    """What the maximum is on this grader, and a line for GPU-only points that did not run."""
    cpu_max, gpu_max = report.possible, report.gpu_possible
    if report.gpu_ran or not gpu_max:
        where = "a GPU" if report.gpu_ran else "this grader"
        return (
            f"Maximum on {where}: {cpu_max + (gpu_max if report.gpu_ran else 0)} points.",
            [],
        )
    per = {}
    for t in report.tests:
        if t.gpu and t.outcome == "skipped":
            per[t.exercise] = per.get(t.exercise, 0) + t.points
    detail = ", ".join(f"{k} {v}" for k, v in per.items())
    note = (
        f"Maximum on this grader: {cpu_max} points. It has no CUDA device, so the {gpu_max} GPU-only points "
        f"({detail}) were not run and are not part of this score; the assignment's total should be "
        f"{cpu_max} here ({cpu_max + gpu_max} on a grader with a GPU)."
    )
    entry = {
        "name": f"GPU-only checks ({gpu_max} points): not run, this grader has no CUDA device",
        "score": 0,
        "max_score": 0,
        "output": note,
        "visibility": "visible",
    }
    return note, [entry]


def _what(message: str) -> str:
    """'imports memlab.x' out of the grader's 'write it yourself: your file f.py imports memlab.x. ...'."""
    m = re.search(r"your file \S+ (.*?)\. The grader", message)
    return m.group(1) if m else message


def results_for(
    report, table: str, found: dict[str, Path], missing: list[str], submission: Path
) -> dict:
    data = gradescope_results(report, table)
    note, extra = _gpu_note(report)
    rel = {n: p.relative_to(submission).as_posix() for n, p in found.items()}
    got = ", ".join(n if rel[n] == n else f"{n} ({rel[n]})" for n in found) or "none"
    lines = [note, f"Exercise files graded from your submission: {got}."]
    if missing:
        lines.append(
            f"Not in your submission, graded as the untouched stub (0 points): {', '.join(missing)}."
        )
    used = {
        f"{s.exercise.file}.py": s.course_code for s in report.scores if s.course_code
    }
    if used:  # for the instructor: these files earn nothing
        lines.append(
            "Graded 0 for using the course's own implementation or files (write it yourself): "
            + "; ".join(f"{f} {_what(why)}" for f, why in used.items())
            + "."
        )
    data["extra_data"]["course_code_used"] = used
    data["output"] = ("\n".join(lines) + "\n\n" + data["output"])[:OUTPUT_LIMIT]
    data["tests"] += extra
    data["extra_data"].update(
        max_score_here=report.possible + (report.gpu_possible if report.gpu_ran else 0),
        gpu_only_not_run=0 if report.gpu_ran else report.gpu_possible,
        submitted=sorted(found),
        missing=missing,
    )
    return data


def run(root: str | os.PathLike | None = None, timeout: float | None = None) -> dict:
    """Grade ``<root>/submission`` against the stubs and write ``<root>/results/results.json``."""
    root = Path(root or os.environ.get(ROOT_ENV) or DEFAULT_ROOT)
    results = root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        submission = root / "submission"
        if not submission.is_dir():
            raise GradingError(f"there is no submission folder ({submission})")
        found, missing = find_submitted(submission)
        work = (
            root / "work" / "exercises"
        )  # the stubs, then the submitted files over them
        shutil.rmtree(work.parent, ignore_errors=True)
        shutil.copytree(ROOT / "exercises", work)
        os.chmod(work.parent, 0o700)
        for name, path in found.items():
            shutil.copyfile(path, work / name)
        report = grade(None, str(work), timeout or DEFAULT_TIMEOUT)
        data = results_for(report, format_table(report), found, missing, submission)
    except (
        Exception
    ) as exc:  # the grader failed, not the student: say so, score 0, never no file
        data = {
            "score": 0,
            "execution_time": round(time.monotonic() - t0, 2),
            "tests": [],
            "output": (
                "The memlab autograder could not grade this submission (not a mistake in your "
                f"code; please tell your instructor): {type(exc).__name__}: {exc}\n\n"
                + traceback.format_exc()[-4000:]
            ),
            "extra_data": {"error": f"{type(exc).__name__}: {exc}"},
        }
    results.write_text(json.dumps(data, indent=1))
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m memlab.course.grading.gradescope")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser(
        "run", help="grade /autograder/submission (what run_autograder calls)"
    )
    r.add_argument(
        "--root", help=f"the autograder folder (default ${ROOT_ENV} or {DEFAULT_ROOT})"
    )
    r.add_argument("--timeout", type=float, help="seconds per test")
    a = p.parse_args(argv)  # the zip itself: python -m memlab.grade --gradescope-bundle
    data = run(a.root, a.timeout)
    print(data["output"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
