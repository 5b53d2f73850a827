"""The unified byte buffer (sglang/srt/mem_cache/unified_memory_pool.py): one uint8 buffer.

``--enable-unified-memory`` (SGLang 0.5.23) replaces the fixed split of a hybrid model's
pools (chapter 07: a full-attention pool and a sliding-window pool, each sized at
start-up) with ONE byte buffer. Every sub-pool sees the whole buffer as an array of its
own entries. An entry is one token slot holding every layer of that sub-pool,
token-major (``[K_0 | V_0 | K_1 | V_1 | ... | pad]``), so physical slot ``t`` of
sub-pool X starts at byte ``t * entry_bytes(X)`` and freeing a slot frees one contiguous
run of bytes. The sub-pools overlap as address spaces; only their allocators keep the
pages in use apart: one END grows up from byte 0, the other down from the top
(``grow_direction``), and the free band between their frontiers is what either can still
take. The buffer itself tracks nothing.

The lowest bytes are the padding sink: slot 0 of every sub-pool (where padded tokens write) lies
there, so each sub-pool's first usable slot, ``min_slot_index``, starts past ``reserved_floor``.

Where memlab is smaller: two END sub-pools only (SGLang also places a "float" sub-pool between
them for Mamba + sliding window + full attention); views for MHA sub-pools only (MLA and Mamba
specs give their entry bytes, which is all the allocators read); no virtual-memory backing after
CUDA-graph capture, no fused speculative-draft region, no NaN poisoning in debug runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch

from memlab.common import _checks
from memlab.common.utils import ceil_align, ceil_div
from memlab.sglang.kv_pool import FP8_DTYPES, MHATokenToKVPool
from memlab.sglang.page_copy import copy_pages
from memlab.sglang.swa import SWAKVPool
from memlab.sglang.write_loc import KVWriteLoc, unwrap_write_loc, write_loc_is_physical

ENTRY_ALIGN_BYTES = (
    32  # an entry (one slot, every layer) is a multiple of this (layout/token_major.py)
)
ROW_ALIGN_BYTES = (
    16  # and so is every per-layer row: the store kernels write 16-byte vectors
)


def align_entry_bytes(num_bytes: int) -> int:
    return ceil_align(num_bytes, ENTRY_ALIGN_BYTES)


@dataclass(frozen=True, kw_only=True)
class SubPoolSpec:
    """One sub-pool's slot layout: its name, layers, and which end of the buffer it grows from."""

    name: str
    layer_num: int
    grow_direction: str  # "up" (from byte 0) or "down" (from the top)

    def __post_init__(self):
        _check_sub_pool_spec(self)

    def entry_bytes(self) -> int:
        """Bytes of one slot over all ``layer_num`` layers."""
        raise NotImplementedError

    def get_dtype(self) -> torch.dtype:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class MHASubPoolSpec(SubPoolSpec):
    head_num: int
    head_dim: int
    store_dtype: torch.dtype  # uint8 for an fp8 cache, as in every KV pool (chapter 02)
    kv_cache_dtype: torch.dtype | None = (
        None  # the logical dtype (default: store_dtype)
    )
    v_head_dim: int | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.kv_cache_dtype is None:
            object.__setattr__(self, "kv_cache_dtype", self.store_dtype)
        if self.v_head_dim is None:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        _check_mha_sub_pool_spec(self)

    def k_row_bytes(self) -> int:
        return self.head_num * self.head_dim * self.store_dtype.itemsize

    def v_row_bytes(self) -> int:
        return self.head_num * self.v_head_dim * self.store_dtype.itemsize

    def entry_bytes(self) -> int:
        return align_entry_bytes(
            self.layer_num * (self.k_row_bytes() + self.v_row_bytes())
        )

    def get_dtype(self) -> torch.dtype:
        return self.store_dtype


@dataclass(frozen=True, kw_only=True)
class MLASubPoolSpec(SubPoolSpec):
    kv_lora_rank: int
    qk_rope_head_dim: int
    store_dtype: torch.dtype

    def entry_bytes(self) -> int:
        return align_entry_bytes(
            self.layer_num
            * (self.kv_lora_rank + self.qk_rope_head_dim)
            * self.store_dtype.itemsize
        )

    def get_dtype(self) -> torch.dtype:
        return self.store_dtype


@dataclass(frozen=True, kw_only=True)
class MambaSubPoolSpec(SubPoolSpec):
    """One request's recurrent state per slot (chapter 07's MambaPool rows), every layer."""

    conv_state_shapes: tuple
    conv_dtype: torch.dtype
    temporal_state_shape: tuple
    temporal_dtype: torch.dtype

    def entry_bytes(self) -> int:
        # Not aligned: SGLang keeps a Mamba entry at its raw size (a state row is read whole).
        conv = sum(prod(s) for s in self.conv_state_shapes) * self.conv_dtype.itemsize
        return self.layer_num * (
            conv + prod(self.temporal_state_shape) * self.temporal_dtype.itemsize
        )

    def get_dtype(self) -> torch.dtype:
        return self.conv_dtype


def reserved_floor_bytes(sub_pool_specs, page_size: int) -> int:
    """The padding sink at byte 0: every sub-pool's slot 0 lands here. A paged sub-pool hands out
    whole pages, so its first usable page starts past all of page 0 (``page_size`` entries); a
    Mamba sub-pool always has pages of one slot, so its entry counts once."""
    return max(
        [max(s.entry_bytes() for s in sub_pool_specs)]
        + [
            page_size * s.entry_bytes()
            for s in sub_pool_specs
            if not isinstance(s, MambaSubPoolSpec)
        ]
    )


class UnifiedKVPool:
    """One ``uint8`` buffer of ``total_bytes`` shared by an "up" and a "down" sub-pool."""

    def __init__(
        self, *, total_bytes: int, sub_pool_specs, device="cpu", page_size: int = 1
    ):
        specs = list(sub_pool_specs)
        _check_unified_kv_pool(total_bytes, specs, page_size)
        self.total_bytes, self.page_size, self.device = total_bytes, page_size, device
        # Chain order, low byte to high: the grow-up end, then the grow-down end.
        self.sub_pool_specs = sorted(specs, key=lambda s: s.grow_direction != "up")
        self._specs_by_name = {s.name: s for s in specs}
        self._reserved_floor = reserved_floor_bytes(specs, page_size)
        # unset slots read as zeros
        self._raw = torch.zeros(total_bytes, dtype=torch.uint8, device=device)
        self._max_slots, self._min_slot_index = {}, {}
        for spec in self.sub_pool_specs:
            entry_bytes = spec.entry_bytes()
            # the whole buffer, in this sub-pool's entries
            max_slots = total_bytes // entry_bytes
            min_slot_index = ceil_div(self._reserved_floor, entry_bytes)
            if max_slots <= min_slot_index:
                raise RuntimeError(
                    f"UnifiedKVPool: sub-pool {spec.name!r} fits only {max_slots} slots in "
                    f"{total_bytes} bytes, but min_slot_index={min_slot_index} leaves no room for "
                    "real data. Increase total_bytes."
                )
            self._max_slots[spec.name], self._min_slot_index[spec.name] = (
                max_slots,
                min_slot_index,
            )

    # -- introspection (all an allocator reads) ----------------------------------------------
    def spec(self, name: str) -> SubPoolSpec:
        return self._specs_by_name[name]

    def max_slots(self, name: str) -> int:
        return self._max_slots[name]

    def min_slot_index(self, name: str) -> int:
        return self._min_slot_index[name]

    @property
    def reserved_floor(self) -> int:
        return self._reserved_floor

    # -- the bytes ---------------------------------------------------------------------------
    def mha_views_for(self, name: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K and V views ``(slots, H, d)`` over the buffer's whole pages, slot stride
        ``entry_bytes``: physical slot ``t``, layer ``l`` starts at byte
        ``t * entry_bytes + l * (K row + V row)`` (K), plus one K row (V)."""
        spec = self.spec(name)
        _check_unified_row_alignment(spec, ROW_ALIGN_BYTES)
        size, typed = spec.store_dtype.itemsize, self._raw.view(spec.store_dtype)
        slots, stride = (
            self._max_slots[name] // self.page_size * self.page_size,
            spec.entry_bytes() // size,
        )
        layer, k_row = spec.k_row_bytes() + spec.v_row_bytes(), spec.k_row_bytes()
        k = [
            torch.as_strided(
                typed,
                (slots, spec.head_num, spec.head_dim),
                (stride, spec.head_dim, 1),
                l * layer // size,
            )
            for l in range(spec.layer_num)
        ]
        v = [
            torch.as_strided(
                typed,
                (slots, spec.head_num, spec.v_head_dim),
                (stride, spec.v_head_dim, 1),
                (l * layer + k_row) // size,
            )
            for l in range(spec.layer_num)
        ]
        return k, v


class UnifiedMHATokenToKVPool(MHATokenToKVPool):
    """An MHA pool whose per-layer ``k_buffer``/``v_buffer`` are views into a UnifiedKVPool,
    indexed by PHYSICAL slot. Its ids are virtual above the allocator, so its write door takes
    only a location marked physical (``requires_physical_write_loc``): an untranslated id would
    land in somebody else's bytes, and the pool cannot tell (it never translates)."""

    requires_physical_write_loc = True

    def __init__(
        self,
        *,
        unified_buffer: UnifiedKVPool,
        sub_pool_name: str,
        page_size: int = 1,
        start_layer: int | None = None,
        end_layer: int | None = None,
        backend: str = "torch",
    ):
        spec = unified_buffer.spec(sub_pool_name)
        self._unified_buffer, self._sub_pool_name, self.backend = (
            unified_buffer,
            sub_pool_name,
            backend,
        )
        self._num_pages = unified_buffer.max_slots(sub_pool_name) // page_size
        super().__init__(
            self._num_pages * page_size - page_size,
            page_size,
            spec.kv_cache_dtype,
            spec.head_num,
            spec.head_dim,
            spec.layer_num,
            unified_buffer.device,
            spec.v_head_dim,
            start_layer,
            end_layer,
        )

    def _create_buffers(self) -> None:
        self.k_buffer, self.v_buffer = self._unified_buffer.mha_views_for(
            self._sub_pool_name
        )

    @property
    def bytes_per_token(self) -> int:
        # the padding included
        return self._unified_buffer.spec(self._sub_pool_name).entry_bytes()

    def get_kv_size_bytes(self) -> tuple[int, int]:
        # the views overlap the other sub-pool's: UnifiedKVPool counts the bytes once
        return (0, 0)

    def get_page_envelope_buffer(self) -> torch.Tensor:
        """This sub-pool's pages over the shared buffer: ``(pages, page_size * entry_bytes)``
        bytes, a page's every layer in one row (SGLang's page envelope)."""
        buf = self._unified_buffer
        page_bytes = self.page_size * buf.spec(self._sub_pool_name).entry_bytes()
        return buf._raw[: self._num_pages * page_bytes].view(
            self._num_pages, page_bytes
        )

    def move_physical_pages(
        self, tgt_pages: torch.Tensor, src_pages: torch.Tensor, page_size: int
    ) -> None:
        """Copy whole page envelopes ``src_pages[i] -> tgt_pages[i]`` (disjoint: a compaction)."""
        assert page_size == self.page_size, (
            f"pages of {page_size} slots for a pool of {self.page_size}"
        )
        env = self.get_page_envelope_buffer()
        copy_pages(env, env, src_pages, tgt_pages, 1, backend=self.backend)

    def zero_physical_pages(self, phys_pages: torch.Tensor) -> None:
        """Zero pages as they are handed out: kernels that load whole pages must not read a NaN
        left behind by the other sub-pool's bytes (its state, seen through this dtype)."""
        self.get_page_envelope_buffer()[phys_pages] = 0


class UnifiedSWAKVPool(SWAKVPool):
    """Chapter 07's two-pool SWA layout over one UnifiedKVPool: sub-pools "full" and "swa"."""

    requires_physical_write_loc = True

    def __init__(
        self,
        *,
        unified_buffer: UnifiedKVPool,
        full_attention_layer_ids,
        swa_attention_layer_ids,
        page_size: int = 1,
        backend: str = "torch",
    ):
        full_ids, swa_ids = (
            list(full_attention_layer_ids),
            list(swa_attention_layer_ids),
        )
        _check_unified_swa_kv_pool(unified_buffer, full_ids, swa_ids)
        self.page_size, self.swa_req_ring_size, self.unified_buffer = (
            page_size,
            None,
            unified_buffer,
        )

        def make(name):
            return UnifiedMHATokenToKVPool(
                unified_buffer=unified_buffer,
                sub_pool_name=name,
                page_size=page_size,
                backend=backend,
            )

        self.full_kv_pool, self.swa_kv_pool = make("full"), make("swa")
        self.size, self.size_swa = self.full_kv_pool.size, self.swa_kv_pool.size
        self.layers_mapping = {lid: (i, False) for i, lid in enumerate(full_ids)}
        self.layers_mapping.update({lid: (i, True) for i, lid in enumerate(swa_ids)})
        self.dtype, self.device = self.full_kv_pool.dtype, self.full_kv_pool.device

    def set_kv_buffer(
        self, layer_id, loc, cache_k, cache_v, k_scale=None, v_scale=None
    ) -> None:
        """Never translates: hands the layer's ids, under the batch's mark, to its sub-pool, whose
        door checks the mark (SWA layers the ``swa_loc``, full layers ``full_loc`` or ``loc``)."""
        ids, swa_loc, full_loc = unwrap_write_loc(loc)
        physical = write_loc_is_physical(loc)
        pool, i, is_swa = self._layer(getattr(layer_id, "layer_id", layer_id))
        if is_swa:
            _checks.swa_write(layer_id, swa_loc)
            sub = KVWriteLoc(swa_loc, physical=physical)
        else:
            sub = KVWriteLoc(ids if full_loc is None else full_loc, physical=physical)
        pool.set_kv_buffer(i, sub, cache_k, cache_v, k_scale, v_scale)

    def get_kv_size_bytes(self) -> tuple[int, int]:
        # the UnifiedKVPool counts its bytes once (total_bytes), as SGLang's
        return (0, 0)


# -- argument checks (memlab's, at the boundary: the engine trusts its caller here) --------------


def _check_sub_pool_spec(spec) -> None:
    _checks.instance("name", spec.name, str, "a sub-pool's name (a str)")
    _checks.positive_ints(layer_num=spec.layer_num)
    # one END at each end of the buffer; SGLang's float middle pool is not in memlab
    if spec.grow_direction not in ("up", "down"):
        raise ValueError(
            f"{spec.name!r}: grow_direction {spec.grow_direction!r}: 'up' or 'down'"
        )


def _check_mha_sub_pool_spec(spec) -> None:
    _checks.positive_ints(head_num=spec.head_num, head_dim=spec.head_dim)
    _checks.positive_ints(v_head_dim=spec.v_head_dim)
    want = torch.uint8 if spec.kv_cache_dtype in FP8_DTYPES else spec.kv_cache_dtype
    if spec.store_dtype != want:
        raise ValueError(
            f"{spec.name!r}: a {spec.kv_cache_dtype} cache is stored as {want}"
        )


def _check_unified_kv_pool(total_bytes, specs: list, page_size) -> None:
    _checks.integer("total_bytes", total_bytes, 1)
    _checks.integer("page_size", page_size, 1)
    names = [getattr(s, "name", None) for s in specs]
    if len(set(names)) != len(specs):
        raise ValueError(f"sub-pool names must be unique, got {names}")
    directions = sorted(getattr(s, "grow_direction", None) for s in specs)
    if directions != ["down", "up"]:
        raise ValueError(
            f"a UnifiedKVPool needs one 'up' and one 'down' sub-pool: {directions}"
        )


def _check_unified_row_alignment(spec, align: int) -> None:
    """Rows of whole 16-byte vectors; a model with others runs without --enable-unified-memory."""
    for part, nbytes in (("K", spec.k_row_bytes()), ("V", spec.v_row_bytes())):
        if nbytes % align:
            raise ValueError(
                f"{spec.name!r}: a {nbytes}-byte {part} row, not {align}-aligned "
                "(run such a model without --enable-unified-memory)"
            )


def _check_unified_swa_kv_pool(buffer, full_ids: list, swa_ids: list) -> None:
    _checks.swa_kv_pool(full_ids, swa_ids, 0, None, None)
    for name, ids in (("full", full_ids), ("swa", swa_ids)):
        spec = buffer._specs_by_name.get(name)
        if spec is None or not hasattr(spec, "head_num"):
            raise ValueError(f"a UnifiedSWAKVPool needs an MHA sub-pool named {name!r}")
        if spec.layer_num != len(ids):
            raise ValueError(
                f"sub-pool {name!r} holds {spec.layer_num} layers, not {len(ids)}"
            )
