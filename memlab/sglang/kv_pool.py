"""The KV stores, slot -> bytes: the ``KVCache`` family of sglang/srt/mem_cache/memory_pool.py.

One tensor per layer, ``size + page_size`` rows: the allocators hand out the slots of pages
1..size // page_size (slots page_size .. size + page_size - 1), and the first page (slot 0 and its
neighbours) absorbs writes of padded tokens. A pool holds only the layers
``start_layer..end_layer`` of a pipeline stage, indexed by ``layer_id - start_layer``.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch

from memlab.common import _checks
from memlab.common.env import resolve_device

# The bytes-per-token formulas both engines share (chapter 02), written once in common.models;
# imported here too, so ``from memlab.sglang.kv_pool import mha_bytes_per_token`` keeps working.
from memlab.common.models import (
    DSA_QUANT_BLOCK,
    dsa_index_bytes_per_token,
    mha_bytes_per_token,
    mla_bytes_per_token,
)

FP8_DTYPES = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, n)
)


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def total_kv_size_bytes(pool) -> int:
    """A pool's ``get_kv_size_bytes()`` as one number; behind the deprecated ``kv_size_bytes()``."""
    warnings.warn(
        "kv_size_bytes() is memlab's old name: call get_kv_size_bytes() (SGLang's: a "
        "(K bytes, V bytes) pair for pools with keys and values, one int for MLA)",
        DeprecationWarning,
        stacklevel=3,
    )
    size = pool.get_kv_size_bytes()
    return sum(size) if isinstance(size, tuple) else size


class BufferDecl(NamedTuple):
    name: str  # the pool's attribute holding one tensor per layer ("k_buffer", ...)
    row_shape: tuple  # the shape of one token's row in one layer
    dtype: torch.dtype  # the stored dtype (uint8 for fp8 pools)


class HostPoolDecl(NamedTuple):
    """One host pool a device pool asks HiCache to keep (SGLang's ``HostPoolDecl``, chapter 11)."""

    pool_name: str
    device_pool: object
    layer_num: int
    buffers: tuple  # BufferDecl per per-layer buffer of the device pool


class KVCache:
    """What every pool shares: sizes, layer range, and the stored vs. logical dtype."""

    # SGLang's unified pools set this: their ids are virtual, so their write doors take only a
    # KVWriteLoc marked physical. memlab's pools hold physical ids by allocation.
    requires_physical_write_loc = False

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        layer_num: int,
        device="cpu",
        start_layer: int | None = None,
        end_layer: int | None = None,
    ):
        _check_kv_cache(size, page_size, dtype, layer_num, start_layer, end_layer)
        start_layer = 0 if start_layer is None else start_layer
        end_layer = start_layer + layer_num - 1 if end_layer is None else end_layer
        self.size, self.page_size, self.layer_num = size, page_size, layer_num
        self.device = resolve_device(device)
        self.dtype = dtype
        # index_put (buffer[loc] = x) has no fp8 implementation: store fp8 as raw bytes.
        self.store_dtype = torch.uint8 if dtype in FP8_DTYPES else dtype
        self.start_layer, self.end_layer = start_layer, end_layer

    def _write_ids(self, loc) -> torch.Tensor:
        """The slots a write goes to. A KVWriteLoc (chapters 07 to 09) is read by its generic ids
        ``loc`` (read by its field, so this chapter-02 module imports no later one); a pool with
        virtual ids takes only one marked physical."""
        if self.requires_physical_write_loc:
            _checks.physical_write_loc(loc, f"{type(self).__name__}.set_kv_buffer")
        return loc if isinstance(loc, torch.Tensor) else getattr(loc, "loc", loc)

    def _local(self, layer_id: int) -> int:
        _check_layer_id(self, layer_id)
        return layer_id - self.start_layer

    def _view(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(self.dtype) if self.store_dtype != self.dtype else t

    def _store(self, x: torch.Tensor, scale) -> torch.Tensor:
        if scale is not None:
            x = x / scale
        x = x.to(self.dtype)
        return x.view(self.store_dtype) if self.store_dtype != self.dtype else x

    buffer_names: tuple = ()  # the attributes holding one tensor per layer

    def buffers(self) -> list[torch.Tensor]:
        return [t for name in self.buffer_names for t in getattr(self, name)]

    def host_pool_decls(self) -> tuple:
        """What a host tier must mirror (HiCache, chapter 11): per layer, one host tensor for each
        of this pool's buffers, with the same row shape and stored dtype."""
        buffers = tuple(
            BufferDecl(name, tuple(getattr(self, name)[0].shape[1:]), self.store_dtype)
            for name in self.buffer_names
        )
        return (HostPoolDecl("kv", self, self.layer_num, buffers),)

    def get_kv_size_bytes(self):
        """Bytes the pool's tensors really hold (padding page included), as SGLang 0.5.23 reports
        them: a ``(K bytes, V bytes)`` pair for a pool with keys and values, one int for a latent
        (MLA) pool."""
        return sum(t.nbytes for t in self.buffers())

    def kv_size_bytes(self) -> int:
        """Deprecated, memlab's old name: the total of ``get_kv_size_bytes()``."""
        return total_kv_size_bytes(self)

    @property
    def bytes_per_token(self) -> int:
        raise NotImplementedError


class MHATokenToKVPool(KVCache):
    """Separate K ``(rows, H, d)`` and V ``(rows, H, d_v)`` per layer."""

    buffer_names = ("k_buffer", "v_buffer")

    def __init__(
        self,
        size,
        page_size,
        dtype,
        head_num,
        head_dim,
        layer_num,
        device="cpu",
        v_head_dim=None,
        start_layer=None,
        end_layer=None,
    ):
        super().__init__(
            size, page_size, dtype, layer_num, device, start_layer, end_layer
        )
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        _checks.positive_ints(
            head_num=head_num, head_dim=head_dim, v_head_dim=v_head_dim
        )
        self.head_num, self.head_dim, self.v_head_dim = head_num, head_dim, v_head_dim
        self._create_buffers()

    def _create_buffers(self) -> None:
        """One K and one V tensor per layer (the unified pool's subclass puts views here)."""
        rows, z = (
            self.size + self.page_size,
            dict(dtype=self.store_dtype, device=self.device),
        )
        self.k_buffer = [
            torch.zeros((rows, self.head_num, self.head_dim), **z)
            for _ in range(self.layer_num)
        ]
        self.v_buffer = [
            torch.zeros((rows, self.head_num, self.v_head_dim), **z)
            for _ in range(self.layer_num)
        ]

    @property
    def bytes_per_token(self) -> int:
        return mha_bytes_per_token(
            self.layer_num,
            self.head_num,
            self.head_dim,
            self.v_head_dim,
            dtype_bytes(self.store_dtype),
        )

    def get_kv_size_bytes(self) -> tuple[int, int]:
        return (
            sum(t.nbytes for t in self.k_buffer),
            sum(t.nbytes for t in self.v_buffer),
        )

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.k_buffer[self._local(layer_id)])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.v_buffer[self._local(layer_id)])

    def get_kv_buffer(self, layer_id: int):
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(
        self, layer_id, loc, cache_k, cache_v, k_scale=None, v_scale=None
    ) -> None:
        """Write the K/V of ``len(loc)`` tokens into slots ``loc`` (divided by scales if given)."""
        i = self._local(getattr(layer_id, "layer_id", layer_id))
        loc = self._write_ids(loc)
        _check_kv_write(
            self,
            loc,
            cache_k=(cache_k, (self.head_num, self.head_dim), "head_num, head_dim"),
            cache_v=(cache_v, (self.head_num, self.v_head_dim), "head_num, v_head_dim"),
        )
        self.k_buffer[i][loc] = self._store(cache_k, k_scale)
        self.v_buffer[i][loc] = self._store(cache_v, v_scale)


class MLATokenToKVPool(KVCache):
    """One latent buffer ``(rows, 1, r + d_r)`` per layer; "V" is a view of its first r columns."""

    buffer_names = ("kv_buffer",)

    def __init__(
        self,
        size,
        page_size,
        dtype,
        kv_lora_rank,
        qk_rope_head_dim,
        layer_num,
        device="cpu",
        start_layer=None,
        end_layer=None,
    ):
        super().__init__(
            size, page_size, dtype, layer_num, device, start_layer, end_layer
        )
        _checks.positive_ints(
            kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim
        )
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        self.kv_buffer = [
            torch.zeros(
                (size + page_size, 1, self.kv_cache_dim),
                dtype=self.store_dtype,
                device=self.device,
            )
            for _ in range(layer_num)
        ]

    @property
    def bytes_per_token(self) -> int:
        return mla_bytes_per_token(
            self.layer_num,
            self.kv_lora_rank,
            self.qk_rope_head_dim,
            dtype_bytes(self.store_dtype),
        )

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.kv_buffer[self._local(layer_id)])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.get_key_buffer(layer_id)[..., : self.kv_lora_rank]

    def get_kv_buffer(self, layer_id: int):
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(
        self, layer_id, loc, cache_k, cache_v=None, k_scale=None, v_scale=None
    ) -> None:
        """Write latent vectors ``cache_k`` (tokens, 1, r + d_r); there is no V to write apart."""
        i = self._local(getattr(layer_id, "layer_id", layer_id))
        loc = self._write_ids(loc)
        _check_kv_write(
            self,
            loc,
            cache_k=(
                cache_k,
                (1, self.kv_cache_dim),
                "1, kv_lora_rank + qk_rope_head_dim",
            ),
        )
        self.kv_buffer[i][loc] = self._store(cache_k, k_scale)


class MHATokenToKOnlyPool(KVCache):
    """K without V, ``(rows, H, d)`` per layer: SGLang's pool for the index branch of MiniMax's
    sparse layers, which never reads V (``sparse_disable_index_value``); a V tensor would be
    memory nobody reads. Writes go through ``set_k_buffer``."""

    buffer_names = ("k_buffer",)

    def __init__(
        self,
        size,
        page_size,
        dtype,
        head_num,
        head_dim,
        layer_num,
        device="cpu",
        start_layer=None,
        end_layer=None,
    ):
        super().__init__(
            size, page_size, dtype, layer_num, device, start_layer, end_layer
        )
        _checks.positive_ints(head_num=head_num, head_dim=head_dim)
        self.head_num, self.head_dim = head_num, head_dim
        self.k_buffer = [
            torch.zeros(
                (size + page_size, head_num, head_dim),
                dtype=self.store_dtype,
                device=self.device,
            )
            for _ in range(layer_num)
        ]

    @property
    def bytes_per_token(self) -> int:
        return (
            self.layer_num
            * self.head_num
            * self.head_dim
            * dtype_bytes(self.store_dtype)
        )

    def get_kv_size_bytes(self) -> tuple[int, int]:
        return sum(t.nbytes for t in self.k_buffer), 0

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.k_buffer[self._local(layer_id)])

    def set_k_buffer(self, layer_id, loc, cache_k, k_scale=None) -> None:
        i = self._local(getattr(layer_id, "layer_id", layer_id))
        loc = self._write_ids(loc)
        _check_kv_write(
            self,
            loc,
            cache_k=(cache_k, (self.head_num, self.head_dim), "head_num, head_dim"),
        )
        self.k_buffer[i][loc] = self._store(cache_k, k_scale)

    def get_value_buffer(self, layer_id: int):
        raise NotImplementedError("MHATokenToKOnlyPool does not allocate V")

    def get_kv_buffer(self, layer_id: int):
        raise NotImplementedError("MHATokenToKOnlyPool does not allocate V")

    def set_kv_buffer(self, *args, **kwargs) -> None:
        raise NotImplementedError(
            "MHATokenToKOnlyPool stores no V: write keys with set_k_buffer"
        )


class DSATokenToKVPool(MLATokenToKVPool):
    """The MLA latent plus the DeepSeek sparse-attention indexer's keys (DeepSeek-V3.2).

    The indexer scores every cached token for each query and picks the top-k the attention then
    reads; for that it keeps its own small key per token and layer, in fp8 with an fp32 scale per
    128 values. Its buffer is page-major, ``(pages, page_size * (d_idx + d_idx / 128 * 4))`` bytes
    per layer: within a page, all the fp8 keys first, then all the scales.
    """

    index_k_with_scale_buffer_dtype = torch.uint8

    def __init__(
        self,
        size,
        page_size,
        dtype,
        kv_lora_rank,
        qk_rope_head_dim,
        layer_num,
        device="cpu",
        index_head_dim: int = 128,
        start_layer=None,
        end_layer=None,
    ):
        super().__init__(
            size,
            page_size,
            dtype,
            kv_lora_rank,
            qk_rope_head_dim,
            layer_num,
            device,
            start_layer,
            end_layer,
        )
        _check_dsa_index_head_dim(index_head_dim)
        self.index_head_dim = index_head_dim
        # SGLang's IndexKeyCache: the padding page, rounded
        num_pages = (size + page_size + 1) // page_size
        row = page_size * (index_head_dim + index_head_dim // DSA_QUANT_BLOCK * 4)
        self.index_k_with_scale_buffer = [
            torch.zeros(
                (num_pages, row),
                dtype=self.index_k_with_scale_buffer_dtype,
                device=self.device,
            )
            for _ in range(layer_num)
        ]

    @property
    def bytes_per_token(self) -> int:
        return super().bytes_per_token + dsa_index_bytes_per_token(
            self.layer_num, self.index_head_dim
        )

    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        return self.index_k_with_scale_buffer[self._local(layer_id)]

    def get_kv_size_bytes(self) -> int:
        return super().get_kv_size_bytes() + sum(
            t.nbytes for t in self.index_k_with_scale_buffer
        )

    def host_pool_decls(self) -> tuple:
        raise NotImplementedError(
            "memlab's HiCache (chapter 11) mirrors MHA and MLA pools; SGLang declares the "
            "indexer keys as a pool of their own (pool_host/dsa.py), memlab does not"
        )


# -- argument checks (memlab's, at the boundary: the engine trusts its caller here) --------------

# What set_kv_buffer casts to the pool's dtype, as SGLang does (an fp8 pool is written
# from bf16/fp32 K/V)
KV_INPUT_DTYPES = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
) + FP8_DTYPES
# a bound far above any model (DeepSeek V3: 61 layers): the buffers are built one per layer
MAX_LAYERS = 4096


def _check_kv_cache(size, page_size, dtype, layer_num, start_layer, end_layer) -> None:
    _checks.integer("size", size, 1, _checks.INT32_MAX)
    _checks.integer("page_size", page_size, 1, _checks.INT32_MAX)
    _checks.integer("layer_num", layer_num, 1, MAX_LAYERS)
    start_layer = (
        0 if start_layer is None else _checks.integer("start_layer", start_layer)
    )
    end_layer = (
        start_layer + layer_num - 1
        if end_layer is None
        else _checks.integer("end_layer", end_layer)
    )
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(
            f"a KV pool stores floating-point K/V: dtype {dtype!r} is not one "
            "(torch.float16, bfloat16, float32, fp8)"
        )
    if end_layer - start_layer + 1 != layer_num:
        raise ValueError(
            f"layers {start_layer}..{end_layer} do not make {layer_num} layers"
        )


def _check_dsa_index_head_dim(index_head_dim) -> None:
    _checks.positive_ints(index_head_dim=index_head_dim)
    # SGLang's DSATokenToKVPool asserts it: one head of 128 for DeepSeek's indexer
    if index_head_dim != 128:
        raise ValueError(
            f"the DSA indexer keeps one key of 128 values per token and layer, got {index_head_dim}"
        )


def _check_layer_id(pool, layer_id) -> None:
    if not pool.start_layer <= _checks.integer("layer_id", layer_id) <= pool.end_layer:
        raise _checks.RangeError(
            f"layer {layer_id} is not in this pool (layers {pool.start_layer}..{pool.end_layer})"
        )


def _check_kv_write(pool, loc, **rows) -> None:
    """A pool's write door: slot ids ``loc`` and the rows to write, each given as
    ``name=(tensor, row shape the pool stores, names of its dims)``."""
    where = f"{type(pool).__name__}.set_kv_buffer"
    _checks.plain_loc(loc, where)
    _checks.index_tensor("loc", loc, pool.device, ndim=1, owner="pool")
    n = loc.numel()
    for name, (x, row_shape, dims) in rows.items():
        _checks.tensor(
            f"{where}: {name}",
            x,
            KV_INPUT_DTYPES,
            like=" (it is cast to the pool's dtype)",
        )
        if tuple(x.shape[1:]) != tuple(row_shape):
            raise ValueError(
                f"{where}: {name} has shape {tuple(x.shape)}; this pool stores rows of "
                f"(tokens, {dims}) = (tokens, {', '.join(map(str, row_shape))})"
            )
        if x.shape[0] != n:
            raise ValueError(f"{n} slots for {x.shape[0]} tokens")
    if loc.device.type == "cpu":  # on a GPU this check would cost a sync per write
        _checks.values_in("loc", loc, 0, pool.size + pool.page_size - 1)
