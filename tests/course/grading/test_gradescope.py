"""The Gradescope autograder bundle, unpacked into a temp folder laid out like Gradescope's
(``source``, ``submission``, ``results`` under MEMLAB_AUTOGRADER_ROOT) and run the way Gradescope
runs it: ``bash run_autograder``. Solutions earn every CPU point, stubs none, and results.json
is written even when grading cannot run."""

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from memlab.course.grading import catalog, gradescope
from memlab.course.grading.stubs import write_stubs
from memlab.grade import main as grade_main

ROOT = Path(__file__).resolve().parents[3]
CPU_MAX = sum(e.points for e in catalog.EXERCISES)
GPU_MAX = sum(e.gpu_points for e in catalog.EXERCISES)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "autograder.zip"
    assert grade_main(["--gradescope-bundle", str(out)]) == 0
    return out


def autograder(bundle: Path, where: Path) -> Path:
    """Gradescope's layout: the zip unpacked into source/, run_autograder copied beside it."""
    root = where / "autograder"
    with zipfile.ZipFile(bundle) as z:
        z.extractall(root / "source")
        for (
            info
        ) in z.infolist():  # zipfile drops the mode bits: restore the executable ones
            mode = info.external_attr >> 16
            if mode & stat.S_IXUSR:
                os.chmod(root / "source" / info.filename, mode & 0o777)
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    (root / "submission").mkdir()
    return root


def run_autograder(
    root: Path, python: str = sys.executable, user: str = "", block: str | None = None
) -> dict:
    """Run the bundle's run_autograder; ``user``: the user the student's code runs as (none here:
    this machine's Python is not one another user may run; see the permission test)."""
    env = dict(
        os.environ,
        MEMLAB_AUTOGRADER_ROOT=str(root),
        MEMLAB_PYTHON=python,
        MEMLAB_SANDBOX_USER=user,
    )
    for k in ("MEMLAB_EXERCISES", "PYTHONPATH", "MEMLAB_SANDBOX_BLOCK"):
        env.pop(k, None)
    if block:
        env["MEMLAB_SANDBOX_BLOCK"] = block
    r = subprocess.run(
        [str(root / "run_autograder")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((root / "results" / "results.json").read_text())


def test_the_bundle_holds_what_gradescope_wants_and_no_solutions(bundle):
    names = zipfile.ZipFile(bundle).namelist()
    assert {"setup.sh", "run_autograder", "requirements.txt"} <= set(
        names
    )  # at the root of the zip
    for e in catalog.EXERCISES:
        assert f"exercises/{e.file}.py" in names and e.test_file in names
    assert "memlab/kernels/alloc_extend.py" in names, (
        "memlab.kernels (a link in the repository) must go in as files"
    )
    assert [n for n in names if n.startswith("solutions/")] == ["solutions/README.md"]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    reqs = zipfile.ZipFile(bundle).read("requirements.txt").decode().split()
    assert any(r.startswith("pytest>=") for r in reqs) and not any(
        r.startswith("torch") for r in reqs
    )
    for script in ("setup.sh", "run_autograder"):
        text = zipfile.ZipFile(bundle).read(script).decode()
        assert text.startswith("#!/usr/bin/env bash")
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0, (
            f"{script} has a syntax error"
        )
    assert (
        zipfile.ZipFile(bundle).getinfo("run_autograder").external_attr >> 16
        & stat.S_IXUSR
    )
    again = bundle.with_name("again.zip")
    gradescope.build_bundle(again)
    assert again.read_bytes() == bundle.read_bytes(), (
        "the same course must give the same zip"
    )


def test_solutions_earn_every_cpu_point_and_say_which_maximum(bundle, tmp_path):
    root = autograder(bundle, tmp_path)
    sub = (
        root / "submission" / "exercises"
    )  # a submitted repository: exercises/ and solutions/
    shutil.copytree(ROOT / "solutions", sub)
    shutil.copytree(
        ROOT / "exercises", root / "submission" / "solutions"
    )  # never graded from here
    data = run_autograder(root)
    assert data["score"] == CPU_MAX, data["output"][:3000]
    assert f"Maximum on this grader: {CPU_MAX} points" in data["output"]
    assert (
        f"the {GPU_MAX} GPU-only points" in data["output"]
        and f"{CPU_MAX + GPU_MAX} on a grader with a GPU" in data["output"]
    )
    gpu = [t for t in data["tests"] if t["name"].startswith("GPU-only checks")]
    assert len(gpu) == 1 and gpu[0]["max_score"] == 0 and "not run" in gpu[0]["name"]
    assert sum(t["max_score"] for t in data["tests"]) == CPU_MAX
    assert (
        data["extra_data"]["gpu_only_not_run"] == GPU_MAX
        and data["extra_data"]["missing"] == []
    )
    assert "ch04_alloc_extend.py (exercises/ch04_alloc_extend.py)" in data["output"]


def test_stubs_and_missing_files_earn_nothing(bundle, tmp_path):
    root = autograder(bundle, tmp_path)
    stubs = (
        write_stubs(tmp_path / "stubs") and tmp_path / "stubs"
    )  # as committed, whatever exercises/ holds
    for stub in stubs.glob("ch0*.py"):  # chapters 01..09 handed in flat, 10 missing
        shutil.copy(stub, root / "submission" / stub.name)
    data = run_autograder(root)
    assert data["score"] == 0 and all(t["score"] == 0 for t in data["tests"])
    assert (
        "graded as the untouched stub (0 points): ch10_admission.py" in data["output"]
    )
    assert "not written yet" in json.dumps(data["tests"])


def test_dishonest_files_earn_nothing_from_the_bundle(bundle, tmp_path):
    """The four files of tests/course/grading/dishonest/ (forge the log, import memlab's implementation, read a
    solution, patch the grader), handed in: 0 points, each listed for the instructor."""
    root = autograder(bundle, tmp_path)
    for f in (ROOT / "tests" / "course" / "grading" / "dishonest").glob("ch*.py"):
        shutil.copy(f, root / "submission" / f.name)
    # This machine's Python lives in a checkout that holds the solutions (a Gradescope image has
    # none): it is the course's too, as far as the student's code is concerned.
    venv = next(
        (p for p in Path(sys.prefix).resolve().parents if (p / "solutions").is_dir()),
        ROOT,
    )
    data = run_autograder(root, block=os.pathsep.join({str(ROOT), str(venv)}))
    assert data["score"] == 0 and all(t["score"] == 0 for t in data["tests"]), data[
        "output"
    ][:3000]
    used = data["extra_data"]["course_code_used"]
    assert sorted(used) == sorted(
        f.name
        for f in (ROOT / "tests" / "course" / "grading" / "dishonest").glob("ch*.py")
    ), used
    assert (
        "Graded 0 for using the course's own implementation or files (write it yourself): ch01_alloc_rows.py "
        "imports memlab.course.grading.plugin" in data["output"]
    ), data["output"][:3000]
    assert (
        "ch04_alloc_extend.py imports memlab.sglang.allocator.reference"
        in data["output"]
    )


def test_results_are_written_when_grading_fails(bundle, tmp_path):
    root = autograder(bundle, tmp_path)
    shutil.rmtree(root / "source" / "tests" / "exercises")  # a broken autograder image
    data = run_autograder(root)
    assert data["score"] == 0 and "could not grade this submission" in data["output"]
    assert "tests/exercises" in data["output"]
    data = run_autograder(
        root, python=str(tmp_path / "no-python")
    )  # Python itself cannot start
    assert (
        data["score"] == 0
        and "could not start" in data["output"]
        and data["tests"] == []
    )


def test_submitted_files_are_found_anywhere_but_under_solutions(tmp_path):
    (tmp_path / "deep" / "exercises").mkdir(parents=True)
    (tmp_path / "solutions").mkdir()
    (tmp_path / "deep" / "exercises" / "ch04_alloc_extend.py").write_text("a")
    (tmp_path / "ch04_alloc_extend.py").write_text(
        "b"
    )  # shallower, but not in an exercises/ folder
    (tmp_path / "solutions" / "ch05_alloc_decode.py").write_text("c")
    (tmp_path / "ch01_alloc_rows.py").write_text("d")
    found, missing = gradescope.find_submitted(tmp_path)
    assert (
        found["ch04_alloc_extend.py"]
        == tmp_path / "deep" / "exercises" / "ch04_alloc_extend.py"
    )
    assert found["ch01_alloc_rows.py"] == tmp_path / "ch01_alloc_rows.py"
    assert "ch05_alloc_decode.py" in missing and len(found) + len(missing) == len(
        catalog.EXERCISES
    )


def _as(user: str, code: str) -> subprocess.CompletedProcess:
    import pwd

    pw = pwd.getpwnam(user)
    return subprocess.run(
        ["/usr/bin/env", "python3", "-c", code],
        user=pw.pw_uid,
        group=pw.pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
    )


def _a_user_who_runs_python() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    import pwd

    for name in ("nobody", "student"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        if _as(name, "print(1)").returncode == 0:
            return name
    return None


@pytest.mark.skipif(
    _a_user_who_runs_python() is None,
    reason="needs root and an unprivileged user (nobody) who can run a system python3",
)
def test_the_students_user_cannot_read_the_graders_files(bundle):
    """run_autograder's permissions, with an existing unprivileged user standing in for Gradescope's
    ``student`` (no user is created here): before it, that user can read the tests and the
    submission; after it, neither them nor the results, while the folder stays traversable for
    the Python the student's code runs on. The grader's Python gets the user and the limits."""
    import tempfile

    user = _a_user_who_runs_python()
    where = Path(
        tempfile.mkdtemp(prefix="memlab-gs-")
    )  # not under pytest's own 0700 folder
    try:
        os.chmod(where, 0o755)
        root = autograder(bundle, where)
        os.chmod(root, 0o755)
        (root / "submission" / "ch01_alloc_rows.py").write_text("x = 1\n")
        test_file = root / "source" / catalog.EXERCISES[0].test_file
        read = "import sys\ntry:\n    open(sys.argv[1]).read()\nexcept PermissionError:\n    print('refused')\n"

        def probe(p):
            return _as(user, read.replace("sys.argv[1]", repr(str(p)))).stdout.strip()

        assert (
            probe(test_file) == ""
            and probe(root / "submission" / "ch01_alloc_rows.py") == ""
        )  # readable before
        fake = where / "python"
        fake.write_text(
            '#!/bin/sh\nenv > "$MEMLAB_AUTOGRADER_ROOT/grader-env.txt"\nexit 3\n'
        )
        fake.chmod(0o755)
        env = dict(
            os.environ,
            MEMLAB_AUTOGRADER_ROOT=str(root),
            MEMLAB_PYTHON=str(fake),
            MEMLAB_SANDBOX_USER=user,
        )
        subprocess.run(
            [str(root / "run_autograder")],
            cwd=root,
            env=env,
            check=True,
            capture_output=True,
        )
        for p in (
            test_file,
            root / "submission" / "ch01_alloc_rows.py",
            root / "results" / "results.json",
            root / "source" / "memlab" / "course" / "grading" / "plugin.py",
        ):
            assert probe(p) == "refused", p
        assert (
            _as(user, f"import os; os.stat({str(root)!r})").returncode == 0
        )  # the folder itself: traversable
        seen = dict(
            line.split("=", 1)
            for line in (root / "grader-env.txt").read_text().splitlines()
            if "=" in line
        )
        assert (
            seen["MEMLAB_SANDBOX_USER"] == user
            and "memory=4G" in seen["MEMLAB_SANDBOX_LIMITS"]
        )
        assert str(root) in seen["MEMLAB_SANDBOX_BLOCK"].split(":")
    finally:
        shutil.rmtree(where, ignore_errors=True)
