"""The Gradescope autograder bundle, unpacked where Gradescope unpacks it and run as Gradescope
runs it: ``run_autograder`` as root, the student's code as an unprivileged user
(tests/course/grading/image.py makes both here). Solutions earn every CPU point (held as copies
of the solutions, which is what they are), stubs none; the student's user reaches the venv and
nothing of the grader's; results.json is written even when grading cannot run. The dishonest
files: tests/course/grading/test_dishonest.py."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from memlab.course.grading import catalog, gradescope
from memlab.course.grading.stubs import write_stubs
from memlab_tests.course.grading import image

ROOT = Path(__file__).resolve().parents[3]
CPU_MAX = sum(e.points for e in catalog.EXERCISES)
GPU_MAX = sum(e.gpu_points for e in catalog.EXERCISES)
HALVES = {"ch01-06": range(1, 7), "ch07-12": range(7, 13)}


@pytest.fixture(scope="module")
def gs():
    image.need(
        image.venv() is not None, "needs root, useradd and a Python users may run"
    )
    return image


def test_the_bundle_holds_what_gradescope_wants_and_no_solutions():
    z = zipfile.ZipFile(image.bundle())
    names = z.namelist()
    assert {
        "setup.sh",
        "run_autograder",
        "requirements.txt",
        "fingerprints.json",
    } <= set(names)
    for e in catalog.EXERCISES:
        assert f"exercises/{e.file}.py" in names and e.test_file in names
    assert "memlab/kernels/alloc_extend.py" in names, "memlab.kernels goes in as files"
    assert {
        "tests/tools/loading.py",
        "tests/tools/ci_skips.py",
        "tests/conftest.py",
    } <= set(names)
    assert [n for n in names if n.startswith("solutions/")] == ["solutions/README.md"]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    reqs = z.read("requirements.txt").decode().split()
    assert any(r.startswith("pytest>=") for r in reqs) and not any(
        r.startswith("torch") for r in reqs
    )
    for script in ("setup.sh", "run_autograder"):
        text = z.read(script).decode()
        assert (
            text.startswith("#!/usr/bin/env bash")
            and 'PYTHONPATH="$AG/source"' not in text
        )
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0, (
            script
        )
        assert z.getinfo(script).external_attr >> 16 & stat.S_IXUSR
    again = image.folder() / "again.zip"
    assert gradescope.build_bundle(again).read_bytes() == image.bundle().read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("half", sorted(HALVES))
def test_solutions_earn_every_cpu_point_held_as_copies(gs, half):
    """A submitted repository: exercises/ holds the solutions, a solutions/ folder the stubs
    (never graded from there). Each file earns its points; those that are a solution's copy
    (all but the smallest) have them held for the instructor, who sees what they would earn."""
    root = gs.autograder(f"solutions-{half}")
    chosen = [e for e in catalog.EXERCISES if e.chapter in HALVES[half]]
    (root / "submission" / "exercises").mkdir()
    write_stubs(root / "submission" / "solutions")
    for e in chosen:
        shutil.copy(
            ROOT / "solutions" / f"{e.file}.py", root / "submission" / "exercises"
        )
    data = gs.run_autograder(root)
    similar = data["extra_data"]["similarity"]
    for e in chosen:
        tests = [
            t for t in data["tests"] if t.get("extra_data", {}).get("exercise") == e.id
        ]
        got = sum(t["score"] for t in tests) + similar[f"{e.file}.py"].get(
            "would_earn", 0
        )
        assert got == e.points, (
            e.id,
            similar[f"{e.file}.py"].get("would_fail"),
            [t["output"][:200] for t in tests if not t["score"]],
        )
    assert f"Maximum on this grader: {CPU_MAX} points" in data["output"]
    assert f"{CPU_MAX + GPU_MAX} on a grader with a GPU" in data["output"]
    assert "random cases from seed" in data["output"] and data["extra_data"]["seed"] > 0
    assert not data["extra_data"]["refused"]


@pytest.mark.slow
def test_stubs_and_missing_files_earn_nothing(gs):
    root = gs.autograder("stubs")
    stubs = image.folder() / "stubs"
    write_stubs(stubs)
    for stub in stubs.glob("ch0*.py"):  # chapters 01..09 handed in flat, 10..12 missing
        shutil.copy(stub, root / "submission" / stub.name)
    data = gs.run_autograder(root)
    assert data["score"] == 0 and all(t["score"] == 0 for t in data["tests"])
    assert "Not in your submission (0 points): ch10_admission.py" in data["output"]
    graded = [
        t for t in data["tests"] if "extra_data" in t and "nodeid" in t["extra_data"]
    ]
    assert graded and all(t["output"].startswith("not written yet") for t in graded), (
        graded[:2]
    )
    # missing ones count too
    assert sum(t["max_score"] for t in data["tests"]) == CPU_MAX


PROBE = """
import json, os, resource, socket, sys

def probe():
    ag = os.path.dirname(sys.prefix)  # the venv's folder: /autograder
    tries = {}
    for p in ("source/tests/exercises/test_ch08_sizing.py", "source/memlab/__init__.py",
              "source/fingerprints.json", "results", "submission", "work", "path/memlab",
              "sandbox"):
        try:
            (os.listdir if os.path.isdir(os.path.join(ag, p)) else open)(os.path.join(ag, p))
            tries[p] = "read"
        except OSError as e:
            tries[p] = type(e).__name__
    try:
        os.kill(os.getppid(), 0)
        tries["signal the zygote"] = "sent"
    except OSError as e:
        tries["signal the zygote"] = type(e).__name__
    try:
        open(sys.prefix + "/sitecustomize.py", "w")
        tries["write the venv"] = "written"
    except OSError as e:
        tries["write the venv"] = type(e).__name__
    import torch  # the venv is the student's to read
    limits = {k: resource.getrlimit(getattr(resource, "RLIMIT_" + k))[0] for k in ("AS", "CPU")}
    return json.dumps(dict(uid=os.getuid(), groups=os.getgroups(), env=sorted(os.environ),
                           tries=tries, limits=limits, torch=torch.__version__))
print("PROBE", probe())
def pool_size_tokens(*args):
    return 0
"""


@pytest.mark.slow
def test_the_students_user_reaches_the_venv_and_nothing_of_the_graders(gs):
    root = gs.autograder("probe")
    (root / "submission" / "ch08_sizing.py").write_text(PROBE)
    data = gs.run_autograder(root)
    printed = next(t["output"] for t in data["tests"] if "PROBE" in t["output"])
    seen = json.loads(printed.split("PROBE ", 1)[1].splitlines()[0])
    assert seen["uid"] == image.user(image.STUDENT)[0] and seen["groups"] == []
    assert set(seen["tries"].values()) == {"PermissionError"}, seen["tries"]
    assert not [n for n in seen["env"] if n.startswith(("MEMLAB", "PYTHONPATH"))], seen[
        "env"
    ]
    assert seen["limits"]["AS"] == 6 << 30 and seen["limits"]["CPU"] == 600
    assert data["extra_data"]["student_user"] == image.STUDENT


def test_without_the_students_user_nothing_is_graded(gs):
    root = gs.autograder("no-user")
    shutil.copy(ROOT / "solutions" / "ch08_sizing.py", root / "submission")
    data = gs.run_autograder(root, student="memlab-nobody-here")
    assert data["score"] == 0 and "no user 'memlab-nobody-here'" in data["output"], (
        data["output"]
    )


def test_results_are_written_when_grading_fails(gs):
    root = gs.autograder("broken")
    shutil.copy(ROOT / "solutions" / "ch08_sizing.py", root / "submission")
    shutil.rmtree(root / "source" / "tests" / "exercises")  # a broken autograder image
    data = gs.run_autograder(root)
    assert data["score"] == 0 and "could not grade this submission" in data["output"]
    fake = image.folder() / "python-that-fails"  # Python itself does not start
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    data = gs.run_autograder(root, env_={"MEMLAB_PYTHON": str(fake)})
    assert data["score"] == 0 and "could not start (exit code 3" in data["output"]


def test_submitted_files_are_found_anywhere_but_under_solutions_and_links_refused(
    tmp_path,
):
    (tmp_path / "deep" / "exercises").mkdir(parents=True)
    (tmp_path / "solutions").mkdir()
    (tmp_path / "deep" / "exercises" / "ch04_alloc_extend.py").write_text("a")
    (tmp_path / "ch04_alloc_extend.py").write_text("b")  # shallower, not in exercises/
    (tmp_path / "solutions" / "ch05_alloc_decode.py").write_text("c")
    (tmp_path / "ch01_alloc_rows.py").write_text("d")
    (tmp_path / "ch08_sizing.py").symlink_to(ROOT / "solutions" / "ch08_sizing.py")
    (tmp_path / "linked").symlink_to(ROOT / "solutions", target_is_directory=True)
    (tmp_path / "exercises").symlink_to(ROOT / "solutions", target_is_directory=True)
    found, refused, missing = gradescope.find_submitted(tmp_path)
    assert found == {"ch01_alloc_rows.py": b"d", "ch04_alloc_extend.py": b"a"}
    assert list(refused) == ["ch08_sizing.py"] and "a link" in refused["ch08_sizing.py"]
    assert "ch05_alloc_decode.py" in missing and len(found) + len(refused) + len(
        missing
    ) == len(catalog.EXERCISES)
