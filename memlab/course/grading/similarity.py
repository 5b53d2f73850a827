"""Copies flagged for the instructor: how much of a submitted exercise file is memlab's own code
or a solution, pasted as is or lightly renamed.

A file's fingerprints are taken as MOSS takes them (winnowing): its tokens with every name,
number and string replaced by its kind (so renaming changes nothing), the hash of each run of
``K`` tokens, and the smallest hash of each window of ``W`` runs. A submission's fingerprints that
its stub has too (the given code every answer keeps) are set aside; the share of the rest found
in one reference file (a solution, a module of memlab) is the file's similarity to it.

The Gradescope bundle carries the solutions' fingerprints, never their text
(``python -m memlab.course.grading.similarity FILE...`` prints a file's report locally).
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import io
import keyword
import sys
import tokenize
from pathlib import Path

K, W = 10, 4  # tokens per run, runs per window
MIN_OWN = 25  # fewer fingerprints of its own than this: too little code to judge
FLAG = 0.5  # share found in one reference: listed for the instructor
HOLD = 0.85  # share of a solution that holds a file's points for the instructor
# a module of memlab: this much, and this much above the solution
FLAG_HOLD, MARGIN = (0.6, 0.2)
KEEP = set(keyword.kwlist) | set(dir(builtins)) | {"self", "torch", "tl", "triton"}


def tokens(source: str) -> list[str]:
    """The file's tokens, names (but keywords, builtins and a few modules) as ``V``, once
    ``ast.unparse`` has laid it out (so parentheses, commas and line breaks say nothing)."""
    try:
        source = ast.unparse(ast.parse(source))
    except (SyntaxError, ValueError, RecursionError):
        pass  # the file as it is
    out = []
    skip = {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
    }
    skip |= {tokenize.ENCODING, tokenize.ENDMARKER}
    try:
        for t in tokenize.generate_tokens(io.StringIO(source).readline):
            if t.type in skip:
                continue
            if t.type == tokenize.NAME:
                out.append(t.string if t.string in KEEP else "V")
            elif t.type in (tokenize.NUMBER, tokenize.STRING):
                out.append("N" if t.type == tokenize.NUMBER else "S")
            else:
                out.append(t.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # what was read before the error still counts
    return out


def fingerprints(source: str) -> set[int]:
    toks = tokens(source)
    runs = [" ".join(toks[i : i + K]) for i in range(len(toks) - K + 1)]
    hashes = [
        int.from_bytes(hashlib.blake2b(r.encode(), digest_size=8).digest())
        for r in runs
    ]
    return {min(hashes[i : i + W]) for i in range(max(0, len(hashes) - W + 1))}


def references(root: Path, solutions: Path | None = None) -> dict[str, set[int]]:
    """Fingerprints of memlab's own code (the library, not the course's machinery) and of the
    solutions (when their folder is given), by file."""
    files = [
        p for p in sorted((root / "memlab").rglob("*.py")) if "course" not in p.parts
    ]
    files += sorted((root / "kernels").glob("*.py"))
    files += sorted(solutions.glob("ch*.py")) if solutions else []
    out = {}
    for p in files:
        name = (
            p.relative_to(root) if p.is_relative_to(root) else Path("solutions", p.name)
        )
        out[name.as_posix()] = fingerprints(p.read_text(errors="replace"))
    return out


def compare(
    source: str, stub: str, refs: dict[str, set[int]], solution=frozenset()
) -> dict:
    """{"own": fingerprints of its own, "matches": [(reference, share)] best first, "verdict":
    "held" | "flagged" | ""}. ``solution``: the fingerprints of this exercise's solution: its
    own share in each module of memlab, plus ``MARGIN``, is the bar a copy of that module must
    clear to be held (an honest answer looks as much like the engine as the course's does)."""
    stub_fp = fingerprints(stub)
    own, base = fingerprints(source) - stub_fp, set(solution) - stub_fp

    def share(fp, of):
        return len(of & fp) / len(of) if of else 0.0

    shares = sorted(
        ((n, share(fp, own)) for n, fp in refs.items()), key=lambda m: -m[1]
    )
    bar = {
        n: HOLD if n.startswith("solutions/") else share(fp, base) + MARGIN
        for n, fp in refs.items()
    }
    held = len(own) >= MIN_OWN and any(s >= max(FLAG_HOLD, bar[n]) for n, s in shares)
    top = shares[0][1] if shares else 0.0
    verdict = "held" if held else "flagged" if top >= FLAG else ""
    matches = [(n, round(s, 2)) for n, s in shares[:3] if s >= FLAG / 2]
    return {"own": len(own), "matches": matches, "verdict": verdict}


def describe(file: str, result: dict) -> str:
    """One line for the instructor."""
    found = ", ".join(f"{n} {s:.0%}" for n, s in result["matches"]) or "nothing"
    what = {"held": "HELD (points withheld)", "flagged": "flagged", "": "ok"}[
        result["verdict"]
    ]
    return f"{file}: {what}; {result['own']} fingerprints of its own, found in: {found}"


if __name__ == "__main__":  # python -m memlab.course.grading.similarity FILE...
    from memlab.course.grading import catalog, loader
    from memlab.course.grading.stubs import course_stub

    refs = references(loader.ROOT, loader.ROOT / "solutions")
    for arg in sys.argv[1:]:
        path = Path(arg)
        file = next((e.file for e in catalog.EXERCISES if e.file in path.stem), None)
        stub = (course_stub(file) or ("",))[0] if file else ""
        result = compare(
            path.read_text(), stub, refs, refs.get(f"solutions/{file}.py", ())
        )
        print(describe(path.name, result))
