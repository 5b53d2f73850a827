"""How much of each core file is checking rather than algorithm (the readable-core rule).

    python tests/tools/check_share.py            the table, one row per core file, the
    boundary, the total python tests/tools/check_share.py --max 20   exit 1 when a core file
    or the whole core is above 20 %

Code lines: lines that hold a statement's tokens, without blank lines, comments and docstrings.
Checking lines: ``assert`` and ``raise`` statements, ``if`` blocks whose body only raises (with no
``else``), and whole functions named ``_check*``, ``check_*``, ``_validate*``, ``validate_*``,
``_pos_int``, ``_nonneg_int``.

The boundary module (``memlab/common/_checks.py``) is counted too, all of it checking: a validator
there that only one core file calls (directly, or through other validators) is counted with that
file, as if it lived there; what several files share stays in the boundary's own row. The total
adds the boundary's row to the core files, so no check escapes the count.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOUNDARY = "memlab/common/_checks.py"
# The layers a chapter sends a learner to read; drivers (vllm compare/replay), pictures, the
# grader, the simulator and the engine are not in this list.
CORE = [
    "memlab/sglang/req_to_token.py",
    "memlab/sglang/kv_pool.py",
    "memlab/common/models.py",
    "memlab/sglang/allocator/base.py",
    "memlab/sglang/allocator/token.py",
    "memlab/sglang/allocator/paged.py",
    "memlab/sglang/allocator/reference.py",
    "memlab/sglang/allocation.py",
    "memlab/vllm/block_pool.py",
    "memlab/vllm/hashing.py",
    "memlab/vllm/kv_cache_manager.py",
    "memlab/vllm/block_table.py",
    "memlab/vllm/request.py",
    "memlab/sglang/swa.py",
    "memlab/sglang/mamba.py",
    "memlab/common/sizing.py",
    "memlab/sglang/write_loc.py",
    "memlab/common/attention.py",
    "memlab/sglang/schedule_policy.py",
    "memlab/sglang/radix_cache.py",
    "memlab/sglang/hicache.py",
    "memlab/sglang/unified/pool.py",
    "memlab/sglang/unified/sub_pool.py",
    "memlab/sglang/unified/hybrid_swa.py",
]
CHECK_FUNCS = ("_check", "check_", "_validate", "validate_")
CHECK_NAMES = ("_pos_int", "_nonneg_int")
TARGET = 20.0  # percent, per file and for the whole core


def _docstring_lines(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if (
            isinstance(
                node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            )
            and node.body
        ):
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                out.update(range(first.lineno, first.end_lineno + 1))
    return out


def _span(node: ast.AST) -> set[int]:
    return set(range(node.lineno, node.end_lineno + 1))


def _code_lines(source: str, tree: ast.AST) -> set[int]:
    code = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (
            tokenize.COMMENT,
            tokenize.NL,
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.ENDMARKER,
        ):
            code.update(range(tok.start[0], tok.end[0] + 1))
    return code - _docstring_lines(tree)


def measure(source: str) -> tuple[int, int]:
    """(code lines, checking lines) of one file."""
    tree = ast.parse(source)
    code = _code_lines(source, tree)
    checking = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assert, ast.Raise)):
            checking |= _span(node)
        elif (
            isinstance(node, ast.If)
            and not node.orelse
            and all(isinstance(s, ast.Raise) for s in node.body)
        ):
            checking |= _span(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
            node.name.startswith(CHECK_FUNCS) or node.name in CHECK_NAMES
        ):
            checking |= _span(node)
    return len(code), len(checking & code)


def _boundary_names_used(source: str) -> set[str]:
    """The boundary's names a module uses: ``_checks.x`` and ``from ..._checks import x``."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "_checks"
        ):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").endswith(
            "_checks"
        ):
            names.update(a.name for a in node.names)
    return names


def boundary_split(files=CORE) -> tuple[dict[str, int], int, int]:
    """The boundary's code lines given to the one core file that uses them ({file: lines}), and
    the (code lines, checking lines) of the shared rest, which stays the boundary's own."""
    path = ROOT / BOUNDARY
    if not path.exists():
        return {}, 0, 0
    source = path.read_text()
    tree = ast.parse(source)
    code = _code_lines(source, tree)
    defs = {
        n.name: n
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    calls = {
        name: {
            c.func.id
            for c in ast.walk(d)
            if isinstance(c, ast.Call)
            and isinstance(c.func, ast.Name)
            and c.func.id in defs
        }
        - {name}
        for name, d in defs.items()
    }
    users: dict[str, set[str]] = {name: set() for name in defs}
    for rel in files:
        p = ROOT / rel
        if not p.exists() or rel == BOUNDARY:
            continue
        todo = list(_boundary_names_used(p.read_text()) & defs.keys())
        seen = set()
        while todo:  # the validators this file reaches, through the ones they call
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += calls[name]
        for name in seen:
            users[name].add(rel)
    given, rest = {}, set(code)
    for name, d in defs.items():
        if len(users[name]) == 1:
            lines = _span(d) & code
            (rel,) = users[name]
            given[rel] = given.get(rel, 0) + len(lines)
            rest -= lines
    # Everything in the boundary is checking, imports and constants included: it exists
    # only to check.
    return given, len(rest), len(rest)


def table(files=CORE) -> list[tuple[str, int, int, float]]:
    """One row per core file (its boundary validators counted in it), then the boundary's shared
    rest, then the total."""
    given, b_code, b_checks = boundary_split(files)
    rows = []
    for rel in files:
        path = ROOT / rel
        if path.exists() and rel != BOUNDARY:
            code, checks = measure(path.read_text())
            code, checks = code + given.get(rel, 0), checks + given.get(rel, 0)
            rows.append((rel, code, checks, 100.0 * checks / max(code, 1)))
    rows.append(
        (BOUNDARY + " (shared)", b_code, b_checks, 100.0 * b_checks / max(b_code, 1))
    )
    code, checks = sum(r[1] for r in rows), sum(r[2] for r in rows)
    rows.append(
        ("total (boundary included)", code, checks, 100.0 * checks / max(code, 1))
    )
    return rows


def table_without_boundary(files=CORE) -> list[tuple[str, int, int, float]]:
    """The old count: each core file alone, the boundary left out."""
    rows = []
    for rel in files:
        path = ROOT / rel
        if path.exists():
            code, checks = measure(path.read_text())
            rows.append((rel, code, checks, 100.0 * checks / max(code, 1)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--max",
        type=float,
        default=None,
        help="fail when a core file or the whole core is above this percentage",
    )
    ap.add_argument(
        "--without-boundary",
        action="store_true",
        help="the old count: core files alone, the boundary module left out",
    )
    args = ap.parse_args(argv)
    rows = table_without_boundary() if args.without_boundary else table()
    print(f"{'file':44} {'code':>5} {'checks':>6} {'share':>6}")
    for rel, code, checks, share in rows:
        print(f"{rel:44} {code:5d} {checks:6d} {share:5.1f}%")
    # The boundary's shared row is all checking by construction; the rule bounds the
    # files and the total.
    judged = [r for r in rows if not r[0].startswith(BOUNDARY)]
    over = [r for r in judged if args.max is not None and r[3] > args.max]
    for rel, *_, share in over:
        print(f"over {args.max:g} %: {rel} ({share:.1f} %)", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
