"""The worker side of vLLM's books: the block table, slot_mapping, and storing K/V by slot.

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

PAD_SLOT_ID = -1
BACKENDS = ("triton", "torch", "python")


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


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


def check_slot_mapping_inputs(block_table: torch.Tensor, req_indices: torch.Tensor, positions: torch.Tensor,
                              block_size: int, num_tokens: int,
                              num_blocks_per_row: torch.Tensor | Sequence[int] | None = None) -> None:
    """Host-side validation (CPU tensors: no device sync). Errors name the first bad token."""
    if block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise TypeError(f"block_table must be a 2-D int32 tensor, got {block_table.dtype} {tuple(block_table.shape)}")
    if req_indices.shape != positions.shape or positions.dim() != 1:
        raise ValueError(f"req_indices {tuple(req_indices.shape)} and positions {tuple(positions.shape)} "
                         "must be 1-D and of one length")
    if not 0 <= num_tokens <= positions.numel():
        raise ValueError(f"num_tokens={num_tokens} outside 0..{positions.numel()}")
    if not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if positions.device.type != "cpu" or num_tokens == 0:
        return
    req = req_indices[:num_tokens].long()
    pos = positions[:num_tokens].long()
    bad = (req < 0) | (req >= block_table.shape[0]) | (pos < 0)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"token {i}: request row {int(req[i])} or position {int(pos[i])} is out of range "
                         f"(rows 0..{block_table.shape[0] - 1}, positions >= 0)")
    limit = (torch.as_tensor(num_blocks_per_row, dtype=torch.long)[req] if num_blocks_per_row is not None
             else torch.full_like(req, block_table.shape[1]))
    bad = pos // block_size >= limit
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"token {i}: position {int(pos[i])} needs block {int(pos[i]) // block_size} of row "
                         f"{int(req[i])}, which holds {int(limit[i])} blocks")


def compute_slot_mapping(block_table: torch.Tensor, req_indices: torch.Tensor, positions: torch.Tensor,
                         block_size: int, num_tokens: int | None = None, backend: str = "triton") -> torch.Tensor:
    """slot_mapping for len(positions) entries, of which the first num_tokens are real tokens."""
    _check_backend(backend)
    num_tokens = positions.numel() if num_tokens is None else num_tokens
    check_slot_mapping_inputs(block_table, req_indices, positions, block_size, num_tokens)
    if backend == "triton":
        from memlab.kernels import slot_mapping

        return slot_mapping.compute_slot_mapping(block_table, req_indices, positions, block_size, num_tokens)
    if backend == "torch":
        return slot_mapping_torch(block_table, req_indices, positions, block_size, num_tokens)
    slots = slot_mapping_python(block_table.tolist(), req_indices[:num_tokens].tolist(),
                                positions[:num_tokens].tolist(), block_size, positions.numel())
    return torch.tensor(slots, dtype=torch.int64, device=positions.device)


# ---- storing K and V at their slots ---------------------------------------------------------

def _check_store_inputs(key, value, key_cache, value_cache, slot_mapping) -> None:
    if key.dim() != 3 or value.dim() != 3 or key_cache.dim() != 4 or value_cache.dim() != 4:
        raise ValueError(f"want key/value (T, H, D) and caches (N, block_size, H, D); got "
                         f"{tuple(key.shape)}, {tuple(value.shape)}, {tuple(key_cache.shape)}, {tuple(value_cache.shape)}")
    if key_cache.shape[:2] != value_cache.shape[:2] or key.shape[1:] != key_cache.shape[2:] \
            or value.shape[1:] != value_cache.shape[2:]:
        raise ValueError(f"shapes disagree: key {tuple(key.shape)} vs key_cache {tuple(key_cache.shape)}, "
                         f"value {tuple(value.shape)} vs value_cache {tuple(value_cache.shape)}")
    if slot_mapping.dim() != 1 or slot_mapping.numel() > key.shape[0] or key.shape[0] != value.shape[0]:
        raise ValueError(f"slot_mapping {tuple(slot_mapping.shape)} must be 1-D with at most one slot per "
                         f"token (key has {key.shape[0]}, value {value.shape[0]})")
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    if key.dtype != key_cache.dtype or value.dtype != value_cache.dtype:
        raise TypeError(f"dtypes differ: key {key.dtype} -> cache {key_cache.dtype}, "
                        f"value {value.dtype} -> cache {value_cache.dtype}")
    if slot_mapping.device.type == "cpu" and slot_mapping.numel():
        num_slots = key_cache.shape[0] * key_cache.shape[1]
        bad = slot_mapping >= num_slots
        if bad.any():
            i = int(bad.nonzero()[0])
            raise ValueError(f"token {i}: slot {int(slot_mapping[i])} is past the cache's {num_slots} slots")


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
    _check_backend(backend)
    _check_store_inputs(key, value, key_cache, value_cache, slot_mapping)
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
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self.block_size = block_size
        self.max_num_reqs = max_num_reqs
        self.max_num_blocks_per_req = max_num_blocks_per_req
        self.block_table = torch.zeros((max_num_reqs, max_num_blocks_per_req), dtype=torch.int32, device=device)
        # Host-side row lengths, one tensor updated in place (the slot-mapping check indexes it
        # directly instead of building a tensor from a list on every call).
        self.num_blocks_per_row = torch.zeros(max_num_reqs, dtype=torch.int64)
        self.slot_mapping = torch.full((max_num_batched_tokens,), PAD_SLOT_ID, dtype=torch.int64, device=device)

    def _check_row(self, row_idx: int) -> None:
        if not isinstance(row_idx, int) or not 0 <= row_idx < self.max_num_reqs:
            raise ValueError(f"row_idx {row_idx!r} outside 0..{self.max_num_reqs - 1}")

    def append_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """Append a request's new block ids to its row (all or nothing)."""
        self._check_row(row_idx)
        if not block_ids:
            return
        start = int(self.num_blocks_per_row[row_idx])
        end = start + len(block_ids)
        if end > self.max_num_blocks_per_req:
            raise ValueError(f"row {row_idx} holds {start} blocks; {len(block_ids)} more exceed "
                             f"max_num_blocks_per_req={self.max_num_blocks_per_req}")
        if min(block_ids) < 0:
            raise ValueError(f"block ids must be >= 0, got {list(block_ids)}")
        self.block_table[row_idx, start:end] = torch.tensor(block_ids, dtype=torch.int32)
        self.num_blocks_per_row[row_idx] = end

    def add_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """A request newly placed in this row: forget what the row held, then append."""
        self._check_row(row_idx)
        old = int(self.num_blocks_per_row[row_idx])
        self.num_blocks_per_row[row_idx] = 0
        try:
            self.append_row(block_ids, row_idx)
        except ValueError:
            self.num_blocks_per_row[row_idx] = old  # a refused add changes nothing
            raise

    def move_row(self, src: int, tgt: int) -> None:
        """Condense the batch: a request moves from row src to row tgt."""
        self._check_row(src)
        self._check_row(tgt)
        n = int(self.num_blocks_per_row[src])
        self.block_table[tgt, :n] = self.block_table[src, :n]
        self.num_blocks_per_row[tgt] = n

    def get_row(self, row_idx: int) -> list[int]:
        self._check_row(row_idx)
        return self.block_table[row_idx, :int(self.num_blocks_per_row[row_idx])].tolist()

    def compute_slot_mapping(self, req_indices: torch.Tensor, positions: torch.Tensor,
                             num_padded: int | None = None, backend: str = "triton") -> torch.Tensor:
        """slot_mapping for these tokens, -1 up to num_padded entries; a view of the buffer."""
        _check_backend(backend)
        num_tokens = positions.numel()
        num_padded = num_tokens if num_padded is None else num_padded
        if not num_tokens <= num_padded <= self.slot_mapping.numel():
            raise ValueError(f"num_padded={num_padded} must lie in {num_tokens}..{self.slot_mapping.numel()}")
        check_slot_mapping_inputs(self.block_table, req_indices, positions, self.block_size, num_tokens,
                                  self.num_blocks_per_row)
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
