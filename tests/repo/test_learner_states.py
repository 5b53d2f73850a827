"""Every state a learner leaves the course in keeps the suite green (issue 28).

One clone of the course, as a learner leaves it after an afternoon:

- chapters opened, run and saved by JupyterLab (a real JupyterLab server, started the way
  ``./course lab`` starts it, still running while the suite runs; the notebooks saved through
  its contents API, as its Save does): outputs stored, the setup cell expanded, a cell added
  after the grade cell, a cell deleted;
- exercises done and committed (ch04_alloc_extend, ch05_paged_free), done and not committed
  (ch06_free_queue, ch11_radix_match), half done and raising (ch01_alloc_rows), a stub deleted
  (ch08_sizing);
- a grading run left behind (``python -m memlab.grade 01 --results results.json``).

There, the tests that read what the learner can change run and must pass: every test found to
read exercises/ (followed through the functions it calls, below), the checks of what the
notebooks store, and the lock's and repository's checks. The suite reads stored files through
``memlab_tests.tools.stored`` and the stubs through ``memlab.course.grading.stubs``, which is what
makes this hold; the chunks below keep each run under a minute.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from memlab_tests.tools.loading import load_file
from memlab_tests.tools.stored import stored

# The learner's clone is a module fixture: each xdist worker that runs tests of this module builds
# its own, in its own tmp (./course test distributes with xdist's default, --dist load).

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ("ch04_alloc_extend", "ch05_paged_free")
UNCOMMITTED = ("ch06_free_queue", "ch11_radix_match")
HALF_DONE = (
    "ch01_alloc_rows"  # alloc_rows and free written, clear still wrong: it raises
)
DELETED = "ch08_sizing"
RAN = ("04", "07")  # run top to bottom in a kernel, then saved
OPENED = ("00", "12")  # opened, the setup cell expanded, a cell added, saved

# -- which tests read exercises/ or copy the course ------------------------------------------------
# A function reads exercises/ when its source names the folder or copies the course (git clone /
# archive / ls-files), or when it calls such a function: by name
# in its module, through what the module imports (memlab's modules and the scripts loaded with
# load_file), or as a fixture. Followed to a fixed point over memlab/, scripts/ and tests/.
MARK = re.compile(
    r"""["'/]exercises["'/]|\bexercises/|["']exercises["']|["'](clone|archive|ls-files)["']|"""
    r"""\bgit (clone|archive|ls-files)\b"""
)


# Functions whose text names exercises/ but that never read the learner's copy, each with why.
NOT_READERS = {
    (module, function): why
    for module, function, why in [
        (
            "memlab.course.grading.loader",
            "source_dir",
            "reads exercises/ only when its caller names it (the suite's default is "
            "solutions/, tests/conftest.py): such a caller is marked itself",
        ),
        (
            "memlab.course.grading.stubs",
            "course_stub",
            "generates the stub from solutions/",
        ),
        ("memlab.course.grading.stubs", "write_stubs", "writes course_stub's stubs"),
        (
            "memlab.course.grading.gradescope",
            "build_bundle",
            "zips course_stub's stubs",
        ),
        (
            "memlab.course.grading.runner",
            "check_checkout",
            "checks the folder is there",
        ),
        ("tests.course.grading.image", "checkout", "writes the generated stubs"),
        ("tests.tools.mutants", "main", "'exercises' is its command line's word"),
        ("tests.tools.mutants", "learner_lines", "compares a solution with its stub"),
        (
            "tests.course.grading.test_gradescope",
            "test_solutions_earn_every_cpu_point_held_as_copies",
            "exercises/ of the submission folder it makes",
        ),
    ]
}


def _marked(fn) -> bool:
    # tests/exercises holds the graded tests, not the learner's files
    text = (
        ast.unparse(fn)
        .replace("tests/exercises", "")
        .replace("'tests' / 'exercises'", "")
    )
    return bool(MARK.search(text))


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


class _Module:
    """One source file: its functions, and what its names stand for (imports, load_file)."""

    def __init__(self, path: Path):
        self.name = _module_name(path)
        self.tree = ast.parse(path.read_text())
        self.functions = {
            n.name: n
            for n in ast.walk(self.tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        # local name -> (module, attribute or None)
        self.names: dict[str, tuple[str, str | None]] = {}
        package = self.name.rsplit(".", 1)[0] if "." in self.name else ""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    full = a.name.replace("memlab_tests", "tests", 1)
                    self.names[a.asname or full.split(".")[0]] = (
                        full if a.asname else full.split(".")[0],
                        None,
                    )
            elif isinstance(node, ast.ImportFrom):
                base = (node.module or "").replace("memlab_tests", "tests", 1)
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1]
                        + ([base] if base else [])
                    )
                for a in node.names:
                    self.names[a.asname or a.name] = (base, a.name)
            elif (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "load_file"
                and node.value.args
                and isinstance(node.value.args[0], ast.Constant)
            ):
                self.names[node.targets[0].id] = (
                    node.value.args[0].value.removesuffix(".py").replace("/", "."),
                    None,
                )

    def refs(self, fn, modules) -> set[tuple[str, str]]:
        """(module, function) pairs a function's body may call or use."""
        out = set()
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) or (
                isinstance(n, ast.arg) and fn.args and n in fn.args.args
            ):
                name = n.id if isinstance(n, ast.Name) else n.arg
                if name in self.functions:
                    out.add((self.name, name))
                elif name in self.names:
                    mod, attr = self.names[name]
                    if attr is not None:
                        out.add(
                            (mod, attr) if mod in modules else (f"{mod}.{attr}", None)
                        )
                out.add(("fixture", name))
            elif (
                isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id in self.names
            ):
                mod, attr = self.names[n.value.id]
                target = mod if attr is None else f"{mod}.{attr}"
                out.add((target, n.attr))
        return out


@functools.cache
def _readers() -> tuple[set[tuple[str, str]], dict[str, _Module]]:
    paths = [
        *sorted((ROOT / "memlab").rglob("*.py")),
        *sorted((ROOT / "scripts").glob("*.py")),
        *sorted((ROOT / "tests").rglob("*.py")),
    ]
    modules = {}
    for p in paths:
        if "kernels" in p.relative_to(ROOT).parts:
            continue
        try:
            m = _Module(p)
        except (SyntaxError, UnicodeDecodeError):
            continue
        modules[m.name] = m
    fixtures = {}  # a fixture is found by its name, in its module or in conftest.py
    for m in modules.values():
        for name, fn in m.functions.items():
            if any("fixture" in ast.unparse(d) for d in fn.decorator_list):
                fixtures.setdefault(name, set()).add((m.name, name))
    reads = {
        (m.name, name)
        for m in modules.values()
        for name, fn in m.functions.items()
        if _marked(fn) and (m.name, name) not in NOT_READERS
    }
    edges = {}
    for m in modules.values():
        for name, fn in m.functions.items():
            refs = m.refs(fn, modules)
            refs |= {
                f
                for r in refs
                if r[0] == "fixture"
                for f in fixtures.get(r[1], ())
                if f[0] in (m.name, "tests.conftest")
            }
            edges[(m.name, name)] = refs
        # a name a module imports stands for the original
        for local, (mod, attr) in m.names.items():
            if attr is not None:
                edges.setdefault((m.name, local), set()).add((mod, attr))
    while True:
        more = {
            k
            for k, refs in edges.items()
            if k not in reads and k not in NOT_READERS and refs & reads
        }
        if not more:
            return reads, modules
        reads |= more


def product_readers() -> set[str]:
    """Functions of memlab/ and scripts/ that read exercises/ (directly, or through one another)."""
    reads, _ = _readers()
    return {name for mod, name in reads if not mod.startswith("tests.")}


def readers() -> list[str]:
    """Node ids of the tests that read exercises/ or copy the course."""
    reads, _ = _readers()
    out = []
    for mod, name in sorted(reads):
        if mod.startswith("tests.") and name.startswith("test_"):
            path = mod.replace(".", "/") + ".py"
            if (
                (ROOT / path).is_file()
                and "/exercises/" not in path
                and path != "tests/repo/test_learner_states.py"
            ):
                out.append(f"{path}::{name}")
    return out


def test_the_tests_that_read_exercises_are_found():
    """The selection holds the tests that once failed for a learner, and the library functions
    that read exercises/ are found through the calls."""
    found = set(readers())
    for must in (
        "tests/course/grading/test_stubs.py::test_in_step_whatever_the_learner_did",
        "tests/chapters/test_notebooks.py::test_chapter_runs_like_colab",
        "tests/chapters/test_notebooks.py::test_drive_gets_the_stubs_once_and_never_overwrites",
    ):
        assert must in found, must
    assert {"in_step", "download_exercises", "use_drive"} <= product_readers()
    assert not set(NOT_READERS) & _readers()[0]


# -- the learner's clone --------------------------------------------------------------------------


def _git(course: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=learner", "-c", "user.email=learner@example.com"]
        + ["-c", "commit.gpgsign=false", *args],
        cwd=course,
        check=True,
        capture_output=True,
    )


def half_done(course: Path) -> str:
    """The solution of HALF_DONE with its ``clear`` still wrong (it raises an IndexError)."""
    source = (course / "solutions" / f"{HALF_DONE}.py").read_text()
    clear = next(
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef) and n.name == "clear"
    )
    lines = source.splitlines()
    body = clear.body[1:] if isinstance(clear.body[0], ast.Expr) else clear.body
    lines[body[0].lineno - 1 : body[-1].end_lineno] = [
        "        self.free_slots = [][0]  # not finished"
    ]
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """JupyterLab serving the clone's chapters, started as ./course lab starts it."""

    def __init__(self, course: Path, log: Path):
        self.port, self.token = free_port(), "learner"
        args = subprocess.run(
            ["bash", "-c", f'source "{course}/course"; PY="{sys.executable}"; lab_settings; '
             'lab_args --headless; printf "%s\\n" "${LAB_ARGS[@]}"'],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", *args, f"--port={self.port}"]
            + [f"--IdentityProvider.token={self.token}", "--ServerApp.port_retries=0"],
            cwd=course,
            env=course_env(course),
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.request("GET", "api/status")
                return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"JupyterLab did not start: {log.read_text()[-2000:]}")

    def request(self, method: str, path: str, body=None):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"null")

    def save(self, name: str, nb) -> None:
        """What JupyterLab's Save sends: the whole notebook through the contents API."""
        self.request(
            "PUT",
            f"api/contents/{name}",
            {"type": "notebook", "format": "json", "content": nb},
        )

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def learner_saves(lab: Lab, course: Path, nn: str, run: bool) -> None:
    name = next((course / "chapters").glob(f"{nn}_*.ipynb")).name
    nb = nbformat.from_dict(lab.request("GET", f"api/contents/{name}")["content"])
    if run:
        execute = load_file("scripts/run_notebooks.py").execute
        nb, _ = execute(
            course / "chapters" / name,
            timeout=240,
            env={"PYTHONPATH": course_env(course)["PYTHONPATH"]},
        )
    setup = next(c for c in nb.cells if c.cell_type == "code")
    setup.metadata.pop("jupyter", None)  # a click on the collapsed form
    nb.cells.append(nbformat.v4.new_code_cell(""))  # Shift+Enter on the grade cell
    del nb.cells[1]  # a cell deleted
    lab.save(name, json.loads(nbformat.writes(nb)))


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    """The clone as the learner leaves it (see the module's docstring), JupyterLab running."""
    course = tmp_path_factory.mktemp("learner") / "memlab"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(course)], check=True)
    for f in COMMITTED + UNCOMMITTED:
        shutil.copyfile(
            course / "solutions" / f"{f}.py", course / "exercises" / f"{f}.py"
        )
        if f in COMMITTED:
            _git(course, "commit", "-qam", f"my {f}")
    (course / "exercises" / f"{HALF_DONE}.py").write_text(half_done(course))
    (course / "exercises" / f"{DELETED}.py").unlink()
    lab = Lab(course, tmp_path_factory.mktemp("lab") / "lab.log")
    try:
        for nn in RAN + OPENED:
            learner_saves(lab, course, nn, run=nn in RAN)
        grade = subprocess.run(
            [sys.executable, "-m", "memlab.grade", "01", "--results", "results.json"],
            cwd=course, env=course_env(course), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        # points lost: fine
        assert grade.returncode in (0, 1), grade.stdout + grade.stderr
        yield course
    finally:
        lab.stop()


def test_the_learner_state_is_what_it_says(learner):
    for nn in RAN + OPENED:
        nb = nbformat.read(next((learner / "chapters").glob(f"{nn}_*.ipynb")), 4)
        setup = next(c for c in nb.cells if c.cell_type == "code")
        assert "jupyter" not in setup.metadata and nb.cells[-1].source == ""
        ran = any(c.get("outputs") for c in nb.cells if c.cell_type == "code")
        assert ran == (nn in RAN), nn
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=learner, capture_output=True, text=True
    ).stdout
    for f in UNCOMMITTED + (HALF_DONE, DELETED):
        assert f"exercises/{f}.py" in status, status
    for f in COMMITTED:
        assert f"exercises/{f}.py" not in status
    assert (learner / "results.json").is_file()


def course_env(course: Path) -> dict:
    """The environment of a process that must run the clone's memlab, not this checkout's (the
    venv's editable install points here): PYTHONPATH gets a folder holding only a link named
    memlab to the clone's, as the chapters' setup cell gives shell cells."""
    links = course.parent / "import"
    links.mkdir(exist_ok=True)
    if not (links / "memlab").exists():
        (links / "memlab").symlink_to(course / "memlab", target_is_directory=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "MEMLAB_EXERCISES", "PYTHONPATH"))
    }
    return env | {"PYTHONPATH": str(links)}


def run_inside(course: Path, args: list[str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q"]
        + ["-rfE", *args],
        cwd=course, env=course_env(course), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and " passed" in out, (
        f"red in the learner's checkout (pytest {' '.join(args)[:300]}):\n{out[-6000:]}"
    )
    return out


def chunks() -> dict[str, list[str]]:
    """The pytest runs in the learner's clone, each under a minute."""
    found = [t for t in readers() if "test_chapter_runs_like_colab" not in t]
    grading = [t for t in found if t.startswith("tests/course/grading/")]
    rest = [t for t in found if t not in grading]
    colab = "tests/chapters/test_notebooks.py::test_chapter_runs_like_colab"
    return {
        "notebooks as stored, lock and repository": [
            "tests/chapters/test_notebooks.py", "tests/repo/test_lock.py",
            "tests/repo/test_repo.py", "-k", "not runs_like_colab and not fresh_python",
        ],
        "grading": grading,
        # the chapter whose exercises the learner committed still runs like Colab
        "other readers of exercises/": [*rest, f"{colab}[04_alloc_extend]"],
    }  # fmt: skip


CHUNKS = (
    "notebooks as stored, lock and repository",
    "grading",
    "other readers of exercises/",
)


def test_the_chunks_are_the_ones_run():
    assert tuple(chunks()) == CHUNKS and all(chunks().values())


@pytest.mark.parametrize("chunk", CHUNKS)
def test_green_in_the_learners_clone(learner, chunk):
    run_inside(learner, chunks()[chunk])


def test_reset_chapters_gives_the_course_back_and_keeps_the_learners(learner, tmp_path):
    course = tmp_path / "memlab"
    shutil.copytree(
        learner, course, symlinks=True, ignore=shutil.ignore_patterns(".venv*")
    )
    r = subprocess.run(
        [sys.executable, "scripts/reset_chapters.py"],
        cwd=course,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    kept = sorted(p.name[:2] for p in (course / "chapters" / "saved").rglob("*.ipynb"))
    assert kept == sorted(RAN + OPENED), r.stdout
    pristine = stored("chapters")
    for nb in (course / "chapters").glob("[0-9][0-9]_*.ipynb"):
        assert nb.read_text() == (pristine / nb.name).read_text(), nb.name
    assert "yours are in chapters/saved/" in r.stdout
