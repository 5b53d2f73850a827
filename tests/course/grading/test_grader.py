"""Tests of the grader itself: the catalog, the seam, the score table, results.json, the bug zoo
(patches in tests/tools/bug_zoo/zoo.py, built into a copy of solutions/), the command
from any working folder, a seed per run, and survival of learner code that loops, crashes or
floods the output. (Dishonest files: test_dishonest; a learner's checkout in every state:
test_learner_states.)

Each grade() call runs a child pytest over tests/exercises; the expensive ones are marked slow
but stay in the normal suite (about a minute in all on 2 cores).
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from memlab.course.grading import catalog, loader, runner, stubs
from memlab.course.grading.runner import grade
from memlab.course.grading.stubs import looks_like_stub
from memlab.grade import main
from memlab_tests.tools.loading import load_file

ROOT = Path(__file__).resolve().parents[3]


zoo = load_file("tests/tools/bug_zoo/zoo.py")
ZOO = zoo.ZOO


def solutions_copy(
    tmp_path: Path, overlay: dict[str, Path | str] = (), name: str = "learner"
) -> Path:
    """solutions/ copied into tmp_path, with some files replaced (by a file or by source text)."""
    dest = tmp_path / name
    shutil.copytree(
        ROOT / "solutions", dest, ignore=shutil.ignore_patterns("__pycache__")
    )
    for name, src in dict(overlay).items():
        (dest / f"{name}.py").write_text(
            src.read_text() if isinstance(src, Path) else src
        )
    return dest


def by_exercise(report):
    return {s.exercise.id: s for s in report.scores}


def check_results_json(data: dict, cpu: list[int]) -> None:
    json.dumps(data)  # serialisable
    assert set(data) >= {"score", "tests", "output", "visibility"}
    assert data["score"] == sum(t["score"] for t in data["tests"])
    for t in data["tests"]:
        assert set(t) >= {
            "name",
            "score",
            "max_score",
            "status",
            "output",
            "visibility",
        }
        assert t["status"] in ("passed", "failed") and t["visibility"] == "visible"
        assert (
            0 <= t["score"] <= t["max_score"]
            and isinstance(t["output"], str)
            and len(t["output"]) <= 8000
        )
    assert data["extra_data"]["cpu"] == cpu


# -- the catalog and the seam -----------------------------------------------------------------


def collected_markers() -> dict[str, list[tuple[str, int, bool]]]:
    """exercise id -> [(test name, points, gpu)] read from the test files' decorators."""
    out = defaultdict(list)
    for path in sorted((ROOT / "tests" / "exercises").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for fn in tree.body:
            if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test_"):
                continue
            pts = [
                d
                for d in fn.decorator_list
                if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "points"
            ]
            assert len(pts) == 1, f"{path.name}::{fn.name} needs exactly one @points(n)"
            gpu = any(ast.unparse(d) == "pytest.mark.gpu" for d in fn.decorator_list)
            helper = next(
                f
                for f in tree.body
                if isinstance(f, ast.FunctionDef) and f.name == "points"
            )
            exercise = next(
                k.value.value
                for k in ast.walk(helper)
                if isinstance(k, ast.keyword) and k.arg == "exercise"
            )
            out[exercise].append((fn.name, pts[0].args[0].value, gpu))
    return out


def test_catalog_matches_the_tests():
    markers = collected_markers()
    assert set(markers) == set(catalog.BY_ID), (
        "every exercise has graded tests and every test an exercise"
    )
    assert len(catalog.EXERCISES) >= 14 and {
        e.chapter for e in catalog.EXERCISES
    } == set(range(1, 13))
    for e in catalog.EXERCISES:
        cpu = sum(p for _, p, gpu in markers[e.id] if not gpu)
        gpu = sum(p for _, p, g in markers[e.id] if g)
        assert (cpu, gpu) == (e.points, e.gpu_points), (
            f"{e.id}: tests give {cpu} CPU + {gpu} GPU points"
        )
        assert (ROOT / "solutions" / f"{e.file}.py").is_file()
        # the stub: in exercises/, or in git (a learner deleted it)
        assert stubs.course_stub(e.file) is not None
        assert (ROOT / e.test_file).is_file()


# -- author-only checks: the stubs as the course ships them ------------------------------------
# A learner edits exercises/ (and may commit there, or delete a file); the checks below are about
# the course's stubs, read through memlab.course.grading.stubs: the working copy while it is the
# stub (an author's edit shows at once), else the newest commit of git's history that has the
# stub. Where nothing holds it (no git) they skip and say why; in CI (CI or MEMLAB_AUTHOR set)
# they fail instead, since there the checkout is the course.
AUTHOR = bool(os.environ.get("CI") or os.environ.get("MEMLAB_AUTHOR"))


def _skip_or_fail(reason: str):
    if AUTHOR:
        pytest.fail(
            f"{reason} (CI or MEMLAB_AUTHOR is set, so this author-only check may not skip)"
        )
    pytest.skip(f"author-only check skipped: {reason}")


def committed_stub(file: str) -> str:
    """exercises/<file>.py as the course ships it, or skip (fail in CI) with the reason."""
    got = stubs.course_stub(file)
    if got is None:
        _skip_or_fail(
            f"exercises/{file}.py is not the course's stub, and this checkout has no git "
            "history that holds it"
        )
    return got[0]


def committed_stubs(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for e in catalog.EXERCISES:
        (folder / f"{e.file}.py").write_text(committed_stub(e.file))
    return folder


def api(text: str):
    tree = ast.parse(text)
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            sig = ast.unparse(node.args) if isinstance(node, ast.FunctionDef) else ""
            out[node.name] = (sig, ast.get_docstring(node))
    return out, ast.get_docstring(tree)


@pytest.mark.parametrize("exercise", catalog.EXERCISES, ids=lambda e: e.id)
def test_stub_and_solution_are_twins(exercise):
    """Same classes, functions, signatures and docstrings; the stub's bodies raise
    NotImplementedError."""
    stub = committed_stub(exercise.file)
    assert api(stub) == api((ROOT / "solutions" / f"{exercise.file}.py").read_text()), (
        f"exercises/{exercise.file}.py and its solution differ in their API or docstrings"
    )
    assert "NotImplementedError" in stub


def test_stub_detection():
    """What counts as the course's stub: the committed twin of each solution does; edited ones
    do not."""
    sol = (ROOT / "solutions" / "ch03_token_allocator.py").read_text()
    stub = committed_stub("ch03_token_allocator")
    assert looks_like_stub(stub, sol) and not looks_like_stub(sol, sol)
    worked = stub.replace(
        "        raise NotImplementedError\n",
        "        return len(self.free_pages)\n",
        1,
    )
    assert not looks_like_stub(worked, sol)  # one function written by a learner
    # a helper added
    assert not looks_like_stub(
        stub + "\n\ndef _helper():\n    raise NotImplementedError\n", sol
    )
    # (A function written word for word as in the solution is not seen here: the points it earns
    # are, by test_stubs_score_zero_with_not_implemented_only.)
    kernel = (ROOT / "solutions" / "ch09_paged_gather.py").read_text()
    # GATHER_WRITTEN = True: a learner's (or an answer)
    assert not looks_like_stub(kernel, kernel)
    assert looks_like_stub(
        kernel.replace("GATHER_WRITTEN = True", "GATHER_WRITTEN = False"), kernel
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_course_stub_is_found_whatever_the_learner_did(tmp_path):
    """The stub is generated from the solution: the same text whether the learner's copy is
    untouched, edited, committed, deleted, or the clone has no git at all."""
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "-q", str(ROOT), str(clone)], check=True, capture_output=True
    )
    name = "ch03_token_allocator"
    stub = stubs.course_stub(name, clone)
    assert stub[1] == f"generated from {name}.py" and looks_like_stub(
        stub[0], (ROOT / "solutions" / f"{name}.py").read_text()
    )
    assert stub[0] == (clone / "exercises" / f"{name}.py").read_text()
    shutil.copyfile(
        clone / "solutions" / f"{name}.py", clone / "exercises" / f"{name}.py"
    )
    (clone / "exercises" / "ch02_bytes_per_token.py").unlink()
    assert stubs.course_stub(name, clone) == stub
    assert looks_like_stub(
        stubs.course_stub("ch02_bytes_per_token", clone)[0],
        (ROOT / "solutions" / "ch02_bytes_per_token.py").read_text(),
    )
    git = ["git", "-c", "user.name=l", "-c", "user.email=l@e"]
    subprocess.run(
        [*git, "commit", "-qam", "my work"], cwd=clone, check=True, capture_output=True
    )
    assert stubs.course_stub(name, clone) == stub
    shutil.rmtree(clone / ".git")
    assert stubs.course_stub(name, clone) == stub


def test_loader_imports_by_path_under_private_names(tmp_path, monkeypatch):
    learner = solutions_copy(tmp_path)
    monkeypatch.setenv(loader.ENV, str(learner))
    mod = loader.load("ch02_bytes_per_token")
    assert (
        Path(mod.__file__).resolve() == (learner / "ch02_bytes_per_token.py").resolve()
    )
    assert mod.__name__.startswith("_memlab_learner_")
    assert loader.load("ch02_bytes_per_token") is mod  # loaded once
    other = loader.load("ch02_bytes_per_token", source="solutions")
    assert other is not mod and Path(other.__file__).parent == ROOT / "solutions"
    assert (
        not (ROOT / "exercises" / "__init__.py").exists()
        and not (ROOT / "solutions" / "__init__.py").exists()
    )
    assert not any(
        n == p or n.startswith(p + ".")
        for n in sys.modules
        for p in ("exercises", "solutions")
    )
    with pytest.raises(FileNotFoundError, match="no such folder"):
        loader.source_dir(str(tmp_path / "missing"))


@pytest.mark.parametrize("variant", ZOO, ids=lambda v: v.name)
def test_bug_zoo_patch_applies_as_one_small_edit(variant):
    """Every old text occurs exactly once in the solution, and the variant differs from it."""
    assert catalog.BY_ID[variant.exercise].file == variant.solution
    text = (ROOT / "solutions" / f"{variant.solution}.py").read_text()
    assert variant.patch and all(old != new for old, new in variant.patch)
    for old, _ in variant.patch:
        assert text.count(old) == 1, (
            f"{variant.name}: {old!r} occurs {text.count(old)} times"
        )
    bug = zoo.build(variant)
    assert bug != text
    changed = [
        line
        for line in difflib.unified_diff(
            text.splitlines(), bug.splitlines(), lineterm="", n=0
        )
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert 0 < len(changed) <= 10, changed  # a formatted statement may span three lines
    compile(bug, variant.name, "exec")  # a mistake of meaning, not of syntax
    names = {n for n, _, _ in collected_markers()[variant.exercise]}
    assert variant.catches in names


def test_bug_zoo_patch_that_no_longer_fits_fails_loudly(tmp_path):
    v = ZOO[0]
    sol = tmp_path / f"{v.solution}.py"
    sol.write_text(
        (ROOT / "solutions" / f"{v.solution}.py").read_text().replace(v.patch[0][0], "")
    )
    with pytest.raises(
        zoo.ZooPatchError, match=f"{v.name}: patch 0 .* found it 0 times"
    ):
        zoo.build(v, tmp_path)
    sol.write_text(2 * v.patch[0][0])
    with pytest.raises(zoo.ZooPatchError, match=f"{v.name}: .* found it 2 times"):
        zoo.build(v, tmp_path)


def test_zoo_is_large_enough():
    assert len(ZOO) >= 50
    assert len({v.name for v in ZOO}) == len(ZOO)
    assert sorted(
        p.name for p in (ROOT / "tests" / "tools" / "bug_zoo").glob("*.py")
    ) == ["zoo.py"], "patches, not copies"


# The interpreter accepts what a GPU compile rejects (a global that is not constexpr, a
# loop-carried value that changes type): build the solutions' kernels for a T4 and a Hopper.
AOT_SCRIPT = """
import importlib.util, os, pathlib, sys
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
folder = pathlib.Path(sys.argv[1])
P64, I32 = "*i64", "i32"
STRIDES = ("kv_group_num", "stride_qb", "stride_qh", "stride_ks", "stride_kh", "stride_vs",
           "stride_vh", "stride_ob", "stride_oh", "stride_r2t")
BUILDS = [
    ("ch04_alloc_extend_kernel", "alloc_extend_kernel", dict(prefix_lens_ptr=P64,
     seq_lens_ptr=P64, last_loc_ptr=P64, free_pages_ptr=P64, out_ptr=P64, page_size=I32),
     dict(BS_BLOCK=64, PAGE_BLOCK=16, TOK_BLOCK=64)),
    ("ch06_slot_mapping", "slot_mapping_kernel", dict(block_table_ptr="*i32",
     block_table_stride=I32, query_start_loc_ptr="*i32", positions_ptr=P64, out_ptr=P64,
     num_reqs=I32, num_tokens_padded=I32, block_size=I32), dict(BLOCK=64)),
] + [("ch09_paged_gather", "decode_attention_kernel", dict(q_ptr=dt, k_ptr=dt, v_ptr=dt,
      o_ptr=dt, req_to_token_ptr="*i32", req_pool_indices_ptr=P64, seq_lens_ptr=P64,
      sm_scale="fp32", **{n: I32 for n in STRIDES}), dict(HEAD_DIM=64, BLOCK_N=16))
     for dt in ("*fp16", "*fp32")]
failed = 0
for fname, name, sig, cx in BUILDS:
    spec = importlib.util.spec_from_file_location("aot_" + fname, folder / (fname + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for cap in (75, 90):
        try:
            full = sig | {k: "constexpr" for k in cx}
            src = ASTSource(fn=getattr(mod, name), signature=full, constexprs=cx)
            triton.compile(src, target=GPUTarget("cuda", cap, 32))
            print("ok", fname, name, sig["q_ptr"] if "q_ptr" in sig else "", "sm_%d" % cap)
        except Exception as exc:
            failed += 1
            print("FAIL", fname, "sm_%d" % cap, type(exc).__name__, str(exc)[:800])
sys.exit(1 if failed else 0)
"""


@pytest.mark.kernel
@pytest.mark.slow
@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="Triton builds only on Linux"
)
def test_solution_kernels_compile_for_a_t4_and_a_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", AOT_SCRIPT, str(ROOT / "solutions")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert sum(line.startswith("ok ") for line in proc.stdout.splitlines()) == 8, (
        proc.stdout
    )


# -- grading ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_solutions_score_full_marks_through_the_cli(tmp_path):
    """Run from a folder outside the repository (a notebook runs in chapters/ or /content), with
    the seed given: the tests' process gets it, the table and results.json say it. (Every
    exercise's full marks: test_gradescope, through the bundle.)"""
    chosen = [e for e in catalog.EXERCISES if e.chapter in (2, 8)]
    cmd = [
        sys.executable,
        "-m",
        "memlab.grade",
        "02",
        "08",
        "--solutions",
        "--seed",
        "1234",
    ]
    cmd += ["--results", "results.json"]
    proc = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("memlab grade: solutions/ on "), proc.stdout[:200]
    data = json.loads((tmp_path / "results.json").read_text())
    total = sum(e.points for e in chosen)
    check_results_json(data, [total, total])
    assert all(t["status"] == "passed" for t in data["tests"]), proc.stdout
    assert f"{total}/{total}" in proc.stdout and data["extra_data"]["seed"] == 1234
    assert (
        "random cases from seed 1234 (--seed 1234 draws the same cases again)"
        in proc.stdout
    )


def test_a_seed_is_drawn_for_each_run_unless_given():
    assert runner.draw_seed(7) == 7
    assert len({runner.draw_seed() for _ in range(20)}) > 15


@pytest.mark.slow
def test_stubs_score_zero_with_not_implemented_only(tmp_path, monkeypatch, capsys):
    """The stubs as committed, graded in process as a notebook calls it (from a working folder
    outside the repository): zero points, every failure a NotImplementedError, and a short table:
    one line per exercise not started, no list of its ~80 failing checks."""
    stubs = committed_stubs(tmp_path / "stubs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(loader.ENV, raising=False)
    code = main(["--from", str(stubs), "--timeout", "60", "--results", "r.json"])
    table = capsys.readouterr().out
    earned = json.loads((tmp_path / "r.json").read_text())["score"]
    # a function a learner wrote and committed, word for word the solution's
    if earned and not AUTHOR:
        pytest.skip(
            f"author-only check skipped: exercises/ as committed earns {earned} points, so it "
            "holds your own work; the check is for the course's stubs"
        )
    assert code == 1, table
    total = sum(e.points for e in catalog.EXERCISES)
    # no progress characters before the table
    assert table.startswith("memlab grade: "), table[:200]
    assert f"0/{total}" in table and "What failed" not in table, table
    rows = [line for line in table.splitlines() if line[:2].isdigit()]
    assert len(rows) == len(catalog.EXERCISES) and all(
        "not started:" in r for r in rows
    ), table
    assert len(table.splitlines()) <= len(catalog.EXERCISES) + 12, table
    assert f"{len(catalog.EXERCISES)} exercises not started yet" in table
    data = json.loads((tmp_path / "r.json").read_text())
    check_results_json(data, [0, total])
    cpu_tests = sum(
        not gpu for tests in collected_markers().values() for _, _, gpu in tests
    )
    assert len(data["tests"]) >= cpu_tests and not any(
        t["name"].endswith("collection") for t in data["tests"]
    )
    # "not written yet" is what the grader says of a NotImplementedError, only
    for t in data["tests"]:
        assert t["status"] == "failed" and t["output"].startswith("not written yet"), t


def test_main_returns_the_exit_code_and_never_exits(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["--list"]) == 0 and "ch04.alloc_extend" in capsys.readouterr().out
    assert main(["--help"]) == 0
    assert main(["13"]) == 2 and "chapter must be 00..12" in capsys.readouterr().err
    assert (
        main(["00"]) == 0 and "chapter 00 has no exercises" in capsys.readouterr().out
    )
    assert (
        main(["--exercise", "ch99.nothing"]) == 2
        and "unknown exercise" in capsys.readouterr().err
    )
    assert (
        main(["--from", "missing", "-q"]) == 2
        and "no such folder" in capsys.readouterr().err
    )
    (tmp_path / "mine").mkdir()
    # --from DIR is relative to the working folder
    assert loader.source_dir("mine") == tmp_path / "mine"
    # the names are the repository's folders
    assert loader.source_dir("exercises") == ROOT / "exercises"
    assert runner.check_checkout() == ROOT == Path(runner.__file__).resolve().parents[3]
    # memlab installed without the course around it
    monkeypatch.setattr(runner, "ROOT", tmp_path)
    assert (
        main(["02", "-q"]) == 2
        and "exercises, solutions, tests/exercises are not next to"
        in capsys.readouterr().err
    )


def zoo_rounds():
    """Variants grouped so that no round holds two variants of one exercise file."""
    rounds: list[list] = []
    for v in ZOO:
        for r in rounds:
            if all(o.solution != v.solution for o in r):
                r.append(v)
                break
        else:
            rounds.append([v])
    return rounds


@pytest.mark.slow
def test_every_zoo_variant_fails_its_test():
    """Each variant, graded by the test it names (in a worker process of tests/tools/mutants.py,
    which survives a variant that crashes or loops), fails it."""
    mutants = load_file("tests/tools/mutants.py")
    jobs = [
        {
            "key": v.name,
            "file": v.solution,
            "source": zoo.build(v),
            "timeout": 60.0,
            "order": [v.catches],
        }
        for v in ZOO
    ]
    results = mutants.run_jobs(jobs, 1)
    passed = [
        f"{v.name} ({v.mistake}) passes {v.catches}"
        for v in ZOO
        if results[v.name]["outcome"] != "killed"
    ]
    assert not passed, passed


@pytest.mark.slow
@pytest.mark.parametrize("round_", zoo_rounds()[:1], ids=lambda r: f"{len(r)}-variants")
def test_bug_zoo_loses_points_where_it_should(round_, tmp_path):
    """Through the grader (one round: a variant of every exercise at once): the variants' tests
    fail and their points are lost."""
    learner = solutions_copy(tmp_path, {v.solution: zoo.build(v) for v in round_})
    report = grade(
        source=str(learner),
        timeout=60,
        exercises=[v.exercise for v in round_],
        tests=sorted({v.catches for v in round_}),
    )
    scores = by_exercise(report)
    for v in round_:
        s = scores[v.exercise]
        caught = [t for t in s.tests if t.name == v.catches]
        assert caught, f"{v.name}: no test named {v.catches}"
        assert caught[0].outcome == "failed", (
            f"{v.name} ({v.mistake}) passed {v.catches}"
        )
        assert caught[0].earned == 0 < caught[0].points, (
            f"{v.name} kept the points of {v.catches}"
        )
        assert caught[0].exc_type != "NotImplementedError"


@pytest.mark.slow
def test_grader_survives_loops_crashes_and_floods(tmp_path):
    """An endless loop, one that swallows the alarm, os._exit, a segfault and megabytes of output,
    each in the learner's process: it is stopped, and the next test gets a new one."""

    def broken(name, *patch):
        return zoo.apply_patch(
            (ROOT / "solutions" / f"{name}.py").read_text(),
            patch,
            "survival test",
            name,
        )

    learner = solutions_copy(
        tmp_path,
        {
            "ch02_bytes_per_token": broken(
                "ch02_bytes_per_token",
                (
                    "    return layer_num * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes",
                    "    while True:\n        pass",
                ),
            ),
            "ch08_sizing": broken(
                "ch08_sizing",
                (
                    "    return budget_bytes // bytes_per_token // page_size * page_size",
                    "    import ctypes\n    ctypes.string_at(0)  # segfault\n    return 0",
                ),
                (
                    "    paged_input = -(-input_tokens // page_size) * page_size\n",
                    "    import time\n    while True:\n        try:\n            time.sleep(0.01)\n"
                    "        except BaseException:\n            pass\n",
                ),
            ),
            "ch07_mamba_tracking": broken(
                "ch07_mamba_tracking",
                (
                    "    if not extra_buffer:\n        return 0\n",
                    "    import os\n    os._exit(3)\n",
                ),
            ),
            "ch01_alloc_rows": broken(
                "ch01_alloc_rows",
                (
                    "        if need_size > len(self.free_slots):\n",
                    '        if need_size == 3 and not __import__("os").environ.get("FLOODED"):\n'
                    '            __import__("os").environ["FLOODED"] = "1"  # once a process\n'
                    '            print("x" * 3_000_000)  # in tests that pass\n'
                    "        if need_size > len(self.free_slots):\n",
                ),
            ),
            "ch10_admission": broken(
                "ch10_admission",
                (
                    "    return admitted, rejected",
                    '    import sys\n    sys.stdout.write("y" * 2_000_000)\n    return [], []',
                ),
            ),
        },
    )
    results = tmp_path / "results.json"
    chapters = ["01", "02", "07", "08", "10"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "memlab.grade",
            *chapters,
            "--from",
            str(learner),
            "--timeout",
            "10",
            "--results",
            str(results),
            "-q",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(proc.stdout) < 20_000, "the learner's megabytes must not reach the table"
    data = json.loads(results.read_text())
    assert len(results.read_text()) < 200_000
    tests = {t["extra_data"]["nodeid"].split("::")[-1]: t for t in data["tests"]}
    # After a timeout the exercise's other tests are skipped (each would wait for the same loop).
    assert (
        "timed out after 10 s (an endless loop?)"
        in tests["test_mla_deepseek_v3"]["output"]
    )
    for name in ("test_matches_real_buffers", "test_bad_input"):
        assert tests[name]["score"] == 0 and tests[name]["status"] == "failed"
        assert tests[name]["output"].startswith(
            "not run: test_mla_deepseek_v3 of this exercise timed out"
        )
    assert tests["test_mha_llama3_8b"]["status"] == "passed"
    # A loop that swallows the alarm runs in the learner's process: the alarm goes off here all the
    # same, and the learner's process is stopped; where it was comes from its traceback.
    swallowed = tests["test_max_new_tokens_formula"]["output"]
    assert swallowed.startswith(
        "timed out after 10 s (an endless loop?), at ch08_sizing.py:"
    ), swallowed
    assert "Current thread" not in swallowed and "wire.py" not in swallowed, swallowed
    for name in (
        "test_max_new_tokens_never_negative",
        "test_decode_len_tree_on_pages",
        "test_reserve_doubled",
    ):
        assert tests[name]["score"] == 0
        assert tests[name]["output"].startswith(
            "not run: test_max_new_tokens_formula of this exercise timed out"
        )
    assert "died (signal SIGSEGV)" in tests["test_pool_size_floored_to_pages"]["output"]
    assert "died (exit code 3)" in tests["test_tracking_slot_counts"]["output"]
    # Everything else was graded normally around them.
    others = {
        n: tests[n]["output"][:300]
        for n in tests
        if tests[n]["status"] != "passed"
        and tests[n]["extra_data"]["exercise"]
        in ("ch01.alloc_rows", "ch07.swa_release")
    }
    assert not others, others
    assert tests["test_next_track_slot_ping_pong"]["status"] == "passed"
    flooded = tests["test_admits_in_order_until_budget"]
    assert flooded["status"] == "failed" and "characters cut" in flooded["output"]
    assert data["extra_data"]["cpu"][1] == sum(
        e.points for e in catalog.EXERCISES if e.chapter in (1, 2, 7, 8, 10)
    )
    assert (
        "ch02.bytes_per_token · 3 more tests: not run: test_mla_deepseek_v3 of this exercise"
        in data["output"]
    )


def test_the_table_keeps_a_case_to_paste_whole():
    """A random case's message ends with lines to paste into a cell; the summary that
    ./course grade and the notebook's grade cell print keeps them as lines, uncut (flattened
    into one line they would not run), and clips only the words around them."""
    from IPython.core.inputtransformer2 import TransformerManager

    from memlab.course.grading.fuzz import PASTE
    from memlab.course.grading.report import format_table
    from memlab.course.grading.runner import ExerciseScore, GradeReport, TestResult

    ex = catalog.EXERCISES[0]
    case = [
        "    import torch",
        "    from memlab.course.notebook import exercise",
        f'    with exercise("{ex.file}") as ex:',
        "        t = ex.RowTable(1)",
        "        print(t.alloc_rows(0))",
    ]
    said = "your `alloc_rows` differs from the engine's " + "x" * 500
    tail = "(the smallest of the differing cases found in 1 random case of seed 7)"
    message = said + PASTE + "\n".join(case) + "\n" + tail
    failed = TestResult("t::t1", ex.id, 2, False, "failed", message, "", "CheckFailed")
    table = format_table(
        GradeReport(ROOT / "exercises", [ExerciseScore(ex, [failed])], 1.0, "CPU")
    )
    lines = table.splitlines()
    start = lines.index("    To see it, paste into a cell:")
    assert lines[start + 1 : start + 1 + len(case)] == case, table
    assert lines[start + 1 + len(case)] == "    " + tail, table
    assert "x" * 500 not in table and "..." in lines[start - 1], table
    pasted = "\n".join(lines[start + 1 : start + 1 + len(case)])
    compile(TransformerManager().transform_cell(pasted), "<cell>", "exec")


def test_table_for_tried_and_untried_exercises():
    """One line per exercise not started; the details (and the tests skipped after a timeout)
    only for exercises that were tried."""
    from memlab.course.grading.report import format_table
    from memlab.course.grading.runner import ExerciseScore, GradeReport, TestResult

    def result(ex, name, outcome, exc_type=None, message=""):
        return TestResult(f"t::{name}", ex.id, 1, False, outcome, message, "", exc_type)

    a, b, c = catalog.EXERCISES[:3]
    scores = [
        ExerciseScore(
            a,
            [
                result(a, "t1", "failed", "NotImplementedError", "not written yet: x"),
                result(a, "t2", "failed", "NotImplementedError", "not written yet: y"),
            ],
        ),
        ExerciseScore(
            b,
            [
                result(b, "t3", "passed"),
                result(b, "t4", "failed", "CheckFailed", "wrong slot"),
                result(b, "t5", "failed", "NotImplementedError", "not written yet: z"),
            ],
        ),
        ExerciseScore(
            c,
            [
                result(c, "t6", "failed", "GradeTimeout", "timed out after 1 s"),
                result(
                    c, "t7", "skipped", message="not run: t6 of this exercise timed out"
                ),
            ],
        ),
    ]
    table = format_table(GradeReport(ROOT / "exercises", scores, 1.0, "CPU"))
    lines = table.splitlines()
    # a's row, and the count
    assert sum("not started" in line for line in lines) == 2, table
    assert (
        "not written yet: x" not in table
        and "not written yet: z" in table
        and "wrong slot" in table
    )
    assert f"{c.id} · 1 more test: not run: t6" in table
    assert "1 exercise not started yet" in table


# -- the solutions agree with memlab's own layers (the exercises are their twins) ----------------


def test_solutions_agree_with_the_library(monkeypatch):
    import random

    import torch

    rng = random.Random(21)

    def sol(name):
        return loader.load(name, source="solutions")

    # 01: the request table.
    from memlab.sglang.req_to_token import ReqToTokenPool

    mine, lib = sol("ch01_alloc_rows").RowTable(6), ReqToTokenPool(6, 4)
    for _ in range(40):
        n = rng.randint(0, 3)
        a, b = mine.alloc_rows(n), lib.alloc_rows(n)
        assert a == b and mine.req_generation.tolist() == lib.req_generation.tolist()
        for row in a or []:
            if rng.random() < 0.7:
                mine.free(row)
                lib.free(row)
        if rng.random() < 0.05:
            mine.clear()
            lib.clear()

    # 03: the token allocator, staged frees included.
    from memlab.sglang.allocator import TokenToKVPoolAllocator

    for need_sort in (False, True):
        mine = sol("ch03_token_allocator").TokenToKVPoolAllocator(20, need_sort)
        lib = TokenToKVPoolAllocator(20, need_sort=need_sort)
        held = []
        for _ in range(60):
            if held and rng.random() < 0.4:
                x = held.pop(rng.randrange(len(held)))
                mine.free(x.clone())
                lib.free(x.clone())
            else:
                n = rng.randint(1, 5)
                a, b = mine.alloc(n), lib.alloc(n)
                assert (a is None and b is None) or a.tolist() == b.tolist()
                if a is not None:
                    held.append(a)
            assert mine.available_size() == lib.available_size()

    # 02: bytes per token.
    from memlab.sglang import kv_pool

    b = sol("ch02_bytes_per_token")
    assert b.mha_bytes_per_token(32, 8, 128, 64, 1) == kv_pool.mha_bytes_per_token(
        32, 8, 128, 64, dtype_bytes=1
    )
    assert b.mla_bytes_per_token(61, 512, 64) == kv_pool.mla_bytes_per_token(
        61, 512, 64
    )

    # 04, 05: paged allocation against the library's plain-Python references.
    from memlab.sglang.allocator import reference

    for _ in range(30):
        ps = rng.choice([1, 4, 16])
        a = sol("ch04_alloc_extend").PagedAllocator(512 * ps, ps)
        pre = [rng.choice([0, rng.randint(1, 30)]) for _ in range(3)]
        seq = [p + rng.randint(0, 40) for p in pre]
        last = [
            -1 if p == 0 else (600 + i) * ps + (p - 1) % ps for i, p in enumerate(pre)
        ]
        free = a.free_pages.tolist()
        out = a.alloc_extend(torch.tensor(pre), torch.tensor(seq), torch.tensor(last))
        assert out.tolist() == reference.alloc_extend_python(pre, seq, last, free, ps)
        d = sol("ch05_alloc_decode").PagedAllocator(512 * ps, ps)
        lens = [rng.randint(1, 40) for _ in range(4)]
        lasts = [(700 + i) * ps for i in range(4)]
        assert d.alloc_decode(
            torch.tensor(lens), torch.tensor(lasts)
        ).tolist() == reference.alloc_decode_python(
            lens, lasts, list(range(1, 513)), ps
        )

    # 06: block hashes, with the library's hash function swapped in.
    from memlab.vllm import hashing
    from memlab.vllm.request import Request

    h = sol("ch06_block_hash")
    monkeypatch.setattr(h, "hash_fn", hashing.sha256)
    monkeypatch.setattr(h, "NONE_HASH", hashing.init_none_hash(hashing.sha256))
    tokens = [rng.randint(0, 999) for _ in range(23)]
    items = [("img", 3, 6), ("aud", 12, 2)]
    req = Request(
        "r",
        tokens,
        block_hasher=hashing.get_request_block_hasher(4, hashing.sha256),
        lora_name="L",
        mm_features=items,
        cache_salt="s",
    )
    assert (
        h.request_block_hashes(
            tokens,
            4,
            lora_name="L",
            mm_items=[h.MMItem(*i) for i in items],
            cache_salt="s",
        )
        == req.block_hashes
    )

    # 07: tracking slots; 08: sizing.
    import itertools

    from memlab.sglang import sizing
    from memlab.sglang.mamba import mamba_tracking_slots

    m = sol("ch07_mamba_tracking")
    for flags in itertools.product((False, True), repeat=3):
        assert m.get_mamba_tracking_slots(*flags) == mamba_tracking_slots(*flags)
    s = sol("ch08_sizing")
    for _ in range(50):
        ps, inp, new, cap = (
            rng.choice([1, 16, 64]),
            rng.randint(0, 5000),
            rng.randint(0, 4000),
            rng.randint(1, 8000),
        )
        assert s.max_new_tokens_for_memory(
            inp, new, cap, ps
        ) == sizing.max_new_tokens_for_memory(inp, new, cap, ps)
        steps, topk, draft = rng.randint(1, 8), rng.randint(1, 8), rng.randint(1, 64)
        spec = sizing.SpeculativeConfig("EAGLE", steps, topk, draft)
        assert s.alloc_len_per_decode(
            ps, steps, topk, draft
        ) == sizing.alloc_len_per_decode(spec, ps)
        assert s.alloc_reserve_per_decode(
            ps, steps, topk, draft
        ) == sizing.alloc_reserve_per_decode(spec, ps)

    # 09: the gather kernel against the library's paged decode attention.
    from memlab.common.attention import decode_attention_fwd
    from memlab.common.env import kernel_device

    dev = kernel_device()
    g = torch.Generator().manual_seed(5)
    k, v = (
        torch.randn(64, 2, 16, generator=g).to(dev),
        torch.randn(64, 2, 16, generator=g).to(dev),
    )
    q = torch.randn(2, 4, 16, generator=g).to(dev)
    r2t = (
        torch.randperm(63, generator=g)[:40].add(1).to(torch.int32).view(2, 20).to(dev)
    )
    rows, lens = torch.tensor([1, 0], device=dev), torch.tensor([20, 7], device=dev)
    got = sol("ch09_paged_gather").decode_attention(q, k, v, r2t, rows, lens)
    assert torch.allclose(
        got, decode_attention_fwd(q, k, v, r2t, rows, lens), atol=1e-5
    )


# Correct ways to write chapter 09's gather that its 64-bit check must accept (the zoo holds the
# wrong ones it must refuse): a cast on its own line, a tl.where over int64 slots, tl.cast, a
# renamed stride over cast slots.
LOAD = "tl.load(req_to_token_ptr + row * stride_r2t + pos, mask=live, other=0)"
CH09_SLOTS = (
    "        slots = tl.load(\n"
    "            req_to_token_ptr + row * stride_r2t + pos, mask=live, other=0\n"
    "        ).to(tl.int64)\n"
)
CH09_CORRECT = {
    "cast on the next line": f"        slots = {LOAD}\n        slots = slots.to(tl.int64)\n",
    "tl.where over int64": f"        raw = {LOAD}.to(tl.int64)\n"
    "        slots = tl.where(live, raw, 0)\n",
    "tl.cast": f"        slots = tl.cast({LOAD}, tl.int64)\n",
    "renamed stride": CH09_SLOTS + "        sk = stride_ks\n",
}


@pytest.mark.parametrize("spelling", sorted(CH09_CORRECT))
def test_ch09_64_bit_check_accepts_correct_spellings(spelling):
    check = load_file("tests/exercises/exercise_refs.py").narrow_products
    source = (ROOT / "solutions" / "ch09_paged_gather.py").read_text()
    assert source.count(CH09_SLOTS) == 1 and check(source) == []
    variant = source.replace(CH09_SLOTS, CH09_CORRECT[spelling])
    if spelling == "renamed stride":
        variant = variant.replace("slots[:, None] * stride_ks", "slots[:, None] * sk")
    assert check(variant) == [], spelling
    assert check(variant.replace("# =", "# -")) != [], (
        "without the markers the check finds nothing to pass"
    )
