"""Dishonest exercise files (tests/course/grading/dishonest/, its README says what each tries)
earn nothing: through the Gradescope bundle run as Gradescope runs it (run_autograder as root,
the student's code as an unprivileged user), and through ``python -m memlab.grade`` run as a
learner runs it at home (as a user of their own, whose processes a file may kill).

Locally the learner owns the machine (README, "Grading the exercises"): a paste of the course's
code is caught by the similarity report, which runs on Gradescope; locally it earns its points.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from memlab_tests.course.grading import image

HERE = Path(__file__).parent
DISHONEST = HERE / "dishonest"
KINDS = sorted(
    p.name for p in DISHONEST.iterdir() if p.is_dir() and p.name != "last_round"
)
LINKS = {  # made here: a stub's name, and the course's file the link points to
    "ch04_alloc_extend_kernel.py": "kernels/alloc_extend.py",
    "ch12_virtual_pages.py": "memlab/common/utils.py",
}
HONEST = (
    "ch03_token_allocator.py"  # handed in beside the last round: it keeps its 10 points
)
RENAMED = "ch11_radix_match.py"  # the solution, renamed: held on Gradescope


def handed_in(round_: str) -> dict[str, str]:
    """name -> source of the files handed in (a round holds one file per exercise)."""
    kinds = (
        ["last_round"]
        if round_ == "last_round"
        else [k for k in KINDS if k != "signals"]
    )
    kinds = ["signals"] if round_ == "signals" else kinds
    out = {f.name: f.read_text() for k in kinds for f in (DISHONEST / k).glob("ch*.py")}
    if round_ == "last_round":
        out[RENAMED] = image.renamed((image.ROOT / "solutions" / RENAMED).read_text())
        out[HONEST] = (HERE / "honest" / HONEST).read_text()
    return out


def earned(data: dict) -> dict[str, int]:
    """Points per exercise file."""
    out: dict[str, int] = {}
    for t in data["tests"]:
        ex = t.get("extra_data", {}).get("exercise") or t["name"].split(" · ")[0]
        name = ex.replace(".", "_", 1) + ".py"
        out[name] = out.get(name, 0) + t["score"]
    return out


def left_running(user: str, where: Path) -> list[int]:
    """Processes of ``user`` still running in a folder under ``where``."""
    uid, out = image.user(user)[0], []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            mine = os.stat(f"/proc/{pid}").st_uid == uid
            if mine and str(where) in os.readlink(f"/proc/{pid}/cwd"):
                out.append(int(pid))
        except OSError:
            pass
    return out


@pytest.mark.slow
@pytest.mark.parametrize("round_", ["kinds+signals", "last_round"])
def test_no_dishonest_file_earns_a_point_on_gradescope(round_):
    image.need(
        image.venv() is not None, "needs root, useradd and a Python users may run"
    )
    root = image.autograder(f"dishonest-{round_}")
    if round_ == "last_round":
        handed = handed_in(round_)
    else:  # on Gradescope a file that kills what it can cannot touch the grader
        handed = {**handed_in("kinds"), **handed_in("signals")}
    for name, text in handed.items():
        (root / "submission" / name).write_text(text)
    if round_ != "last_round":  # an absolute link, and a relative one that climbs out
        for name, target in LINKS.items():
            to = (
                root / "source" / target
                if "kernels" in target
                else Path("../source", target)
            )
            (root / "submission" / name).symlink_to(to)
    student = (
        f"memlab-gs-{round_[:4]}"  # a user per round: signals/ kills all of its own
    )
    image.need(image.user(student) is not None, "needs root and useradd")
    data = image.run_autograder(root, student)
    got = earned(data)
    assert {n: p for n, p in got.items() if p and n != HONEST} == {}, data["output"][
        :3000
    ]
    refused = sorted(data["extra_data"]["refused"])
    assert refused == (sorted(LINKS) if round_ != "last_round" else []), refused
    similar = data["extra_data"]["similarity"]
    hidden = [t for t in data["tests"] if t.get("visibility") == "hidden"]
    assert len(hidden) == 1 and all(n in hidden[0]["output"] for n in similar)
    if round_ == "last_round":
        assert got[HONEST] == 10 and similar[HONEST]["verdict"] == "", similar[HONEST]
        held = similar[RENAMED]
        assert held["verdict"] == "held" and held["would_earn"] == 12, held
    else:
        # memlab's, pasted
        assert similar["ch03_token_allocator.py"]["verdict"] == "held"
    # Nothing planted where the grader imports from: the venv, the course, its own folders.
    names = ("sitecustomize.py", "usercustomize.py", "memlab_persist.pth")
    site = next(image.venv().glob("lib/python*/site-packages"))
    planted = [p for d in (site, root / "source", root / "path") for p in d.glob("*")]
    planted += [p for p in root.glob("*") if p.is_file()]
    assert not [p for p in planted if p.name in names], planted
    assert left_running(student, root) == [], "the student's processes outlived grading"
    assert data["score"] == (10 if round_ == "last_round" else 0)


@pytest.mark.slow
@pytest.mark.parametrize("round_", ["kinds", "signals", "last_round"])
def test_no_dishonest_file_earns_a_point_locally(round_):
    """``python -m memlab.grade`` as the learner's own user: a file that kills every process of
    its user (signals/) ends the grading itself; the others are graded and earn nothing but
    the pastes."""
    image.need(
        image.venv() is not None, "needs root, useradd and a Python users may run"
    )
    handed = handed_in(round_)
    # only the exercises graded: no stub needed
    folder = image.folder() / f"local-{round_}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for name, text in handed.items():
        (folder / name).write_text(text)
    if round_ == "kinds":
        for name, target in LINKS.items():
            (folder / name).symlink_to(image.checkout() / target)
    subprocess.run(["chmod", "-R", "go+rX", str(folder)], check=True)
    names = sorted({*handed, *(LINKS if round_ == "kinds" else ())})
    args = [a for n in names for a in ("--exercise", n.removesuffix(".py"))]
    learner = (
        f"memlab-home-{round_[:4]}"  # a user per round: signals/ kills all of its own
    )
    image.need(image.user(learner) is not None, "needs root and useradd")
    try:
        proc, data = image.grade_as_learner(learner, folder, *args)
    finally:
        image.clean_up_after(learner)
    if round_ == "signals":
        assert proc.returncode == -9 and not data, (
            proc.returncode,
            proc.stdout[-2000:],
        )
        return
    assert proc.returncode == 1 and data, proc.stdout[-3000:] + proc.stderr[-3000:]
    pasted = {f.name for f in (DISHONEST / "paste_memlab").glob("ch*.py")}
    pasted |= {RENAMED, HONEST} if round_ == "last_round" else set()
    got = earned(data)
    assert {n: p for n, p in got.items() if p and n not in pasted} == {}, proc.stdout[
        :4000
    ]
    # Locally nobody stops what a learner's file leaves behind (its write_results/ daemon):
    # the learner owns the machine; the test does (clean_up_after).
