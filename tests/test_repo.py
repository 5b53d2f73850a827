"""The repository's promises: the README's commands, CI, and one list of dependencies."""

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_environment_yml_agrees_with_pyproject():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    want = set(meta["dependencies"]) | {d for extra in meta["optional-dependencies"].values() for d in extra}
    text = (ROOT / "environment.yml").read_text()
    pip = text.split("- pip:", 1)[1]
    got = {line.strip()[2:].strip() for line in pip.splitlines() if line.strip().startswith("- ")}
    assert got == want, f"only in environment.yml: {sorted(got - want)}; only in pyproject: {sorted(want - got)}"


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
