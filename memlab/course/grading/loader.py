"""The one seam between graded tests and learner code.

Tests never import exercise files; they call ``load("ch04_alloc_extend")``, which imports that
file from the folder chosen by ``MEMLAB_EXERCISES``: ``exercises`` (the default), ``solutions``,
or any folder path. Files are loaded by path under private module names, so ``exercises`` and
``solutions`` never become importable top-level names.
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
        raise FileNotFoundError(f"{ENV}={source!r}: no such folder (use 'exercises', 'solutions' or a path)")
    return path


def load(name: str, source: str | None = None) -> ModuleType:
    """Import ``<folder>/<name>.py`` (once per file) and return the module."""
    path = source_dir(source) / f"{name}.py"
    path = path.resolve()
    if path in _cache:
        return _cache[path]
    if not path.is_file():
        raise FileNotFoundError(f"exercise file {path} is missing (expected {name}.py in {path.parent})")
    # Triton reads TRITON_INTERPRET when a kernel is defined: fix the mode before any import.
    from memlab.common.env import ensure_kernel_mode

    ensure_kernel_mode()
    tag = hashlib.sha1(str(path.parent).encode()).hexdigest()[:8]
    modname = f"_memlab_learner_{tag}_{name}"
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
