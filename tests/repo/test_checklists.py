"""CONTRIBUTING.md's "where things go": for each kind of addition (a kernel, an exercise, a model
config), every place it must reach is reached. The other rows of that table are checked where
their files are tested (named in CONTRIBUTING.md)."""

import ast
import re
from pathlib import Path

import pytest

from memlab.common.models import MODELS
from memlab.course.grading import catalog
from memlab.course.grading.stubs import course_stub
from memlab_tests.tools.loading import load_file

ROOT = Path(__file__).resolve().parents[2]


# -- a new kernel ---------------------------------------------------------------------------------


def jit_functions(path: Path) -> set[str]:
    """The kernels of a kernel file: its @triton.jit functions but the helpers that other
    @triton.jit functions call (those are compiled into their callers)."""
    tree = ast.parse(path.read_text())
    jit = {
        f.name: f
        for f in tree.body
        if isinstance(f, ast.FunctionDef)
        and any(
            ast.unparse(d).split("(")[0] in ("triton.jit", "jit")
            for d in f.decorator_list
        )
    }
    helpers = {
        c.func.id
        for f in jit.values()
        for c in ast.walk(f)
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in jit
    }
    return set(jit) - helpers


def aot_builds(
    script: Path = ROOT / "tests" / "tools" / "compile_kernels.py",
) -> dict[str, set[str]]:
    """compile_kernels.py's BUILDS, read without running it (it imports Triton and drops the
    interpreter): kernel file -> every string written in its entry (the kernel names among them)."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [
            "BUILDS"
        ]:
            return {
                k.value: {
                    c.value
                    for c in ast.walk(v)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
                for k, v in zip(node.value.keys, node.value.values)
            }
    raise AssertionError(f"{script.name} has no BUILDS dict")


def missing_builds(kernels_dir: Path, builds: dict[str, set[str]]) -> list[str]:
    missing = []
    for f in sorted(kernels_dir.glob("*.py")):
        if f.name == "__init__.py":
            continue
        for name in sorted(jit_functions(f)):
            if name not in builds.get(f.name, ()):
                missing.append(f"{f.name}:{name}")
    return missing


def test_every_kernel_has_an_ahead_of_time_build():
    builds = aot_builds()
    assert missing_builds(ROOT / "kernels", builds) == [], (
        "add these @triton.jit kernels to BUILDS in tests/tools/compile_kernels.py (signature and "
        "constexprs)"
    )
    assert set(builds) <= {f.name for f in (ROOT / "kernels").glob("*.py")}, (
        "BUILDS names a file kernels/ lacks"
    )


def test_the_kernel_check_catches_a_forgotten_kernel(tmp_path):
    (tmp_path / "new.py").write_text(
        "import triton\n\n@triton.jit\ndef _k(x):\n    _helper(x)\n\n@triton.jit()\n"
        "def _k2(x):\n    pass\n\n@triton.jit\ndef _helper(x):\n    pass\n\n"
        "def launch():\n    pass\n"
    )
    assert jit_functions(tmp_path / "new.py") == {"_k", "_k2"}
    assert missing_builds(tmp_path, {"new.py": {"_k", "*i64"}}) == ["new.py:_k2"]
    assert missing_builds(tmp_path, {}) == ["new.py:_k", "new.py:_k2"]


# -- a new exercise -------------------------------------------------------------------------------


def files(folder: str, pattern: str, strip: str = "") -> set[str]:
    return {p.stem.removeprefix(strip) for p in (ROOT / folder).glob(pattern)}


def test_every_exercise_file_is_in_the_catalog_and_has_its_twins():
    listed = {e.file for e in catalog.EXERCISES}
    assert len(listed) == len(catalog.EXERCISES), "two catalog entries share a file"
    for folder, pattern, strip in (
        ("exercises", "ch[0-9][0-9]_*.py", ""),
        ("solutions", "ch[0-9][0-9]_*.py", ""),
        ("tests/exercises", "test_ch[0-9][0-9]_*.py", "test_"),
    ):
        found = files(folder, pattern, strip)
        if folder == "exercises":  # a learner may have deleted a stub: it is generated
            found |= {e.file for e in catalog.EXERCISES if course_stub(e.file)[0]}
        assert found == listed, (
            f"{folder}/: not in memlab/course/grading/catalog.py: {sorted(found - listed)}; "
            f"catalog entries without a file here: {sorted(listed - found)}"
        )
    for e in catalog.EXERCISES:
        assert e.id == f"ch{e.chapter:02d}.{e.file[5:]}" and e.file.startswith(
            f"ch{e.chapter:02d}_"
        ), e


def test_every_exercise_has_a_zoo_variant_caught_by_one_of_its_tests():
    zoo = load_file("tests/tools/bug_zoo/zoo.py")
    for e in catalog.EXERCISES:
        mine = [v for v in zoo.ZOO if v.exercise == e.id]
        assert mine, f"{e.id}: no known-wrong variant in tests/tools/bug_zoo/zoo.py"
        assert all(v.solution == e.file for v in mine), (
            f"{e.id}: a variant patches another solution"
        )
        tests = set(
            re.findall(r"^def (test_\w+)", (ROOT / e.test_file).read_text(), re.M)
        )
        assert {v.catches for v in mine} <= tests, (
            f"{e.id}: a variant names a test {e.test_file} lacks"
        )


def graded_tests(path: Path) -> list[ast.FunctionDef]:
    return [
        f
        for f in ast.parse(path.read_text()).body
        if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")
    ]


def points_mark(fn: ast.FunctionDef) -> ast.Call | None:
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and ast.unparse(d.func) == "points":
            return d
    return None


def gates(path: Path) -> dict[str, str]:
    """Test name -> the test its points are gated on (``points(n, requires=...)``)."""
    out = {}
    for fn in graded_tests(path):
        mark = points_mark(fn)
        for kw in mark.keywords if mark is not None else ():
            if kw.arg == "requires":
                out[fn.name] = ast.literal_eval(kw.value)
    return out


def test_edge_points_are_gated_on_an_earlier_core_test():
    """``requires`` names a graded test of the same file, defined (so run) before the gated
    one: the run that grades the gated test has already seen the core test's outcome."""
    for e in catalog.EXERCISES:
        path = ROOT / e.test_file
        order = [f.name for f in graded_tests(path) if points_mark(f) is not None]
        for test, core in gates(path).items():
            assert core in order[: order.index(test)], (
                f"{e.test_file}: {test} is gated on {core!r}, which is no graded test "
                "defined before it"
            )
    assert gates(ROOT / "tests" / "exercises" / "test_ch05_paged_free.py") == {
        "test_free_empty_noop": "test_free_dedups_pages",
        "test_free_segment_rejects_unaligned": "test_free_segment_aligned",
    }


# Graded tests whose cases no seed changes, and why.
FIXED = {
    # Eight combinations of three flags: the table of answers is the function.
    "test_ch07_mamba_tracking.py::test_tracking_slot_counts",
    # Their cases are the engine worktree's to redraw (chapter 10 follows SGLang's PrefillAdder).
    *(
        f"test_ch10_admission.py::{n}"
        for n in (
            "test_admits_in_order_until_budget",
            "test_no_overtaking",
            "test_running_requests_keep_their_reserve",
            "test_prompt_in_whole_pages",
            "test_reject_and_clip",
            "test_max_running_requests",
        )
    ),
}


def draws_at_random(fn: ast.FunctionDef) -> bool:
    """The test takes the run's ``rng`` and uses it, or runs a property (``check(...)``)."""
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    calls = {ast.unparse(c.func) for c in ast.walk(fn) if isinstance(c, ast.Call)}
    return (
        "rng" in [a.arg for a in fn.args.args] and "rng" in names
    ) or "check" in calls


def test_every_graded_test_draws_cases_a_table_cannot_hold():
    """No fixed case list: every graded test draws from the run's seed (a file of recorded
    answers earned full marks on fixed cases), but the few listed in FIXED, with their reason."""
    fixed = set()
    for path in sorted((ROOT / "tests" / "exercises").glob("test_ch*.py")):
        for fn in graded_tests(path):
            if points_mark(fn) is not None and not draws_at_random(fn):
                fixed.add(f"{path.name}::{fn.name}")
    assert fixed == FIXED


@pytest.mark.parametrize("exercise", catalog.EXERCISES, ids=lambda e: e.id)
def test_every_exercise_has_a_mutation_score(exercise):
    note = (ROOT / "tests" / "tools" / "bug_zoo" / "equivalent_mutants.md").read_text()
    score = note.split("<!-- score:begin -->")[1].split("<!-- score:end -->")[0]
    assert re.search(rf"^\| {exercise.file} \| \d+ \|", score, re.M), (
        f"{exercise.file} has no row in the mutation score: run ./course mutants {exercise.file}"
    )


# -- a new model config ---------------------------------------------------------------------------


def test_every_model_config_is_in_the_table():
    tree = ast.parse((ROOT / "memlab" / "common" / "models.py").read_text())
    defined = {
        t.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and ast.unparse(node.value.func) == "ModelConfig"
        for t in node.targets
    }
    import memlab.common.models as models

    assert defined and {getattr(models, n).name for n in defined} == set(MODELS), (
        "every ModelConfig constant in memlab/common/models.py belongs in MODELS (chapters 02 and "
        "08 list MODELS)"
    )
