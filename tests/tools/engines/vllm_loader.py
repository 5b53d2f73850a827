"""vLLM 0.33's scheduler-side KV cache code, imported from its published wheel at test time.

Only the pure-Python modules the differential tests drive are extracted from the wheel and run
(``REAL``): the block pool, the free queue and the hashing helpers, the single-type managers,
the coordinator and the KV cache manager, the request, plus the small modules they need for
their types. Any
other ``vllm.*`` module they import (configs, logging, events, metrics, multimodal, platforms:
each pulls in much of vLLM and its dependencies) is a stub: a module whose attributes are inert
placeholder classes, so ``from vllm.x import Y`` succeeds and ``Y`` is never used on the paths
the tests take. A handful of stubs need a real value (``STUBS``) and get a few lines of their own.

The real modules are imported under their own names while a finder answers for ``vllm``; then
every ``vllm`` entry leaves ``sys.modules`` again, so nothing leaks into other tests (the loaded
modules keep the references they imported). Nothing of vLLM is copied into the repository.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import types
from functools import lru_cache

import pytest

from memlab_tests.tools.engines.wheels import extracted

REAL = (
    "vllm.utils",
    "vllm.utils.hashing",
    "vllm.utils.math_utils",
    "vllm.v1.kv_cache_layout",
    "vllm.v1.kv_cache_spec_registry",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.block_pool",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.request",
)
# real modules that are packages: their file is <name>/__init__.py
PACKAGES = ("vllm.utils",)


def _file(name: str) -> str:
    return name.replace(".", "/") + ("/__init__.py" if name in PACKAGES else ".py")


FILES = [_file(name) for name in REAL]
# imported at the top of vllm.utils.hashing; only its cbor hashes use it
THIRD_PARTY = ("cbor2",)


class _Placeholder(type):
    """Metaclass of the stubs' attributes: a class that takes any arguments, whose own
    attributes are placeholders too (``RequestStatus.WAITING``) and that can be subscripted in
    annotations (``Foo[int]``)."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Placeholder(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(cls, name, value)
        return value

    def __getitem__(cls, item):
        return cls


class _NullLogger:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _dtype_size(dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


def _not_loaded(what):
    def fail(*args, **kwargs):
        raise NotImplementedError(f"{what} is a stub in the memlab differential tests")

    return fail


# Stubs that must hold a working value (everything else is a placeholder).
STUBS = {
    "vllm.logger": {"init_logger": lambda name=None: _NullLogger()},
    "vllm.envs": {
        "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": False,
        "VLLM_KV_CACHE_LAYOUT": None,
    },
    "vllm.utils.torch_utils": {"get_dtype_size": _dtype_size},
    # Used by the request block hasher only when a request with multimodal items GROWS;
    # the tests hash such requests from scratch.
    "vllm.multimodal.utils": {
        "get_mm_features_in_window": _not_loaded("get_mm_features_in_window")
    },
    # vLLM's Request keeps read-only views of its token lists; the view itself is enough here.
    "vllm.v1.utils": {"ConstantList": lambda tokens: tokens},
    "cbor2": {"dumps": _not_loaded("cbor2.dumps")},
}


def _stub_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # a package: its submodules come through the finder too
    module.__dict__.update(STUBS.get(name, {}))

    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        sub = f"{name}.{attr}"
        if sub in REAL or sub in STUBS:  # ``from vllm import envs`` means the submodule
            return importlib.import_module(sub)
        value = _Placeholder(attr, (), {"__init__": lambda self, *a, **k: None})
        setattr(module, attr, value)
        return value

    module.__getattr__ = __getattr__
    return module


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return _stub_module(spec.name)

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, root):
        self.root = root

    def find_spec(self, name, path=None, target=None):
        if name in REAL:
            return importlib.util.spec_from_file_location(
                name,
                self.root / _file(name),
                submodule_search_locations=[] if name in PACKAGES else None,
            )
        if name == "vllm" or name.startswith("vllm.") or name in THIRD_PARTY:
            return importlib.machinery.ModuleSpec(name, _StubLoader(), is_package=True)
        return None


# why the wheel is out of reach, once known: every later test skips at once
_skipped: list[str] = []


def load() -> types.SimpleNamespace:
    """The real modules, by short name, plus ``RequestStatus`` (a placeholder the manager
    compares ``request.status`` with). Loaded once per process; without the wheel, skips."""
    if _skipped:
        pytest.skip(_skipped[0])
    try:
        return _load()
    except pytest.skip.Exception as exc:
        _skipped.append(str(exc))
        raise


@lru_cache(maxsize=1)
def _load() -> types.SimpleNamespace:
    root = extracted("vllm", FILES)
    finder = _Finder(root)
    ours = lambda n: n == "vllm" or n.startswith("vllm.") or n in THIRD_PARTY  # noqa: E731
    saved = {n: m for n, m in sys.modules.items() if ours(n)}
    for n in saved:
        del sys.modules[n]
    sys.meta_path.insert(0, finder)
    try:
        mods = {name.rsplit(".", 1)[1]: importlib.import_module(name) for name in REAL}
        # vLLM's own registration of spec -> manager classes (it ends with a platform hook,
        # a stub here). The registry is filled now, while stubs still answer its imports.
        mods["single_type_kv_cache_manager"].register_all_kvcache_specs(None)
    finally:
        sys.meta_path.remove(finder)
        for n in [n for n in sys.modules if ours(n)]:
            del sys.modules[n]
        sys.modules.update(saved)
    mods["RequestStatus"] = mods["request"].RequestStatus
    logging.getLogger(__name__).debug("loaded vLLM modules from %s", root)
    return types.SimpleNamespace(**mods)


class EngineRequest:
    """What vLLM 0.33's KV cache code reads of a request (vllm/v1/request.py's Request is
    built from engine inputs and pulls in the sampling stack; these are its fields the
    scheduler-side books read, with the values a plain text request has)."""

    def __init__(
        self,
        request_id,
        prompt_token_ids,
        block_hasher=None,
        *,
        status=None,
        lora_request=None,
        mm_features=(),
        cache_salt=None,
    ):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.all_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        self.num_preemptions = 0
        self.status = status
        self.skip_reading_prefix_cache = False
        self.shared_prefix_boundary = 0
        self.lora_request = lora_request
        self.mm_features = list(mm_features)
        self.cache_salt = cache_salt
        self.prompt_embeds = None
        self._prompt_embeds_per_block_hashes = {}
        self.session_id = None
        self.block_hashes = []
        self._block_hasher = block_hasher
        if block_hasher is not None:
            self.block_hashes.extend(block_hasher(self))

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def append_output_token_ids(self, token_ids) -> None:
        self.all_token_ids.extend(token_ids)
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))


# ---- the books of a block pool, read the same way on both sides -------------------------------


def pool_books(pool, strip=lambda key: key) -> dict:
    """Everything a step may change in a BlockPool: the free queue from head to tail, the free
    count, each block's ref count and hash, and the hash map ({hash: block ids in lookup
    order}). ``strip`` turns vLLM's map keys (hash + 4-byte KV cache group id) into the hash."""
    cache = {}
    for key, blocks in pool.cached_block_hash_to_block._cache.items():
        cache[strip(key)] = (
            list(blocks) if isinstance(blocks, dict) else [blocks.block_id]
        )
    return {
        "free queue": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        "get_num_free_blocks()": pool.get_num_free_blocks(),
        "ref_cnt": [b.ref_cnt for b in pool.blocks],
        "block_hash": [
            None if b.block_hash is None else strip(b.block_hash) for b in pool.blocks
        ],
        "hash map": cache,
    }


def assert_same_books(ours, theirs, where: str) -> None:
    for name in ours:
        if ours[name] != theirs[name]:
            raise AssertionError(
                f"{where}: {name} differs\n  memlab: {ours[name]}\n  vLLM  : {theirs[name]}"
            )
