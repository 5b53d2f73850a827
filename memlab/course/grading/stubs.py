"""The course's stubs, as the course ships them, whatever a learner has done to exercises/.

A learner edits ``exercises/`` (and may commit there, or delete a file); whatever needs the stubs
themselves (the Gradescope bundle, the author-only checks of the test suite, the mutation run's
learner lines, a chapter run the way Colab runs it) reads them from here: the working copy while
it is untouched, else the newest commit in git's history where the file is still the stub.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

from memlab.course.grading.loader import ROOT


def looks_like_stub(stub: str, solution: str) -> bool:
    """Untouched by a learner: every function that differs from the solution only raises
    NotImplementedError (after its docstring), and a kernel's flag (``*_WRITTEN``) is False."""
    try:
        st, so = ast.parse(stub), ast.parse(solution)
    except SyntaxError:
        return False
    if ast.dump(st) == ast.dump(so):
        return False  # the solution itself (a learner who copied it, or an author's slip: CI fails on it)
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


def _git(root: Path, *args: str) -> str | None:
    if shutil.which("git") is None:
        return None
    r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def course_stub(file: str, root: Path = ROOT) -> tuple[str, str] | None:
    """(text, where it came from) of ``exercises/<file>.py`` as the course ships it: the working
    copy while it is the stub, else the newest commit of git's history where it is; None when
    neither holds it (no git, or no commit ever had the stub)."""
    solution = (root / "solutions" / f"{file}.py").read_text()
    working = root / "exercises" / f"{file}.py"
    if working.is_file() and looks_like_stub(working.read_text(), solution):
        return working.read_text(), "the working copy"
    commits = _git(
        root, "log", "--format=%H", "-n", "200", "--", f"exercises/{file}.py"
    )
    for commit in (commits or "").split():
        text = _git(root, "show", f"{commit}:exercises/{file}.py")
        if text is not None and looks_like_stub(text, solution):
            return text, f"commit {commit[:10]}"
    return None


def write_stubs(folder: Path, root: Path = ROOT) -> dict[str, str]:
    """Every exercise's course stub written into ``folder``; returns file -> where it came from.
    Raises FileNotFoundError naming a stub that neither the working copy nor git holds."""
    from memlab.course.grading import catalog

    folder.mkdir(parents=True, exist_ok=True)
    where = {}
    for e in catalog.EXERCISES:
        got = course_stub(e.file, root)
        if got is None:
            raise FileNotFoundError(
                f"exercises/{e.file}.py is not the course's stub, and git's history has none "
                f"(restore it: git checkout <the course's commit> -- exercises/{e.file}.py)"
            )
        (folder / f"{e.file}.py").write_text(got[0])
        where[e.file] = got[1]
    return where
