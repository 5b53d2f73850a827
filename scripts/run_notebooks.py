"""Execute chapter notebooks headless, the way CI does, and print each one's run time.

    python scripts/run_notebooks.py [NN ...] [--full]

Each notebook runs in a fresh kernel with chapters/ as its working folder and MEMLAB_FAST=1
(small sizes) unless --full. Cells tagged ``raises-exception`` (exercise stubs) may raise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"


def chapter_notebooks(only=()) -> list[Path]:
    nbs = sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
    return [p for p in nbs if not only or p.name[:2] in only]


def execute(path: Path, fast: bool = True, timeout: int = 300):
    """Run every cell in order; return (executed notebook, seconds). Raises on an unexpected error."""
    nb = nbformat.read(path, as_version=4)
    env_before = os.environ.get("MEMLAB_FAST")
    os.environ["MEMLAB_FAST"] = "1" if fast else "0"
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(CHAPTERS)}})
        t0 = time.monotonic()
        client.execute()
        return nb, time.monotonic() - t0
    finally:
        if env_before is None:
            os.environ.pop("MEMLAB_FAST", None)
        else:
            os.environ["MEMLAB_FAST"] = env_before


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("chapters", nargs="*", help="two-digit chapter numbers (default: all)")
    p.add_argument("--full", action="store_true", help="full sizes (no MEMLAB_FAST)")
    a = p.parse_args(argv)
    total, failed = 0.0, 0
    for path in chapter_notebooks(a.chapters):
        try:
            _, secs = execute(path, fast=not a.full)
            print(f"{path.name:<32} {secs:6.1f} s")
            total += secs
        except Exception as exc:  # report and go on: one broken chapter should not hide the rest
            failed += 1
            print(f"{path.name:<32} FAILED: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    print(f"{'total':<32} {total:6.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
