"""The worker side of vLLM's books (vllm/v1/worker/block_table.py): block table, slot_mapping, storing K/V.

The scheduler (block pool, manager) sends each request's NEW block ids; the worker appends
them to the request's row of an int32 block table (rows only grow: a block id once given never
changes). Before each forward step it turns (request row, token position) into a slot:

    slot = block_table[req, pos // block_size] * block_size + pos % block_size

and the KV-store kernel writes each token's K and V at that slot, skipping slot -1 (padding).
The attention kernel sees nothing else: just the block table and slot_mapping.

Each operation has three spellings that tests hold equal: the Triton kernel (kernels/), a
torch reference and a plain-Python reference (both here). ``backend`` picks one.
"""

from __future__ import annotations

from typing import Sequence

import torch

from memlab.common import _checks
from memlab.common.env import resolve_device

PAD_SLOT_ID = -1
BACKENDS = ("triton", "torch", "python")
MAX_SIZE = 2 ** 31 - 1  # block ids and rows are int32


# ---- slot_mapping ---------------------------------------------------------------------------

def slot_mapping_python(block_table: Sequence[Sequence[int]], req_indices: Sequence[int],
                        positions: Sequence[int], block_size: int, num_padded: int | None = None) -> list[int]:
    """The definition, one token at a time; tokens past len(positions) up to num_padded get -1."""
    num_padded = len(positions) if num_padded is None else num_padded
    slots = []
    for req, pos in zip(req_indices, positions):
        slots.append(block_table[req][pos // block_size] * block_size + pos % block_size)
    return slots + [PAD_SLOT_ID] * (num_padded - len(slots))


def slot_mapping_torch(block_table: torch.Tensor, req_indices: torch.Tensor, positions: torch.Tensor,
                       block_size: int, num_tokens: int | None = None) -> torch.Tensor:
    """Batched: one gather for all tokens. Entries at index >= num_tokens are padding (-1)."""
    num_tokens = positions.numel() if num_tokens is None else num_tokens
    out = torch.full((positions.numel(),), PAD_SLOT_ID, dtype=torch.int64, device=positions.device)
    req = req_indices[:num_tokens].long()
    pos = positions[:num_tokens].long()
    block_numbers = block_table[req, pos // block_size].long()
    out[:num_tokens] = block_numbers * block_size + pos % block_size
    return out


def compute_slot_mapping(block_table: torch.Tensor, req_indices: torch.Tensor, positions: torch.Tensor,
                         block_size: int, num_tokens: int | None = None, backend: str = "triton") -> torch.Tensor:
    """slot_mapping for len(positions) entries, of which the first num_tokens are real tokens."""
    num_tokens = _check_slot_mapping(block_table, req_indices, positions, block_size, num_tokens, backend)
    if backend == "triton":
        from memlab.kernels import slot_mapping

        return slot_mapping.compute_slot_mapping(block_table, req_indices, positions, block_size, num_tokens)
    if backend == "torch":
        return slot_mapping_torch(block_table, req_indices, positions, block_size, num_tokens)
    slots = slot_mapping_python(block_table.tolist(), req_indices[:num_tokens].tolist(),
                                positions[:num_tokens].tolist(), block_size, positions.numel())
    return torch.tensor(slots, dtype=torch.int64, device=positions.device)


# ---- storing K and V at their slots ---------------------------------------------------------

def store_kv_python(key, value, key_cache, value_cache, slot_mapping) -> None:
    """The definition, one token at a time."""
    block_size = key_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        key_cache[slot // block_size, slot % block_size] = key[t]
        value_cache[slot // block_size, slot % block_size] = value[t]


def store_kv_torch(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Batched: one masked scatter per cache (the mask drops padded tokens)."""
    block_size = key_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    n = slot_mapping.numel()
    key_cache[slots // block_size, slots % block_size] = key[:n][keep]
    value_cache[slots // block_size, slots % block_size] = value[:n][keep]


def store_kv(key, value, key_cache, value_cache, slot_mapping, backend: str = "triton") -> None:
    """Write token t's K and V into the paged caches at slot_mapping[t] (skipping -1)."""
    _check_store_kv(key, value, key_cache, value_cache, slot_mapping, backend)
    if backend == "triton":
        from memlab.kernels import store_kv as kernel

        kernel.store_kv(key, value, key_cache, value_cache, slot_mapping)
    elif backend == "torch":
        store_kv_torch(key, value, key_cache, value_cache, slot_mapping)
    else:
        store_kv_python(key, value, key_cache, value_cache, slot_mapping)


# ---- the block table ------------------------------------------------------------------------

class BlockTable:
    """One int32 row of block ids per running request (vLLM's worker BlockTable).

    Rows only grow (append_row); a new request takes a row with add_row. The batch's
    slot_mapping is built into a preallocated int64 buffer, padded with -1.
    """

    def __init__(self, block_size: int, max_num_reqs: int, max_num_blocks_per_req: int,
                 max_num_batched_tokens: int, device: str | torch.device = "cpu"):
        for name, v in (("block_size", block_size), ("max_num_reqs", max_num_reqs),
                        ("max_num_blocks_per_req", max_num_blocks_per_req),
                        ("max_num_batched_tokens", max_num_batched_tokens)):
            _checks.integer(name, v, 1, MAX_SIZE)
        device = resolve_device(device)
        self.block_size = block_size
        self.max_num_reqs = max_num_reqs
        self.max_num_blocks_per_req = max_num_blocks_per_req
        self.block_table = torch.zeros((max_num_reqs, max_num_blocks_per_req), dtype=torch.int32, device=device)
        # Host-side row lengths, one tensor updated in place (the slot-mapping check indexes it
        # directly instead of building a tensor from a list on every call).
        self.num_blocks_per_row = torch.zeros(max_num_reqs, dtype=torch.int64)
        self.slot_mapping = torch.full((max_num_batched_tokens,), PAD_SLOT_ID, dtype=torch.int64, device=device)

    def append_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """Append a request's new block ids to its row (all or nothing)."""
        _check_row(self, "row_idx", row_idx)
        start = int(self.num_blocks_per_row[row_idx])
        _check_append(self, block_ids, row_idx, start)
        if not block_ids:
            return
        end = start + len(block_ids)
        self.block_table[row_idx, start:end] = torch.tensor(block_ids, dtype=torch.int32)
        self.num_blocks_per_row[row_idx] = end

    def add_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """A request newly placed in this row: forget what the row held, then append. Checked
        before the row is touched: a refused add changes nothing."""
        _check_row(self, "row_idx", row_idx)
        _check_append(self, block_ids, row_idx, 0)
        self.num_blocks_per_row[row_idx] = 0
        self.append_row(block_ids, row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        """Condense the batch: a request moves from row src to row tgt."""
        _check_row(self, "src", src)
        _check_row(self, "tgt", tgt)
        n = int(self.num_blocks_per_row[src])
        self.block_table[tgt, :n] = self.block_table[src, :n]
        self.num_blocks_per_row[tgt] = n

    def get_row(self, row_idx: int) -> list[int]:
        _check_row(self, "row_idx", row_idx)
        return self.block_table[row_idx, :int(self.num_blocks_per_row[row_idx])].tolist()

    def compute_slot_mapping(self, req_indices: torch.Tensor, positions: torch.Tensor,
                             num_padded: int | None = None, backend: str = "triton") -> torch.Tensor:
        """slot_mapping for these tokens, -1 up to num_padded entries; a view of the buffer."""
        num_padded = _check_table_slot_mapping(self, req_indices, positions, num_padded, backend)
        num_tokens = positions.numel()
        out = self.slot_mapping[:num_padded]
        if backend == "triton":
            from memlab.kernels import slot_mapping

            # Kernel reads positions only below num_tokens; it writes -1 for the rest.
            slot_mapping.compute_slot_mapping(self.block_table, req_indices, positions, self.block_size,
                                              num_tokens, out=out)
        else:
            pad_req = torch.zeros(num_padded, dtype=req_indices.dtype, device=req_indices.device)
            pad_pos = torch.zeros(num_padded, dtype=positions.dtype, device=positions.device)
            pad_req[:num_tokens] = req_indices
            pad_pos[:num_tokens] = positions
            out.copy_(compute_slot_mapping(self.block_table, pad_req, pad_pos, self.block_size, num_tokens, backend))
        return out

    def clear(self) -> None:
        self.block_table.zero_()
        self.num_blocks_per_row.zero_()
        self.slot_mapping.fill_(PAD_SLOT_ID)


# -- argument checks at the boundary: shapes and dtypes, values only on the CPU (no device sync) ----

def _backend(backend) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def _check_slot_mapping(block_table, req_indices, positions, block_size, num_tokens, backend,
                        num_blocks_per_row=None) -> int:
    """Returns num_tokens (None: every position). Errors name the first bad token."""
    _backend(backend)
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
        raise TypeError(f"block_table must be an int32 tensor, got {getattr(block_table, 'dtype', type(block_table).__name__)}")
    if block_table.dim() != 2:
        raise ValueError(f"block_table must be 2-D, got shape {tuple(block_table.shape)}")
    _checks.index_tensor("positions", positions, block_table.device, ndim=1, owner="block table")
    _checks.index_tensor("req_indices", req_indices, block_table.device, ndim=1, owner="block table")
    if req_indices.shape != positions.shape:
        raise ValueError(f"req_indices {tuple(req_indices.shape)} and positions {tuple(positions.shape)} "
                         "must be of one length")
    num_tokens = positions.numel() if num_tokens is None else _checks.integer("num_tokens", num_tokens, 0,
                                                                               positions.numel())
    _checks.integer("block_size", block_size, 1, MAX_SIZE)
    if positions.device.type != "cpu" or num_tokens == 0:
        return num_tokens
    req = req_indices[:num_tokens].long()
    pos = positions[:num_tokens].long()
    bad = (req < 0) | (req >= block_table.shape[0]) | (pos < 0)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"token {i}: request row {int(req[i])} (req_indices) or position {int(pos[i])} (positions) "
                         f"is out of range (rows 0..{block_table.shape[0] - 1}, positions >= 0)")
    limit = (torch.as_tensor(num_blocks_per_row, dtype=torch.long)[req] if num_blocks_per_row is not None
             else torch.full_like(req, block_table.shape[1]))
    bad = pos // block_size >= limit
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"token {i}: position {int(pos[i])} (positions) needs block {int(pos[i]) // block_size} "
                         f"of row {int(req[i])}, which holds {int(limit[i])} blocks")
    return num_tokens


def _float_tensor(name, t, ndim) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")


def _check_store_kv(key, value, key_cache, value_cache, slot_mapping, backend) -> None:
    _backend(backend)
    for name, t, ndim in (("key", key, 3), ("value", value, 3), ("key_cache", key_cache, 4),
                          ("value_cache", value_cache, 4)):
        _float_tensor(name, t, ndim)
    if key_cache.shape[:2] != value_cache.shape[:2] or key.shape[1:] != key_cache.shape[2:] \
            or value.shape[1:] != value_cache.shape[2:]:
        raise ValueError(f"shapes disagree: key {tuple(key.shape)} vs key_cache {tuple(key_cache.shape)}, "
                         f"value {tuple(value.shape)} vs value_cache {tuple(value_cache.shape)}")
    _checks.index_tensor("slot_mapping", slot_mapping, key_cache.device, ndim=1, owner="cache")
    if slot_mapping.numel() > key.shape[0] or key.shape[0] != value.shape[0]:
        raise ValueError(f"slot_mapping {tuple(slot_mapping.shape)} must hold at most one slot per token "
                         f"(key has {key.shape[0]}, value {value.shape[0]})")
    if key.dtype != key_cache.dtype or value.dtype != value_cache.dtype:
        raise TypeError(f"dtypes differ: key {key.dtype} -> cache {key_cache.dtype}, "
                        f"value {value.dtype} -> cache {value_cache.dtype}")
    if slot_mapping.device.type == "cpu" and slot_mapping.numel():
        num_slots = key_cache.shape[0] * key_cache.shape[1]
        bad = (slot_mapping >= num_slots) | (slot_mapping < PAD_SLOT_ID)
        if bad.any():
            i = int(bad.nonzero()[0])
            raise ValueError(f"token {i}: slot {int(slot_mapping[i])} (slot_mapping) is outside the cache's "
                             f"{num_slots} slots (-1 is padding)")


def _check_row(table, name, row_idx) -> None:
    _checks.integer(name, row_idx, 0, table.max_num_reqs - 1)


def _check_append(table, block_ids, row_idx, start: int) -> None:
    """New block ids for a row that holds ``start`` blocks: they must be ids and fit."""
    _checks.int_list("block_ids", block_ids, 0, MAX_SIZE)
    if start + len(block_ids) > table.max_num_blocks_per_req:
        raise ValueError(f"row {row_idx} holds {start} blocks; {len(block_ids)} more block_ids exceed "
                         f"max_num_blocks_per_req={table.max_num_blocks_per_req}")


def _check_table_slot_mapping(table, req_indices, positions, num_padded, backend) -> int:
    _checks.index_tensor("positions", positions, ndim=1)
    num_tokens = positions.numel()
    num_padded = num_tokens if num_padded is None else num_padded
    _checks.integer("num_padded", num_padded, num_tokens, table.slot_mapping.numel())
    _check_slot_mapping(table.block_table, req_indices, positions, table.block_size, num_tokens, backend,
                        table.num_blocks_per_row)
    return num_padded
