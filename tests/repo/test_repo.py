"""The repository's promises: the README's commands, CI, and one list of dependencies."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(\./course \w+)", readme, flags=re.M)
    assert commands[:2] == ["./course lab", "./course test"], commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./course test" in ci.split("#")[-1] or "\n./course test" in ci


# Files CONTRIBUTING.md names before they exist, each with what brings it. Delete a line
# when it lands.
CONTRIBUTING_PENDING: dict = {}


def contributing_paths(text: str) -> set[str]:
    """Repository paths CONTRIBUTING.md names in backticks (templates such as kernels/<name>.py
    aside)."""
    names = {
        m.split("::")[0]
        for m in re.findall(r"`([\w./<>-]+/[\w.<>-]+\.(?:py|md|toml))`", text)
    }
    return {n for n in names if not re.search(r"<|NN|chNN", n)}


def test_contributing_names_files_that_exist():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    named = contributing_paths(text)
    assert {
        "tests/tools/compile_kernels.py",
        "memlab/course/grading/catalog.py",
        "tests/repo/test_checklists.py",
    } <= named
    missing = sorted(
        n for n in named - set(CONTRIBUTING_PENDING) if not (ROOT / n).exists()
    )
    assert not missing, f"CONTRIBUTING.md names files that do not exist: {missing}"
    landed = sorted(n for n in CONTRIBUTING_PENDING if (ROOT / n).exists())
    assert not landed, (
        f"these exist now: delete them from CONTRIBUTING_PENDING: {landed}"
    )
    assert contributing_paths("`tests/nope.py` and `kernels/<name>.py`") == {
        "tests/nope.py"
    }


def mirror_modules() -> dict[str, str]:
    """memlab module -> its docstring's first line, for every module of the two engine sections."""
    out = {}
    for section in ("sglang", "vllm"):
        for path in sorted((ROOT / "memlab" / section).rglob("*.py")):
            if path.name == "__init__.py":
                continue
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            text = path.read_text()
            first = (
                text.split('"""', 2)[1].splitlines()[0]
                if text.startswith('"""')
                else ""
            )
            out[module] = first
    return out


def readme_mirror_table() -> dict[str, str]:
    """README's module/engine/chapter table: memlab module -> engine file column."""
    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `(memlab\.[\w.]+)` \| (.+?) \| [\d, -]+ \|$", text, re.M)
    return dict(rows)


def unnamed_mirrors(mods: dict[str, str]) -> list[str]:
    return sorted(
        m
        for m, first in mods.items()
        if not re.search(r"\b(sglang|vllm)/[\w/]+(\.py|/)", first)
    )


def test_every_mirror_module_names_its_engine_file_first():
    mods = mirror_modules()
    assert "memlab.sglang.allocator.paged" in mods and "memlab.vllm.block_pool" in mods
    unnamed = unnamed_mirrors(mods)
    assert not unnamed, (
        f"name the engine file each mirrors in the first docstring line: {unnamed}"
    )


def test_readme_table_lists_every_mirror_module_with_its_file():
    table, mods = readme_mirror_table(), mirror_modules()
    assert len(table) >= 15
    assert not sorted(set(mods) - set(table)), (
        f"add to README's module/engine/chapter table: {sorted(set(mods) - set(table))}"
    )
    stale = sorted(
        m
        for m in table
        if not (ROOT / pathlib.Path(*m.split("."))).with_suffix(".py").exists()
    )
    assert not stale, f"README's table names modules that do not exist: {stale}"
    # the file the docstring names is the one the table names
    for m in mods:
        named = re.findall(r"\b((?:sglang|vllm)/[\w/]+\.py)", mods[m])
        assert not named or any(n.split("/")[-1] in table[m] for n in named), (
            m,
            named,
            table[m],
        )


def test_the_mirror_check_sees_a_module_without_its_file(tmp_path, monkeypatch):
    pkg = tmp_path / "memlab" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text('"""A thing that mirrors nothing named."""\n')
    (pkg / "b.py").write_text('"""B (sglang/srt/mem_cache/b.py)."""\n')
    (tmp_path / "memlab" / "vllm").mkdir()
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    mods = mirror_modules()
    assert set(mods) == {"memlab.sglang.a", "memlab.sglang.b"}
    assert unnamed_mirrors(mods) == ["memlab.sglang.a"]
