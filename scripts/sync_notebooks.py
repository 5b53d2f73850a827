"""Keep chapters/NN_name.ipynb and chapters/py/NN_name.py (jupytext percent) in step.

    python scripts/sync_notebooks.py           rebuild every notebook from its .py twin
    python scripts/sync_notebooks.py --check   exit 1 if any pair disagrees or a notebook has
                                               outputs
    python scripts/sync_notebooks.py --from-ipynb NAME.ipynb   rewrite one twin from its notebook

The .py twin is the source reviewers read and authors edit; notebooks are stored without outputs
or execution counts, with metadata that asks Colab for a GPU runtime. Edited a notebook in
JupyterLab instead? ``--from-ipynb NAME.ipynb`` writes its cells back to the twin.

Two things the notebook has that its twin only names:
- pictures: a twin shows ``![alt](img/NAME.png)`` (a file of chapters/img/, the one source); the
  notebook carries that file inline, ``![alt](data:image/png;base64,...)``, so it shows with no
  network and no published home in JupyterLab, in Colab opened from its badge and on GitHub
  (Colab shows neither cell attachments nor relative paths; GitHub's viewer and JupyterLab show
  a data address like any other picture);
- the first code cell (the setup) is collapsed: JupyterLab's ``jupyter.source_hidden`` and Colab's
  form view (``cellView: form``, with the cell's ``#@title`` line).
"""

from __future__ import annotations

import argparse
import base64
import re
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
IMAGES = CHAPTERS / "img"
# ![alt](img/NAME.png) in a twin
PICTURE = re.compile(r"(!\[[^\]]*\]\()img/([\w.-]+\.png)(\))")
# the same, in a notebook
INLINE = re.compile(r"(!\[[^\]]*\]\()data:image/png;base64,([A-Za-z0-9+/=]+)(\))")
# the first code cell, collapsed
SETUP_META = {"jupyter": {"source_hidden": True}, "cellView": "form"}
# No jupytext pairing metadata (and no jupytext.toml): with pairing, JupyterLab's jupytext
# extension refuses to open a notebook whose file is newer than its twin, which a fresh git
# checkout can produce. The twins are kept in step by this script and checked in CI.


def twins() -> list[Path]:
    return sorted(TWINS.glob("[0-9][0-9]_*.py"))


def notebook_of(twin: Path) -> Path:
    return CHAPTERS / (twin.stem + ".ipynb")


def _cell_key(cell) -> tuple:
    meta = cell.get("metadata", {})
    return (
        cell["cell_type"],
        cell["source"].strip(),
        tuple(meta.get("tags", [])),
        meta.get("jupyter", {}).get("source_hidden", False),
        meta.get("cellView"),
    )


def inline_pictures(source: str, where: str = "") -> str:
    """A twin's markdown with every ``![alt](img/NAME.png)`` carrying the file itself."""

    def embed(m):
        png = IMAGES / m.group(2)
        if not png.is_file():
            raise FileNotFoundError(
                f"{where}shows img/{m.group(2)}, which chapters/img/ does not have "
                "(python -m memlab.course.viz.render_static)"
            )
        return (
            m.group(1)
            + "data:image/png;base64,"
            + base64.b64encode(png.read_bytes()).decode()
            + m.group(3)
        )

    return PICTURE.sub(embed, source)


def named_pictures(source: str, where: str = "") -> str:
    """The reverse, for --from-ipynb: each inline picture back to the chapters/img/ file it
    equals."""
    files = {p.read_bytes(): p.name for p in IMAGES.glob("*.png")}

    def name(m):
        data = base64.b64decode(m.group(2))
        if data not in files:
            raise ValueError(
                f"{where}has a picture that is no file of chapters/img/: save it there (or draw it "
                "with memlab.course.viz.render_static) and show it as ![alt](img/NAME.png)"
            )
        return m.group(1) + "img/" + files[data] + m.group(3)

    return INLINE.sub(name, source)


def build(twin: Path):
    """The notebook a twin stands for: its cells, no outputs, fixed metadata."""
    nb = jupytext.read(twin, fmt="py:percent")
    cells = []
    for i, c in enumerate(nb.cells):
        meta = {"tags": c.metadata["tags"]} if c.metadata.get("tags") else {}
        if c.cell_type == "code":
            if not any(x.cell_type == "code" for x in cells):
                meta.update(SETUP_META)
            cells.append(nbformat.v4.new_code_cell(c.source, metadata=meta))
        else:
            source = inline_pictures(c.source, f"py/{twin.name} cell {i} ")
            cells.append(nbformat.v4.new_markdown_cell(source, metadata=meta))
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
            found.append(
                f"py/{t.name} has no notebook {nb_path.name} (run scripts/sync_notebooks.py)"
            )
            continue
        nb = nbformat.read(nb_path, as_version=4)
        for i, c in enumerate(nb.cells):
            if c.cell_type == "code" and (
                c.get("outputs") or c.get("execution_count") is not None
            ):
                found.append(
                    f"{nb_path.name} cell {i} is stored with outputs or an execution count"
                )
        want = [_cell_key(c) for c in build(t).cells]
        got = [_cell_key(c) for c in nb.cells]
        if want != got:
            i = next(
                (k for k, (a, b) in enumerate(zip(want, got)) if a != b),
                min(len(want), len(got)),
            )
            found.append(
                f"{nb_path.name} and py/{t.name} disagree from cell {i} on "
                f"({len(got)} cells vs {len(want)}): run scripts/sync_notebooks.py"
            )
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
        for i, c in enumerate(nb.cells):
            c.metadata = {"tags": c.metadata["tags"]} if c.metadata.get("tags") else {}
            c.pop("attachments", None)
            if c.cell_type == "markdown":
                c.source = named_pictures(c.source, f"{nb_path.name} cell {i} ")
        jupytext.write(nb, TWINS / (nb_path.stem + ".py"), fmt="py:percent")
        print(f"wrote py/{nb_path.stem}.py")
    for t in twins():
        nbformat.write(build(t), notebook_of(t))
    print(f"wrote {len(twins())} notebooks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
