"""The mutation testing of the graded tests (tests/tools/mutants.py, ./course mutants): its mutants
stay in the code a learner writes, its note of equivalent mutants is current, and a small sample
of mutants runs here, each of which the graded tests must kill. The whole run (about a thousand
mutants, a few minutes) is `./course mutants`; its score is in tests/tools/bug_zoo/equivalent_mutants.md."""

import difflib
from pathlib import Path

import pytest

from memlab.course.grading import catalog
from memlab_tests.tools.loading import load_file

ROOT = Path(__file__).resolve().parents[3]


mutants = load_file("tests/tools/mutants.py")


@pytest.mark.parametrize("exercise", catalog.EXERCISES, ids=lambda e: e.id)
def test_mutants_change_only_what_a_learner_writes(exercise):
    lines = mutants.learner_lines(exercise.file)
    made = mutants.make_mutants(exercise.file)
    assert lines and len(made) >= 20, (
        f"{exercise.file}: {len(lines)} learner lines, {len(made)} mutants"
    )
    solution = (ROOT / "solutions" / f"{exercise.file}.py").read_text().splitlines()
    for m in made:
        ops = difflib.SequenceMatcher(
            None, solution, m.source.splitlines(), autojunk=False
        ).get_opcodes()
        changed = [
            i + 1 for tag, i1, i2, _, _ in ops if tag != "equal" for i in range(i1, i2)
        ]
        assert changed and set(changed) <= lines, (
            f"{m.id} changes lines {changed}, the learner writes {sorted(lines)}"
        )
        compile(m.source, m.id, "exec")
    assert len({m.id for m in made}) == len(made), "mutant ids must be unique"


def test_the_note_lists_only_mutants_that_exist():
    note = mutants.read_note()
    assert note, "the note lists no equivalent mutant"
    existing = {m.id for e in catalog.EXERCISES for m in mutants.make_mutants(e.file)}
    stale = sorted(set(note) - existing)
    assert not stale, (
        f"the note lists mutants that no longer exist (edit the note): {stale}"
    )
    assert all(len(why) > 15 for why in note.values()), (
        "every equivalent mutant needs its reason"
    )
    text = mutants.NOTE.read_text()
    assert "<!-- score:begin -->" in text and "(not measured yet)" not in text


@pytest.mark.slow
def test_a_sample_of_mutants_is_killed(capsys):
    """Two random mutants of three exercises (a kernel among them), the script end to end."""
    code = mutants.main(
        [
            "ch02",
            "ch06_free_queue",
            "ch09",
            "--sample",
            "2",
            "--seed",
            "7",
            "--jobs",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "| ch09_paged_gather | 2 |" in out and "survivor" not in out, out
