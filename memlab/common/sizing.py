"""Moved to ``memlab.sglang.sizing``: pool sizing mirrors SGLang's ``kv_cache_configurator.py``
and ``allocation_sizing.py``, so it lives with the SGLang side (``memlab.common`` imports nothing
of ``memlab.sglang``).

This name stays only until chapter 08, the capstone engine and the course's pictures import the
new one; every name read through it warns (DeprecationWarning) and is the new module's own
object. ``tests/repo/test_import_graph.py`` lists this module as the one layer exception, to be
deleted with it.
"""

from __future__ import annotations

import warnings

from memlab.sglang import sizing as _sizing


def __getattr__(name: str):
    try:
        value = getattr(_sizing, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    warnings.warn(
        f"memlab.common.sizing.{name} moved to memlab.sglang.sizing.{name}: "
        "import it from there",
        DeprecationWarning,
        stacklevel=2,
    )
    return value


def __dir__():
    return dir(_sizing)
