"""SGLang 0.5.23's unified memory pool, loaded from its published wheel on top of ``sglang_loader``.

Executed whole from the wheel: ``kernels/ops/memory/virtual_slot.py`` (the bind, unbind
and translate functions; off CUDA each takes its own pure-torch path),
``srt/mem_cache/layout/token_major.py`` (entry layouts and the strided views),
``allocator/unified_sub_pool.py`` (``MultiEndedAllocator``),
``allocator/unified_hybrid_swa.py`` (``UnifiedSWATokenToKVPoolAllocator``) and
``utils/rank_consensus_checker.py`` (a no-op decorator unless its environment variable
is set). Picked from ``unified_memory_pool.py`` (2,500 lines that import the CUDA-heavy
``memory_pool.py`` classes): the sub-pool specs, the reserved floor and
``UnifiedKVPool``.

Stubbed, each for one thing these tests do not exercise:
- ``msgspec`` (not a memlab dependency): ``token_major.py`` declares its layouts as
  ``msgspec.Struct``; here a Struct is a frozen keyword dataclass, which is all those use;
- ``runtime_context.get_memory`` / ``get_disagg``: the server's configuration bags, read by
  ``evict_to_free_tokens`` (HiCache off, no PD disaggregation), and ``attn_dcp_rank = 0``
  (decode context parallelism off);
- the re-exports of ``sglang.srt.mem_cache.allocator``'s ``__init__`` (the loader's packages are
  empty on purpose), set by hand as the real file sets them;
- placeholder classes for names used only in ``isinstance`` checks and annotations: the fused
  speculative-draft regions, the post-capture VMM buffer owner (CUDA only), and
  ``UnifiedMHATokenToKVPool`` / ``UnifiedMLATokenToKVPool`` (the real ones subclass the 6,000-line
  ``memory_pool.py`` pools; the allocator only asks whether its kvcache is one, to zero pages).

The KV pools handed to the allocators are recording stand-ins (``RecordingKVPool``): the
allocators call only ``move_physical_pages`` on them.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types

from memlab_tests.tools.engines import sglang_loader

UMP = "sglang.srt.mem_cache.unified_memory_pool"


def _msgspec_stand_in() -> None:
    class Struct:
        def __init_subclass__(cls, frozen=False, kw_only=False, **kw):
            super().__init_subclass__(**kw)
            dataclasses.dataclass(cls, frozen=frozen, kw_only=kw_only)

    sys.modules["msgspec"] = types.SimpleNamespace(
        Struct=Struct, field=dataclasses.field
    )


@functools.cache
def load() -> types.SimpleNamespace:
    base = sglang_loader.load()  # skips the test without the wheel
    L = sglang_loader._Loader(base.root)
    base.serving.parallel.attn_dcp_rank = 0
    rc = sys.modules["sglang.srt.runtime_context"]
    rc.get_memory = lambda: types.SimpleNamespace(
        enable_hierarchical_cache=False, hicache_storage_backend=None
    )
    rc.get_disagg = lambda: types.SimpleNamespace(disaggregation_mode="null")
    pkg = sys.modules["sglang.srt.mem_cache.allocator"]
    pkg.BaseTokenToKVPoolAllocator = sys.modules[
        "sglang.srt.mem_cache.allocator.base"
    ].BaseTokenToKVPoolAllocator
    pkg.PagedTokenToKVPoolAllocator = base.PagedTokenToKVPoolAllocator
    pkg.TokenToKVPoolAllocator = base.TokenToKVPoolAllocator

    vs = L.module("sglang.kernels.ops.memory.virtual_slot")
    L.module("sglang.srt.utils.rank_consensus_checker")
    L.package("sglang.srt.mem_cache.layout")
    if "msgspec" not in sys.modules:
        try:
            import msgspec  # noqa: F401
        except ImportError:
            _msgspec_stand_in()
    tm = L.module("sglang.srt.mem_cache.layout.token_major")
    placeholders = {
        n: type(n, (), {})
        for n in (
            "DenseDraftRegion",
            "DraftRegion",
            "DraftStateRegion",
            "FusedDraftPlacement",
            "KvVmmBufferOwner",
            "KvBufferDesc",
            "UnifiedMHATokenToKVPool",
            "UnifiedMLATokenToKVPool",
        )
    }
    ump = L.pick(
        UMP,
        [
            "logger",
            "GB",
            "_prod",
            "_check_row_alignment",
            "_store_dtype_for",
            "SubPoolSpec",
            "MHASubPoolSpec",
            "MLASubPoolSpec",
            "MambaSubPoolSpec",
            "_assert_physical_id_bound",
            "_reserved_floor_bytes",
            "UnifiedKVPool",
        ],
        envs=sys.modules["sglang.srt.environ"].envs,
        GPU_MEMORY_TYPE_KV_CACHE=sys.modules[
            "sglang.srt.constants"
        ].GPU_MEMORY_TYPE_KV_CACHE,
        TorchMemorySaverAdapter=sys.modules[
            "sglang.srt.utils.torch_memory_saver_adapter"
        ].TorchMemorySaverAdapter,
        **{
            n: getattr(tm, n)
            for n in (
                "ROW_ALIGN_BYTES",
                "DenseEntryLayout",
                "DensePart",
                "align_entry_bytes",
                "align_part_offset",
                "build_dense_views",
                "build_mamba_entry_views",
            )
        },
        **placeholders,
    )
    sub = L.module("sglang.srt.mem_cache.allocator.unified_sub_pool")
    hswa = L.module("sglang.srt.mem_cache.allocator.unified_hybrid_swa")
    return types.SimpleNamespace(base=base, vs=vs, ump=ump, sub=sub, hswa=hswa)


class RecordingKVPool:
    """A sub-pool's KV pool as the allocator sees it: page moves, recorded (src, dst)."""

    def __init__(self):
        self.moves = []

    def move_physical_pages(self, tgt_pages, src_pages, page_size):
        self.moves.append((src_pages.tolist(), tgt_pages.tolist()))


class RecordingSWAKV:
    """``UnifiedSWAKVPool`` as the SWA composite sees it: two sub-pools and an attach hook."""

    def __init__(self):
        self.full_kv_pool, self.swa_kv_pool = RecordingKVPool(), RecordingKVPool()

    def attach_allocators(self, *, full_allocator, swa_allocator):
        pass
