"""Every name a learner meets in memlab's SGLang classes is one they find in SGLang 0.5.23.

The wheel's source is read as text (``ast``, nothing of it runs): for each memlab class that
mirrors an SGLang class, every public name memlab's class defines (methods, properties, class
attributes, ``__slots__``, attributes set on ``self``) must be a name of the wheel's class or of
its bases. The names memlab adds of its own are listed below, each with why; a name that leaves
memlab, or that SGLang gains, must leave the list too (the list only holds names still missing).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap

import pytest

from memlab_tests.tools.engines.wheels import unpacked

pytestmark = pytest.mark.engines

MEM, SB = "sglang/srt/mem_cache/", "sglang/srt/managers/schedule_batch.py"
# memlab module -> {class: the wheel's file that holds the class it mirrors}
MIRRORS = {
    "memlab.sglang.kv_pool": {
        c: MEM + "memory_pool.py"
        for c in (
            "KVCache",
            "MHATokenToKVPool",
            "MLATokenToKVPool",
            "MHATokenToKOnlyPool",
            "DSATokenToKVPool",
        )
    },
    "memlab.sglang.allocator.base": {
        "BaseTokenToKVPoolAllocator": MEM + "allocator/base.py"
    },
    "memlab.sglang.allocator.paged": {
        "PagedTokenToKVPoolAllocator": MEM + "allocator/paged.py"
    },
    "memlab.sglang.allocator.token": {
        "TokenToKVPoolAllocator": MEM + "allocator/token.py"
    },
    "memlab.sglang.swa": {
        "SWAKVPool": MEM + "swa_memory_pool.py",
        "SWATokenToKVPoolAllocator": MEM + "allocator/swa.py",
    },
    "memlab.sglang.mamba": {
        "MambaPool": MEM + "memory_pool.py",
        "HybridReqToTokenPool": MEM + "memory_pool.py",
        "MambaSlotAllocator": MEM + "allocator/mamba.py",
    },
    "memlab.sglang.req_to_token": {
        "ReqToTokenPool": MEM + "memory_pool.py",
        "ReqKvInfo": SB,
        "Req": SB,
    },
    "memlab.sglang.radix_cache": {
        **dict.fromkeys(("RadixKey", "TreeNode", "RadixCache"), MEM + "radix_cache.py"),
        **dict.fromkeys(
            (
                "MatchPrefixParams",
                "InsertParams",
                "EvictParams",
                "MatchResult",
                "InsertResult",
                "EvictResult",
                "IncLockRefResult",
                "DecLockRefResult",
            ),
            MEM + "base_prefix_cache.py",
        ),
    },
    "memlab.sglang.unified.pool": dict.fromkeys(
        (
            "UnifiedKVPool",
            "UnifiedMHATokenToKVPool",
            "UnifiedSWAKVPool",
            "SubPoolSpec",
            "MHASubPoolSpec",
            "MLASubPoolSpec",
            "MambaSubPoolSpec",
        ),
        MEM + "unified_memory_pool.py",
    ),
    "memlab.sglang.unified.sub_pool": {
        "MultiEndedAllocator": MEM + "allocator/unified_sub_pool.py"
    },
    "memlab.sglang.unified.hybrid_swa": {
        "UnifiedSWATokenToKVPoolAllocator": MEM + "allocator/unified_hybrid_swa.py"
    },
    "memlab.sglang.write_loc": {"KVWriteLoc": MEM + "memory_pool.py"},
}

DEBUG = "memlab's debug mode (SGLang reads a flag per sub-allocator or an environment level)"
BOOKS = "memlab's debug-mode census of the books (SGLang asserts inline)"
ALIAS = "memlab's old name, kept as a deprecated alias (get_kv_size_bytes is SGLang's)"
BYTES = (
    "memlab's per-token byte count, chapter 02 (SGLang computes it in its configurator)"
)
BUFFERS = "memlab's list of the per-layer buffers, which the HiCache declaration reads"
BACKEND = "memlab's choice of Triton kernel, torch or plain-Python reference"
SWA_RING = "the ring's cost in tokens (SGLang: _swa_ring_cost / swa_ring_cost_tokens)"
# (class, name) -> why memlab has a name SGLang's class does not
MEMLAB_OWN = {
    ("KVCache", "buffer_names"): BUFFERS,
    ("KVCache", "buffers"): BUFFERS,
    ("KVCache", "bytes_per_token"): BYTES,
    (
        "KVCache",
        "get_kv_size_bytes",
    ): "SGLang's subclasses each define it; memlab's base sums the buffers",
    ("KVCache", "kv_size_bytes"): ALIAS,
    ("MHATokenToKVPool", "buffer_names"): BUFFERS,
    ("MHATokenToKVPool", "bytes_per_token"): BYTES,
    ("MLATokenToKVPool", "buffer_names"): BUFFERS,
    ("MLATokenToKVPool", "bytes_per_token"): BYTES,
    ("MHATokenToKOnlyPool", "buffer_names"): BUFFERS,
    ("MHATokenToKOnlyPool", "bytes_per_token"): BYTES,
    ("DSATokenToKVPool", "bytes_per_token"): BYTES,
    ("BaseTokenToKVPoolAllocator", "check_books"): BOOKS,
    ("BaseTokenToKVPoolAllocator", "debug_mode"): DEBUG,
    ("BaseTokenToKVPoolAllocator", "page_id_range"): "the ids a free may name, for the "
    "boundary's range check",
    ("PagedTokenToKVPoolAllocator", "backend"): BACKEND,
    ("SWAKVPool", "is_swa_layer"): "memlab's question for the pictures (SGLang reads "
    "layers_mapping)",
    ("SWAKVPool", "kv_size_bytes"): ALIAS,
    ("SWAKVPool", "swa_ring_cost"): SWA_RING,
    ("SWATokenToKVPoolAllocator", "check_books"): BOOKS,
    ("SWATokenToKVPoolAllocator", "debug_mode"): DEBUG,
    (
        "SWATokenToKVPoolAllocator",
        "page_id_range",
    ): "the full side's ids, which callers hold",
    ("SWATokenToKVPoolAllocator", "release_out_of_window"): "SGLang's "
    "free_swa_out_of_window_slots (mem_cache/common.py), one request's part, here",
    (
        "SWATokenToKVPoolAllocator",
        "ring_loc",
    ): "ring mode's SWA slot of a (row, position); "
    "SGLang computes it in its attention backend",
    ("SWATokenToKVPoolAllocator", "swa_ring_cost"): SWA_RING,
    (
        "SWATokenToKVPoolAllocator",
        "write_loc",
    ): "the batch's KVWriteLoc; SGLang's attention "
    "backend builds it (KVWriteLoc.for_batch)",
    ("MambaPool", "bytes_per_slot"): "chapter 07's per-request state bytes",
    ("MambaPool", "conv"): "SGLang keeps it in mamba_cache.conv",
    ("MambaPool", "temporal"): "SGLang keeps it in mamba_cache.temporal",
    ("MambaPool", "copy_slots"): "SGLang's copy_from, by slot lists",
    ("MambaPool", "move_slots"): "copy then clear, for a slot's whole state",
    ("MambaPool", "get_state"): "SGLang's mamba2_layer_cache(...).at_layer_idx",
    (
        "MambaPool",
        "mem_usage_bytes",
    ): "SGLang's MambaPool.mem_usage_bytes lives on the cache",
    ("HybridReqToTokenPool", "debug_mode"): DEBUG,
    (
        "HybridReqToTokenPool",
        "ensure_tracking_slots",
    ): "lazy mode's second slot; SGLang takes it in the scheduler",
    ("HybridReqToTokenPool", "execute_deferred_mamba_cow_and_clear"): "SGLang's "
    "ModelRunner._maybe_execute_deferred_mamba_cow_and_clear, run here (no forward stream)",
    ("HybridReqToTokenPool", "held_mamba_slots"): BOOKS,
    ("HybridReqToTokenPool", "mamba_extra_buffer_lazy"): "SGLang reads the server args",
    (
        "HybridReqToTokenPool",
        "mamba_last_track_seqlen",
    ): "SGLang keeps it on ReqKvInfo; memlab per row",
    ("HybridReqToTokenPool", "mamba_next_track_idx"): "SGLang keeps it on ReqKvInfo; "
    "memlab per row",
    ("HybridReqToTokenPool", "mamba_layer_index"): "SGLang's mamba_map lookup, with a "
    "named error",
    (
        "HybridReqToTokenPool",
        "next_track_slots",
    ): "the ping-pong step SGLang's scheduler takes (get_mamba_ping_pong_other_idx)",
    ("HybridReqToTokenPool", "track_state"): "the snapshot SGLang's forward takes",
    ("MambaSlotAllocator", "debug_mode"): DEBUG,
    (
        "ReqKvInfo",
        "swa_evicted_seqlen",
    ): "SGLang's get_evicted_seqlen(ComponentType.SWA)",
    ("Req", "generation"): "chapter 01's row generation, read by the pictures",
    (
        "TreeNode",
        "host_value",
    ): "transitional: None on a plain tree's node for the chapter-11 "
    "pictures; the field is HiTreeNode's",
    ("RadixCache", "check_idle"): "SGLang's scheduler's idle check, for one tree",
    ("RadixCache", "debug_mode"): DEBUG,
    ("RadixCache", "device_pages"): BOOKS,
    (
        "RadixCache",
        "num_evicted_tokens",
    ): "SGLang's eviction metric, without the collector",
    ("RadixCache", "page_aligned"): "RadixKey.page_aligned for memlab's short calls",
    (
        "RadixCache",
        "sliding_window_size",
    ): "SGLang's SWA trees keep it; memlab's one tree serves both",
    (
        "UnifiedKVPool",
        "page_size",
    ): "one page size for both sub-pools (SGLang passes it to each)",
    ("UnifiedKVPool", "reserved_floor"): "the padding sink's bytes, for the pictures",
    ("UnifiedMHATokenToKVPool", "backend"): BACKEND,
    ("UnifiedMHATokenToKVPool", "bytes_per_token"): BYTES,
    ("MultiEndedAllocator", "check_books"): BOOKS,
    (
        "MultiEndedAllocator",
        "free_page_ids_group",
    ): "the paged allocator's page-id group (memlab's base)",
    ("MultiEndedAllocator", "staged_pages"): "the paged allocator's need_sort staging "
    "(memlab's base; eager compaction stages nothing)",
    ("MultiEndedAllocator", "num_staged_pages"): "as staged_pages",
    ("MultiEndedAllocator", "page_id_range"): "the ids a free may name",
    ("MultiEndedAllocator", "used_page_range"): "eager compaction's dense run, for the "
    "pictures",
    ("UnifiedSWATokenToKVPoolAllocator", "check_books"): BOOKS,
    ("UnifiedSWATokenToKVPoolAllocator", "debug_mode"): DEBUG,
    ("UnifiedSWATokenToKVPoolAllocator", "write_loc"): "the batch's KVWriteLoc, marked "
    "physical (SGLang's KVLocPlan.bind)",
    ("KVWriteLoc", "full_ids"): "the full side's ids, loc or full_loc",
    ("KVWriteLoc", "narrow"): "a padded batch cut back to its real tokens",
}


def _names(cls_node: ast.ClassDef) -> set[str]:
    """What a class defines: methods, class attributes, ``__slots__``, dataclass fields, and
    every attribute its methods set on ``self``."""
    out = set()
    for b in cls_node.body:
        if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(b.name)
        elif isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name):
            out.add(b.target.id)
        elif isinstance(b, ast.Assign):
            for t in b.targets:
                if isinstance(t, ast.Name):
                    out.add(t.id)
                    if t.id == "__slots__" and isinstance(
                        b.value, (ast.Tuple, ast.List)
                    ):
                        out |= {
                            e.value for e in b.value.elts if isinstance(e, ast.Constant)
                        }
    for n in ast.walk(cls_node):
        targets = (
            n.targets if isinstance(n, ast.Assign) else [getattr(n, "target", None)]
        )
        for t in (
            targets if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) else ()
        ):
            for e in ast.walk(t):
                if (
                    isinstance(e, ast.Attribute)
                    and isinstance(e.value, ast.Name)
                    and e.value.id == "self"
                ):
                    out.add(e.attr)
    return out


@pytest.fixture(scope="module")
def wheel_classes() -> dict[str, list[tuple[str, ast.ClassDef]]]:
    root = unpacked("sglang")
    classes: dict[str, list] = {}
    # the mirrored classes' files and those of their bases
    files = {f for mirrors in MIRRORS.values() for f in mirrors.values()}
    files |= {MEM + "base_swa_memory_pool.py", MEM + "base_prefix_cache.py"}
    for path in sorted(root / f for f in files):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                rel = str(path.relative_to(root))
                classes.setdefault(node.name, []).append((rel, node))
    return classes


def wheel_names(classes, name: str, file: str | None = None, seen=None) -> set[str]:
    """The names of the wheel's class ``name`` (in ``file`` when given) and of its bases."""
    seen = set() if seen is None else seen
    for rel, node in classes.get(name, []):
        if file is not None and rel != file:
            continue
        out = _names(node)
        for b in node.bases:
            base = getattr(b, "id", getattr(b, "attr", None))
            if base and base not in seen:
                seen.add(base)
                out |= wheel_names(classes, base, None, seen)
        return out
    return set()


def memlab_names(cls) -> set[str]:
    node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    return {n for n in _names(node) if not n.startswith("_")}


def missing(classes, table=MIRRORS) -> dict[tuple[str, str], None]:
    out = {}
    for module, mirrors in table.items():
        mod = importlib.import_module(module)
        for cls, file in mirrors.items():
            theirs = wheel_names(classes, cls, file)
            assert theirs, f"the wheel has no class {cls} in {file}"
            for name in sorted(memlab_names(getattr(mod, cls)) - theirs):
                out[(cls, name)] = None
    return out


def test_every_mirrored_name_is_sglangs_or_listed(wheel_classes):
    gone = missing(wheel_classes)
    unlisted = sorted(set(gone) - set(MEMLAB_OWN))
    assert not unlisted, (
        f"names SGLang 0.5.23's classes do not have: rename them as SGLang does, or list them in "
        f"MEMLAB_OWN with why: {unlisted}"
    )
    stale = sorted(set(MEMLAB_OWN) - set(gone))
    assert not stale, f"these are SGLang's names now, or gone from memlab: drop {stale}"


class UnifiedMHATokenToKVPool:
    """A stand-in with memlab's old name for SGLang's get_page_envelope_buffer."""

    def page_envelopes(self):
        return None


def test_the_name_check_sees_a_name_sglang_does_not_have(wheel_classes):
    stand_in = {__name__: {"UnifiedMHATokenToKVPool": MEM + "unified_memory_pool.py"}}
    assert missing(wheel_classes, stand_in) == {
        ("UnifiedMHATokenToKVPool", "page_envelopes"): None
    }
