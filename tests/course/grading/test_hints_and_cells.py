"""What a stuck learner meets: hints one at a time (./course hint, a notebook's hint()), exercises
named by their file everywhere, a chapter without exercises, and an exercise cell that says
which of the chapter's checks failed when the learner's code raised nothing."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memlab.course.grading import catalog, hints
from memlab.course.notebook import exercise, hint
from memlab.grade import main as grade_main

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def state(tmp_path, monkeypatch):
    path = tmp_path / "hints.json"
    monkeypatch.setenv(hints.STATE_ENV, str(path))
    return path


def test_every_exercise_has_two_or_three_hints_and_none_is_its_solution():
    assert set(hints.HINTS) == {e.file for e in catalog.EXERCISES}
    for e in catalog.EXERCISES:
        said = hints.HINTS[e.file]
        assert 2 <= len(said) <= 3 and all(40 <= len(h) <= 600 for h in said), e.file
        solution = (ROOT / "solutions" / f"{e.file}.py").read_text()
        stub = (
            (ROOT / "exercises" / f"{e.file}.py").read_text()
            if (ROOT / "exercises" / f"{e.file}.py").exists()
            else ""
        )
        # No line of the code a learner writes (the lines the solution has and the stub
        # has not) is in a hint.
        written = {" ".join(line.split()) for line in solution.splitlines()} - {
            " ".join(x.split()) for x in stub.splitlines()
        }
        written = {
            w for w in written if len(w) > 24 and not w.startswith(("#", '"', "'"))
        }
        for h in said:
            flat = " ".join(h.split())
            assert not [w for w in written if w in flat], (
                f"{e.file}: a hint quotes the solution"
            )


def test_hints_come_one_at_a_time_and_are_remembered(state):
    first = hints.next_hint("ch04_alloc_extend")
    assert first.startswith("ch04_alloc_extend: hint 1/3") and "run it again" in first
    # the id works too
    assert hints.next_hint("ch04.alloc_extend").startswith(
        "ch04_alloc_extend: hint 2/3"
    )
    assert json.loads(state.read_text()) == {"ch04_alloc_extend": 2}
    third = hints.next_hint("exercises/ch04_alloc_extend.py")
    assert "hint 3/3" in third and "that was the last" in third
    again = hints.next_hint("ch04_alloc_extend")
    assert "no more hints" in again and "--all" in again
    # its own count
    assert hints.next_hint("ch02_bytes_per_token").startswith(
        "ch02_bytes_per_token: hint 1/3"
    )
    assert hints.reset("ch04_alloc_extend").endswith("start over at 1")
    assert hints.next_hint("ch04_alloc_extend").startswith(
        "ch04_alloc_extend: hint 1/3"
    )
    everything = hints.all_hints("ch11_radix_match")
    assert all(f"hint {i}/3" in everything for i in (1, 2, 3))


def test_the_command_and_the_notebook_show_the_same_hints(state, capsys):
    assert hints.main(["ch05_paged_free"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ch05_paged_free: hint 1/3")
    hint("ch05_paged_free")
    assert capsys.readouterr().out.startswith("ch05_paged_free: hint 2/3")
    assert (
        hints.main(["ch99_nothing"]) == 2
        and "unknown exercise" in capsys.readouterr().err
    )
    assert hints.main([]) == 0 and "ch11_radix_match" in capsys.readouterr().out
    proc = subprocess.run(
        [str(ROOT / "course"), "help"], capture_output=True, text=True
    )
    assert "./course hint EXERCISE" in proc.stdout


def test_hints_survive_a_home_they_cannot_write(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    # its folder is a file
    monkeypatch.setenv(hints.STATE_ENV, str(tmp_path / "a-file" / "hints.json"))
    assert hints.next_hint("ch01_alloc_rows").startswith("ch01_alloc_rows: hint 1/3")
    # not remembered, no crash
    assert hints.next_hint("ch01_alloc_rows").startswith("ch01_alloc_rows: hint 1/3")


def test_exercises_are_named_by_their_file_everywhere(tmp_path, monkeypatch, capsys):
    for name in (
        "ch04_alloc_extend",
        "ch04.alloc_extend",
        "ch04_alloc_extend.py",
        "exercises/ch04_alloc_extend.py",
    ):
        assert catalog.find(name).id == "ch04.alloc_extend"
    with pytest.raises(ValueError, match="the exercises are ch01_alloc_rows"):
        catalog.find("ch04")
    assert exercise("ch04.alloc_extend").name == "ch04_alloc_extend"
    monkeypatch.chdir(tmp_path)
    assert (
        grade_main(["--exercise", "ch99_nothing"]) == 2
        and "unknown exercise" in capsys.readouterr().err
    )
    mutants = ROOT / "tests" / "tools" / "mutants.py"
    proc = subprocess.run(
        [sys.executable, str(mutants), "ch08_sizing", "--list"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "ch08_sizing." in proc.stdout


@pytest.mark.slow
def test_grading_by_file_name_and_a_chapter_without_exercises(tmp_path, capsys):
    assert (
        grade_main(["00"]) == 0
        and "chapter 00 has no exercises" in capsys.readouterr().out
    )
    assert grade_main(["--exercise", "ch02_bytes_per_token", "--solutions", "-q"]) == 0
    out = capsys.readouterr().out
    pts = next(e.points for e in catalog.EXERCISES if e.file == "ch02_bytes_per_token")
    assert (
        re.search(rf"ch02\.bytes_per_token +{pts}/{pts}\b", out) and "ch01" not in out
    )


def test_the_grade_table_says_hints_exist():
    from memlab.course.grading.report import format_table
    from memlab.course.grading.runner import ExerciseScore, GradeReport, TestResult

    e = catalog.BY_ID["ch05.paged_free"]
    report = GradeReport(
        ROOT / "exercises",
        [
            ExerciseScore(
                e,
                [
                    TestResult("t::a", e.id, 1, False, "passed"),
                    TestResult("t::b", e.id, 2, False, "failed", "wrong page"),
                ],
            )
        ],
        1.0,
        "CPU",
    )
    table = format_table(report)
    assert (
        "Stuck? ./course hint ch05_paged_free shows a hint" in table
        and 'hint("ch05_paged_free")' in table
    )
    report.scores[0].tests[1].outcome = "passed"
    assert "Stuck?" not in format_table(report)


# -- the exercise cell: which check failed ------------------------------------------------------------


def run_cell(tmp_path, source: str, monkeypatch, capsys) -> str:
    """Run a cell's code (with a file of its own, as IPython does) against the solutions."""
    monkeypatch.setenv("MEMLAB_EXERCISES", "solutions")
    cell = tmp_path / f"cell{len(list(tmp_path.glob('cell*.py')))}.py"
    cell.write_text(source)
    exec(
        compile(source, str(cell), "exec"),
        {"exercise": exercise, "__name__": "__main__"},
    )
    return capsys.readouterr().out


def test_a_chapter_check_that_fails_is_named_with_what_it_expected(
    tmp_path, monkeypatch, capsys
):
    out = run_cell(
        tmp_path,
        (
            "import torch\n"
            'with exercise("ch05_alloc_decode") as ex:\n'
            "    got = ex.PagedAllocator(64, 4).alloc_decode(torch.tensor([5]), torch.tensor([19]))\n"
            "    assert got.tolist() == [99], \\\n"
            '        f"yours {got.tolist()}, the kernel\'s [99]"\n'
        ),
        monkeypatch,
        capsys,
    )
    assert "raised AssertionError" not in out
    assert (
        "your code ran without an error, but the chapter's check failed: got.tolist() == [99]"
        in out
    )
    assert (
        "it expected: yours [4], the kernel's [99]" in out
        and 'hint("ch05_alloc_decode")' in out
    )
    out = run_cell(
        tmp_path,
        'with exercise("ch05_alloc_decode") as ex:\n    n = 3\n    assert n == 4 and \\\n'
        "        n > 0\n",
        monkeypatch,
        capsys,
    )
    assert (
        "the chapter's check failed: n == 4 and n > 0" in out
        and "it expected" not in out
    )


def test_an_error_in_the_learners_code_is_still_theirs(tmp_path, monkeypatch, capsys):
    learner = tmp_path / "mine"
    learner.mkdir()
    source = (ROOT / "solutions" / "ch08_sizing.py").read_text()
    tree = ast.parse(source)
    fn = next(
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name == "pool_size_tokens"
    )
    lines = source.splitlines()
    lines.insert(fn.body[-1].lineno - 1, "    assert budget_bytes < 0, 'my own check'")
    (learner / "ch08_sizing.py").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("MEMLAB_EXERCISES", str(learner))
    cell = (
        'with exercise("ch08_sizing") as ex:\n    ex.pool_size_tokens(1024, 64, 16)\n'
    )
    exec(compile(cell, str(tmp_path / "cell.py"), "exec"), {"exercise": exercise})
    out = capsys.readouterr().out
    assert (
        "ch08_sizing: your code raised AssertionError: my own check" in out
        and "chapter's check" not in out
    )
