"""vLLM's worker-side books (vllm/v1/worker/block_table.py): block table, slot_mapping, K/V.

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

from collections.abc import Sequence

import torch

from memlab.common import _checks
from memlab.common.env import resolve_device

PAD_SLOT_ID = -1
BACKENDS = ("triton", "torch", "python")
MAX_SIZE = 2**31 - 1  # block ids and rows are int32


# ---- slot_mapping ---------------------------------------------------------------------------


def slot_mapping_python(
    block_table: Sequence[Sequence[int]],
    req_indices: Sequence[int],
    positions: Sequence[int],
    block_size: int,
    num_padded: int | None = None,
) -> list[int]:
    """The definition, one token at a time; tokens past len(positions) up to num_padded get -1."""
    num_padded = len(positions) if num_padded is None else num_padded
    slots = []
    for req, pos in zip(req_indices, positions):
        slots.append(
            block_table[req][pos // block_size] * block_size + pos % block_size
        )
    return slots + [PAD_SLOT_ID] * (num_padded - len(slots))


def slot_mapping_torch(
    block_table: torch.Tensor,
    req_indices: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    num_tokens: int | None = None,
) -> torch.Tensor:
    """Batched: one gather for all tokens. Entries at index >= num_tokens are padding (-1)."""
    num_tokens = positions.numel() if num_tokens is None else num_tokens
    out = torch.full(
        (positions.numel(),), PAD_SLOT_ID, dtype=torch.int64, device=positions.device
    )
    req = req_indices[:num_tokens].long()
    pos = positions[:num_tokens].long()
    block_numbers = block_table[req, pos // block_size].long()
    out[:num_tokens] = block_numbers * block_size + pos % block_size
    return out


def compute_slot_mapping(
    block_table: torch.Tensor,
    req_indices: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    num_tokens: int | None = None,
    backend: str = "triton",
) -> torch.Tensor:
    """slot_mapping for len(positions) entries, of which the first num_tokens are real tokens."""
    num_tokens = _check_slot_mapping(
        block_table, req_indices, positions, block_size, num_tokens, backend
    )
    if backend == "triton":
        from memlab.kernels import slot_mapping

        return slot_mapping.compute_slot_mapping(
            block_table, req_indices, positions, block_size, num_tokens
        )
    if backend == "torch":
        return slot_mapping_torch(
            block_table, req_indices, positions, block_size, num_tokens
        )
    slots = slot_mapping_python(
        block_table.tolist(),
        req_indices[:num_tokens].tolist(),
        positions[:num_tokens].tolist(),
        block_size,
        positions.numel(),
    )
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


def store_kv(
    key, value, key_cache, value_cache, slot_mapping, backend: str = "triton"
) -> None:
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

    def __init__(
        self,
        block_size: int,
        max_num_reqs: int,
        max_num_blocks_per_req: int,
        max_num_batched_tokens: int,
        device: str | torch.device = "cpu",
    ):
        for name, v in (
            ("block_size", block_size),
            ("max_num_reqs", max_num_reqs),
            ("max_num_blocks_per_req", max_num_blocks_per_req),
            ("max_num_batched_tokens", max_num_batched_tokens),
        ):
            _checks.integer(name, v, 1, MAX_SIZE)
        device = resolve_device(device)
        self.block_size = block_size
        self.max_num_reqs = max_num_reqs
        self.max_num_blocks_per_req = max_num_blocks_per_req
        self.block_table = torch.zeros(
            (max_num_reqs, max_num_blocks_per_req), dtype=torch.int32, device=device
        )
        # Host-side row lengths, one tensor updated in place (the slot-mapping check indexes it
        # directly instead of building a tensor from a list on every call).
        self.num_blocks_per_row = torch.zeros(max_num_reqs, dtype=torch.int64)
        self.slot_mapping = torch.full(
            (max_num_batched_tokens,), PAD_SLOT_ID, dtype=torch.int64, device=device
        )

    def append_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """Append a request's new block ids to its row (all or nothing)."""
        _checks.integer("row_idx", row_idx, 0, self.max_num_reqs - 1)
        start = int(self.num_blocks_per_row[row_idx])
        _checks.int_list("block_ids", block_ids, 0, MAX_SIZE)
        # a refusal only ever reports a total above it
        cap = self.max_num_blocks_per_req
        _checks.integer(
            f"row {row_idx} holds {start} blocks; {len(block_ids)} more exceed "
            f"max_num_blocks_per_req={cap}: the total",
            start + len(block_ids),
            0,
            cap,
        )
        if not block_ids:
            return
        end = start + len(block_ids)
        self.block_table[row_idx, start:end] = torch.tensor(
            block_ids, dtype=torch.int32
        )
        self.num_blocks_per_row[row_idx] = end

    def add_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """A request newly placed in this row: forget what the row held, then append. Checked
        before the row is touched: a refused add changes nothing."""
        _checks.integer("row_idx", row_idx, 0, self.max_num_reqs - 1)
        _checks.int_list("block_ids", block_ids, 0, MAX_SIZE)
        _checks.integer(
            "len(block_ids) (it may not exceed max_num_blocks_per_req)",
            len(block_ids),
            0,
            self.max_num_blocks_per_req,
        )
        self.num_blocks_per_row[row_idx] = 0
        self.append_row(block_ids, row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        """Condense the batch: a request moves from row src to row tgt."""
        _checks.integer("src", src, 0, self.max_num_reqs - 1)
        _checks.integer("tgt", tgt, 0, self.max_num_reqs - 1)
        n = int(self.num_blocks_per_row[src])
        self.block_table[tgt, :n] = self.block_table[src, :n]
        self.num_blocks_per_row[tgt] = n

    def get_row(self, row_idx: int) -> list[int]:
        _checks.integer("row_idx", row_idx, 0, self.max_num_reqs - 1)
        return self.block_table[
            row_idx, : int(self.num_blocks_per_row[row_idx])
        ].tolist()

    def compute_slot_mapping(
        self,
        req_indices: torch.Tensor,
        positions: torch.Tensor,
        num_padded: int | None = None,
        backend: str = "triton",
    ) -> torch.Tensor:
        """slot_mapping for these tokens, -1 up to num_padded entries; a view of the buffer."""
        _checks.index_tensor("positions", positions, ndim=1)
        num_tokens = positions.numel()
        num_padded = _checks.integer(
            "num_padded",
            num_tokens if num_padded is None else num_padded,
            num_tokens,
            self.slot_mapping.numel(),
        )
        _check_slot_mapping(
            self.block_table,
            req_indices,
            positions,
            self.block_size,
            num_tokens,
            backend,
            self.num_blocks_per_row,
        )
        out = self.slot_mapping[:num_padded]
        if backend == "triton":
            from memlab.kernels import slot_mapping

            # Kernel reads positions only below num_tokens; it writes -1 for the rest.
            slot_mapping.compute_slot_mapping(
                self.block_table,
                req_indices,
                positions,
                self.block_size,
                num_tokens,
                out=out,
            )
        else:
            pad_req = torch.zeros(
                num_padded, dtype=req_indices.dtype, device=req_indices.device
            )
            pad_pos = torch.zeros(
                num_padded, dtype=positions.dtype, device=positions.device
            )
            pad_req[:num_tokens] = req_indices
            pad_pos[:num_tokens] = positions
            out.copy_(
                compute_slot_mapping(
                    self.block_table,
                    pad_req,
                    pad_pos,
                    self.block_size,
                    num_tokens,
                    backend,
                )
            )
        return out

    def clear(self) -> None:
        self.block_table.zero_()
        self.num_blocks_per_row.zero_()
        self.slot_mapping.fill_(PAD_SLOT_ID)


# -- argument checks at the boundary: shapes and dtypes, values only on the CPU (no device sync)


def _check_slot_mapping(
    block_table, req_indices, positions, block_size, num_tokens, backend, per_row=None
) -> int:
    """Returns num_tokens (None: every position)."""
    _checks.one_of("backend", backend, BACKENDS)
    _checks.tensor("block_table", block_table, (torch.int32,), ndim=2)
    for name, t in (("positions", positions), ("req_indices", req_indices)):
        _checks.index_tensor(name, t, block_table.device, ndim=1, owner="block table")
    _checks.integer("block_size", block_size, 1, MAX_SIZE)
    _checks.tensor("req_indices (one per position)", req_indices, shape=positions.shape)
    n = positions.numel() if num_tokens is None else num_tokens
    _checks.integer("num_tokens", n, 0, positions.numel())
    if positions.device.type == "cpu" and n:
        req = req_indices[:n].long()
        _checks.values_in("req_indices", req, 0, block_table.shape[0] - 1)
        width = torch.full((block_table.shape[0],), block_table.shape[1])
        rows = width if per_row is None else per_row
        need = positions[:n] // block_size
        name = "positions // block_size (the block a position needs)"
        _checks.values_in(name, need, 0, rows[req] - 1)
    return n


def _check_store_kv(key, value, key_cache, value_cache, slot_mapping, backend) -> None:
    _checks.one_of("backend", backend, BACKENDS)
    kv = {
        "key": key,
        "value": value,
        "key_cache": key_cache,
        "value_cache": value_cache,
    }
    for name, t in kv.items():
        _checks.tensor(name, t, ndim=4 if name.endswith("cache") else 3)
    _checks.index_tensor("slot_mapping", slot_mapping, key_cache.device, 1, "cache")
    if (
        key_cache.shape[:2] != value_cache.shape[:2]
        or key.shape[1:] != key_cache.shape[2:]
        or value.shape[1:] != value_cache.shape[2:]
        or not slot_mapping.numel() <= key.shape[0] == value.shape[0]
    ):
        shapes = [tuple(t.shape) for t in kv.values()]
        raise ValueError(
            f"shapes disagree (key, value, key_cache, value_cache): {shapes}"
        )
    if key.dtype != key_cache.dtype or value.dtype != value_cache.dtype:
        raise TypeError(
            f"dtypes differ: key {key.dtype}, value {value.dtype}, caches {key_cache.dtype}"
        )
    num_slots = key_cache.shape[0] * key_cache.shape[1]
    if slot_mapping.device.type == "cpu":  # -1 is padding
        _checks.values_in("slot_mapping", slot_mapping, PAD_SLOT_ID, num_slots - 1)
