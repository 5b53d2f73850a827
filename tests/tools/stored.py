"""The repository as git holds it, for the checks of what the course stores.

A learner's checkout is never pristine: JupyterLab saves the chapters they ran with outputs and
an expanded setup cell, they add and delete cells, they write their exercises (committed or
not). Checks of what the repository stores (no outputs, collapsed setup cells, the grade cell
last, twins in step) read the files as committed, through ``stored``; CI, on a fresh clone,
reads the same bytes as the working copy.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@cache
def stored(folder: str, root: Path = ROOT) -> Path:
    """``root/folder`` as committed at HEAD, extracted once per process into a temporary folder
    (returned: the same relative layout, ``stored("chapters") / "00_orientation.ipynb"``). Outside
    a git checkout (a downloaded archive) the working copy is all there is."""
    r = subprocess.run(
        ["git", "archive", "--format=tar", "HEAD", folder],
        cwd=root,
        capture_output=True,
    )
    if r.returncode != 0:
        return root / folder
    dest = Path(tempfile.mkdtemp(prefix="memlab-stored-"))
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
        tar.extractall(dest, filter="tar")
    return dest / folder
