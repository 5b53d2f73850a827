"""The chapters: every notebook runs top to bottom the way Colab runs it, and the stored notebooks
are clean: no outputs, in step with their jupytext twins, no absolute paths, one setup cell that
clones the notebook's own version, exercise cells that never stop "Run all", pictures carried inside
the notebook (no network, no relative path), links to their exercises, and a last cell that runs
the grader.

Each chapter executes once in CI, in test_chapter_runs_like_colab: a fresh folder without the
repository (like Colab's /content), a local git repository standing in for GitHub (built from
this working tree and tagged with the home's REF), every cell tag removed, the stubs untouched.
"""

import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from memlab.course import home
from memlab.course.grading import catalog
from memlab_tests.tools.loading import load_file
from memlab_tests.tools.stored import stored

ROOT = Path(__file__).resolve().parents[2]
sync_notebooks = load_file("scripts/sync_notebooks.py")
run_notebooks = load_file("scripts/run_notebooks.py")
execute = run_notebooks.execute
# What the course stores: the chapters as committed, never the working copy a learner's
# JupyterLab saved (with outputs, an expanded setup cell, cells added or deleted).
CHAPTERS = stored("chapters")
NOTEBOOKS = sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
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


def exercise_cells(nb, file):
    return [c for c in code_cells(nb) if f'with exercise("{file}") as ' in c.source]


# -- a stand-in for GitHub ------------------------------------------------------------------------


def git(*args, cwd=None):
    r = subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=dict(
            os.environ,
            GIT_AUTHOR_NAME="t",
            GIT_AUTHOR_EMAIL="t@t",
            GIT_COMMITTER_NAME="t",
            GIT_COMMITTER_EMAIL="t@t",
            GIT_CONFIG_GLOBAL=os.devnull,
        ),
    )
    assert r.returncode == 0, f"git {args}: {r.stderr}"
    return r.stdout


@pytest.fixture(scope="session")
def home_repo(tmp_path_factory):
    """A git repository holding the course as committed (HEAD), tagged REF: what GitHub serves once
    the course is published. Its exercises/ are the course's stubs (memlab.course.grading.stubs),
    whatever a learner has done to this checkout's, committed or not. Returns its folder."""
    import tarfile

    from memlab.course.grading.stubs import write_stubs

    src = tmp_path_factory.mktemp("github") / "memlab"
    src.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    # memlab/kernels stays a link
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(
            src, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {})
        )
    write_stubs(src / "exercises")
    git("init", "-q", cwd=src)
    git("add", "-A", cwd=src)
    git("commit", "-q", "-m", "the course as published", cwd=src)
    git("tag", home.REF, cwd=src)
    return src


# -- every chapter runs like Colab ----------------------------------------------------------------


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
    """No cell raised (tags or not); widgets drawn; every exercise cell said its stub is not
    written yet; the grader's table printed."""
    for i, c in enumerate(code_cells(nb)):
        errors = [o for o in c.outputs if o.output_type == "error"]
        if errors:
            raise AssertionError(
                f"{name} code cell {i} raised {errors[0].ename}: {errors[0].evalue}"
            )
    kinds = {k for c in code_cells(nb) for o in c.outputs for k in o.get("data", {})}
    assert WIDGET in kinds, f"{name} shows no widget"
    for e in catalog.for_chapter(int(name[:2])):
        said = "".join(outputs_text(c) for c in exercise_cells(nb, e.file))
        assert (
            f"not written yet: edit exercises/{e.file}.py (then re-run this cell)"
            in said
        ), (
            f"{name}: the exercise cell of {e.file} did not report its stub:\n{said[-1500:]}"
        )
    last = outputs_text(code_cells(nb)[-1])
    assert "total (CPU)" in last, (
        f"{name}: the grader cell printed no score table:\n{last[-1500:]}"
    )


INLINE_PNG = "data:image/png;base64,"


def picture_paths(nb) -> list[str]:
    """Repository paths of the pictures a notebook carries inline: the chapters/img/ file each
    equals byte for byte (a picture that equals no file there, or is not inline, is left out)."""
    files = {
        p.read_bytes(): f"chapters/img/{p.name}"
        for p in (CHAPTERS / "img").glob("*.png")
    }
    data = [
        base64.b64decode(u[len(INLINE_PNG) :])
        for u in image_refs(markdown(nb))
        if u.startswith(INLINE_PNG)
    ]
    return [files[d] for d in data if d in files]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_chapter_runs_like_colab(path, home_repo, tmp_path):
    content = tmp_path / "content"  # Colab's working folder: no repository around it
    content.mkdir()
    nb, seconds = execute(
        path,
        fast=True,
        timeout=240,
        cwd=content,
        # Colab's kernel has no PYTHONPATH: memlab must come from the clone the cell makes
        env={
            "MEMLAB_REPO_URL": home_repo.as_uri(),
            "MEMLAB_EXERCISES": "",
            "PYTHONPATH": "",
        },
    )
    check_executed(nb, path.name)
    clone = content / home.clone_folder()
    first = outputs_text(code_cells(nb)[0])
    assert f"repository {clone.name}/" in first, (
        f"memlab was not imported from the clone:\n{first}"
    )
    # not Colab: no warning about a recycled runtime
    assert "in this runtime ONLY" not in first
    from memlab.course.grading.stubs import course_stub

    # the clone's stubs are the course's, and the run left them alone
    for e in catalog.EXERCISES:
        assert (clone / "exercises" / f"{e.file}.py").read_text() == course_stub(
            e.file
        )[0], f"{e.file} changed"
    print(f"{path.name}: {seconds:.1f} s")


def test_execution_check_catches_an_unexpected_error():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0")])
    nb.cells[0].outputs = [
        nbformat.v4.new_output(
            "error", ename="ZeroDivisionError", evalue="division by zero", traceback=[]
        )
    ]
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        check_executed(nb, "00_bad.ipynb")
    # a tag excuses nothing: Colab ignores it
    nb.cells[0].metadata["tags"] = ["raises-exception"]
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        check_executed(nb, "00_bad.ipynb")
    nb.cells[0].outputs = []
    with pytest.raises(AssertionError, match="no widget"):
        check_executed(nb, "00_bad.ipynb")


def test_execution_check_wants_every_stub_reported():
    e = catalog.for_chapter(4)[0]
    cell = nbformat.v4.new_code_cell(f'with exercise("{e.file}") as ex:\n    ex.f()')
    widget = nbformat.v4.new_output(
        "display_data", data={WIDGET: {}, "text/plain": "w"}
    )
    cell.outputs = [widget, nbformat.v4.new_output("stream", text="nothing said")]
    nb = nbformat.v4.new_notebook(cells=[cell])
    with pytest.raises(
        AssertionError, match="(?s)did not report its stub.*nothing said"
    ):
        check_executed(nb, "04_x.ipynb")


# -- the set of chapters --------------------------------------------------------------------------


def test_every_chapter_of_the_map_is_there():
    assert [p.name[:2] for p in NOTEBOOKS] == [f"{i:02d}" for i in range(13)], [
        p.name for p in NOTEBOOKS
    ]


@pytest.mark.parametrize("readme", ["README.md", "chapters/README.md"])
def test_readmes_link_every_chapter_to_colab(readme):
    text = (ROOT / readme).read_text()
    for p in NOTEBOOKS:
        assert home.colab_url(f"chapters/{p.name}") in text, (
            f"{readme} has no Colab badge for {p.name}"
        )


# -- hygiene --------------------------------------------------------------------------------------


def test_notebooks_and_twins_agree_and_have_no_outputs(monkeypatch):
    monkeypatch.setattr(sync_notebooks, "CHAPTERS", CHAPTERS)
    monkeypatch.setattr(sync_notebooks, "TWINS", CHAPTERS / "py")
    monkeypatch.setattr(sync_notebooks, "IMAGES", CHAPTERS / "img")
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


ABSOLUTE = re.compile(
    r"(?<![\w.])(/(?:work|home|root|tmp|Users|usr|opt|content)/|[A-Za-z]:\\\\|file://)"
)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_no_absolute_paths(path):
    for i, c in enumerate(load(path).cells):
        # a picture's bytes are no path
        m = ABSOLUTE.search(re.sub(r"data:image/png;base64,[\w+/=]+", "", c.source))
        assert m is None, f"{path.name} cell {i} has an absolute path: {m.group(0)!r}"


def test_absolute_path_check_catches_one():
    assert ABSOLUTE.search("open('/work/main/chapters/img/x.png')")
    assert ABSOLUTE.search("C:\\\\Users\\\\me")
    assert not ABSOLUTE.search("![x](img/00_mappings.png) and chapters/py/")


def setup_cell(nn: str) -> str:
    twin = (CHAPTERS / "py").glob("00_*.py")
    first = code_cells(sync_notebooks.build(next(twin)))[0].source
    return first.replace('start("00", ', f'start("{nn}", ')


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_first_cells_set_up_colab_and_local_alike(path):
    nb = load(path)
    nn = path.name[:2]
    assert (
        nb.cells[0].cell_type == "markdown"
        and "After this chapter you can" in nb.cells[0].source
    )
    assert home.colab_url(f"chapters/{path.name}") in nb.cells[0].source, (
        f"{path.name}: no Colab link to itself"
    )
    setup = code_cells(nb)[0]
    first = setup.source
    assert first == setup_cell(nn), (
        f"{path.name}: the setup cell differs from chapter 00's"
    )
    assert f'HOME, REF = "{home.REPO}", "{home.REF}"' in first, (
        "the setup cell clones another home or version"
    )
    assert 'f"memlab-{REF}"' in first and home.clone_folder("X") == "memlab-X", (
        "clone folder: cell and home disagree"
    )
    assert "pip install" not in first, "the setup cell must not reinstall anything"
    assert len(first.splitlines()) <= 11, (
        "keep the setup cell short: what runs after the clone is notebook.start's"
    )
    assert "sys.path.insert" not in first and "sys.path += [str(root)]" in first, (
        "the setup cell appends the course to sys.path: a folder of the course put first "
        "would hide an installed package of the same name (kernels/ hides Hugging Face's)"
    )
    # Collapsed: Colab shows the #@title form (its DRIVE checkbox), JupyterLab hides the source.
    assert re.fullmatch(
        r'# @title [^{}]+\{ display-mode: "form" \}', first.splitlines()[0]
    ), first.splitlines()[0]
    assert 'DRIVE = False  # @param {type:"boolean"}' in first.splitlines()
    assert setup.metadata.get("cellView") == "form" and setup.metadata.get(
        "jupyter"
    ) == {"source_hidden": True}
    assert not any(
        c.metadata.get("jupyter") or c.metadata.get("cellView")
        for c in nb.cells
        if c is not setup
    )
    assert (
        nb.metadata.get("accelerator") == "GPU"
        and nb.metadata["kernelspec"]["name"] == "python3"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_chapter_links_its_exercises_and_ends_with_its_grader(path):
    nb = load(path)
    n = chapter_no(path)
    text = markdown(nb)
    for e in catalog.for_chapter(n):
        assert f"exercises/{e.file}.py" in text, (
            f"{path.name} does not point to exercises/{e.file}.py"
        )
        assert exercise_cells(nb, e.file), (
            f'{path.name} has no cell "with exercise("{e.file}") as ...:" on the chapter\'s state'
        )
    last = code_cells(nb)[-1].source
    want = 'grade(["--quiet"])' if n == 0 else f'grade(["{n:02d}"])'
    assert "from memlab.grade import main as grade" in last and want in last, (
        f"{path.name} last cell: {last!r}"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_no_cell_relies_on_a_tag_and_exercises_run_inside_their_guard(path):
    # Colab ignores raises-exception: an exercise cell must catch its own stub (the with block).
    for c in code_cells(load(path)):
        assert not c.metadata.get("tags"), (
            f"{path.name}: a tagged cell (Colab ignores tags):\n{c.source}"
        )
        if re.search(r"(?<![\w.])exercise\(", c.source):
            assert c.source.startswith("with exercise("), (
                f"{path.name}: an exercise used outside its with block stops Run all:\n{c.source}"
            )


def test_sections_named_by_the_exercises_exist():
    # The stubs say "See chapter NN (section; other section)": each must be a heading there.
    refs = re.compile(r"see chapter (\d\d) \(([^)]+)\)", re.IGNORECASE)
    found = 0
    from memlab.course.grading.stubs import course_stub

    # the stubs as the course ships them, not a learner's file
    for e in catalog.EXERCISES:
        stub = Path(f"{e.file}.py")
        text = " ".join(course_stub(e.file)[0].split())
        for nn, names in refs.findall(text):
            (path,) = [p for p in NOTEBOOKS if p.name.startswith(nn)] or [None]
            assert path is not None, (
                f"{stub.name} points to chapter {nn}, which does not exist"
            )
            headings = {
                line.lstrip("#").strip().replace("`", "").lower()
                for line in markdown(load(path)).splitlines()
                if line.startswith("#")
            }
            for name in names.split(";"):
                found += 1
                assert name.strip().lower() in headings, (
                    f"{stub.name} points to section {name.strip()!r} of {path.name}, "
                    "which has no such heading"
                )
    assert found, "no stub points to a chapter section any more: update this test"


IMAGE = re.compile(
    r"!\[[^\]]*\]\(\s*<?([^)\s>]+)|<img\b[^>]*?\bsrc\s*=\s*[\"']?([^\"'\s>]+)", re.I
)


def image_refs(text: str) -> list[str]:
    """Every picture a markdown text shows: ![alt](target) and <img src=target>."""
    return [a or b for a, b in IMAGE.findall(text)]


def test_image_refs_finds_both_spellings():
    text = (
        '![a](img/x.png) and <img width=3 src="y.png"> and ![b]( <https://h/z.png> "t")'
    )
    assert image_refs(text) == ["img/x.png", "y.png", "https://h/z.png"]


def picture_problems(nb, name) -> list[str]:
    """Pictures that could break: an address (the network, a home that may not exist), a relative
    path (Colab opened from its badge has no folder around the notebook), or inline bytes that are
    not a file of chapters/img/ (the PNG there is the one source)."""
    found = []
    for ref in image_refs(markdown(nb)):
        if not ref.startswith(INLINE_PNG):
            found.append(
                f"{name} shows {ref[:80]}: not inline (the twin writes ![alt](img/NAME.png), "
                "python scripts/sync_notebooks.py carries the file into the notebook)"
            )
    shown = len(image_refs(markdown(nb))) - len(found)
    if len(picture_paths(nb)) != shown:
        found.append(
            f"{name} carries a picture that is no file of chapters/img/ (or an old one): "
            "python scripts/sync_notebooks.py"
        )
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_pictures_are_inside_the_notebook(path):
    assert picture_problems(load(path), path.name) == []
    twin = (CHAPTERS / "py" / f"{path.stem}.py").read_text()
    for ref in image_refs(twin):
        assert re.fullmatch(r"img/[\w.-]+\.png", ref), (
            f"py/{path.stem}.py shows {ref}: write ![alt](img/NAME.png)"
        )


def test_picture_check_catches_an_address_a_relative_path_and_a_stale_picture():
    png = next((CHAPTERS / "img").glob("*.png")).read_bytes()
    good = f"![ok]({INLINE_PNG}{base64.b64encode(png).decode()})"
    stale = f"![old]({INLINE_PNG}{base64.b64encode(png + b'x').decode()})"
    for text, says in (
        (good, None),
        (
            "![a](https://raw.githubusercontent.com/o/n/v1/chapters/img/a.png)",
            "not inline",
        ),
        ('<img src="img/a.png">', "not inline"),
        (stale, "no file of chapters/img/"),
    ):
        found = picture_problems(
            nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text)]),
            "x.ipynb",
        )
        assert (
            (found == []) if says is None else (len(found) == 1 and says in found[0])
        ), (text[:40], found)


def test_static_pictures_exist_and_are_shown():
    from memlab.course.viz.render_static import PICTURES

    shown = {}
    for p in NOTEBOOKS:
        for pic in picture_paths(load(p)):
            assert (ROOT / pic).is_file(), (
                f"{p.name} shows {pic}, which is missing "
                "(python -m memlab.course.viz.render_static)"
            )
            shown[pic] = p
    drawn = {f"chapters/img/{name}.png" for name in PICTURES}
    not_drawn = sorted(
        p for p in shown if p.startswith("chapters/img/") and p not in drawn
    )
    assert not not_drawn, (
        "shown but not drawn by python -m memlab.course.viz.render_static "
        f"(add to PICTURES): {not_drawn}"
    )
    for name in PICTURES:
        pic = f"chapters/img/{name}.png"
        assert pic in shown, f"{pic} is rendered but no chapter shows it"
        assert shown[pic].name[:2] == name[:2], f"{pic} is shown by {shown[pic].name}"
    assert all(p.name[:2] in {Path(i).name[:2] for i in shown} for p in NOTEBOOKS), (
        "every chapter shows a static picture"
    )


def test_points_quoted_in_the_text_match_the_catalog():
    # "exercises/x.py ... (N points" or "(N points, +G on a GPU)" in the same markdown cell
    quote = re.compile(
        r"exercises/(ch\d\d_\w+)\.py.*?\((\d+) points(?:, \+(\d+) on a GPU)?", re.DOTALL
    )
    seen = 0
    for p in NOTEBOOKS:
        for c in load(p).cells:
            if c.cell_type != "markdown":
                continue
            for file, pts, gpu in quote.findall(c.source):
                e = next(x for x in catalog.EXERCISES if x.file == file)
                seen += 1
                assert int(pts) == e.points, (
                    f"{p.name} says {file} is worth {pts} points, the catalog {e.points}"
                )
                assert int(gpu or 0) == e.gpu_points, (
                    f"{p.name}: {file} GPU points {gpu or 0} vs {e.gpu_points}"
                )
    assert seen >= 10


def test_twin_round_trips_through_the_notebook(tmp_path, monkeypatch):
    # An author who edits a notebook in JupyterLab writes it back with --from-ipynb:
    # nothing may drift.
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
    assert "jupytext" not in nb.metadata, (
        "no pairing metadata: it makes JupyterLab refuse newer notebooks"
    )


# -- the setup cell: local checkout, clone, reuse, failures (run in this process) ------------------


def run_setup_cell(cwd, monkeypatch, url=None):
    """Execute chapter 00's setup cell here with working folder ``cwd``; return its namespace."""
    monkeypatch.chdir(cwd)
    # the cell appends the course (the test's own checkout first leaves so it can)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(ROOT)])
    # start() extends it
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    if url is not None:
        monkeypatch.setenv("MEMLAB_REPO_URL", url)
    ns = {}
    exec(compile(setup_cell("00"), "setup-cell", "exec"), ns)
    return ns


def test_setup_cell_uses_the_checkout_around_the_notebook(
    monkeypatch, capsys, tmp_path
):
    # never cloned
    ns = run_setup_cell(
        ROOT / "chapters", monkeypatch, url=(tmp_path / "nowhere").as_uri()
    )
    assert ns["root"] == ROOT and sys.path[-1] == str(ROOT)
    assert f"repository {ROOT.name}/" in capsys.readouterr().out


def test_setup_cell_clones_its_version_once_and_reuses_it(
    home_repo, monkeypatch, capsys, tmp_path
):
    ns = run_setup_cell(tmp_path, monkeypatch, url=home_repo.as_uri())
    clone = tmp_path / home.clone_folder()
    assert ns["root"] == clone and sys.path[-1] == str(clone)
    assert git("describe", "--tags", "--exact-match", cwd=clone).strip() == home.REF
    (clone / "exercises" / "mine.txt").write_text("work")
    # no second clone needed
    run_setup_cell(tmp_path, monkeypatch, url=(tmp_path / "gone").as_uri())
    assert (clone / "exercises" / "mine.txt").read_text() == "work"
    assert not (tmp_path / f"{clone.name}.partial").exists()


def test_setup_cell_replaces_an_unfinished_clone(
    home_repo, monkeypatch, capsys, tmp_path
):
    part = tmp_path / f"{home.clone_folder()}.partial"
    (part / "memlab").mkdir(parents=True)  # a clone that was interrupted
    (part / "memlab" / "half.py").write_text("x")
    run_setup_cell(tmp_path, monkeypatch, url=home_repo.as_uri())
    clone = tmp_path / home.clone_folder()
    assert (
        (clone / "pyproject.toml").is_file()
        and not (clone / "memlab" / "half.py").exists()
        and not part.exists()
    )


def test_setup_cell_in_a_fresh_python_runs_the_clones_kernels(home_repo, tmp_path):
    """Colab's way end to end, in a fresh interpreter whose working folder has no course around it:
    the cell clones the course and puts it on sys.path; memlab and memlab.kernels then come from
    that clone (not from the checkout this test's Python has installed), a kernel runs, and a shell
    cell (a new process, like !python -m memlab.grade) finds the clone's kernels too."""
    code = setup_cell("00") + (
        "\nimport memlab, memlab.kernels.canary as canary, torch\n"
        "from memlab.common.env import kernel_device\n"
        "print('MEMLAB', memlab.__file__)\n"
        "print('KERNEL', canary.__file__)\n"
        "print('AXPB', canary.axpb(torch.arange(4, device=kernel_device()), a=3, b=2).tolist())\n"
        "shell = subprocess.run(\n"
        "    [sys.executable, '-c', 'import memlab.kernels.canary as c; print(c.__file__)'],\n"
        "    capture_output=True, text=True, cwd='/')\n"
        "print('SHELL', shell.stdout.strip() or shell.stderr)\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TRITON_INTERPRET", "PYTHONPATH", "MEMLAB_EXERCISES")
    }
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env | {"MEMLAB_REPO_URL": home_repo.as_uri()},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    got = dict(
        line.split(" ", 1)
        for line in r.stdout.splitlines()
        if line.split(" ", 1)[0].isupper()
    )
    clone = tmp_path / home.clone_folder()
    assert got["MEMLAB"] == str(clone / "memlab" / "__init__.py")
    # a shell cell finds it through a link to the clone's memlab
    for key in ("KERNEL", "SHELL"):
        assert (
            Path(got[key]).resolve()
            == (clone / "memlab" / "kernels" / "canary.py").resolve()
        ), f"{key}: {got[key]}"
        # the clone's own kernels/ folder
        assert Path(got[key]).resolve() == clone / "kernels" / "canary.py"
    assert got["AXPB"] == "[2, 5, 8, 11]"


@pytest.fixture(scope="session")
def untagged_repo(tmp_path_factory):
    src = tmp_path_factory.mktemp("untagged")
    (src / "README.md").write_text("not the course\n")
    git("init", "-q", cwd=src)
    git("add", "-A", cwd=src)
    git("commit", "-q", "-m", "x", cwd=src)
    return src


@pytest.mark.parametrize(
    "case, says",
    [
        ("missing", "no such repository or version"),
        ("untagged", "no such repository or version"),
        ("offline", "no network"),
    ],
)
def test_setup_cell_says_why_a_clone_failed(
    case, says, untagged_repo, monkeypatch, tmp_path
):
    # port 9 (discard) refuses the connection
    url = {
        "missing": (tmp_path / "no-such-repo").as_uri(),
        "untagged": untagged_repo.as_uri(),
        "offline": "http://127.0.0.1:9/memlab",
    }[case]
    with pytest.raises(RuntimeError, match=says) as err:
        run_setup_cell(tmp_path, monkeypatch, url=url)
    assert f"at version {home.REF}" in str(err.value) and "git said:" in str(err.value)
    assert not (tmp_path / home.clone_folder()).exists(), (
        "a failed clone must not look like a finished one"
    )


def test_a_clone_moved_off_its_version_is_refused(home_repo, tmp_path):
    from memlab.course.notebook import check_clone

    clone = tmp_path / home.clone_folder()
    git(
        "clone",
        "-q",
        "--depth",
        "1",
        "--branch",
        home.REF,
        home_repo.as_uri(),
        str(clone),
    )
    check_clone(clone, home.REF)  # at its version: fine
    check_clone(ROOT, home.REF)  # a local checkout is the learner's own: never checked
    (clone / "moved.txt").write_text("x")
    git("add", "moved.txt", cwd=clone)
    git("commit", "-q", "-m", "a pull or a checkout", cwd=clone)
    with pytest.raises(RuntimeError, match=f"no longer at version {home.REF}"):
        check_clone(clone, home.REF)
    shutil.rmtree(clone / ".git" / "refs")
    (clone / ".git" / "packed-refs").unlink(missing_ok=True)
    with pytest.raises(RuntimeError, match="not a complete clone"):
        check_clone(clone, home.REF)


# -- exercise cells never stop Run all -----------------------------------------------------------


@pytest.fixture
def learner(tmp_path, monkeypatch):
    """A learner folder (MEMLAB_EXERCISES) to write exercise files into."""
    monkeypatch.setenv("MEMLAB_EXERCISES", str(tmp_path))
    return tmp_path


def test_a_stub_is_reported_and_the_cell_goes_on(learner, capsys):
    from memlab.course.notebook import exercise

    (learner / "ch98_demo.py").write_text("def f():\n    raise NotImplementedError\n")
    ran = []
    with exercise("ch98_demo") as ex:
        ex.f()
        ran.append("after")
    assert (
        ran == []
        and f"not written yet: edit {learner / 'ch98_demo.py'} (then re-run this cell)"
        in capsys.readouterr().out
    )


def test_a_wrong_answer_or_a_broken_file_is_shown_and_the_cell_goes_on(learner, capsys):
    from memlab.course.notebook import exercise

    (learner / "ch98_demo.py").write_text("def f():\n    return 1\n")
    with exercise("ch98_demo") as ex:
        assert ex.f() == 2, "want 2"
    out = capsys.readouterr().out
    # The learner's code raised nothing: the chapter's own check failed, and the cell says which.
    assert (
        "ch98_demo: your code ran without an error, but the chapter's check failed: ex.f() == 2"
        in out
    )
    assert "it expected: want 2" in out and "raised AssertionError" not in out
    # does not compile: reported inside the block
    (learner / "ch98_demo.py").write_text("def f(:\n")
    with exercise("ch98_demo") as ex:
        ex.f()
    assert "raised SyntaxError" in capsys.readouterr().out
    # the edit is picked up
    (learner / "ch98_demo.py").write_text("def f():\n    return 2\n")
    with exercise("ch98_demo") as ex:
        assert ex.f() == 2


def test_an_interrupt_still_stops_the_cell(learner):
    from memlab.course.notebook import exercise

    (learner / "ch98_demo.py").write_text("def f():\n    raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt), exercise("ch98_demo") as ex:
        ex.f()


# -- keeping the learner's work: Google Drive in Colab (mocked) ------------------------------------


@pytest.fixture
def fake_colab(tmp_path, monkeypatch):
    """google.colab with drive.mount and files.download that work on a temp folder."""
    import types

    mount, calls = tmp_path / "drive", {"mount": 0, "download": []}

    def do_mount(where):
        assert Path(where) == mount
        calls["mount"] += 1
        (mount / "MyDrive").mkdir(parents=True, exist_ok=True)

    colab = types.ModuleType("google.colab")
    colab.drive = types.SimpleNamespace(mount=do_mount)
    colab.files = types.SimpleNamespace(download=lambda p: calls["download"].append(p))
    google = types.ModuleType("google")
    google.colab = colab
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setenv("MEMLAB_DRIVE_MOUNT", str(mount))
    # Set, then removed: monkeypatch then knows to remove what notebook.start sets (a bare
    # delenv of an unset name records nothing, and the test's own delenv would put it back).
    monkeypatch.setenv("MEMLAB_EXERCISES", "")
    monkeypatch.delenv("MEMLAB_EXERCISES")
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    return mount, calls


def test_drive_gets_the_stubs_once_and_never_overwrites(
    fake_colab, capsys, monkeypatch
):
    from memlab.course import notebook

    mount, calls = fake_colab
    notebook.start("04", drive=True)
    folder = mount / notebook.DRIVE_FOLDER
    stubs = sorted(p.name for p in (ROOT / "exercises").glob("ch*.py"))
    assert sorted(p.name for p in folder.iterdir()) == stubs and calls["mount"] == 1
    assert os.environ["MEMLAB_EXERCISES"] == str(folder)
    out = capsys.readouterr().out
    assert (
        f"your exercise files: {folder} on Google Drive ({len(stubs)} files copied there now from"
        in out
    )
    (folder / "ch04_alloc_extend.py").write_text("# my work\n")
    (folder / "ch05_alloc_decode.py").unlink()
    monkeypatch.delenv("MEMLAB_EXERCISES")
    # another chapter, a new runtime: Drive already mounted
    notebook.start("05", drive=True)
    assert (folder / "ch04_alloc_extend.py").read_text() == "# my work\n"
    assert (folder / "ch05_alloc_decode.py").read_bytes() == (
        ROOT / "exercises/ch05_alloc_decode.py"
    ).read_bytes()
    assert (
        "(1 files copied there now" in capsys.readouterr().out and calls["mount"] == 1
    )
    from memlab.course.grading import loader

    # the exercise cells and the grader read the Drive folder
    assert loader.source_dir() == folder


def test_without_drive_colab_says_the_work_lives_in_the_runtime(
    fake_colab, capsys, tmp_path, monkeypatch
):
    from memlab.course import notebook

    mount, calls = fake_colab
    notebook.start("04")
    out = capsys.readouterr().out
    assert (
        "in this runtime ONLY: they are lost when Colab recycles it" in out
        and "DRIVE = True" in out
    )
    assert (
        f"the glossary (every word of the books): {home.github_url('chapters/glossary.md')}"
        in out
    )
    assert (
        calls["mount"] == 0
        and not mount.exists()
        and "MEMLAB_EXERCISES" not in os.environ
    )
    monkeypatch.chdir(tmp_path)
    from memlab.course.grading import loader

    # as in a notebook (the graded tests' conftest grades solutions/)
    monkeypatch.setattr(loader, "_default", "exercises")
    zipped = notebook.download_exercises()
    import zipfile

    assert calls["download"] == [str(zipped)]
    assert len(zipfile.ZipFile(zipped).namelist()) == len(
        list((ROOT / "exercises").glob("ch*.py"))
    )


def test_outside_colab_drive_is_ignored_and_the_folder_named(capsys, monkeypatch):
    from memlab.course import notebook

    monkeypatch.delenv("MEMLAB_EXERCISES", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    notebook.start("04", drive=True)
    assert (
        "your exercise files: exercises/ (DRIVE = True only applies in Colab)"
        in capsys.readouterr().out
    )
    monkeypatch.setenv("MEMLAB_EXERCISES", "solutions")
    notebook.start("04")
    assert (
        "your exercise files: solutions (MEMLAB_EXERCISES)" in capsys.readouterr().out
    )
