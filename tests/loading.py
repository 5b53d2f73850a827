"""Load a repository file that is not part of a package (the bug zoo, a script) as a module, once
per test session: dataclasses in it look their module up by name, so it stays in sys.modules."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
