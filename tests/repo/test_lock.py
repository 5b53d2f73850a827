"""The course's lock (requirements/, written by `./course lock`): one resolution per virtual
environment, exact versions, every file's hash, in step with pyproject.toml; environment.yml
and `./course` install from it and from nothing else."""

import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

from memlab_tests.tools.loading import load_file

ROOT = Path(__file__).resolve().parents[2]
REQ = ROOT / "requirements"
LOCKS = ("torch.txt", "torch-cuda.txt", "course.txt", "colab.txt")
lock = load_file("scripts/lock.py")


def entries(text: str) -> dict[str, list[tuple[str, list[str]]]]:
    """name -> [(its requirement line, its hashes)], from a lock file's text."""
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for e in lock.entries(text.splitlines()):
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", "\n".join(e))
        out.setdefault(lock.name(e), []).append((e[0].rstrip(" \\"), hashes))
    return out


def name_of(spec: str) -> str:
    return re.split(r"[<>=!~;\s\[]", spec, maxsplit=1)[0].lower().replace("_", "-")


@pytest.mark.parametrize("file", LOCKS)
def test_every_locked_package_is_one_exact_version_with_its_hashes(file):
    text = (REQ / file).read_text()
    found = entries(text)
    assert found, f"requirements/{file} locks nothing"
    for name, versions in found.items():
        for line, hashes in versions:
            assert re.fullmatch(rf"{re.escape(name)}==[\w.+!-]+( ; .+)?", line, re.I), (
                f"requirements/{file}: {line!r} is not one exact version"
            )
            assert hashes, f"requirements/{file}: {line!r} has no hash"
    assert "--index-url https://pypi.org/simple" in text


def test_exactness_check_catches_a_range_and_a_missing_hash():
    assert re.fullmatch(r"numpy==[\w.+!-]+( ; .+)?", "numpy>=1.24") is None
    assert entries("numpy==2.0.0 \\\n    --hash=sha256:" + "0" * 64) == {
        "numpy": [("numpy==2.0.0", ["0" * 64])]
    }
    assert entries("numpy==2.0.0\n") == {"numpy": [("numpy==2.0.0", [])]}


@pytest.mark.parametrize("file", LOCKS)
def test_the_lock_was_written_from_this_pyproject(file):
    stamp = lock.pyproject_stamp()
    assert f"when it was written: {stamp}" in (REQ / file).read_text(), (
        f"pyproject.toml or requirements/lock.in changed since requirements/{file} was "
        "written: run ./course lock"
    )


def test_the_stamp_moves_when_a_dependency_changes(tmp_path):
    for f in ("lock.in", "colab-overrides.txt"):
        (tmp_path / "requirements").mkdir(exist_ok=True)
        (tmp_path / "requirements" / f).write_text((REQ / f).read_text())
    text = (ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(text)
    before = lock.pyproject_stamp(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        text.replace('"tqdm>=4.60"', '"tqdm>=4.61"')
    )
    assert lock.pyproject_stamp(tmp_path) != before


def declared() -> tuple[set[str], set[str]]:
    """(names .venv must hold, names .venv-colab must hold) by pyproject and lock.in."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {name_of(d) for d in meta["dependencies"]}
    extra = meta["optional-dependencies"]
    tools = {
        name_of(line)
        for line in (REQ / "lock.in").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    course = base | {name_of(d) for d in extra["course"] + extra["test"]} | tools
    colab = base | {name_of(d) for d in extra["test"]} | tools
    return course, colab


def test_every_declared_package_is_locked_for_both_environments():
    course, colab = declared()
    torch = set(entries((REQ / "torch.txt").read_text()))
    assert torch == {"torch"}
    assert course - torch <= set(entries((REQ / "course.txt").read_text()))
    assert colab - torch <= set(entries((REQ / "colab.txt").read_text()))
    cuda = set(entries((REQ / "torch-cuda.txt").read_text()))
    assert cuda and all(lock.CUDA_ONLY.match(n) for n in cuda)


def test_colab_pairing_is_locked():
    wants = dict(
        line.split("==")
        for line in (REQ / "colab-overrides.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    got = entries((REQ / "colab.txt").read_text())
    for name, version in wants.items():
        assert [line for line, _ in got[name]] == [f"{name}=={version.strip()}"], got[
            name
        ]


def test_environment_yml_is_written_from_the_lock():
    assert (ROOT / "environment.yml").read_text() == lock.environment_yml(
        lock.pyproject_stamp()
    ), "environment.yml is not the lock's: run ./course lock"
    for line in re.findall(r"- -r (\S+)", (ROOT / "environment.yml").read_text()):
        assert (ROOT / line).is_file(), line


def test_the_course_script_installs_only_from_the_lock():
    script = (ROOT / "course").read_text()
    calls = re.findall(r"pipq \"\$PY\" ([^\n]+)", script)
    assert calls
    for call in calls:
        assert (
            "--require-hashes" in call
            or call == '"$MEMLAB_TORCH"'
            or call == "--no-deps --no-build-isolation -e ."
        ), call
    # a learner's own torch, by name, and only by name
    assert '"$MEMLAB_TORCH"' in calls


def test_the_readme_says_which_versions_the_course_was_tested_with():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Versions", 1)[1].split("\n## ", 1)[0]
    course = entries((REQ / "course.txt").read_text())
    torch = entries((REQ / "torch.txt").read_text())
    colab = entries((REQ / "colab.txt").read_text())
    for name, source in (
        ("torch", torch),
        ("triton", course),
        ("numpy", course),
        ("jupyterlab", course),
        ("ipywidgets", course),
        ("transformers", course),
    ):
        versions = {line.split("==")[1].split(" ;")[0] for line, _ in source[name]}
        assert any(f"{name} {v}" in section for v in versions), (
            f"README's Versions section does not name {name} {sorted(versions)}"
        )
    for name in ("triton", "numpy"):
        (v,) = {line.split("==")[1] for line, _ in colab[name]}
        assert f"{name} {v}" in section, f"README: Colab's pairing {name} {v}"
    assert "./course lock" in section
