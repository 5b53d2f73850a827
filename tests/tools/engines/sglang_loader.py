"""SGLang 0.5.23's memory books, loaded from its published wheel for the differential tests.

Only what the tests drive is executed, each line from the wheel's own files:

- whole modules: the allocators (``mem_cache/allocator/{base,token,paged,swa,mamba}.py``), their
  Triton kernels (``kernels/ops/memory/allocator.py``), the radix tree
  (``mem_cache/{radix_cache,base_prefix_cache,evict_policy,cache_init_params}.py``), the
  env-var registry (``environ.py``) and small modules those import (``constants.py``,
  ``utils/invariants.py``, ``utils/torch_memory_saver_adapter.py``,
  ``configs/mamba_utils.py``,
  ``mem_cache/{base_swa_memory_pool,ple_state_pool,mamba_checkpoint_pool}.py``,
  ``mem_cache/unified_cache/component_type.py``);
- named definitions only, from files too heavy to import whole (``memory_pool.py``: 6,000 lines
  that import CUDA kernels and model layers; ``utils/common.py``: a web stack; the scheduler's
  ``schedule_batch.py``...): ``ReqToTokenPool``, ``MambaPool``, ``HybridReqToTokenPool``,
  ``KVWriteLoc``, ``SWAKVPool``, ``free_swa_out_of_window_slots``, the request's lifecycle around
  the tree (``common.checkpoint_kv_cache``, ``release_kv_cache``, ``free_kv_row_segments``...),
  ``get_num_new_pages``, the decode sizing rules, ``ScheduleBatch``'s decode demand, retraction
  order and deferred Mamba clears (as functions)...
  Each is compiled from the wheel's source; nothing is retyped here.

The rest are a few stubs, each standing for one thing the tests do not exercise (the platform
registry, the server's configuration bags, placeholders for KV buffer classes never built, the
tree's KV-event recorder and metrics, both off). ``RadixCache`` reads ``time.monotonic()`` for
its LRU order; the loader gives its module a clock that ticks once per call, so both trees see
the same order of events (memlab's tree keeps a counter for the same reason).
Packages get an empty ``__path__``: a module this file does not load cannot be imported by
accident; the wheel code would fail with ModuleNotFoundError naming it, which is the message to
extend this file by.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import itertools
import sys
import time
import types
from pathlib import Path

import pytest

from memlab_tests.tools.engines.wheels import unpacked

_ROOTS_OK = {"torch", "triton", "numpy"} | set(sys.stdlib_module_names)
_MARK = "__memlab_loaded_from__"


class _Platform:
    """Stands for ``sglang.srt.platforms.current_platform``: a CUDA-like platform whose paged
    allocator is SGLang's own. Whether the allocators use their Triton kernels is chosen per
    instance by the tests (``use_triton_kernels``), so both backends run."""

    class capabilities:
        supports_triton = False

    @staticmethod
    def get_paged_allocator_cls():
        return None

    @staticmethod
    def is_pin_memory_available(device=None) -> bool:
        return False

    @staticmethod
    def synchronize() -> None:
        pass


class TickClock:
    """time.monotonic that advances by one per call; perf_counter stays real."""

    def __init__(self):
        self._t = itertools.count(1)

    def monotonic(self) -> float:
        return float(next(self._t))

    @staticmethod
    def perf_counter() -> float:
        return time.perf_counter()


def _no_server_context():
    # SGLang's own unit-test path: no global server-args context, so opt-in pools stay off.
    raise ValueError("no server-args context in memlab's differential tests")


class _Loader:
    def __init__(self, root: Path):
        self.root = root

    def package(self, name: str) -> types.ModuleType:
        mod = sys.modules.get(name)
        if mod is None:
            mod = types.ModuleType(name)
            mod.__path__ = []  # no finder may look inside: only what this file loads exists
            setattr(mod, _MARK, str(self.root))
            self.register(name, mod)
        return mod

    def register(self, name: str, mod: types.ModuleType) -> types.ModuleType:
        sys.modules[name] = mod
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(self.package(parent), leaf, mod)
        return mod

    def path(self, name: str) -> Path:
        return self.root / (name.replace(".", "/") + ".py")

    def module(self, name: str) -> types.ModuleType:
        """Execute the wheel's file for ``name`` as that module."""
        spec = importlib.util.spec_from_file_location(name, self.path(name))
        mod = importlib.util.module_from_spec(spec)
        self.register(name, mod)
        spec.loader.exec_module(mod)
        return mod

    def stub(self, name: str, **attrs) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        return self.register(name, mod)

    def pick(
        self, name: str, names, source: str | None = None, **provided
    ) -> types.ModuleType:
        """A module holding only ``names`` (top-level defs, classes, assignments, or
        ``Class.method`` as a plain function under the method's name) of a wheel file.

        Kept besides them: ``from __future__`` and the file's imports of the standard library,
        torch, triton and numpy. ``provided`` fills in the other names they refer to.
        """
        path = self.path(source or name)
        tree = ast.parse(path.read_text(), str(path))
        wanted, keep = set(names), []
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                if node.__class__ is ast.ImportFrom and node.level:
                    continue
                if all(m.split(".")[0] in _ROOTS_OK for m in mods):
                    keep.append(node)
            elif (
                isinstance(node, (ast.FunctionDef, ast.ClassDef))
                and node.name in wanted
            ):
                keep.append(node)
                wanted.discard(node.name)
            # "Class.method": the method alone, as a function
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if (
                        isinstance(item, ast.FunctionDef)
                        and f"{node.name}.{item.name}" in wanted
                    ):
                        item.decorator_list = [
                            d
                            for d in item.decorator_list
                            if not (isinstance(d, ast.Name) and d.id == "staticmethod")
                        ]
                        keep.append(item)
                        wanted.discard(f"{node.name}.{item.name}")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = (
                    node.targets if isinstance(node, ast.Assign) else [node.target]
                )
                hit = {t.id for t in targets if isinstance(t, ast.Name)} & wanted
                if hit:
                    keep.append(node)
                    wanted -= hit
        if wanted:
            raise LookupError(
                f"{path} has no top-level {sorted(wanted)}: the wheel changed"
            )
        mod = types.ModuleType(name)
        mod.__file__ = str(path)
        mod.__dict__.update(provided)
        self.register(name, mod)
        exec(
            compile(
                ast.Module(keep, type_ignores=[]), str(path), "exec", dont_inherit=True
            ),
            mod.__dict__,
        )
        return mod


@functools.cache
def load() -> types.SimpleNamespace:
    """The SGLang classes and functions the tests compare with memlab (skips without the wheel)."""
    root = unpacked("sglang")
    have = sys.modules.get("sglang")
    if have is not None and getattr(have, _MARK, None) != str(root):
        pytest.skip(
            "another sglang is already imported in this process; run the engines tests on their own"
        )
    L = _Loader(root)
    for pkg in (
        "sglang",
        "sglang.srt",
        "sglang.srt.mem_cache",
        "sglang.srt.mem_cache.allocator",
        "sglang.srt.utils",
        "sglang.srt.configs",
        "sglang.srt.managers",
        "sglang.srt.distributed",
        "sglang.kernels",
        "sglang.kernels.ops",
        "sglang.kernels.ops.memory",
    ):
        L.package(pkg)

    # Leaves: what the allocators and pools import.
    L.stub("sglang.srt.platforms", current_platform=_Platform())
    # The server's configuration bags: the sizing tests set these before asking.
    serving = types.SimpleNamespace(
        spec=types.SimpleNamespace(
            speculative_algorithm=None,
            speculative_num_steps=None,
            speculative_eagle_topk=None,
            speculative_num_draft_tokens=None,
            max_speculative_num_draft_tokens=None,
        ),
        schedule=types.SimpleNamespace(page_size=1, retraction_policy="length"),
        parallel=types.SimpleNamespace(attn_dcp_size=1),
    )
    L.pick(
        "sglang.srt.runtime_context",
        ["max_speculative_num_draft_tokens"],
        get_exec=_no_server_context,
        get_spec=lambda: serving.spec,
        get_schedule=lambda: serving.schedule,
        get_parallel=lambda: serving.parallel,
        get_observability=lambda: None,
        get_serving=lambda: types.SimpleNamespace(strip_thinking_cache=False),
    )
    L.module("sglang.srt.environ")
    L.module("sglang.srt.constants")
    common = L.pick(
        "sglang.srt.utils.common",
        [
            "logger",
            "_warned_bool_env_var_keys",
            "get_bool_env_var",
            "get_num_new_pages",
            "next_power_of_2",
            "ceil_div",
            "ceil_align",
            "async_h2d",
            "is_pin_memory_available",
            "is_confidential_compute",
            "is_hip",
            "is_npu",
            "is_cuda",
            "is_xpu",
            "is_cpu",
            "is_host_cpu_x86",
            "is_host_cpu_arm64",
        ],
        envs=sys.modules["sglang.srt.environ"].envs,
        current_platform=_Platform(),
    )
    utils = sys.modules["sglang.srt.utils"]
    utils.__dict__.update(
        {k: v for k, v in vars(common).items() if not k.startswith("__")}
    )
    # AMX kernels are a CPU-engine option, off here
    utils.cpu_has_amx_support = lambda: False
    L.module("sglang.srt.utils.invariants")
    L.module("sglang.srt.utils.torch_memory_saver_adapter")
    L.pick("sglang.srt.distributed.utils", ["ensure_divisibility", "divide"])
    L.module("sglang.srt.configs.mamba_utils")
    policy = L.module("sglang.srt.mem_cache.evict_policy")
    L.pick(
        "sglang.srt.mem_cache.utils",
        [
            "maybe_init_custom_mem_pool",
            "_EVICTION_POLICY_FACTORIES",
            "get_eviction_strategy",
            "split_node_hash_value",
        ],
        envs=common.envs,
        **{n: getattr(policy, n) for n in dir(policy) if n.endswith("Strategy")},
    )
    L.package("sglang.srt.speculative")
    # plugin algorithms: none registered here
    L.pick(
        "sglang.srt.speculative.spec_info",
        ["SpeculativeAlgorithm"],
        CustomSpecAlgo=type("CustomSpecAlgo", (), {}),
    )
    rc = sys.modules["sglang.srt.runtime_context"]
    sizing = L.pick(
        "sglang.srt.mem_cache.allocation_sizing",
        [
            "get_mamba_tracking_slots",
            "get_alloc_page_size",
            "get_alloc_len_per_decode",
            "get_alloc_reserve_per_decode",
            "get_req_to_token_extra_context_len",
        ],
        get_spec=rc.get_spec,
        get_schedule=rc.get_schedule,
        get_parallel=rc.get_parallel,
        max_speculative_num_draft_tokens=rc.max_speculative_num_draft_tokens,
    )

    # The allocators and their kernels.
    L.module("sglang.kernels.ops.memory.allocator")
    L.module("sglang.srt.mem_cache.allocator.base")
    L.module("sglang.srt.mem_cache.allocator.token")
    L.module("sglang.srt.mem_cache.allocator.paged")
    L.module("sglang.srt.mem_cache.allocator.mamba")

    # The pools: only their classes, from the 6,000-line memory_pool.py.
    from sglang.srt.constants import GPU_MEMORY_TYPE_KV_CACHE
    from sglang.srt.mem_cache.allocation_sizing import get_mamba_tracking_slots
    from sglang.srt.mem_cache.allocator.mamba import MambaSlotAllocator
    from sglang.srt.mem_cache.utils import maybe_init_custom_mem_pool
    from sglang.srt.utils.torch_memory_saver_adapter import TorchMemorySaverAdapter

    mp = L.pick(
        "sglang.srt.mem_cache.memory_pool",
        [
            "logger",
            "_MAMBA_DEBUG_ASSERTS",
            "GB",
            "_is_cuda",
            "_is_npu",
            "_is_cpu",
            "_cpu_has_amx_support",
            "conv_window_dedup_enabled",
            "get_tensor_size_bytes",
            "ReqToTokenPool",
            "MambaPool",
            "HybridReqToTokenPool",
            "KVWriteLoc",
            "unwrap_write_loc",
            "write_loc_is_physical",
            "KVCache",
        ],
        envs=common.envs,
        is_cuda=common.is_cuda,
        is_npu=common.is_npu,
        is_cpu=common.is_cpu,
        cpu_has_amx_support=utils.cpu_has_amx_support,
        current_platform=_Platform(),
        async_h2d=common.async_h2d,
        TorchMemorySaverAdapter=TorchMemorySaverAdapter,
        GPU_MEMORY_TYPE_KV_CACHE=GPU_MEMORY_TYPE_KV_CACHE,
        get_mamba_tracking_slots=get_mamba_tracking_slots,
        MambaSlotAllocator=MambaSlotAllocator,
        maybe_init_custom_mem_pool=maybe_init_custom_mem_pool,
    )
    L.module("sglang.srt.mem_cache.ple_state_pool")
    L.module("sglang.srt.mem_cache.mamba_checkpoint_pool")
    L.module("sglang.srt.mem_cache.base_swa_memory_pool")
    # SWAKVPool only: its sub-pools (MHA/MLA/DSA buffers) are never built here, the tests hand it
    # recording stand-ins, so those names are bare placeholders.
    swa_pool = L.pick(
        "sglang.srt.mem_cache.swa_memory_pool",
        ["logger", "SWAKVPool"],
        unwrap_write_loc=mp.unwrap_write_loc,
        KVCache=mp.KVCache,
        BaseSWAKVPool=sys.modules[
            "sglang.srt.mem_cache.base_swa_memory_pool"
        ].BaseSWAKVPool,
        **{
            n: type(n, (), {})
            for n in (
                "MHATokenToKVPool",
                "MLATokenToKVPool",
                "DSATokenToKVPool",
                "RadixAttention",
            )
        },
    )
    L.module("sglang.srt.mem_cache.allocator.swa")
    # beam search is not modelled
    sb = L.pick(
        "sglang.srt.managers.schedule_batch",
        [
            "ReqKvInfo",
            "ScheduleBatch.new_tokens_required_next_decode",
            "ScheduleBatch._new_tokens_required_next_decode_spec_v2",
            "ScheduleBatch._get_decode_retraction_order",
            "ScheduleBatch._collect_deferred_mamba_cow_and_clear",
            "Req.finished",
            "Req.refresh_fill_ids",
            "Req.owned_kv_len",
            "Req.reset_for_retract",
            "ScheduleBatch.check_decode_mem",
        ],
        ceil_align=common.ceil_align,
        get_schedule=rc.get_schedule,
        get_serving=rc.get_serving,
        get_alloc_reserve_per_decode=sizing.get_alloc_reserve_per_decode,
        num_beam_member_rows=lambda reqs: 0,
    )

    L.package("sglang.srt.mem_cache.unified_cache")
    ct = L.module("sglang.srt.mem_cache.unified_cache.component_type")

    # The radix tree, with KV events and metrics stubbed (off in SGLang by default too).
    sys.modules[
        "sglang.srt.mem_cache.allocator"
    ].BaseTokenToKVPoolAllocator = sys.modules[
        "sglang.srt.mem_cache.allocator.base"
    ].BaseTokenToKVPoolAllocator

    class _Recorder:  # events disabled: every record_* is a no-op
        def __init__(self, **kw):
            pass

        def __getattr__(self, name):
            return lambda *a, **k: None

    L.stub(
        "sglang.srt.mem_cache.events",
        KVCacheEventRecorder=_Recorder,
        LoRANameTable=type("LoRANameTable", (), {}),
        KvEventLoraNames=type("KvEventLoraNames", (), {}),
    )
    L.package("sglang.srt.observability")
    L.stub(
        "sglang.srt.observability.metrics_collector",
        STAT_LOGGER_ROLE_RADIX_CACHE="radix_cache",
        RadixCacheMetricsCollector=type("RadixCacheMetricsCollector", (), {}),
        radix_cache_metric_labels=lambda *a, **k: {},
        resolve_collector_class=lambda *a, **k: None,
    )
    cip = L.module("sglang.srt.mem_cache.cache_init_params")
    bpc = L.module("sglang.srt.mem_cache.base_prefix_cache")
    radix = L.module("sglang.srt.mem_cache.radix_cache")
    radix.time = TickClock()
    # page sharding (DCP) is not modelled
    mc = L.pick(
        "sglang.srt.mem_cache.common",
        [
            "logger",
            "free_swa_out_of_window_slots",
            "coalesce_ranges",
            "free_kv_row_segments",
            "checkpoint_kv_cache",
            "evict_from_tree_cache",
            "release_kv_cache",
            "_release_overallocated_kv_indices",
            "_evict_until_allocatable",
        ],
        ceil_align=common.ceil_align,
        ComponentType=ct.ComponentType,
        get_spec=rc.get_spec,
        get_serving=rc.get_serving,
        EvictParams=bpc.EvictParams,
        EvictResult=bpc.EvictResult,
        page_interleave_shard_size=lambda allocator: 1,
    )

    from sglang.kernels.ops.memory import allocator as kernels
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    return types.SimpleNamespace(
        root=root,
        PagedTokenToKVPoolAllocator=PagedTokenToKVPoolAllocator,
        TokenToKVPoolAllocator=TokenToKVPoolAllocator,
        SWATokenToKVPoolAllocator=SWATokenToKVPoolAllocator,
        SWAKVPool=swa_pool.SWAKVPool,
        ReqToTokenPool=mp.ReqToTokenPool,
        MambaPool=mp.MambaPool,
        HybridReqToTokenPool=mp.HybridReqToTokenPool,
        MambaSlotAllocator=MambaSlotAllocator,
        KVWriteLoc=mp.KVWriteLoc,
        ReqKvInfo=sb.ReqKvInfo,
        Mamba2CacheParams=Mamba2CacheParams,
        Mamba2StateShape=Mamba2StateShape,
        get_mamba_tracking_slots=get_mamba_tracking_slots,
        get_num_new_pages=common.get_num_new_pages,
        kernels=kernels,
        free_swa_out_of_window_slots=mc.free_swa_out_of_window_slots,
        ComponentType=ct.ComponentType,
        serving=serving,
        sizing=sizing,
        schedule_batch=sb,
        RadixCache=radix.RadixCache,
        radix_cache=radix,
        base_prefix_cache=bpc,
        CacheInitParams=cip.CacheInitParams,
        common=mc,
    )
