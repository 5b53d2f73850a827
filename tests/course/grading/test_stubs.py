"""The stubs are generated from the solutions' regions (memlab.course.grading.stubs,
scripts/make_stubs.py), and exercises/ is in step with them whatever a learner did there."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memlab.course.grading import catalog, stubs

ROOT = Path(__file__).resolve().parents[3]
CI = bool(os.environ.get("CI"))


def test_regions_become_the_stub():
    solution = (
        '"""Doc."""\n\n'
        "# BEGIN SOLUTION (stub: FLAG = False)\n"
        "FLAG = True\n"
        "# END SOLUTION\n\n\n"
        "def f(x):\n"
        '    """Say what f does."""\n'
        "    # BEGIN SOLUTION\n"
        "    y = x + 1\n"
        "    return y\n"
        "    # END SOLUTION\n\n\n"
        "def k():\n"
        "    for i in range(3):\n"
        "        # BEGIN SOLUTION (stub: # YOUR CODE HERE)\n"
        "        print(i)\n"
        "        # END SOLUTION\n"
    )
    assert stubs.generate(solution) == (
        '"""Doc."""\n\n'
        "FLAG = False\n\n\n"
        "def f(x):\n"
        '    """Say what f does."""\n'
        "    raise NotImplementedError\n\n\n"
        "def k():\n"
        "    for i in range(3):\n"
        "        # YOUR CODE HERE\n"
    )


@pytest.mark.parametrize(
    "text, says",
    [
        ("x = 1\n", "no # BEGIN SOLUTION region"),
        ("# BEGIN SOLUTION\nx = 1\n", "never closed"),
        ("x = 1\n# END SOLUTION\n", "without # BEGIN SOLUTION"),
        ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION\n", "inside the region"),
    ],
)
def test_malformed_regions_are_refused_with_the_line(text, says):
    with pytest.raises(stubs.StubError, match=says):
        stubs.generate(text, "solutions/x.py")


@pytest.mark.parametrize("exercise", catalog.EXERCISES, ids=lambda e: e.file)
def test_every_stub_is_generated_from_its_solution(exercise):
    text, where = stubs.course_stub(exercise.file)
    solution = (ROOT / "solutions" / f"{exercise.file}.py").read_text()
    assert where == f"generated from {exercise.file}.py"
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    assert stubs.looks_like_stub(text, solution), (
        f"solutions/{exercise.file}.py: a region left code a learner would write in the "
        "stub, or its kernel flag True"
    )
    compile(text, f"exercises/{exercise.file}.py", "exec")


@pytest.mark.parametrize("exercise", catalog.EXERCISES, ids=lambda e: e.file)
def test_exercises_are_in_step_with_the_solutions(exercise):
    """exercises/ holds the generated stubs (the working copy, or a commit since the solution's
    last change: a learner's edits, committed or not, never turn this red). An author who edits a
    solution runs scripts/make_stubs.py and commits both."""
    ok, where = stubs.in_step(exercise.file)
    if ok is None and not CI:
        pytest.skip(f"cannot tell here: {where}")
    assert ok, (
        f"exercises/{exercise.file}.py is not the stub generated from its solution ({where}): "
        "run python scripts/make_stubs.py and commit exercises/ with solutions/"
    )


def test_the_script_checks_and_writes_the_stubs():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_stubs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("in step") == len(catalog.EXERCISES), proc.stdout


def git(cwd, *args):
    proc = subprocess.run(
        ["git", "-c", "user.name=l", "-c", "user.email=l@e", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"


@pytest.mark.skipif(shutil.which("git") is None and not CI, reason="needs git")
def test_in_step_whatever_the_learner_did(tmp_path):
    """Untouched, edited, edited and committed, deleted: in step; a solution changed without its
    stub: not, with or without a commit; no git and no stub: cannot tell."""
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(ROOT), str(clone))
    name = "ch03_token_allocator"
    stub = clone / "exercises" / f"{name}.py"
    solution = clone / "solutions" / f"{name}.py"
    assert stubs.in_step(name, clone) == (True, "the working copy")
    stub.write_text(solution.read_text())  # a learner's answer, not committed
    ok, where = stubs.in_step(name, clone)
    assert ok and where.startswith("commit "), where
    git(clone, "commit", "-qam", "my work")  # ... and committed, twice
    stub.write_text(stub.read_text() + "\n# more\n")
    git(clone, "commit", "-qam", "more work")
    ok, where = stubs.in_step(name, clone)
    assert ok and where.startswith("commit "), where
    stub.unlink()
    assert stubs.in_step(name, clone)[0]
    # An author's slip: the solution's docstring changed, the stub not regenerated.
    solution.write_text(
        solution.read_text().replace("Given: the state", "Given, the state")
    )
    assert stubs.in_step(name, clone)[0] is False  # not committed
    git(clone, "commit", "-qam", "solution only")
    ok, where = stubs.in_step(name, clone)
    assert ok is False and "no commit since" in where, where
    # The author regenerates and commits: in step again, and a learner's later edit is theirs.
    stub.write_text(stubs.course_stub(name, clone)[0])  # what make_stubs.py writes
    assert stubs.in_step(name, clone) == (True, "the working copy")
    git(clone, "add", "-A")
    git(clone, "commit", "-qm", "stub regenerated")
    stub.write_text("# mine\n")
    ok, where = stubs.in_step(name, clone)
    assert ok and where.startswith("commit "), where
    shutil.rmtree(clone / ".git")
    assert stubs.in_step(name, clone)[0] is None
