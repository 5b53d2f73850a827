"""How much of each core file is checking rather than algorithm (the readable-core rule).

    python scripts/check_share.py            the table, one row per core file
    python scripts/check_share.py --max 20   exit 1 when a core file is above 20 % checking lines

Code lines: lines that hold a statement's tokens, without blank lines, comments and docstrings.
Checking lines: ``assert`` and ``raise`` statements, ``if`` blocks whose body only raises (with no
``else``), and whole functions named ``_check*``, ``check_*``, ``_validate*``, ``validate_*``,
``_pos_int``, ``_nonneg_int``. Argument checks that live in the boundary module
(``memlab/common/_checks.py``) are not core code and are not counted.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
    "memlab/sglang/radix_cache.py",
    "memlab/sglang/hicache.py",
    "memlab/sglang/unified/pool.py",
    "memlab/sglang/unified/sub_pool.py",
    "memlab/sglang/unified/hybrid_swa.py",
]
CHECK_FUNCS = ("_check", "check_", "_validate", "validate_")
CHECK_NAMES = ("_pos_int", "_nonneg_int")


def _docstring_lines(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.update(range(first.lineno, first.end_lineno + 1))
    return out


def _span(node: ast.AST) -> set[int]:
    return set(range(node.lineno, node.end_lineno + 1))


def measure(source: str) -> tuple[int, int]:
    """(code lines, checking lines) of one file."""
    tree = ast.parse(source)
    code = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                            tokenize.DEDENT, tokenize.ENDMARKER):
            code.update(range(tok.start[0], tok.end[0] + 1))
    code -= _docstring_lines(tree)
    checking = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assert, ast.Raise)):
            checking |= _span(node)
        elif isinstance(node, ast.If) and not node.orelse and all(isinstance(s, ast.Raise) for s in node.body):
            checking |= _span(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.name.startswith(CHECK_FUNCS) or node.name in CHECK_NAMES):
            checking |= _span(node)
    return len(code), len(checking & code)


def table(files=CORE) -> list[tuple[str, int, int, float]]:
    rows = []
    for rel in files:
        path = ROOT / rel
        if path.exists():
            code, checks = measure(path.read_text())
            rows.append((rel, code, checks, 100.0 * checks / max(code, 1)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=float, default=None, help="fail when a core file is above this percentage")
    args = ap.parse_args(argv)
    rows = table()
    print(f"{'file':36} {'code':>5} {'checks':>6} {'share':>6}")
    for rel, code, checks, share in rows:
        print(f"{rel:36} {code:5d} {checks:6d} {share:5.1f}%")
    over = [r for r in rows if args.max is not None and r[3] > args.max]
    for rel, *_, share in over:
        print(f"over {args.max:g} %: {rel} ({share:.1f} %)", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
