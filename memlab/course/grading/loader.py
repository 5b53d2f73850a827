"""The one seam between graded tests and learner code.

Tests never import exercise files; they call ``load("ch04_alloc_extend")``, which runs that file
from the folder chosen by ``MEMLAB_EXERCISES`` (``exercises``, the default, ``solutions``, or any
folder path) in a learner process of its own and returns a stand-in for its module
(memlab.course.grading.sandbox): the learner's code is reached only through it, with data,
learner objects and callbacks, and nothing of the grader runs where the learner's code runs.
What comes back is plain data, or an object of the learner's code that a check must not compare
(``is_learner_object``).

``load_here`` imports a file into this process instead, for code that trusts it: a notebook's
exercise cell (the learner's own check of their own file) and the course's own tools (the
solutions compared with the library). Files are loaded by path under private module names, so
``exercises`` and ``solutions`` never become importable top-level names.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

# The repository root: the folder above the memlab package, found from this file and never from
# the working folder (a notebook runs in chapters/, or in Colab's /content).
ROOT = Path(__file__).resolve().parents[3]
ENV = "MEMLAB_EXERCISES"
_default = "exercises"
_cache: dict[Path, ModuleType] = {}
_sandboxed: dict[Path, ModuleType] = {}


def set_default(source: str) -> None:
    """The folder used when MEMLAB_EXERCISES is unset (the plain test suite grades solutions)."""
    global _default
    _default = source


def source_dir(source: str | None = None) -> Path:
    """Resolve 'exercises', 'solutions' or a path to the folder holding the learner's files."""
    source = source or os.environ.get(ENV) or _default
    if source in ("exercises", "solutions"):
        return ROOT / source
    path = Path(source).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(
            f"{ENV}={source!r}: no such folder (use 'exercises', 'solutions' or a path)"
        )
    return path


def _path(name: str, source: str | None) -> Path:
    # not resolved: a link is the sandbox's to refuse
    path = source_dir(source) / f"{name}.py"
    if not os.path.lexists(path):
        raise FileNotFoundError(
            f"exercise file {path} is missing (expected {name}.py in {path.parent})"
        )
    return path


def _modname(path: Path) -> str:
    tag = hashlib.sha1(str(path.parent).encode()).hexdigest()[:8]
    return f"_memlab_learner_{tag}_{path.stem}"


def load(name: str, source: str | None = None) -> ModuleType:
    """``<folder>/<name>.py`` running in a learner process of its own (started once per file and
    again after a crash): a proxy of its module. A file edited since it was started is started
    afresh."""
    from memlab.course.grading import sandbox

    path = _path(name, source)
    st = path.lstat()
    stamp = st.st_mtime_ns, st.st_size
    mod = _sandboxed.get(path)
    if mod is None or mod._stamp != stamp:
        if mod is not None and mod._session is not None:
            mod._session.stop("its file changed")
        mod = sandbox.LearnerModule(path, _modname(path))
        mod._stamp = stamp
        _sandboxed[path] = mod
    mod._live()  # raises what importing it raised, in each test that loads it
    return mod


def is_learner_object(x) -> bool:
    """Whether ``x`` stands for an object of the learner's code (an instance, a function, a
    class, a method, the module): checks must not compare it, since its process would answer."""
    from memlab.course.grading import sandbox

    return isinstance(x, (sandbox.LearnerObject, sandbox.LearnerModule))


def load_here(name: str, source: str | None = None) -> ModuleType:
    """Import ``<folder>/<name>.py`` into this process (once per file) and return the module: for
    code that trusts the file (never the graded tests)."""
    path = _path(name, source)
    if path in _cache:
        return _cache[path]
    # Triton reads TRITON_INTERPRET when a kernel is defined: fix the mode before any import.
    from memlab.common.env import ensure_kernel_mode

    ensure_kernel_mode()
    modname = _modname(path)
    spec = importlib.util.spec_from_file_location(modname, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module  # dataclasses and Triton look a module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[modname]
        raise
    _cache[path] = module
    return module
