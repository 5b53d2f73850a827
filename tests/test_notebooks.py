"""The chapters: every notebook runs top to bottom headless (fast mode, working folder chapters/),
and the stored notebooks are clean: no outputs, in step with their jupytext twins, no absolute
paths, a Colab-ready first cell, links to their exercises, and a last cell that runs the grader."""

import json
import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import sync_notebooks  # noqa: E402
from run_notebooks import CHAPTERS, chapter_notebooks, execute  # noqa: E402

from memlab.grading import catalog  # noqa: E402

NOTEBOOKS = chapter_notebooks()
WIDGET = "application/vnd.jupyter.widget-view+json"


def ids(paths):
    return [p.stem for p in paths]


def load(path):
    return nbformat.read(path, as_version=4)


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def markdown(nb):
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def chapter_no(path) -> int:
    return int(path.name[:2])


# -- every chapter runs ---------------------------------------------------------------------------


def outputs_text(cell):
    parts = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            parts.append(o.text)
        elif o.output_type == "error":
            parts.append(f"{o.ename}: {o.evalue}")
        else:
            parts.append(json.dumps(o.get("data", {}).get("text/plain", "")))
    return "".join(parts)


def check_executed(nb, name):
    """Errors only where a cell is tagged raises-exception; widgets drawn; the grader's table printed."""
    for i, c in enumerate(code_cells(nb)):
        errors = [o for o in c.outputs if o.output_type == "error"]
        if errors and "raises-exception" not in c.metadata.get("tags", []):
            raise AssertionError(f"{name} code cell {i} raised {errors[0].ename}: {errors[0].evalue}")
    kinds = {k for c in code_cells(nb) for o in c.outputs for k in o.get("data", {})}
    assert WIDGET in kinds, f"{name} shows no widget"
    last = outputs_text(code_cells(nb)[-1])
    assert "total (CPU)" in last, f"{name}: the grader cell printed no score table:\n{last[-1500:]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_chapter_runs_top_to_bottom(path):
    nb, seconds = execute(path, fast=True, timeout=240)
    check_executed(nb, path.name)
    print(f"{path.name}: {seconds:.1f} s")


def test_execution_check_catches_an_unexpected_error():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0")])
    nb.cells[0].outputs = [nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="division by zero",
                                                  traceback=[])]
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        check_executed(nb, "bad.ipynb")
    nb.cells[0].metadata["tags"] = ["raises-exception"]  # an exercise stub may raise ...
    with pytest.raises(AssertionError, match="no widget"):  # ... but the chapter must still draw
        check_executed(nb, "bad.ipynb")


# -- the set of chapters --------------------------------------------------------------------------


def test_every_chapter_of_the_map_is_there():
    assert [p.name[:2] for p in NOTEBOOKS] == [f"{i:02d}" for i in range(11)], [p.name for p in NOTEBOOKS]


def test_readme_links_every_chapter_to_colab():
    text = (CHAPTERS / "README.md").read_text()
    for p in NOTEBOOKS:
        url = f"https://colab.research.google.com/github/memlab-course/memlab/blob/main/chapters/{p.name}"
        assert url in text, f"chapters/README.md has no Colab link for {p.name}"


# -- hygiene --------------------------------------------------------------------------------------


def test_notebooks_and_twins_agree_and_have_no_outputs():
    assert sync_notebooks.problems() == []


def test_pairing_check_catches_drift_and_outputs(tmp_path, monkeypatch):
    twin = sync_notebooks.twins()[0]
    (tmp_path / "py").mkdir()
    (tmp_path / "py" / twin.name).write_text(twin.read_text())
    nb = sync_notebooks.build(twin)
    nb.cells[-1].outputs = [nbformat.v4.new_output("stream", text="x")]
    nbformat.write(nb, tmp_path / f"{twin.stem}.ipynb")
    monkeypatch.setattr(sync_notebooks, "CHAPTERS", tmp_path)
    monkeypatch.setattr(sync_notebooks, "TWINS", tmp_path / "py")
    assert any("outputs" in p for p in sync_notebooks.problems())
    nb.cells[-1].outputs = []
    nb.cells[1].source += "\nprint('edited in the notebook only')"
    nbformat.write(nb, tmp_path / f"{twin.stem}.ipynb")
    assert any("disagree from cell 1" in p for p in sync_notebooks.problems())


ABSOLUTE = re.compile(r"(?<![\w.])(/(?:work|home|root|tmp|Users|usr|opt|content)/|[A-Za-z]:\\\\|file://)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_no_absolute_paths(path):
    for i, c in enumerate(load(path).cells):
        m = ABSOLUTE.search(c.source)
        assert m is None, f"{path.name} cell {i} has an absolute path: {m.group(0)!r}"


def test_absolute_path_check_catches_one():
    assert ABSOLUTE.search("open('/work/main/chapters/img/x.png')")
    assert ABSOLUTE.search("C:\\\\Users\\\\me")
    assert not ABSOLUTE.search("![x](img/00_mappings.png) and chapters/py/")


def setup_cell(nn: str) -> str:
    twin = (CHAPTERS / "py").glob("00_*.py")
    first = code_cells(sync_notebooks.build(next(twin)))[0].source
    return first.replace('start("00")', f'start("{nn}")')


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_first_cells_set_up_colab_and_local_alike(path):
    nb = load(path)
    nn = path.name[:2]
    assert nb.cells[0].cell_type == "markdown" and "After this chapter you can" in nb.cells[0].source
    assert f"colab.research.google.com/github/memlab-course/memlab/blob/main/chapters/{path.name}" in nb.cells[0].source
    first = code_cells(nb)[0].source
    assert first == setup_cell(nn), f"{path.name}: the setup cell differs from chapter 00's"
    for needed in ("pyproject.toml", "git", "clone", "sys.path.insert"):
        assert needed in first
    assert "pip install" not in first, "the setup cell must not reinstall anything"
    assert nb.metadata.get("accelerator") == "GPU" and nb.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_chapter_links_its_exercises_and_ends_with_its_grader(path):
    nb = load(path)
    n = chapter_no(path)
    text = markdown(nb)
    for e in catalog.for_chapter(n):
        assert f"exercises/{e.file}.py" in text, f"{path.name} does not point to exercises/{e.file}.py"
        tried = [c for c in code_cells(nb) if f'exercise("{e.file}")' in c.source]
        assert tried, f"{path.name} has no cell that runs exercise {e.file} on the chapter's state"
    last = code_cells(nb)[-1].source
    want = 'grade(["--quiet"])' if n == 0 else f'grade(["{n:02d}"])'
    assert "from memlab.grade import main as grade" in last and want in last, f"{path.name} last cell: {last!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_only_exercise_cells_may_raise(path):
    for c in code_cells(load(path)):
        if "raises-exception" in c.metadata.get("tags", []):
            assert "viz.notebook.exercise(" in c.source, \
                f"{path.name}: a tagged cell that runs no exercise:\n{c.source}"


def test_sections_named_by_the_exercises_exist():
    # The stubs say "See chapter NN (section; other section)": each must be a heading there.
    refs = re.compile(r"see chapter (\d\d) \(([^)]+)\)", re.IGNORECASE)
    found = 0
    for stub in sorted((ROOT / "exercises").glob("ch*.py")):
        text = " ".join(stub.read_text().split())
        for nn, names in refs.findall(text):
            (path,) = [p for p in NOTEBOOKS if p.name.startswith(nn)] or [None]
            assert path is not None, f"{stub.name} points to chapter {nn}, which does not exist"
            headings = {line.lstrip("#").strip().replace("`", "").lower()
                        for line in markdown(load(path)).splitlines() if line.startswith("#")}
            for name in names.split(";"):
                found += 1
                assert name.strip().lower() in headings, \
                    f"{stub.name} points to section {name.strip()!r} of {path.name}, which has no such heading"
    assert found, "no stub points to a chapter section any more: update this test"


def test_static_pictures_exist_and_are_shown():
    from memlab.viz.render_static import PICTURES

    shown = {}
    for p in NOTEBOOKS:
        for img in re.findall(r"\]\((img/[^)]+)\)", markdown(load(p))):
            assert (CHAPTERS / img).is_file(), \
                f"{p.name} shows {img}, which is missing (python -m memlab.viz.render_static)"
            shown[img] = p
    for name in PICTURES:
        img = f"img/{name}.png"
        assert img in shown, f"{img} is rendered but no chapter shows it"
        assert shown[img].name[:2] == name[:2], f"{img} is shown by {shown[img].name}"
    assert all(p.name[:2] in {i[4:6] for i in shown} for p in NOTEBOOKS), "every chapter shows a static picture"


def test_points_quoted_in_the_text_match_the_catalog():
    # "exercises/x.py ... (N points" or "(N points, +G on a GPU)" in the same markdown cell
    quote = re.compile(r"exercises/(ch\d\d_\w+)\.py.*?\((\d+) points(?:, \+(\d+) on a GPU)?", re.DOTALL)
    seen = 0
    for p in NOTEBOOKS:
        for c in load(p).cells:
            if c.cell_type != "markdown":
                continue
            for file, pts, gpu in quote.findall(c.source):
                e = next(x for x in catalog.EXERCISES if x.file == file)
                seen += 1
                assert int(pts) == e.points, f"{p.name} says {file} is worth {pts} points, the catalog {e.points}"
                assert int(gpu or 0) == e.gpu_points, f"{p.name}: {file} GPU points {gpu or 0} vs {e.gpu_points}"
    assert seen >= 10


def test_twin_round_trips_through_the_notebook(tmp_path, monkeypatch):
    # An author who edits a notebook in JupyterLab writes it back with --from-ipynb: nothing may drift.
    twin = sync_notebooks.twins()[-1]
    (tmp_path / "py").mkdir()
    (tmp_path / "py" / twin.name).write_text(twin.read_text())
    monkeypatch.setattr(sync_notebooks, "CHAPTERS", tmp_path)
    monkeypatch.setattr(sync_notebooks, "TWINS", tmp_path / "py")
    assert sync_notebooks.main([]) == 0
    assert sync_notebooks.main(["--from-ipynb", f"{twin.stem}.ipynb"]) == 0
    assert (tmp_path / "py" / twin.name).read_text() == twin.read_text()
    assert sync_notebooks.problems() == []
    nb = load(tmp_path / f"{twin.stem}.ipynb")
    assert "jupytext" not in nb.metadata, "no pairing metadata: it makes JupyterLab refuse newer notebooks"
