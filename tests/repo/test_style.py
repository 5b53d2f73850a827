"""One formatter and one linter (ruff, configured in pyproject.toml) over everything the course
writes in Python, as git holds it: the library, the kernels, the tests, the scripts, the
benchmarks, the solutions, the chapters' twins, and the exercise stubs as the course ships them
(a learner's own exercise files, committed or not, are theirs to format)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memlab.course.grading.stubs import write_stubs
from memlab_tests.tools.stored import stored

ROOT = Path(__file__).resolve().parents[2]
RUFF = [sys.executable, "-m", "ruff"]
# pyproject's list of files with long lines: it only shrinks
LONG_LINES_ALLOWED_AT_MOST = 2


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """The repository as committed, with the course's stubs in exercises/."""
    root = stored(".")
    copy = tmp_path_factory.mktemp("style") / "memlab"
    subprocess.run(["cp", "-a", f"{root}/.", str(copy)], check=True)
    for f in (copy / "exercises").glob("*.py"):
        f.unlink()
    write_stubs(copy / "exercises")
    return copy


def ruff(tree: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*RUFF, *args, "--no-cache", "."], cwd=tree, capture_output=True, text=True
    )


def test_everything_is_formatted(tree):
    r = ruff(tree, "format", "--check")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_everything_passes_the_linter(tree):
    r = ruff(tree, "check", "--output-format", "concise")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def long_line_entries() -> list[str]:
    text = (ROOT / "pyproject.toml").read_text()
    return re.findall(r'^"([^"*]+\.py)" = \["E501"\]$', text, re.M)


def test_the_list_of_files_with_long_lines_only_shrinks():
    listed = long_line_entries()
    assert len(listed) <= LONG_LINES_ALLOWED_AT_MOST, (
        f"{len(listed)} files may have long lines, at most {LONG_LINES_ALLOWED_AT_MOST}: wrap "
        "the new file's lines instead of listing it"
    )
    files = [f for f in listed if (ROOT / f).is_file()]
    assert files == listed, f"listed but gone: {sorted(set(listed) - set(files))}"
    r = subprocess.run(
        [*RUFF, "check", "--isolated", "--select", "E501", "--line-length", "100"]
        + ["--output-format", "concise", "--no-cache", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    still_long = {
        line.split(":")[0] for line in r.stdout.splitlines() if ": E501 " in line
    }
    wrapped = sorted(set(files) - still_long)
    assert not wrapped, (
        f"no long lines any more: delete their entries in pyproject: {wrapped}"
    )


def test_the_checks_can_fail(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "x.py").write_text("import os, sys\nx=( 1,2 )\n")
    assert ruff(tmp_path, "format", "--check").returncode == 1
    assert ruff(tmp_path, "check").returncode == 1


# torch.tensor infers float32 from an empty list: an index or length built from data that may be
# empty (a batch needing no new page, a request with nothing to free) must name its dtype, or
# the empty case turns into a float tensor that an allocator refuses or a check misreads.
TYPED_TENSOR_FOLDERS = ("memlab", "tests/exercises")


def untyped_tensors(path: Path) -> list[tuple[str, int, str]]:
    """(file, line, call) of each ``torch.tensor(x)`` without a dtype whose data is computed,
    not a non-empty literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) == "torch.tensor"
            and node.args
            and not any(k.arg == "dtype" for k in node.keywords)
        ):
            continue
        data = node.args[0]
        literal = isinstance(data, (ast.List, ast.Tuple)) and data.elts
        if isinstance(data, ast.Constant) or (
            literal and not any(isinstance(e, ast.Starred) for e in data.elts)
        ):
            continue
        found.append((path.name, node.lineno, ast.unparse(node)[:80]))
    return found


def test_tensors_of_computed_data_name_their_dtype(tree):
    # the one deliberate float: the token allocator must refuse an empty float tensor
    allowed = {("test_ch03_token_allocator.py", "torch.tensor([])")}
    found = {
        (name, call): f"{name}:{line}: {call}"
        for folder in TYPED_TENSOR_FOLDERS
        for f in sorted((tree / folder).rglob("*.py"))
        for name, line, call in untyped_tensors(f)
    }
    assert found.keys() <= allowed, "\n".join(
        sorted(where for k, where in found.items() if k not in allowed)
    )
    assert found.keys() == allowed, (
        f"the allowed case is gone: {allowed - found.keys()}"
    )


def test_the_dtype_rule_can_fail(tmp_path):
    f = tmp_path / "x.py"
    f.write_text(
        "import torch\n"
        "a = torch.tensor(rows)\n"
        "b = torch.tensor([r for r in rows], device='cpu')\n"
        "c = torch.tensor([1, 2])\n"
        "d = torch.tensor(rows, dtype=torch.int64)\n"
    )
    assert [line for _, line, _ in untyped_tensors(f)] == [2, 3]
