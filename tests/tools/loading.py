"""How the tests reach code that is not installed, without ever putting a repository folder on
``sys.path`` (where ``tests/``, ``kernels/`` or ``scripts/`` would shadow an installed package of
the same name).

- ``register()`` makes the tests folder importable as the package ``memlab_tests`` (its tools,
  the graded tests' references): ``from memlab_tests.tools.alloc import check_books``. The root
  ``conftest.py`` calls it; a script run outside pytest loads this file by path and calls it.
- ``load_file(relpath)`` loads a repository file that is no package's module (a script under
  ``scripts/`` or ``bench/``) once per process; it stays in ``sys.modules``, where dataclasses in
  it look their module up by name.
"""

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "memlab_tests"


def register() -> None:
    if PACKAGE in sys.modules:
        return
    spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
    spec.submodule_search_locations = [str(ROOT / "tests")]
    sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)


def load_file(relpath: str):
    name = "_memlab_" + relpath.replace("/", "_").removesuffix(".py")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]  # no half-run module for the next caller
            raise
    return sys.modules[name]
