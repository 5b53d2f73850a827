"""The repository's promises: the README's commands, CI, and one list of dependencies."""

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


CONDA_FORGE = {"numpy", "matplotlib", "jupyterlab", "ipywidgets"}  # compiled or large: conda's builds


def environment_yml() -> tuple[list[str], list[str]]:
    """(conda dependencies, pip dependencies) of environment.yml, as written."""
    text = (ROOT / "environment.yml").read_text()
    conda_part, pip_part = text.split("- pip:", 1)
    items = lambda part: [line.strip()[2:].strip() for line in part.splitlines()  # noqa: E731
                          if line.strip().startswith("- ")]
    return items(conda_part.split("dependencies:", 1)[1]), items(pip_part)


def name_of(spec: str) -> str:
    return re.split(r"[<>=!;\s\[]", spec, maxsplit=1)[0].lower()


def test_environment_yml_agrees_with_pyproject():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    want = set(meta["dependencies"]) | {d for extra in meta["optional-dependencies"].values() for d in extra}
    conda, pip = environment_yml()
    got = set(pip) | {d for d in conda if name_of(d) not in ("python", "pip")}
    assert got == want, f"only in environment.yml: {sorted(got - want)}; only in pyproject: {sorted(want - got)}"
    assert len(got) == len(pip) + len(conda) - 2, "a package is listed twice"


def test_environment_yml_pins_python_and_takes_compiled_packages_from_conda_forge():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    conda, pip = environment_yml()
    (python,) = [d for d in conda if name_of(d) == "python"]
    m = re.fullmatch(r"python=3\.(\d+)", python)
    assert m, f"pin one Python minor version (python=3.X), not {python!r}"
    floor = int(re.fullmatch(r">=3\.(\d+)", meta["requires-python"]).group(1))
    assert int(m.group(1)) >= floor, f"{python} is below requires-python {meta['requires-python']}"
    assert {name_of(d) for d in conda} >= CONDA_FORGE, "numpy, matplotlib, jupyterlab, ipywidgets from conda-forge"
    assert not {name_of(d) for d in pip} & CONDA_FORGE, "a conda-forge package is installed by pip again"
    assert "conda-forge" in (ROOT / "environment.yml").read_text().split("channels:", 1)[1].split("dependencies:")[0]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(\./course \w+)", readme, flags=re.M)
    assert commands[:2] == ["./course lab", "./course test"], commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./course test" in ci.split("#")[-1] or "\n./course test" in ci


def test_course_script_never_pins_over_an_existing_torch():
    script = (ROOT / "course").read_text()
    # torch is installed only behind a failed import check
    installs = [line for line in script.splitlines() if "MEMLAB_TORCH" in line and "pip" in line]
    assert installs and all("import torch" in line and "||" in line for line in installs), installs


# Files CONTRIBUTING.md names before they exist, each with what brings it. Delete a line when it lands.
CONTRIBUTING_PENDING: dict = {}


def contributing_paths(text: str) -> set[str]:
    """Repository paths CONTRIBUTING.md names in backticks (templates such as kernels/<name>.py aside)."""
    names = {m.split("::")[0] for m in re.findall(r"`([\w./<>-]+/[\w.<>-]+\.(?:py|md|toml))`", text)}
    return {n for n in names if not re.search(r"<|NN|chNN", n)}


def test_contributing_names_files_that_exist():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    named = contributing_paths(text)
    assert {"scripts/compile_kernels.py", "memlab/grading/catalog.py", "tests/test_checklists.py"} <= named
    missing = sorted(n for n in named - set(CONTRIBUTING_PENDING) if not (ROOT / n).exists())
    assert not missing, f"CONTRIBUTING.md names files that do not exist: {missing}"
    landed = sorted(n for n in CONTRIBUTING_PENDING if (ROOT / n).exists())
    assert not landed, f"these exist now: delete them from CONTRIBUTING_PENDING: {landed}"
    assert contributing_paths("`tests/nope.py` and `kernels/<name>.py`") == {"tests/nope.py"}
