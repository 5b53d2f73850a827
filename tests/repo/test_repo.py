"""The repository's promises: the README's commands, CI, and one list of dependencies."""

import pathlib
import re

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


CONDA_FORGE = {
    "numpy",
    "matplotlib",
    "jupyterlab",
    "ipywidgets",
}  # compiled or large: conda's builds


def environment_yml() -> tuple[list[str], list[str]]:
    """(conda dependencies, pip dependencies) of environment.yml, as written."""
    text = (ROOT / "environment.yml").read_text()
    conda_part, pip_part = text.split("- pip:", 1)

    def items(part):
        return [
            line.strip()[2:].strip()
            for line in part.splitlines()
            if line.strip().startswith("- ")
        ]

    return items(conda_part.split("dependencies:", 1)[1]), items(pip_part)


def name_of(spec: str) -> str:
    return re.split(r"[<>=!;\s\[]", spec, maxsplit=1)[0].lower()


def test_environment_yml_agrees_with_pyproject():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    want = set(meta["dependencies"]) | {
        d for extra in meta["optional-dependencies"].values() for d in extra
    }
    conda, pip = environment_yml()
    got = set(pip) | {d for d in conda if name_of(d) not in ("python", "pip")}
    assert got == want, (
        f"only in environment.yml: {sorted(got - want)}; only in pyproject: {sorted(want - got)}"
    )
    assert len(got) == len(pip) + len(conda) - 2, "a package is listed twice"


def test_environment_yml_pins_python_and_takes_compiled_packages_from_conda_forge():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    conda, pip = environment_yml()
    (python,) = [d for d in conda if name_of(d) == "python"]
    m = re.fullmatch(r"python=3\.(\d+)", python)
    assert m, f"pin one Python minor version (python=3.X), not {python!r}"
    floor = int(re.fullmatch(r">=3\.(\d+)", meta["requires-python"]).group(1))
    assert int(m.group(1)) >= floor, (
        f"{python} is below requires-python {meta['requires-python']}"
    )
    assert {name_of(d) for d in conda} >= CONDA_FORGE, (
        "numpy, matplotlib, jupyterlab, ipywidgets from conda-forge"
    )
    assert not {name_of(d) for d in pip} & CONDA_FORGE, (
        "a conda-forge package is installed by pip again"
    )
    assert (
        "conda-forge"
        in (ROOT / "environment.yml")
        .read_text()
        .split("channels:", 1)[1]
        .split("dependencies:")[0]
    )


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(\./course \w+)", readme, flags=re.M)
    assert commands[:2] == ["./course lab", "./course test"], commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./course test" in ci.split("#")[-1] or "\n./course test" in ci


def test_course_script_never_pins_over_an_existing_torch():
    script = (ROOT / "course").read_text()
    # torch is installed only behind a failed import check
    installs = [
        line for line in script.splitlines() if "MEMLAB_TORCH" in line and "pip" in line
    ]
    assert installs and all(
        "import torch" in line and "||" in line for line in installs
    ), installs


# Files CONTRIBUTING.md names before they exist, each with what brings it. Delete a line
# when it lands.
CONTRIBUTING_PENDING: dict = {}


def contributing_paths(text: str) -> set[str]:
    """Repository paths CONTRIBUTING.md names in backticks (templates such as kernels/<name>.py aside)."""
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
