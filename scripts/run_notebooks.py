"""Execute chapter notebooks headless and print each one's run time.

    python scripts/run_notebooks.py [NN ...] [--full] [--jobs N]

Each notebook runs in a fresh kernel with chapters/ as its working folder and
MEMLAB_FAST=1 (small sizes) unless --full. Every cell must run: an exercise cell reports
a stub that is not written yet and the notebook goes on
(tests/chapters/test_notebooks.py runs the chapters the way Colab does: in a fresh
folder that clones the course first).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"


def chapter_notebooks(only=()) -> list[Path]:
    nbs = sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
    return [p for p in nbs if not only or p.name[:2] in only]


def strip_tags(nb) -> None:
    """Drop every cell tag (raises-exception and friends): Colab ignores them, so a run must not
    need them."""
    for c in nb.cells:
        c.metadata.pop("tags", None)


def execute(
    path: Path,
    fast: bool = True,
    timeout: int = 300,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
):
    """Run every cell in order in a fresh kernel started in ``cwd`` (default chapters/) with
    ``env`` added to this process's environment and every cell tag removed; return (executed
    notebook, seconds). Raises on the first cell that raises."""
    nb = nbformat.read(path, as_version=4)
    strip_tags(nb)
    kernel_env = dict(os.environ, MEMLAB_FAST="1" if fast else "0", **(env or {}))
    kernel_env.setdefault("MPLBACKEND", "Agg")
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd or CHAPTERS)}},
    )
    t0 = time.monotonic()
    client.execute(env=kernel_env)
    return nb, time.monotonic() - t0


def _run_one(path: Path, fast: bool, timeout: int):
    try:
        return path, execute(path, fast=fast, timeout=timeout)[1], None
    # report and go on: one broken chapter should not hide the rest
    except Exception as exc:
        return path, 0.0, (str(exc).strip().splitlines() or [type(exc).__name__])[-1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "chapters", nargs="*", help="two-digit chapter numbers (default: all)"
    )
    p.add_argument("--full", action="store_true", help="full sizes (no MEMLAB_FAST)")
    p.add_argument(
        "--jobs", type=int, default=1, help="chapters run at once (default 1)"
    )
    p.add_argument(
        "--timeout", type=int, default=300, help="seconds per cell (default 300)"
    )
    a = p.parse_args(argv)

    total, failed = 0.0, 0
    paths = chapter_notebooks(a.chapters)
    # one process per chapter at a time
    with ProcessPoolExecutor(max(1, a.jobs)) as pool:
        for path, secs, error in pool.map(
            _run_one, paths, [not a.full] * len(paths), [a.timeout] * len(paths)
        ):
            if error:
                failed += 1
                print(f"{path.name:<32} FAILED: {error}", flush=True)
            else:
                print(f"{path.name:<32} {secs:6.1f} s", flush=True)
                total += secs
    print(f"{'total':<32} {total:6.1f} s ({failed} failed)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
