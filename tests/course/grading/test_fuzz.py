"""The graded tests' random cases (memlab.course.grading.fuzz) and checks (checks): one seed per
run, printed and reproducible; Gradescope's hidden cases; edge cases gated on their core test;
learner objects refused where a value is expected; and a failure's message, pasted into a cell,
shows the failure."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memlab.course.grading import fuzz, loader, plugin
from memlab.course.grading.checks import CheckFailed, expect_equal, plural
from memlab_tests.tools.loading import load_file

ROOT = Path(__file__).resolve().parents[3]
zoo = load_file("tests/tools/bug_zoo/zoo.py")


def draws(monkeypatch, seed, profile=None):
    """The first case of a property under a seed: its choices and its size."""
    monkeypatch.setenv(fuzz.SEED_ENV, str(seed))
    if profile:
        monkeypatch.setenv(fuzz.PROFILE_ENV, profile)
    else:
        monkeypatch.delenv(fuzz.PROFILE_ENV, raising=False)
    seen = []

    def prop(d):
        seen.append([d.int(0, 10**9), len(list(d.count(10, 10)))])

    fuzz.check(prop, trials=3, name="x")
    return seen


def test_one_seed_per_run_draws_the_same_cases_again(monkeypatch):
    first = draws(monkeypatch, 7)
    assert draws(monkeypatch, 7) == first and len(first) == 3
    assert draws(monkeypatch, 8) != first
    monkeypatch.setenv(fuzz.SEED_ENV, "7")
    assert fuzz.rng("a").random() == fuzz.rng("a").random() != fuzz.rng("b").random()
    monkeypatch.delenv(fuzz.SEED_ENV)
    drawn = fuzz.grade_seed()  # none given: one is drawn, and kept for the whole run
    assert os.environ[fuzz.SEED_ENV] == str(drawn) and fuzz.grade_seed() == drawn


def test_gradescope_adds_more_and_larger_cases(monkeypatch):
    public = draws(monkeypatch, 7)
    hidden = draws(monkeypatch, 7, "gradescope")
    assert len(hidden) == fuzz.HIDDEN_TRIALS * len(public)
    assert {n for _, n in public} == {10}  # d.count(10, 10): 10 items; hidden: 10 to 20
    assert {n for _, n in hidden} <= set(range(10, 21)) and max(
        n for _, n in hidden
    ) > 10


def test_the_header_names_the_seed_and_a_failure_reproduces(tmp_path):
    """The plain suite draws a seed and prints it; MEMLAB_GRADE_SEED=N runs the same cases."""
    env = {k: v for k, v in os.environ.items() if k != fuzz.SEED_ENV}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0"]
    test = "tests/exercises/test_ch08_sizing.py::test_pool_size_floored_to_pages"
    out = subprocess.run(
        [*cmd, "--co", test], cwd=ROOT, env=env, capture_output=True, text=True
    ).stdout
    seed = re.search(r"random cases of seed (\d+) \(MEMLAB_GRADE_SEED=\1 draws", out)
    assert seed, out


def learner_folder(tmp_path, variant):
    folder = tmp_path / variant.name
    shutil.copytree(
        ROOT / "solutions", folder, ignore=shutil.ignore_patterns("__pycache__")
    )
    (folder / f"{variant.solution}.py").write_text(zoo.build(variant))
    return folder


def test_edge_points_are_gated_on_the_core_test(tmp_path):
    """A free that frees nothing fails the core test, and the 'an empty free changes nothing'
    test, which it would pass, then fails at once and says why."""
    (variant,) = [v for v in zoo.ZOO if v.name == "ch05_paged_free__frees_nothing"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "-q",
            "-rf",
            "tests/exercises/test_ch05_paged_free.py",
            "-k",
            "dedups or empty",
        ],
        cwd=ROOT,
        env={**os.environ, loader.ENV: str(learner_folder(tmp_path, variant))},
        capture_output=True,
        text=True,
    )
    out = proc.stdout
    assert (
        "FAILED tests/exercises/test_ch05_paged_free.py::test_free_dedups_pages" in out
    )
    assert "FAILED tests/exercises/test_ch05_paged_free.py::test_free_empty_noop" in out
    assert (
        "CheckFailed: not counted yet: this edge case earns its points once "
        "test_free_dedups_pages (the exercise's core behaviour) passes, and it failed"
    ) in out, out


def test_a_learner_object_is_never_compared(tmp_path, monkeypatch):
    """An object of the learner's code (its == says yes to anything) is refused where a value
    is expected, by the checks and by a property's comparisons alike."""
    (tmp_path / "liar.py").write_text(
        "class Yes(int):\n"
        "    def __eq__(self, other):\n"
        "        return True\n\n"
        "    __hash__ = int.__hash__\n\n\n"
        "def answer():\n"
        "    return Yes(3)\n\n\n"
        "def answers():\n"
        "    return [1, Yes(2)]\n"
    )
    m = loader.load("liar", source=str(tmp_path))
    with pytest.raises(
        CheckFailed, match="expected a plain value, got an object of type"
    ):
        expect_equal(m.answer(), 3, "the answer")
    with pytest.raises(CheckFailed, match="an object of your code"):
        expect_equal(m.answers(), [1, 2], "the answers")
    expect_equal([1, 2], [1, 2], "plain values")
    monkeypatch.setenv(fuzz.SEED_ENV, "1")
    with pytest.raises(
        CheckFailed, match="your `answer` returned a value: expected a plain"
    ):
        fuzz.check(lambda d: d.returns("answer", m.answer(), 3), trials=1, name="liar")


def test_messages_say_index_and_count_their_nouns():
    with pytest.raises(CheckFailed) as e:
        expect_equal([5, 8], [5, 9], "slots")
    assert (
        str(e.value)
        == "slots: at index 1 got 8, expected 9 (got [5, 8], expected [5, 9])"
    )
    with pytest.raises(CheckFailed) as e:
        expect_equal([5], [5, 9, 1], "slots")
    assert str(e.value).startswith("slots: expected 3 values, got 1 value:")
    assert "position" not in str(e.value)
    with pytest.raises(CheckFailed) as e:
        expect_equal([[1, 2, None]], [[1, 2, b"h"]], "blocks")
    assert str(e.value).startswith("blocks: expected bytes at [0][2], got None:")
    with pytest.raises(CheckFailed) as e:
        expect_equal([[1], [3]], [[1], [3, 4]], "tables")
    assert str(e.value).startswith("tables: at index 1 got [3], expected [3, 4]")
    assert [plural(n, w) for n, w in ((1, "entry"), (2, "entry"), (2, "hash"))] == [
        "1 entry",
        "2 entries",
        "2 hashes",
    ]


# -- a failure's message pastes and runs as printed ---------------------------------------------

# One variant per exercise that fails the exercise's random test, and that test.
PASTED = {
    "ch01_alloc_rows": ("neg_zero_slice", "test_random_streams_match_the_engine"),
    "ch02_bytes_per_token": ("k_only", "test_random_shapes_match_the_engine"),
    "ch03_token_allocator": ("free_to_head", "test_random_streams_match_the_engine"),
    "ch04_alloc_extend": ("bitmask_offset", "test_random_batches_match_the_engine"),
    "ch04_alloc_extend_kernel": (
        "bitmask_offset",
        "test_random_batches_match_the_engine",
    ),
    "ch05_alloc_decode": ("bitmask_opens", "test_random_decode_steps_match_the_engine"),
    "ch05_paged_free": ("no_dedup", "test_random_frees_match_the_engine"),
    "ch06_free_queue": ("clears_hash", "test_random_frees_match_the_engine"),
    "ch06_block_hash": ("partial_blocks", "test_random_requests_match_the_engine"),
    "ch06_slot_mapping": ("bitmask_offset", "test_random_batches_match_the_engine"),
    "ch07_swa_release": (
        "bitmask_floor",
        "test_random_windows_and_maps_match_the_engine",
    ),
    "ch07_mamba_tracking": ("partial_reset", "test_random_sequences_match_the_engine"),
    "ch08_sizing": ("bitmask_floor", "test_random_configurations_match_the_engine"),
    "ch09_paged_gather": ("row_is_batch_index", "test_random_batches_match_the_engine"),
    "ch10_admission": ("overtaking", "test_random_queues_match_the_engine"),
    "ch11_radix_match": ("mru", "test_random_sequences_match_the_engine"),
    "ch12_virtual_pages": ("unbound_not_sink", "test_translate_random_tables"),
}


def run_cell(code: str, folder: Path, monkeypatch, capsys) -> str:
    """The pasted lines run as a notebook cell runs them (IPython drops the indentation they
    share), on the learner's files in ``folder``; what the cell printed."""
    from IPython.core.inputtransformer2 import TransformerManager

    monkeypatch.setenv(loader.ENV, str(folder))
    capsys.readouterr()
    exec(compile(TransformerManager().transform_cell(code), "<cell>", "exec"), {})
    return capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("exercise", sorted(PASTED))
def test_a_failure_pastes_into_a_cell_and_shows_itself(
    exercise, tmp_path, monkeypatch, capsys, pytestconfig
):
    """The message of a failing random case holds, with its line breaks and uncut, the lines
    that show it: pasted into a cell, they print other values on the learner's file than on the
    solution, and what the message says the learner's code gave."""
    mistake, test = PASTED[exercise]
    (variant,) = [v for v in zoo.ZOO if v.name == f"{exercise}__{mistake}"]
    folder = learner_folder(tmp_path, variant)
    monkeypatch.setenv(loader.ENV, str(folder))
    monkeypatch.setenv(fuzz.SEED_ENV, "20261204")
    plugin.register_markers(pytestconfig)  # the graded tests' points markers
    module = load_file(f"tests/exercises/test_{exercise}.py")
    with pytest.raises(CheckFailed) as failed:
        getattr(module, test)()
    message = str(failed.value)
    assert "\nTo see it, paste into a cell:\n" in message, message
    block = message.split("\nTo see it, paste into a cell:\n")[1].split(
        "\n(the smallest"
    )[0]
    assert "..." not in block and block.count("\n") >= 3, block
    assert f'with exercise("{exercise}") as ex:' in block
    assert "seed 20261204: --seed 20261204 draws them again" in message
    yours = run_cell(block, folder, monkeypatch, capsys)
    theirs = run_cell(block, ROOT / "solutions", monkeypatch, capsys)
    assert yours.strip() and theirs.strip() and yours != theirs, (block, yours, theirs)
    assert "Traceback" not in yours + theirs and "raised" not in theirs, (yours, theirs)
