"""Load SGLang 0.5.23's RadixCache (sglang/srt/mem_cache/radix_cache.py) from its published wheel.

What runs is SGLang's own code: ``radix_cache.py`` (the tree), ``base_prefix_cache.py`` (the
result types and the base class), ``evict_policy.py`` (the LRU strategy), ``cache_init_params.py``
and ``unified_cache/component_type.py``, each imported under its real module name from the
unpacked wheel. The packages above them (``sglang``, ``sglang.srt``, ...) are bare namespace
modules, so their ``__init__`` files (which import the whole server) never run.

Stubbed, because importing the real ones pulls in the server, CUDA kernels or orjson/msgspec,
and none of it takes part in the tree's books:
- ``sglang.srt.mem_cache.events``: the KV-event recorder (a recorder that records nothing,
  which is what SGLang itself does with events disabled);
- ``sglang.srt.mem_cache.utils``: only ``get_eviction_strategy`` (built on the REAL
  ``evict_policy`` classes) and ``split_node_hash_value`` (hashes stay None in these tests);
- ``sglang.srt.utils.common.ceil_align``; the allocator and request-table base classes
  (type annotations only); observability and runtime context (metrics are off).

``RadixCache.evict`` reads ``time.monotonic()`` for LRU order; ``load`` replaces the module's
``time`` with a clock that ticks once per call, so both trees see the same order of events
(memlab's tree keeps a counter for the same reason).
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import time
import types
from pathlib import Path

from memlab_tests.tools.engines.wheels import unpacked

PKGS = (
    "sglang",
    "sglang.srt",
    "sglang.srt.mem_cache",
    "sglang.srt.mem_cache.unified_cache",
)
REAL = (
    "sglang.srt.mem_cache.evict_policy",
    "sglang.srt.mem_cache.unified_cache.component_type",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.radix_cache",
)


class TickClock:
    """time.monotonic that advances by one per call; perf_counter stays real."""

    def __init__(self):
        self._t = itertools.count(1)

    def monotonic(self) -> float:
        return float(next(self._t))

    @staticmethod
    def perf_counter() -> float:
        return time.perf_counter()


def _module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def _stubs(root: Path, evict_policy) -> None:
    class _Recorder:  # events disabled: every record_* is a no-op in SGLang too
        def __init__(self, **kw):
            pass

        def __getattr__(self, name):
            return lambda *a, **k: None

    class _Names:
        def __init__(self, *a, **k):
            pass

    _module(
        "sglang.srt.mem_cache.events",
        KVCacheEventRecorder=_Recorder,
        LoRANameTable=_Names,
        KvEventLoraNames=_Names,
    )
    strategies = {
        "lru": evict_policy.LRUStrategy,
        "lfu": evict_policy.LFUStrategy,
        "fifo": evict_policy.FIFOStrategy,
    }

    def get_eviction_strategy(policy, config=None):
        return strategies[policy.lower()](**(config or {}))

    def split_node_hash_value(hash_value, split_len, page_size):
        if hash_value is not None:
            raise NotImplementedError(
                "the radix differential tests never compute page hashes"
            )
        return None, None

    _module(
        "sglang.srt.mem_cache.utils",
        get_eviction_strategy=get_eviction_strategy,
        split_node_hash_value=split_node_hash_value,
    )
    _module("sglang.srt.utils", __path__=[])
    _module("sglang.srt.utils.common", ceil_align=lambda x, a: -(-x // a) * a)
    _module(
        "sglang.srt.mem_cache.allocator",
        BaseTokenToKVPoolAllocator=type("BaseTokenToKVPoolAllocator", (), {}),
    )
    _module(
        "sglang.srt.mem_cache.memory_pool",
        ReqToTokenPool=type("ReqToTokenPool", (), {}),
    )
    _module("sglang.srt.observability", __path__=[])
    _module(
        "sglang.srt.observability.metrics_collector",
        STAT_LOGGER_ROLE_RADIX_CACHE="radix_cache",
        RadixCacheMetricsCollector=type("RadixCacheMetricsCollector", (), {}),
        radix_cache_metric_labels=lambda *a, **k: {},
        resolve_collector_class=lambda *a, **k: None,
    )
    _module(
        "sglang.srt.runtime_context",
        get_observability=lambda: None,
        get_parallel=lambda: None,
    )


def _load_real(root: Path, name: str) -> types.ModuleType:
    path = root.joinpath(*name.split(".")).with_suffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


_loaded: types.SimpleNamespace | None = None


def load() -> types.SimpleNamespace:
    """SGLang's radix_cache and base_prefix_cache modules (built once per process), with a tick
    clock.

    They are built in isolation: every ``sglang*`` entry of sys.modules (another loader's) is set
    aside while they import, and put back after, so neither loader sees the other's stubs.
    """
    global _loaded
    if _loaded is not None:
        return _loaded
    root = unpacked("sglang")
    saved = {
        k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")
    }
    for k in saved:
        del sys.modules[k]
    try:
        for name in PKGS:
            _module(name, __path__=[str(root.joinpath(*name.split(".")))])
        evict_policy = _load_real(root, REAL[0])
        _stubs(root, evict_policy)
        mods = {name: _load_real(root, name) for name in REAL[1:]}
    finally:
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    rc = mods["sglang.srt.mem_cache.radix_cache"]
    rc.time = TickClock()
    _loaded = types.SimpleNamespace(
        radix_cache=rc, base=mods["sglang.srt.mem_cache.base_prefix_cache"], root=root
    )
    return _loaded
