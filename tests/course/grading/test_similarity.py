"""The similarity report (memlab.course.grading.similarity): a solution pasted and renamed, or
memlab's own code pasted into a stub, is held for the instructor; an honest answer written
apart is not flagged, and no solution of the course, which is as close to the engine as an
honest answer may be, is held against memlab's code or the other solutions."""

from __future__ import annotations

from pathlib import Path

import pytest

from memlab.course.grading import catalog, similarity
from memlab.course.grading.stubs import course_stub
from memlab_tests.course.grading import image

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def refs():
    return similarity.references(ROOT, ROOT / "solutions")


def verdict(refs, source: str, file: str, leave_out: str = "") -> dict:
    mine = {k: v for k, v in refs.items() if k != leave_out}
    return similarity.compare(
        source, course_stub(file)[0], mine, refs[f"solutions/{file}.py"]
    )


def test_names_numbers_and_layout_say_nothing():
    a = "def f(x, y):\n    total = x + 2  # add\n    return (total, y)\n"
    b = "def g(aa,bb):\n  s=aa+7\n  return s,bb\n"
    assert similarity.tokens(a) == similarity.tokens(b)
    # builtins are kept
    assert similarity.tokens("len(x)") != similarity.tokens("abs(x)")


@pytest.mark.parametrize(
    "file", ["ch03_token_allocator", "ch08_sizing", "ch11_radix_match"]
)
def test_a_renamed_solution_is_held(refs, file):
    pasted = image.renamed((ROOT / "solutions" / f"{file}.py").read_text())
    got = verdict(refs, pasted, file)
    assert got["verdict"] == "held" and got["matches"][0] == (
        f"solutions/{file}.py",
        1.0,
    ), got


def test_memlab_pasted_into_a_stub_is_held(refs):
    source = (
        HERE / "dishonest" / "paste_memlab" / "ch03_token_allocator.py"
    ).read_text()
    got = verdict(refs, source, "ch03_token_allocator")
    assert got["verdict"] == "held", got
    assert got["matches"][0][0] == "memlab/sglang/allocator/token.py", got


def test_an_honest_answer_is_not_flagged(refs):
    source = (HERE / "honest" / "ch03_token_allocator.py").read_text()
    got = verdict(refs, source, "ch03_token_allocator")
    assert (
        got == {"own": got["own"], "matches": [], "verdict": ""} and got["own"] > 50
    ), got


@pytest.mark.parametrize(
    "margin, held", [(similarity.MARGIN, []), (0.0, ["ch09_paged_gather"])]
)
def test_no_solution_is_held_against_memlab_or_the_others(
    refs, margin, held, monkeypatch
):
    """Each solution stands for an honest answer: written in the engine's shape, it looks like
    memlab's module of that engine; only a copy clearly closer than that is held. Without the
    margin over the solution's own likeness, the kernel of chapter 09 would be."""
    monkeypatch.setattr(similarity, "MARGIN", margin)
    got = {
        e.file: verdict(
            refs,
            (ROOT / "solutions" / f"{e.file}.py").read_text(),
            e.file,
            leave_out=f"solutions/{e.file}.py",
        )["verdict"]  # fmt: skip
        for e in catalog.EXERCISES
    }
    assert [f for f, v in got.items() if v == "held"] == held, got


def test_the_bundle_carries_fingerprints_not_solutions():
    from memlab.course.grading.gradescope import fingerprints

    stored = fingerprints()
    assert sorted(stored) == sorted(f"solutions/{e.file}.py" for e in catalog.EXERCISES)
    one = stored["solutions/ch08_sizing.py"].split()
    assert all(len(h) == 16 for h in one) and "def " not in " ".join(stored.values())
    assert {int(h, 16) for h in one} == similarity.fingerprints(
        (ROOT / "solutions" / "ch08_sizing.py").read_text()
    )
