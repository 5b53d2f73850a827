"""Mutation testing of the graded tests: how many small wrong versions of each solution they fail.

    python tests/tools/mutants.py [EXERCISE ...] [--jobs N] [--sample N] [--seed S] [--update-note]
    ./course mutants [...]                      (the same, in the course's .venv)

A mutant is one solution file with ONE small change in the code a learner writes (the lines that
differ between the stub in exercises/ and its twin in solutions/): a comparison made strict or
loose (``<`` / ``<=``), an operator swapped, a constant off by one, a call or keyword argument
dropped, a statement deleted, a name swapped for a look-alike (``stride_ks`` / ``stride_vs``),
``and`` / ``or``, ``is`` / ``is not``, ``break`` / ``continue``, a slice turned round. Each mutant
is graded by the exercise's graded tests (tests/exercises, the learner's tests, in the order of
their cost); it is *killed* when one of them fails, crashes or times out, as the grader would
take points for it. A mutant that survives is either a hole in the tests (write a check) or
*equivalent*: it behaves like the solution on every input the docstring allows. Equivalent
mutants are listed, with the reason, in tests/tools/bug_zoo/equivalent_mutants.md; the score of an
exercise is killed / (mutants - equivalent).

The mutants run in worker processes (``--jobs``, default 2); each mutant loads through the
grader's seam (memlab.course.grading.loader) from a folder of its own, so it runs in a learner
process as the grader runs it (memlab.course.grading.sandbox). A mutant that loops is stopped
after ``--timeout`` seconds (counted as killed: the grader's per-test limit takes its points).
``--sample N`` grades N mutants per exercise chosen with ``--seed`` (the CI sample);
``--update-note`` rewrites the score table in the note. Exit code: 0 when every exercise scores
at least ``--target`` (95 %), 1 otherwise, 2 when a solution itself fails its tests.
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import importlib.util
import inspect
import json
import os
import random
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTE = ROOT / "tests" / "tools" / "bug_zoo" / "equivalent_mutants.md"
TESTS = ROOT / "tests" / "exercises"
DEFAULT_TIMEOUT = 60.0

# -- making mutants ---------------------------------------------------------------------------


@dataclass
class Mutant:
    file: str  # the solution's stem, e.g. ch03_token_allocator
    func: str  # the enclosing function's qualified name
    before: str
    after: str
    line: int
    source: str = field(repr=False)
    n: int = 1  # the n-th mutant with this func/before/after

    @property
    def key(self) -> str:
        """Stable across edits elsewhere in the file: what changed, where (not the line number)."""
        return f"{self.func}: {self.before} => {self.after}" + (
            f" (#{self.n})" if self.n > 1 else ""
        )

    @property
    def id(self) -> str:
        return f"{self.file}.{self.key}"


def learner_lines(file: str) -> set[int]:
    """Line numbers of solutions/<file>.py that the learner writes: those differing from the stub
    generated from it, without the flag that says a kernel section is written
    (``*_WRITTEN = True``)."""
    from memlab.course.grading.stubs import course_stub

    sol = (ROOT / "solutions" / f"{file}.py").read_text().splitlines()
    stub = course_stub(file, ROOT)[0].splitlines()
    lines: set[int] = set()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(
        None, stub, sol, autojunk=False
    ).get_opcodes():
        if tag in ("replace", "insert"):
            lines.update(range(j1 + 1, j2 + 1))
    return {n for n in lines if not re.match(r"\s*[A-Z0-9_]+_WRITTEN\s*=", sol[n - 1])}


def _text(node: ast.AST) -> str:
    return " ".join(ast.unparse(node).split())


_MODULES = {"tl", "torch", "triton", "math", "hashlib", "self", "np"}
_BINOPS = {
    ast.Add: (ast.Sub, ast.Mult),
    ast.Sub: (ast.Add,),
    ast.Mult: (ast.Add, ast.FloorDiv),
    ast.FloorDiv: (ast.Mult, ast.Div, ast.Mod),
    ast.Div: (ast.Mult, ast.FloorDiv),
    ast.Mod: (ast.FloorDiv,),
    ast.BitAnd: (ast.BitOr,),
    ast.BitOr: (ast.BitAnd,),
}
_CMPOPS = {
    ast.Lt: (ast.LtE, ast.GtE),
    ast.LtE: (ast.Lt, ast.Gt),
    ast.Gt: (ast.GtE, ast.LtE),
    ast.GtE: (ast.Gt, ast.Lt),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}
_FUNC_SWAPS = {
    "min": "max",
    "max": "min",
    "any": "all",
    "all": "any",
    "minimum": "maximum",
    "maximum": "minimum",
}


def _expr_variants(node: ast.AST, names: set[str]) -> list[ast.AST]:
    """Replacements for one expression node (copies; the node itself is never changed)."""
    c = lambda: copy.deepcopy(node)  # noqa: E731
    out: list[ast.AST] = []
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        for op in _BINOPS[type(node.op)]:
            n = c()
            n.op = op()
            out.append(n)
        out += [copy.deepcopy(node.left), copy.deepcopy(node.right)]
    elif isinstance(node, ast.UnaryOp) and isinstance(
        node.op, (ast.USub, ast.Not, ast.Invert)
    ):
        out.append(copy.deepcopy(node.operand))
    elif (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and type(node.ops[0]) in _CMPOPS
    ):
        for op in _CMPOPS[type(node.ops[0])]:
            n = c()
            n.ops = [op()]
            out.append(n)
        right = node.comparators[0]
        if (
            isinstance(right, ast.Constant)
            and right.value is None
            and isinstance(node.ops[0], (ast.Is, ast.IsNot))
        ):
            # truthiness for a None test: `x is not None` -> `x`, `x is None` -> `not x`
            left = copy.deepcopy(node.left)
            out.append(
                left
                if isinstance(node.ops[0], ast.IsNot)
                else ast.UnaryOp(ast.Not(), left)
            )
    elif isinstance(node, ast.BoolOp):
        n = c()
        n.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        out.append(n)
        out += [copy.deepcopy(v) for v in node.values]
    elif isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool):
            out.append(ast.Constant(not v))
        elif isinstance(v, int):
            out += [ast.Constant(v + 1)] + ([ast.Constant(v - 1)] if v > 0 else [])
        elif isinstance(v, float):
            out.append(ast.Constant(v + 1.0))
    elif isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name) and f.id in _FUNC_SWAPS:
            n = c()
            n.func.id = _FUNC_SWAPS[f.id]
            out.append(n)
        if isinstance(f, ast.Attribute) and f.attr in _FUNC_SWAPS:
            n = c()
            n.func.attr = _FUNC_SWAPS[f.attr]
            out.append(n)
        if (
            len(node.args) == 1
            and not node.keywords
            and not isinstance(node.args[0], ast.Starred)
        ):
            out.append(copy.deepcopy(node.args[0]))  # f(x) -> x
        if isinstance(f, ast.Name) and f.id == "range" and node.args:
            # range(a, b) -> range(a, b + 1), range(a, b - 1)
            for op in (ast.Add, ast.Sub):
                n = c()
                i = 1 if len(n.args) > 1 else 0
                n.args[i] = ast.BinOp(n.args[i], op(), ast.Constant(1))
                out.append(n)
        if isinstance(f, ast.Attribute) and not (
            isinstance(f.value, ast.Name) and f.value.id in _MODULES
        ):
            out.append(copy.deepcopy(f.value))  # x.clone() -> x, x.to(torch.int64) -> x
        for i in range(len(node.keywords)):
            n = c()
            del n.keywords[i]
            out.append(n)
    elif isinstance(node, ast.Name) and len(node.id) >= 3:
        for other in sorted(names):
            if (
                other != node.id
                and len(other) == len(node.id)
                and sum(a != b for a, b in zip(other, node.id)) == 1
            ):
                out.append(ast.Name(other, ast.Load()))
    elif isinstance(node, ast.Subscript):
        out.append(copy.deepcopy(node.value))  # x[i] -> x
        s = node.slice
        if (
            isinstance(s, ast.Slice)
            and s.step is None
            and (s.lower is None) != (s.upper is None)
        ):
            n = c()
            n.slice.lower, n.slice.upper = s.upper, s.lower  # x[:n] <-> x[n:]
            out.append(n)
        if isinstance(s, ast.Slice):
            # x[:n] -> x[:n + 1], x[:n - 1] (constants are mutated anyway)
            for bound in ("lower", "upper"):
                b = getattr(s, bound)
                if b is not None and not isinstance(b, ast.Constant):
                    for op in (ast.Add, ast.Sub):
                        n = c()
                        setattr(
                            n.slice,
                            bound,
                            ast.BinOp(copy.deepcopy(b), op(), ast.Constant(1)),
                        )
                        out.append(n)
    elif (
        isinstance(node, ast.Tuple)
        and len(node.elts) == 2
        and isinstance(getattr(node, "ctx", None), ast.Load)
    ):
        n = c()
        n.elts.reverse()  # torch.cat((a, b)) -> torch.cat((b, a)): head and tail swapped
        out.append(n)
    elif isinstance(node, ast.IfExp):
        n = c()
        n.body, n.orelse = node.orelse, node.body
        out.append(n)
    return out


def _stmt_variants(node: ast.stmt) -> list[str]:
    """Replacement source for one statement (indentation is kept by the splice)."""
    out = []
    if isinstance(
        node,
        (ast.Assign, ast.AugAssign, ast.Expr, ast.If, ast.For, ast.Raise, ast.While),
    ):
        # not a docstring
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            out.append("pass")
    if isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)):
        n = copy.deepcopy(node)
        n.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
        out.append(ast.unparse(n))
    if isinstance(node, ast.Break):
        out.append("continue")
    if isinstance(node, ast.Continue):
        out.append("break")
    if (
        isinstance(node, ast.Return)
        and node.value is not None
        and not (isinstance(node.value, ast.Constant) and node.value.value is None)
    ):
        out.append("return None")
        if not isinstance(
            node.value, (ast.Constant, ast.Tuple, ast.List, ast.Compare, ast.BoolOp)
        ):
            v = ast.unparse(node.value)
            # a list where a tensor is promised
            out.append(f"return {v if _atom(node.value) else f'({v})'}.tolist()")
    if (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.BinOp)
        and isinstance(node.value.left, (ast.Name, ast.Attribute))
    ):
        # `x = a - b` written as `x = a; x -= b`: the in-place update changes `a` itself (a tensor)
        t, v = node.targets[0].id, node.value
        op = ast.unparse(ast.AugAssign(ast.Name("_"), v.op, ast.Constant(0))).split()[1]
        out.append(f"{t} = {ast.unparse(v.left)}; {t} {op} {ast.unparse(v.right)}")
    return out


def _clip(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _pair(before: str, after: str, width: int = 90) -> tuple[str, str]:
    """Long before/after texts cut to the part that differs, with some context around it."""
    if len(before) <= width and len(after) <= width:
        return before, after
    n = min(len(before), len(after))
    p = next((i for i in range(n) if before[i] != after[i]), n)
    q = next((i for i in range(n - p) if before[-1 - i] != after[-1 - i]), n - p)
    start = max(0, p - 30)

    def cut(t: str) -> str:
        end = len(t) - max(0, q - 12)
        return ("..." if start else "") + t[start:end] + ("..." if end < len(t) else "")

    return cut(before), cut(after)


def _replaced(parent: ast.AST, node: ast.AST, new: ast.AST) -> ast.AST:
    """A copy of ``parent`` with ``node`` (one of its descendants) replaced by ``new``."""
    index = next(i for i, n in enumerate(ast.walk(parent)) if n is node)
    cp = copy.deepcopy(parent)
    target = list(ast.walk(cp))[index]
    for p in ast.walk(cp):
        for name, value in ast.iter_fields(p):
            if value is target:
                setattr(p, name, new)
                return cp
            if isinstance(value, list) and any(v is target for v in value):
                value[[i for i, v in enumerate(value) if v is target][0]] = new
                return cp
    return cp


def _atom(node: ast.AST) -> bool:
    return isinstance(
        node,
        (
            ast.Name,
            ast.Constant,
            ast.Call,
            ast.Attribute,
            ast.Subscript,
            ast.List,
            ast.Tuple,
        ),
    )


def _splice(lines: list[str], node: ast.AST, text: str) -> str:
    """The source with ``node``'s span replaced by ``text``."""
    out = list(lines)
    a, b = node.lineno - 1, node.end_lineno - 1
    head, tail = out[a][: node.col_offset], out[b][node.end_col_offset :]
    out[a : b + 1] = [head + text + tail]
    return "\n".join(out) + "\n"


def make_mutants(file: str) -> list[Mutant]:
    src = (ROOT / "solutions" / f"{file}.py").read_text()
    lines = src.splitlines()
    tree = ast.parse(src)
    mine = learner_lines(file)
    found: list[Mutant] = []

    def inside(node) -> bool:
        return all(n in mine for n in range(node.lineno, node.end_lineno + 1))

    def add(func, node, before, after, source):
        if before == after or source == src:
            return
        try:
            compile(source, file, "exec", flags=ast.PyCF_ONLY_AST)
        except SyntaxError:
            return
        found.append(Mutant(file, func, before, after, node.lineno, source))

    def visit(node, qual: str, names: set[str], skip: bool, parent):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            qual = f"{qual}.{node.name}" if qual else node.name
            if isinstance(node, ast.FunctionDef):
                names = {a.arg for a in node.args.args + node.args.kwonlyargs} | {
                    t.id
                    for n in ast.walk(node)
                    for t in (
                        [n.target]
                        if isinstance(n, (ast.AugAssign, ast.For))
                        else n.targets
                        if isinstance(n, ast.Assign)
                        else []
                    )
                    if isinstance(t, ast.Name)
                }
        skip = skip or isinstance(node, ast.JoinedStr)
        if qual and not skip and hasattr(node, "lineno") and inside(node):
            if isinstance(node, ast.stmt):
                for text in _stmt_variants(node):
                    add(
                        qual, node, _clip(_text(node)), text, _splice(lines, node, text)
                    )
                if isinstance(node, (ast.If, ast.While)) and not isinstance(
                    node.test, (ast.Compare, ast.BoolOp, ast.UnaryOp)
                ):
                    new = f"not ({ast.unparse(node.test)})"  # a truth test turned round
                    add(
                        qual,
                        node.test,
                        _text(node.test),
                        new,
                        _splice(lines, node.test, new),
                    )
            elif isinstance(node, ast.expr) and not isinstance(
                getattr(node, "ctx", None), (ast.Store, ast.Del)
            ):
                for new in _expr_variants(node, names):
                    text = ast.unparse(new)
                    before, after = _text(node), " ".join(text.split())
                    if (
                        isinstance(node, (ast.Constant, ast.Name))
                        and parent is not None
                    ):
                        # "0 => 1" says little
                        before, after = (
                            _text(parent),
                            _text(_replaced(parent, node, new)),
                        )
                    add(
                        qual,
                        node,
                        *_pair(before, after),
                        _splice(lines, node, text if _atom(new) else f"({text})"),
                    )
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            return  # a docstring
        for child in ast.iter_child_nodes(node):
            visit(
                child,
                qual,
                names,
                skip,
                node if isinstance(node, (ast.expr, ast.stmt)) else parent,
            )

    visit(tree, "", set(), False, None)
    seen: dict[str, int] = {}
    for m in found:
        k = f"{m.func}: {m.before} => {m.after}"
        seen[k] = seen.get(k, 0) + 1
        m.n = seen[k]
    return found


# -- the equivalents note -----------------------------------------------------------------------


def read_note(path: Path = NOTE) -> dict[str, str]:
    """mutant id -> why it is equivalent, from the note's '### <file>' sections."""
    out: dict[str, str] = {}
    file = None
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        m = re.match(r"###\s+(\w+)\s*$", line)
        if m:
            file = m.group(1)
            continue
        m = re.match(r"- `(.+?)`: (.+)$", line)
        if m and file:
            out[f"{file}.{m.group(1)}"] = m.group(2)
    return out


# -- grading one mutant (worker side) ----------------------------------------------------------


class MutantTimeout(BaseException):
    pass


def _graded_tests(file: str):
    """(name, function) of the graded tests of one exercise, GPU ones only with a GPU."""
    import torch

    spec = importlib.util.spec_from_file_location(
        f"_mutants_test_{file}", TESTS / f"test_{file}.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = []
    for name, fn in vars(mod).items():
        if not name.startswith("test_") or not callable(fn):
            continue
        marks = {m.name for m in getattr(fn, "pytestmark", [])}
        if "points" not in marks or ("gpu" in marks and not torch.cuda.is_available()):
            continue
        out.append((name, fn))
    return out


def worker() -> None:
    """Read mutants (JSON lines) on stdin; answer one JSON line each on stdout."""
    # the graded tests import memlab_tests.exercises.exercise_refs
    runpy.run_path(str(ROOT / "tests" / "tools" / "loading.py"))["register"]()
    from memlab.common.env import ensure_kernel_mode

    ensure_kernel_mode()
    import torch

    torch.set_num_threads(1)
    from memlab.course.grading import fuzz, loader

    out = sys.stdout
    sys.stdout = sys.stderr  # tests may print; keep the protocol clean
    tests: dict[str, list] = {}
    work = Path(tempfile.mkdtemp(prefix="memlab-mutants-"))

    def on_alarm(signum, frame):
        raise MutantTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    for n, line in enumerate(sys.stdin):
        job = json.loads(line)
        file = job["file"]
        if file not in tests:
            tests[file] = _graded_tests(file)
        folder = work / f"m{n}"
        folder.mkdir()
        (folder / f"{file}.py").write_text(job["source"])
        os.environ[loader.ENV] = str(folder)
        order = job.get("order") or [name for name, _ in tests[file]]
        by_name = dict(tests[file])
        result = {
            "key": job["key"],
            "outcome": "survived",
            "by": "",
            "detail": "",
            "times": {},
        }
        signal.setitimer(signal.ITIMER_REAL, job["timeout"])
        try:
            for name in order:
                t0 = time.perf_counter()
                fn = by_name[name]
                # the graded tests' own random stream, as their conftest gives it
                takes = inspect.signature(fn).parameters
                kwargs = (
                    {"rng": fuzz.rng(f"test_{file}::{name}")} if "rng" in takes else {}
                )
                try:
                    fn(**kwargs)
                except MutantTimeout:
                    raise
                except BaseException as exc:
                    if type(exc).__name__ == "Skipped":
                        continue
                    result.update(
                        outcome="killed",
                        by=name,
                        detail=f"{type(exc).__name__}: {str(exc)[:300]}",
                    )
                    if job.get("trace"):
                        result["detail"] += "\n" + traceback.format_exc()[-3000:]
                    break
                finally:
                    result["times"][name] = time.perf_counter() - t0
        except MutantTimeout:
            result.update(
                outcome="killed",
                by="timeout",
                detail=f"still running after {job['timeout']:g} s",
            )
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        # A CUDA fault (an illegal address) poisons this process's context: every later mutant
        # would fail for it. Ask for a fresh worker.
        result["restart"] = (
            "CUDA error" in result["detail"]
            or "illegal memory access" in result["detail"]
        )
        out.write(json.dumps(result) + "\n")
        out.flush()


# -- the parent -------------------------------------------------------------------------------


SEED = ["0"]  # the graded tests' seed every worker gets (main sets it from --seed)


class Worker:
    def __init__(self):
        # memlab is installed (editable) in this environment; the repository root stays off
        # the path, where its kernels/ would hide an installed `kernels`.
        env = dict(
            os.environ,
            PYTHONDONTWRITEBYTECODE="1",
            MPLBACKEND="Agg",
            OMP_NUM_THREADS="1",
            MEMLAB_GRADE_SEED=SEED[0],
        )
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        self.job = None
        self.started = 0.0

    def send(self, job: dict) -> None:
        self.job, self.started = job, time.monotonic()
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def run_jobs(jobs: list[dict], n_workers: int, progress=None) -> dict[str, dict]:
    """Grade every job; a worker that dies or hangs is replaced and its mutant counted as killed."""
    import selectors

    todo = list(jobs)
    results: dict[str, dict] = {}
    workers: list[Worker] = []
    sel = selectors.DefaultSelector()

    def start() -> Worker:
        w = Worker()
        workers.append(w)
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        return w

    def retire(w: Worker, outcome: dict) -> None:
        sel.unregister(w.proc.stdout)
        w.kill()
        workers.remove(w)
        results[w.job["key"]] = outcome
        if progress:
            progress(w.job, outcome)
        if todo:
            start().send(todo.pop(0))

    for _ in range(min(n_workers, len(todo))):
        start().send(todo.pop(0))
    try:
        while workers:
            for key, _ in sel.select(timeout=0.5):
                w = key.data
                line = w.proc.stdout.readline()
                # the worker died: a crash in the mutant (a segfault, os._exit)
                if not line:
                    rc = w.proc.wait()
                    retire(
                        w,
                        {
                            "key": w.job["key"],
                            "outcome": "killed",
                            "by": "crash",
                            "detail": f"the process died (exit code {rc})",
                            "times": {},
                        },
                    )
                    continue
                outcome = json.loads(line)
                if outcome.get("restart"):
                    retire(w, outcome)
                    continue
                results[outcome["key"]] = outcome
                if progress:
                    progress(w.job, outcome)
                if todo:
                    w.send(todo.pop(0))
                else:
                    sel.unregister(w.proc.stdout)
                    w.proc.stdin.close()
                    w.proc.wait()
                    workers.remove(w)
            now = time.monotonic()
            for w in list(workers):
                if w.job is not None and now - w.started > w.job["timeout"] + 10:
                    retire(
                        w,
                        {
                            "key": w.job["key"],
                            "outcome": "killed",
                            "by": "timeout",
                            "detail": "ignored the alarm; the worker was killed",
                            "times": {},
                        },
                    )
    finally:
        for w in list(workers):
            w.kill()
    return results


@dataclass
class Score:
    file: str
    total: int = 0
    killed: int = 0
    equivalent: int = 0
    survivors: list = field(default_factory=list)

    @property
    def non_equivalent(self) -> int:
        return self.total - self.equivalent

    @property
    def ratio(self) -> float:
        return self.killed / self.non_equivalent if self.non_equivalent else 1.0


def baseline(files: list[str], n_workers: int, timeout: float) -> dict[str, list[str]]:
    """Run each solution once: it must pass; its test order is cheapest first."""
    jobs = [
        {
            "key": f,
            "file": f,
            "source": (ROOT / "solutions" / f"{f}.py").read_text(),
            "timeout": timeout * 4,
            "trace": True,
        }
        for f in files
    ]
    res = run_jobs(jobs, n_workers)
    order = {}
    for f in files:
        r = res[f]
        if r["outcome"] != "survived":
            print(
                f"solutions/{f}.py fails its own graded tests ({r['by']}): {r['detail']}",
                file=sys.stderr,
            )
            raise SystemExit(2)
        order[f] = sorted(r["times"], key=r["times"].get)
    return order


def score_table(scores: list[Score]) -> str:
    rows = [
        "| exercise file | mutants | equivalent | killed / non-equivalent | score |",
        "|---|---:|---:|---:|---:|",
    ]
    for s in scores:
        rows.append(
            f"| {s.file} | {s.total} | {s.equivalent} | {s.killed} / {s.non_equivalent} | "
            f"{100 * s.ratio:.1f} % |"
        )
    t = Score(
        "all",
        sum(s.total for s in scores),
        sum(s.killed for s in scores),
        sum(s.equivalent for s in scores),
    )
    rows.append(
        f"| **all** | {t.total} | {t.equivalent} | {t.killed} / {t.non_equivalent} | "
        f"{100 * t.ratio:.1f} % |"
    )
    return "\n".join(rows)


def noted_scores() -> dict[str, Score]:
    """The rows of the note's score table, by exercise file."""
    block = (
        NOTE.read_text().split("<!-- score:begin -->")[1].split("<!-- score:end -->")[0]
    )
    out = {}
    for m in re.finditer(
        r"^\| (ch\w+) \| (\d+) \| (\d+) \| (\d+) / \d+ \|", block, re.M
    ):
        file, total, equivalent, killed = m.groups()
        out[file] = Score(file, int(total), int(killed), int(equivalent))
    return out


def update_note(scores: list[Score], seconds: float, jobs: int) -> None:
    """Write the score table into the note: this run's rows, and the note's own rows of the
    exercises it did not grade (a run of a few exercises keeps the others' scores)."""
    from memlab.course.grading import catalog

    merged = {**noted_scores(), **{s.file: s for s in scores}}
    rows = [merged[e.file] for e in catalog.EXERCISES if e.file in merged]
    again = (
        ""
        if len(scores) == len(rows)
        else f"; {', '.join(s.file for s in scores)} graded again"
    )
    text = NOTE.read_text()
    block = (
        f"<!-- score:begin -->\nMeasured with `./course mutants --jobs {jobs}` on "
        f"{time.strftime('%Y-%m-%d')} "
        f"({seconds / 60:.1f} min{again}):\n\n{score_table(rows)}\n<!-- score:end -->"
    )
    text = re.sub(
        r"<!-- score:begin -->.*<!-- score:end -->",
        lambda _: block,
        text,
        flags=re.DOTALL,
    )
    NOTE.write_text(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    p.add_argument(
        "exercises",
        nargs="*",
        help="exercise files or ids (ch03_token_allocator, ch03.token_allocator, "
        "or a chapter like 03); default: all",
    )
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds per mutant (default %(default)s)",
    )
    p.add_argument(
        "--sample", type=int, default=0, help="grade only N random mutants per exercise"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--target",
        type=float,
        default=95.0,
        help="score every exercise must reach, in %% (default 95)",
    )
    p.add_argument("--list", action="store_true", help="list the mutants and stop")
    p.add_argument(
        "--show-killed",
        action="store_true",
        help="also list killed mutants and what killed them",
    )
    p.add_argument(
        "--update-note", action="store_true", help="write the score table into the note"
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker()
        return 0
    from memlab.course.grading import catalog

    files = []
    for x in a.exercises or [e.file for e in catalog.EXERCISES]:
        hit = [
            e.file
            for e in catalog.EXERCISES
            if x in (e.file, e.id) or x.lstrip("ch") == f"{e.chapter:02d}"
        ]
        if not hit:
            p.error(f"unknown exercise {x!r}")
        files += [f for f in hit if f not in files]
    equivalent = read_note()
    all_mutants = {f: make_mutants(f) for f in files}
    if a.list:
        for ms in all_mutants.values():
            for m in ms:
                print(
                    f"{'EQ ' if m.id in equivalent else '   '}{m.id}  (line {m.line})"
                )
        return 0
    # One seed for the graded tests' random cases in every worker: a score measured again
    # with the same --seed grades the same cases.
    SEED[0] = os.environ.get("MEMLAB_GRADE_SEED", str(a.seed))
    rng = random.Random(a.seed)
    chosen = {
        f: (rng.sample(ms, min(a.sample, len(ms))) if a.sample else ms)
        for f, ms in all_mutants.items()
    }
    t0 = time.monotonic()
    order = baseline(files, a.jobs, a.timeout)
    by_key = {m.id: m for ms in chosen.values() for m in ms}
    jobs = [
        {
            "key": m.id,
            "file": m.file,
            "source": m.source,
            "timeout": a.timeout,
            "order": order[m.file],
        }
        for m in by_key.values()
        if m.id not in equivalent
    ]
    done = [0]

    def progress(job, outcome):
        done[0] += 1
        if outcome["outcome"] == "survived":
            print(f"  SURVIVED {job['key']}", flush=True)
        elif a.show_killed:
            print(
                f"  killed   {job['key']}  by {outcome['by']}: {outcome['detail'][:120]}",
                flush=True,
            )
        elif sys.stdout.isatty():
            print(f"  {done[0]}/{len(jobs)}", end="\r", flush=True)

    print(
        f"{len(by_key)} mutants in {len(files)} exercise files, {len(by_key) - len(jobs)} listed "
        "as equivalent; "
        f"grading the rest with {a.jobs} workers",
        flush=True,
    )
    results = run_jobs(jobs, a.jobs, progress)
    seconds = time.monotonic() - t0
    scores = []
    for f in files:
        s = Score(f)
        for m in chosen[f]:
            s.total += 1
            if m.id in equivalent:
                s.equivalent += 1
            elif results[m.id]["outcome"] == "killed":
                s.killed += 1
            else:
                s.survivors.append(m)
        scores.append(s)
    table = score_table(scores)
    print("\n" + table)
    print(f"\n{seconds:.0f} s")
    stale = [
        k
        for k in equivalent
        if k.split(".", 1)[0] in files
        and not a.sample
        and k not in {m.id for ms in all_mutants.values() for m in ms}
    ]
    for k in stale:
        print(f"note lists a mutant that no longer exists: {k}")
    for s in scores:
        for m in s.survivors:
            print(f"survivor: {m.id}  (line {m.line})")
    if a.update_note and not a.sample:
        update_note(scores, seconds, a.jobs)
    return 0 if all(100 * s.ratio >= a.target for s in scores) and not stale else 1


if __name__ == "__main__":
    sys.exit(main())
