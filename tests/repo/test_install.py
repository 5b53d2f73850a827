"""memlab.kernels is a real package in every way the course is used.

The kernels live in the repository's top-level kernels/ folder (the course's layout names it);
memlab/kernels is a symbolic link to it, kept by git. So ``memlab.kernels.alloc_extend`` is a
file under memlab/ for an IDE or a type checker, for an editable install (``./course``,
``pip install -e .``), for a regular install (``pip install .``: the wheel holds real copies) and
for a clone put on sys.path (Colab's first cell: tests/chapters/test_notebooks.py,
test_setup_cell_in_a_fresh_python_runs_the_clones_kernels). Each way is checked here in a fresh
interpreter (-S: no site-packages, so neither this checkout's own install nor torch and Triton),
from a folder with no course around it. A kernel running from a clone is the Colab test's part.
"""

import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# __init__.py among them
KERNELS = sorted(p.name for p in (ROOT / "kernels").glob("*.py"))

PROBE = """
import importlib.util, os
# the package's __init__ fixes the kernel mode (no torch here: interpreter)
import memlab, memlab.kernels
print("MEMLAB", memlab.__file__)
print("KERNELS", *(
    importlib.util.find_spec(f"memlab.kernels.{n}").origin for n in ("canary", "alloc_extend")
))
print("MODE", os.environ.get("TRITON_INTERPRET"))
print("TOPLEVEL", [n for n in ("kernels", "exercises", "solutions") if importlib.util.find_spec(n)])
"""


def test_memlab_kernels_is_the_kernels_folder_through_a_link_git_keeps():
    link = ROOT / "memlab" / "kernels"
    assert link.is_symlink() and os.readlink(link) == "../kernels", (
        "memlab/kernels must be a link to ../kernels"
    )
    assert {p.name for p in link.glob("*.py")} == set(
        KERNELS
    ) and "__init__.py" in KERNELS
    listed = subprocess.run(
        ["git", "ls-files", "-s", "memlab/kernels"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if listed.returncode:
        pytest.skip("not a git checkout")
    assert listed.stdout.split()[:1] == ["120000"], (
        f"git must store memlab/kernels as a link: {listed.stdout!r}"
    )


def course_copy(dest: Path) -> Path:
    """What a build needs (pyproject, README, LICENSE, memlab/ with its link, kernels/), copied."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, dest / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "memlab", dest / "memlab", symlinks=True, ignore=skip)
    shutil.copytree(ROOT / "kernels", dest / "kernels", ignore=skip)
    return dest


def install(src: Path, target: Path, editable: bool) -> Path:
    """Build the wheel pip would build (setuptools' PEP 517/660 hook, in this interpreter) and
    unpack it into ``target``, as installing it does. No pip: ``pip install --prefix`` would
    uninstall this checkout's own install first."""
    try:
        have = tuple(
            int(x) for x in importlib.metadata.version("setuptools").split(".")[:2]
        )
    except importlib.metadata.PackageNotFoundError:
        have = (0, 0)
    if have < (77, 0):
        pytest.skip(
            f"pyproject.toml needs setuptools >= 77 to build (this Python has {have})"
        )
    hook = "build_editable" if editable else "build_wheel"
    out = target.parent / "dist"
    # pip runs the hook as a script of its own: the source folder is the working folder, not on
    # sys.path (where its kernels/ would hide an installed `kernels`, whose setuptools entry point
    # the build loads).
    code = (
        "import sys\nsys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
        f"from setuptools import build_meta\nprint(build_meta.{hook}({str(out)!r}))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    with zipfile.ZipFile(out / r.stdout.split()[-1]) as wheel:
        wheel.extractall(target)
    return target


def probe(setup: str, cwd: Path) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TRITON_INTERPRET", "PYTHONPATH")
    }
    r = subprocess.run(
        [sys.executable, "-S", "-c", "import sys\n" + setup + PROBE],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return dict(
        line.split(" ", 1)
        for line in r.stdout.splitlines()
        if line.split(" ", 1)[0].isupper()
    )


def test_an_editable_install_finds_the_kernels_and_sees_edits(tmp_path):
    src = course_copy(tmp_path / "course")
    site_dir = install(src, tmp_path / "site", editable=True)
    # editable: a new kernel file is seen at once
    (src / "kernels" / "added_later.py").write_text("X = 1\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # site.addsitedir reads the install's .pth file, as Python's start-up does in an environment
    got = probe(
        f"import site\nsite.addsitedir({str(site_dir)!r})\nimport memlab.kernels.added_later\n",
        elsewhere,
    )
    assert got["MEMLAB"] == str(src / "memlab" / "__init__.py")
    assert [Path(k).resolve() for k in got["KERNELS"].split()] == [
        src / "kernels" / "canary.py",
        src / "kernels" / "alloc_extend.py",
    ]
    assert got["MODE"] == "1" and got["TOPLEVEL"] == "[]"


def test_a_regular_install_holds_the_kernels(tmp_path):
    src = course_copy(tmp_path / "course")
    target = install(src, tmp_path / "site", editable=False)
    shutil.rmtree(src)  # nothing may point back at the source
    installed = target / "memlab" / "kernels"
    assert installed.is_dir() and not installed.is_symlink()
    assert sorted(p.name for p in installed.glob("*.py")) == KERNELS
    assert not [p for p in (target / "memlab").rglob("*") if p.is_symlink()]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    got = probe(f"sys.path.insert(0, {str(target)!r})\n", elsewhere)
    assert got["MEMLAB"] == str(target / "memlab" / "__init__.py")
    assert got["KERNELS"].split() == [
        str(installed / "canary.py"),
        str(installed / "alloc_extend.py"),
    ]
    assert got["MODE"] == "1" and got["TOPLEVEL"] == "[]"
