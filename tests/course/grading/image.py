"""A Gradescope image on this machine, for the tests that grade the way Gradescope does and the
way a learner does: unprivileged users, a venv they can run, the bundle unpacked where
Gradescope unpacks it.

Gradescope runs ``run_autograder`` as root with the student's code as an unprivileged user. The
tests run as root here, so they make that user (``useradd``) and a venv it can run: this
machine's site-packages linked (hard links: no path leads back into the checkout) under a Python
of the same version that user may execute. Where that cannot be done, the tests that need it
skip, and fail when ``CI`` is set. Each helper is cached: one bundle, one venv per process.
"""

from __future__ import annotations

import ast
import atexit
import functools
import json
import os
import pwd
import shutil
import site
import stat
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

import pytest

from memlab.course.grading.stubs import write_stubs

ROOT = Path(__file__).resolve().parents[3]
# The student's user on the Gradescope image. Ending a grading run ends every process of that
# user, so each pytest process that may grade at the same time as another (an xdist worker, the
# learner-state run's own pytest) has a user of its own.
STUDENT = "memlab-student" + (
    f"-{os.environ['PYTEST_XDIST_WORKER']}"
    if os.environ.get("PYTEST_XDIST_WORKER")
    else ""
)
TIMEOUT = 300


def need(ok: bool, why: str) -> None:
    """Skip without it; in CI, fail (a test that cannot run there must not vanish)."""
    if not ok:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(why)


@functools.cache
def user(name: str) -> tuple[int, int] | None:
    """(uid, gid) of an unprivileged user made for the tests (None: this machine cannot)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        return None
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        cmd = [
            "useradd",
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ]
        if subprocess.run(cmd, capture_output=True).returncode != 0:
            return None
        pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid


def as_user(name: str, args, **kw) -> subprocess.CompletedProcess:
    uid, gid = user(name)
    kw.setdefault("cwd", "/")
    return subprocess.run(args, user=uid, group=gid, extra_groups=[], **kw)


def _runnable_python(name: str) -> str | None:
    """A Python of this version that ``name`` may run (pyenv's may sit in root's home)."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    found = [sys._base_executable, shutil.which(f"python{version}")]
    found += [f"{d}/python{version}" for d in ("/usr/bin", "/usr/local/bin")]
    for p in dict.fromkeys(filter(None, found)):
        try:
            ok = (
                as_user(name, [p, "-I", "-c", "pass"], capture_output=True).returncode
                == 0
            )
        except OSError:
            ok = False
        if ok:
            return p
    return None


@functools.cache
def folder() -> Path:
    """Where the image lives: outside the checkout and outside pytest's root-only tmp."""
    where = Path(tempfile.mkdtemp(prefix="memlab-image-"))
    os.chmod(where, 0o755)
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    return where


@functools.cache
def venv() -> Path | None:
    """A venv the unprivileged users run: this one's packages (memlab's own install left out)."""
    if user(STUDENT) is None:
        return None
    python = _runnable_python(STUDENT)
    if python is None:
        return None
    env = folder() / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(env)], check=True)
    target = Path(env / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}")
    target = target / "site-packages"
    source = sysconfig.get_path("purelib") or site.getsitepackages()[0]
    if subprocess.run(["cp", "-al", f"{source}/.", str(target)]).returncode != 0:
        # another file system: copies
        shutil.copytree(source, target, dirs_exist_ok=True)
    for p in target.glob("*"):  # no path from the venv into the checkout
        if p.name.startswith(("__editable__", "memlab")):
            p.unlink() if p.is_file() else shutil.rmtree(p)
    subprocess.run(["chmod", "-R", "go-w,go+rX", str(env)], check=True)
    return env


@functools.cache
def bundle() -> Path:
    from memlab.course.grading.gradescope import build_bundle

    return build_bundle(folder() / "autograder.zip")


def autograder(name: str) -> Path:
    """A fresh /autograder: the bundle in source/, run_autograder beside it, the shared venv,
    an empty submission/."""
    root = folder() / name / "autograder"
    shutil.rmtree(root.parent, ignore_errors=True)
    with zipfile.ZipFile(bundle()) as z:
        z.extractall(root / "source")
        # zipfile drops the mode bits: put the executable ones back
        for info in z.infolist():
            if (info.external_attr >> 16) & stat.S_IXUSR:
                os.chmod(root / "source" / info.filename, 0o755)
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    (root / "venv").symlink_to(venv())
    (root / "submission").mkdir()
    os.chmod(root.parent, 0o755)
    return root


def run_autograder(root: Path, student: str | None = STUDENT, env_=None) -> dict:
    """run_autograder as Gradescope runs it: as root, the student's code as ``student``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("MEMLAB_", "PYTHON"))
    }
    env.update(MEMLAB_AUTOGRADER_ROOT=str(root), MEMLAB_SANDBOX_USER=student or "")
    env.update(env_ or {})
    r = subprocess.run(
        [str(root / "run_autograder")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((root / "results" / "results.json").read_text())
    data["stdout"] = r.stdout
    return data


@functools.cache
def checkout() -> Path:
    """A learner's clone, readable by the learner's user: the course without its git history."""
    dest = folder() / "checkout"
    for part in ("memlab", "kernels", "solutions", "tests/exercises"):
        shutil.copytree(ROOT / part, dest / part, symlinks=True, dirs_exist_ok=True)
    # The stubs as the course ships them (generated from the solutions), not this working copy's
    # exercises/, which may hold the learner's own work.
    write_stubs(dest / "exercises")
    shutil.copy2(ROOT / "exercises" / "README.md", dest / "exercises" / "README.md")
    from memlab.course.grading.gradescope import BUNDLE_FILES

    for part in BUNDLE_FILES:
        (dest / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / part, dest / part)
    subprocess.run(["chmod", "-R", "go-w,go+rX", str(dest)], check=True)
    path = folder() / "path"  # PYTHONPATH: a folder holding only memlab
    path.mkdir(exist_ok=True)
    if not (path / "memlab").exists():
        (path / "memlab").symlink_to(dest / "memlab")
    return dest


def grade_as_learner(learner: str, files: Path, *args: str):
    """``python -m memlab.grade --from files`` in the learner's clone, as the user ``learner``
    (what a learner's code may do to the grader, it does to that user's processes alone):
    (the finished process, results.json or {})."""
    checkout()
    results = Path(tempfile.mkdtemp(prefix="memlab-results-", dir=folder()))
    os.chmod(results, 0o777)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(folder() / "path"),
    }
    env.update(HOME=str(results), LANG="C.UTF-8")
    cmd = [
        str(venv() / "bin" / "python"),
        "-s",
        "-m",
        "memlab.grade",
        "--from",
        str(files),
    ]
    cmd += ["--results", str(results / "results.json"), "-q", *args]
    r = as_user(learner, cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    out = results / "results.json"
    return r, json.loads(out.read_text()) if out.is_file() else {}


def renamed(source: str) -> str:
    """A solution pasted and lightly renamed: the names each function assigns changed, the code
    reformatted, the comments gone."""

    class Rename(ast.NodeTransformer):
        def visit_FunctionDef(self, fn):
            args = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
            stored = [
                t for n in ast.walk(fn) if isinstance(n, ast.Assign) for t in n.targets
            ]
            mine = {t.id for t in stored if isinstance(t, ast.Name)} - args
            for n in ast.walk(fn):
                if isinstance(n, ast.Name) and n.id in mine:
                    n.id = f"my_{n.id[::-1]}"
            return fn

    return ast.unparse(Rename().visit(ast.parse(source)))


def clean_up_after(name: str) -> None:
    """What a learner's grading left when its own files killed it: its processes, its folders
    in /tmp (the grader would have removed them had it lived)."""
    as_user(name, ["pkill", "-KILL", "-u", name], check=False)
    uid = user(name)[0]
    for p in Path(tempfile.gettempdir()).glob("memlab-*"):
        if p.is_dir() and p.stat().st_uid == uid:
            shutil.rmtree(p, ignore_errors=True)
