"""The notebooks' side of the course: what a chapter's cells call once the first cell has put the
course on ``sys.path`` (``from memlab.course.notebook import exercise, start``).

- ``start(chapter, ref, drive)``: the rest of the setup (kernel mode, a clone's version, where your
  exercise files live: this runtime, or a folder on Google Drive in Colab);
- ``exercise(name)``: the context manager of an exercise cell: a stub that is not written yet,
  an error in your code, or a chapter's check your result does not pass, is reported in plain
  words and the notebook goes on ("Run all" reaches the grade cell in Colab too, which ignores
  the ``raises-exception`` tag);
- ``hint(name)``: the next hint for an exercise (memlab.course.grading.hints);
- ``download_exercises()``: your exercise files as one zip (Colab: the browser downloads it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
import zipfile
from pathlib import Path

# where the grader looks for a learner's files
from memlab.course.grading.loader import ENV as EXERCISES_ENV
from memlab.course.grading.loader import (
    ROOT,
)

DRIVE_MOUNT = "/content/drive"  # where Colab mounts Google Drive (MEMLAB_DRIVE_MOUNT overrides it)
DRIVE_FOLDER = (
    "MyDrive/memlab/exercises"  # one folder for every chapter and every course version
)


def fast() -> bool:
    """MEMLAB_FAST=1 (set by the notebook tests) asks the chapters for small sizes."""
    return os.environ.get("MEMLAB_FAST", "") not in ("", "0")


def in_colab() -> bool:
    return "google.colab" in sys.modules


# -- the version of a clone -------------------------------------------------------------------


def _git(root: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def check_clone(root: Path, ref: str) -> None:
    """A clone made by the first cell (folder ``memlab-REF``) must still be at REF: someone may
    have run ``git checkout`` or ``git pull`` in it, and then the course code no longer matches
    the notebook. Raise in plain words when it moved; a local checkout is the learner's own."""
    from memlab.course.home import clone_folder

    if root.name != clone_folder(ref) or not (root / ".git").exists():
        return
    head, want = (
        _git(root, "rev-parse", "HEAD"),
        _git(root, "rev-parse", f"{ref}^{{commit}}"),
    )
    if head is None or want is None:
        raise RuntimeError(
            f"{root} is not a complete clone of version {ref} (git cannot read it): rename or "
            "delete that folder (copy your exercise files out first) and re-run this cell"
        )
    if head != want:
        raise RuntimeError(
            f"{root} is no longer at version {ref} (it is at {head[:10]}: a git checkout or pull "
            f"moved it), so the course code does not match this notebook. Rename that folder (your "
            "exercise files stay in it) and re-run this cell for a fresh clone of this version"
        )


# -- where the learner's files live ---------------------------------------------------------


def _show(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def use_drive(stubs: Path | None = None) -> tuple[Path, list[str]]:
    """Mount Google Drive (Colab asks for access once), make MyDrive/memlab/exercises, copy each
    exercise file of this runtime (a stub, or work done before) that is not there yet (a file
    already there is never overwritten) and point MEMLAB_EXERCISES at it. Returns the folder and
    the names copied now."""
    from google.colab import drive  # only in Colab

    mount = Path(os.environ.get("MEMLAB_DRIVE_MOUNT", DRIVE_MOUNT))
    if not (mount / "MyDrive").is_dir():
        drive.mount(str(mount))
    folder = mount / DRIVE_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    copied = []
    for stub in sorted((stubs or ROOT / "exercises").glob("ch[0-9][0-9]_*.py")):
        target = folder / stub.name
        if not target.exists():
            shutil.copyfile(stub, target)
            copied.append(stub.name)
    os.environ[EXERCISES_ENV] = str(folder)
    return folder, copied


def _where_work_lives(drive: bool) -> list[str]:
    """Say where the exercise files are, and in Colab whether they outlive the runtime."""
    note = " (DRIVE = True only applies in Colab)" if drive and not in_colab() else ""
    if os.environ.get(EXERCISES_ENV) and not (drive and in_colab()):
        return [
            f"your exercise files: {os.environ[EXERCISES_ENV]} (MEMLAB_EXERCISES){note}"
        ]
    if not in_colab():
        return [f"your exercise files: {_show(ROOT / 'exercises')}/{note}"]
    if drive:
        folder, copied = use_drive()
        # The runtime's files are copied, so work done before DRIVE = True moves along
        # with the stubs.
        news = (
            f"{len(copied)} files copied there now from {ROOT.name}/exercises/"
            if copied
            else "nothing copied"
        )
        return [
            f"your exercise files: {folder} on Google Drive ({news}; files already there are "
            "never overwritten). Edit them there: every chapter with DRIVE ticked (DRIVE = True) "
            "uses them."
        ]
    return [
        f"your exercise files: {ROOT / 'exercises'}, in this runtime ONLY: they are lost when "
        "Colab recycles it.",
        "  Keep them: tick DRIVE in the first cell (DRIVE = True) and re-run it (a folder on your "
        "Google Drive), or download them now and then: from memlab.course.notebook import "
        "download_exercises; download_exercises()",
    ]


def download_exercises(to: str | os.PathLike | None = None) -> Path:
    """Zip your exercise files (the folder the grader reads); in Colab the browser downloads it."""
    from memlab.course.grading import loader

    src = loader.source_dir()
    out = Path(to) if to else Path.cwd() / "memlab-exercises.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(src.glob("ch[0-9][0-9]_*.py")):
            z.write(f, f"exercises/{f.name}")
    if in_colab():
        from google.colab import files

        files.download(str(out))
    print(
        f"wrote {out} ({len(zipfile.ZipFile(out).namelist())} exercise files from {src})"
    )
    return out


# -- the first cell's second half -----------------------------------------------------------


def expose_to_new_processes(root: Path) -> None:
    """Shell cells (``!python -m memlab.grade 04``) start a new Python: let it import memlab
    from ``root`` too. PYTHONPATH gets a folder that holds only a link named ``memlab`` to
    ``root/memlab``, never ``root`` itself: the course's other folders (``kernels/`` above all)
    would come before site-packages there and hide installed packages of the same name."""
    tag = hashlib.sha1(str(root).encode()).hexdigest()[:10]
    link_dir = Path(tempfile.gettempdir()) / f"memlab-path-{os.getuid()}-{tag}"
    link = link_dir / "memlab"
    if not (link.is_symlink() and link.resolve() == (root / "memlab").resolve()):
        link_dir.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(root / "memlab", target_is_directory=True)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(link_dir) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(link_dir), *paths])


def start(chapter: str, ref: str | None = None, drive: bool = False) -> bool:
    """Check the clone's version, fix the kernel mode before anything imports Triton, say where
    kernels run and where your exercise files live; return fast()."""
    from memlab.common.env import ensure_kernel_mode, has_cuda

    here = Path.cwd().resolve()
    # a clone beside the notebook (Colab)
    if ref is not None and ROOT not in (here, *here.parents):
        check_clone(ROOT, ref)
    expose_to_new_processes(ROOT)
    try:
        mode = ensure_kernel_mode()
    except RuntimeError as exc:  # triton was imported first by something else
        mode = f"unavailable ({exc})"
    if mode == "gpu":
        import torch

        where = f"on the GPU ({torch.cuda.get_device_name()}), compiled"
    elif mode == "interpreter":
        where = "in the Triton interpreter on the CPU (slow but exact)"
        if not sys.platform.startswith("linux"):
            where += "; Triton has no wheels here, so kernel cells need Linux or Colab"
    else:
        where = mode
    flags = " · fast mode (small sizes)" if fast() else ""
    print(
        f"memlab chapter {chapter} · repository {ROOT.name}/ · kernels run {where}{flags}"
    )
    if not has_cuda() and in_colab():
        print(
            "Colab without a GPU: Runtime > Change runtime type > T4 GPU runs the kernels compiled."
        )
    # The chapters' links to chapters/glossary.md are relative: JupyterLab's and GitHub's.
    if in_colab():
        from memlab.course.home import github_url

        print(
            f"the glossary (every word of the books): {github_url('chapters/glossary.md')}"
        )
    for line in _where_work_lives(drive):
        print(line)
    return fast()


# -- exercise cells ---------------------------------------------------------------------------


def hint(name: str, all: bool = False) -> None:
    """Print the next hint for an exercise (``all=True``: every hint), as ``./course hint`` does."""
    from memlab.course.grading import hints

    print(hints.all_hints(name) if all else hints.next_hint(name))


class _Yours:
    """Your exercise module, loaded on first use inside the ``with`` block, so that a file that
    does not import (a syntax error) is reported like any other error of the cell. It runs in
    this notebook's process (your own check of your own file); the grader runs it apart."""

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attr):
        if attr.startswith("_"):
            raise AttributeError(attr)
        if self._module is None:
            from memlab.course.grading import loader

            path = (loader.source_dir() / f"{self._name}.py").resolve()
            # loaded once per process; a notebook wants the latest edit
            loader._cache.pop(path, None)
            self._module = loader.load_here(self._name)
        return getattr(self._module, attr)


class exercise:
    """``with exercise("ch04_alloc_extend") as ex:`` runs the cell's check of your file (freshly
    loaded from exercises/, or the folder MEMLAB_EXERCISES names). A stub that is not written yet
    prints one line; any other error prints its traceback; either way the notebook goes on."""

    def __init__(self, name: str):
        from memlab.course.grading import catalog

        try:
            # ch04_alloc_extend, or its id ch04.alloc_extend
            self.name = catalog.find(name).file
        except ValueError:  # a file of your own beside the course's: its name as given
            self.name = name

    def __enter__(self) -> _Yours:
        return _Yours(self.name)

    def _file(self) -> str:
        from memlab.course.grading import loader

        try:
            return _show(loader.source_dir() / f"{self.name}.py")
        except FileNotFoundError:
            return f"exercises/{self.name}.py"

    def _raised_by_yours(self, tb) -> bool:
        """Whether a frame of the traceback is in your exercise file (else the cell raised it)."""
        from memlab.course.grading import loader

        try:
            mine = (loader.source_dir() / f"{self.name}.py").resolve()
        except FileNotFoundError:
            return False
        while tb is not None:
            try:
                if Path(tb.tb_frame.f_code.co_filename).resolve() == mine:
                    return True
            except (OSError, ValueError):
                pass
            tb = tb.tb_next
        return False

    @staticmethod
    def _check_text(tb) -> str:
        """The source of the statement that raised in the cell (the condition of an ``assert``)."""
        import ast
        import linecache

        while tb.tb_next is not None:
            tb = tb.tb_next
        code, line = tb.tb_frame.f_code, tb.tb_lineno
        # a file edited since (IPython's cells have names of their own)
        linecache.checkcache(code.co_filename)
        source = "".join(linecache.getlines(code.co_filename, tb.tb_frame.f_globals))
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a cell with IPython's own syntax: the line alone
            return linecache.getline(code.co_filename, line).strip()
        found = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.stmt)
            and n.lineno <= line <= n.end_lineno
            and not isinstance(
                n, (ast.With, ast.For, ast.While, ast.If, ast.Try, ast.FunctionDef)
            )
        ]
        if not found:
            return linecache.getline(code.co_filename, line).strip()
        node = max(found, key=lambda n: n.lineno)  # the innermost statement
        return ast.unparse(node.test if isinstance(node, ast.Assert) else node)

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None or not issubclass(exc_type, Exception):
            return False  # KeyboardInterrupt and friends stop the notebook as usual
        if issubclass(exc_type, NotImplementedError):
            print(f"not written yet: edit {self._file()} (then re-run this cell)")
            return True
        if issubclass(exc_type, AssertionError) and not self._raised_by_yours(tb):
            # Your code ran and returned; the chapter's own check of its result failed.
            check = self._check_text(tb)
            said = str(exc).strip()
            print(
                f"{self.name}: your code ran without an error, "
                f"but the chapter's check failed: {check}"
                + (f"\n  it expected: {said}" if said else "")
                + f"\n  fix {self._file()} (then re-run this cell); the notebook goes on. "
                f'Stuck? hint("{self.name}") (from memlab.course.notebook import hint)',
                flush=True,
            )
            return True
        print(
            f"{self.name}: your code raised {exc_type.__name__}: {exc}\n"
            f"  fix {self._file()} (then re-run this cell); the notebook goes on. Traceback:",
            flush=True,
        )
        traceback.print_exception(exc_type, exc, tb, limit=-4, file=sys.stdout)
        return True
