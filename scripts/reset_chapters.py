"""Write every chapter notebook anew, as the course ships it: ``./course reset-chapters``.

JupyterLab saves a chapter you ran with its outputs, its setup cell expanded and the cells you
added. This moves each notebook that differs from the course's into ``chapters/saved/<time>/``
(nothing is deleted), then writes the course's notebooks from their twins in ``chapters/py``.
Your exercise files are not touched.
"""

from __future__ import annotations

import runpy
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"


def main() -> int:
    sync = runpy.run_path(str(ROOT / "scripts" / "sync_notebooks.py"))
    saved = CHAPTERS / "saved" / time.strftime("%Y-%m-%d_%H%M%S")
    kept = []
    for twin in sync["twins"]():
        path = sync["notebook_of"](twin)
        fresh = sync["nbformat"].writes(sync["build"](twin)) + "\n"  # as nbformat.write
        if path.is_file() and path.read_text() != fresh:
            saved.mkdir(parents=True, exist_ok=True)
            shutil.move(path, saved / path.name)
            kept.append(path.name)
        path.write_text(fresh)
    where = (
        f"; yours are in {saved.relative_to(ROOT)}/: {', '.join(kept)}" if kept else ""
    )
    print(
        f"memlab: {len(sync['twins']())} chapter notebooks as the course ships them{where}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
