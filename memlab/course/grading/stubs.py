"""The course's stubs, generated from the solutions (one source per exercise).

A solution marks the code a learner writes as regions, as otter-grader and nbgrader do::

    def alloc(self, need_size):
        \"\"\"The docstring stays in the stub.\"\"\"
        # BEGIN SOLUTION
        ...the answer...
        # END SOLUTION

``generate`` writes the stub: each region becomes ``raise NotImplementedError`` at the marker's
indentation, or the one line the marker names (``# BEGIN SOLUTION (stub: # YOUR CODE HERE)``, a
kernel's section; ``(stub: SECTION_WRITTEN = False)``, its flag). ``scripts/make_stubs.py``
writes ``exercises/`` from ``solutions/``; ``in_step`` tells whether ``exercises/<file>.py`` is
the generated stub, reading git's history so that a learner's own edits, committed or not, never
count against the course: the working copy, or any commit since the solution's last change, that
holds the generated stub will do.

Whatever needs the stubs themselves (the Gradescope bundle, the style check, the mutation run's
learner lines, a chapter run the way Colab runs it) reads them from here, never from
``exercises/``, which is the learner's.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

from memlab.course.grading.loader import ROOT

BEGIN = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION(?: \(stub: (?P<stub>.+)\))?$")
END = re.compile(r"^[ \t]*# END SOLUTION$")


class StubError(ValueError):
    """A solution's regions are malformed (unclosed, nested, missing)."""


def generate(solution: str, name: str = "solution") -> str:
    """The stub of a solution's text: each ``# BEGIN SOLUTION`` ... ``# END SOLUTION`` region
    replaced by its stub line (``raise NotImplementedError`` unless the marker names one)."""
    out: list[str] = []
    region: tuple[int, re.Match] | None = None
    count = 0
    for n, line in enumerate(solution.splitlines(keepends=True), 1):
        text = line.rstrip("\n")
        begin, end = BEGIN.match(text), END.match(text)
        if region is None:
            if end:
                raise StubError(f"{name}:{n}: # END SOLUTION without # BEGIN SOLUTION")
            if begin:
                region = (n, begin)
            else:
                out.append(line)
            continue
        if begin:
            raise StubError(
                f"{name}:{n}: # BEGIN SOLUTION inside the region opened at line {region[0]}"
            )
        if end:
            m = region[1]
            out.append(f"{m['indent']}{m['stub'] or 'raise NotImplementedError'}\n")
            region, count = None, count + 1
    if region is not None:
        raise StubError(f"{name}:{region[0]}: # BEGIN SOLUTION is never closed")
    if not count:
        raise StubError(
            f"{name}: no # BEGIN SOLUTION region: nothing for a learner to write"
        )
    return "".join(out)


def course_stub(file: str, root: Path = ROOT) -> tuple[str, str]:
    """(text, where it came from) of ``exercises/<file>.py`` as the course ships it: generated
    from ``solutions/<file>.py``."""
    path = root / "solutions" / f"{file}.py"
    return generate(
        path.read_text(), f"solutions/{file}.py"
    ), f"generated from {path.name}"


def write_stubs(folder: Path, root: Path = ROOT) -> dict[str, str]:
    """Every exercise's course stub written into ``folder``; returns file -> where it came from."""
    from memlab.course.grading import catalog

    folder.mkdir(parents=True, exist_ok=True)
    where = {}
    for e in catalog.EXERCISES:
        text, where[e.file] = course_stub(e.file, root)
        (folder / f"{e.file}.py").write_text(text)
    return where


# -- in step: exercises/ holds the generated stubs (a learner's edits aside) ----------------------


def _git(root: Path, *args: str) -> str | None:
    if shutil.which("git") is None:
        return None
    r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def in_step(file: str, root: Path = ROOT) -> tuple[bool | None, str]:
    """Whether ``exercises/<file>.py`` is the stub generated from its solution, and where that
    was seen: True when the working copy holds it, or a commit since the solution's last change
    (the learner may have written in it since, and committed); False when none does; None when
    git cannot tell (no history) and the working copy is not the stub."""
    want = course_stub(file, root)[0]
    working = root / "exercises" / f"{file}.py"
    if working.is_file() and working.read_text() == want:
        return True, "the working copy"
    stub, solution = f"exercises/{file}.py", f"solutions/{file}.py"
    if _git(root, "rev-parse", "HEAD") is None:
        return None, "no git history here, and the working copy is not the stub"
    last = (_git(root, "log", "-n", "1", "--format=%H", "--", solution) or "").strip()
    if not last or _git(root, "diff", "--quiet", "HEAD", "--", solution) is None:
        # A solution not committed, or changed since: only the working copy can follow it.
        return (
            False,
            f"{solution} has changes not committed; the working copy is not its stub",
        )
    commits = [last] + (
        _git(root, "rev-list", f"{last}..HEAD", "--", stub) or ""
    ).split()
    for commit in commits:
        if _git(root, "show", f"{commit}:{stub}") == want:
            return True, f"commit {commit[:10]}"
    return (
        False,
        f"no commit since {solution}'s last change ({last[:10]}) holds its stub",
    )


def looks_like_stub(stub: str, solution: str) -> bool:
    """Untouched by a learner: every function that differs from the solution only raises
    NotImplementedError (after its docstring), and a kernel's flag (``*_WRITTEN``) is False."""
    try:
        st, so = ast.parse(stub), ast.parse(solution)
    except SyntaxError:
        return False
    if ast.dump(st) == ast.dump(so):
        return False  # the solution itself (a learner who copied it)
    for node in st.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id.endswith("_WRITTEN") for t in node.targets
        ):
            return ast.literal_eval(node.value) is False

    def functions(tree, prefix=""):
        for n in getattr(tree, "body", []):
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
                if isinstance(n, ast.FunctionDef):
                    yield prefix + n.name, n
                yield from functions(n, f"{prefix}{n.name}.")

    ref = dict(functions(so))

    def names(tree):
        return {
            n.name
            for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.ClassDef))
        }

    if names(st) != names(so):
        return False  # a helper added, or a function renamed: a learner's file
    for name, fn in functions(st):
        if name in ref and ast.dump(fn) != ast.dump(ref[name]):
            body = [
                b
                for b in fn.body
                if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))
            ]
            if not (
                len(body) == 1
                and isinstance(body[0], ast.Raise)
                and "NotImplementedError" in ast.unparse(body[0])
            ):
                return False
    return True
