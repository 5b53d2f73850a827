"""Keep chapters/NN_name.ipynb and chapters/py/NN_name.py (jupytext percent) in step.

    python scripts/sync_notebooks.py           rebuild every notebook from its .py twin
    python scripts/sync_notebooks.py --check   exit 1 if any pair disagrees or a notebook has outputs
    python scripts/sync_notebooks.py --from-ipynb NAME.ipynb   rewrite one twin from its notebook

The .py twin is the source reviewers read and authors edit; notebooks are stored without outputs
or execution counts, with metadata that asks Colab for a GPU runtime. Edited a notebook in
JupyterLab instead? ``--from-ipynb NAME.ipynb`` writes its cells back to the twin.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
TWINS = CHAPTERS / "py"
METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
    "accelerator": "GPU",
    "colab": {"provenance": [], "gpuType": "T4"},
}
# No jupytext pairing metadata (and no jupytext.toml): with pairing, JupyterLab's jupytext
# extension refuses to open a notebook whose file is newer than its twin, which a fresh git
# checkout can produce. The twins are kept in step by this script and checked in CI.


def twins() -> list[Path]:
    return sorted(TWINS.glob("[0-9][0-9]_*.py"))


def notebook_of(twin: Path) -> Path:
    return CHAPTERS / (twin.stem + ".ipynb")


def _cell_key(cell) -> tuple:
    tags = tuple(cell.get("metadata", {}).get("tags", []))
    return cell["cell_type"], cell["source"].strip(), tags


def build(twin: Path):
    """The notebook a twin stands for: its cells, no outputs, fixed metadata."""
    nb = jupytext.read(twin, fmt="py:percent")
    cells = []
    for c in nb.cells:
        meta = {"tags": c.metadata["tags"]} if c.metadata.get("tags") else {}
        if c.cell_type == "code":
            cells.append(nbformat.v4.new_code_cell(c.source, metadata=meta))
        else:
            cells.append(nbformat.v4.new_markdown_cell(c.source, metadata=meta))
    out = nbformat.v4.new_notebook(cells=cells, metadata=dict(METADATA))
    for i, c in enumerate(out.cells):
        c["id"] = f"{twin.stem[:2]}-{i:03d}"  # stable ids: rebuilding changes nothing
    return out


def problems() -> list[str]:
    """Everything that keeps the pairs from agreeing, in words (empty when all is well)."""
    found = []
    ts = twins()
    if not ts:
        found.append(f"no chapter twins in {TWINS.relative_to(ROOT)}")
    names = {t.stem for t in ts}
    for nb_path in sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb")):
        if nb_path.stem not in names:
            found.append(f"{nb_path.name} has no twin py/{nb_path.stem}.py")
    for t in ts:
        nb_path = notebook_of(t)
        if not nb_path.exists():
            found.append(f"py/{t.name} has no notebook {nb_path.name} (run scripts/sync_notebooks.py)")
            continue
        nb = nbformat.read(nb_path, as_version=4)
        for i, c in enumerate(nb.cells):
            if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None):
                found.append(f"{nb_path.name} cell {i} is stored with outputs or an execution count")
        want = [_cell_key(c) for c in build(t).cells]
        got = [_cell_key(c) for c in nb.cells]
        if want != got:
            i = next((k for k, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
            found.append(f"{nb_path.name} and py/{t.name} disagree from cell {i} on "
                         f"({len(got)} cells vs {len(want)}): run scripts/sync_notebooks.py")
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true")
    p.add_argument("--from-ipynb", metavar="NOTEBOOK")
    a = p.parse_args(argv)
    if a.check:
        found = problems()
        for f in found:
            print(f)
        return 1 if found else 0
    if a.from_ipynb:
        nb_path = CHAPTERS / Path(a.from_ipynb).name
        nb = nbformat.read(nb_path, as_version=4)
        nb.metadata = {}  # the twin carries cells only: no header
        nb.metadata["jupytext"] = {"notebook_metadata_filter": "-all"}
        for c in nb.cells:
            c.metadata = {"tags": c.metadata["tags"]} if c.metadata.get("tags") else {}
        jupytext.write(nb, TWINS / (nb_path.stem + ".py"), fmt="py:percent")
        print(f"wrote py/{nb_path.stem}.py")
    for t in twins():
        nbformat.write(build(t), notebook_of(t))
    print(f"wrote {len(twins())} notebooks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
