"""slot_mapping: where each scheduled token's K and V go (vLLM's worker, block_table.py).

    slot = block_table[req, pos // block_size] * block_size + pos % block_size

One program handles BLOCK tokens. Tokens at index >= num_tokens are padding (a CUDA-graph
batch is padded to a fixed size) and get slot -1, which the KV-store kernel skips. The
references are memlab.vllm.block_table.slot_mapping_torch / slot_mapping_python.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _slot_mapping_kernel(
    block_table_ptr,
    block_table_stride,
    num_rows,
    max_num_blocks,
    req_indices_ptr,
    positions_ptr,
    slot_mapping_ptr,
    num_tokens,
    num_padded,
    block_size,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_out = offs < num_padded
    real = offs < num_tokens
    req = tl.load(req_indices_ptr + offs, mask=real, other=0).to(tl.int64)
    pos = tl.load(positions_ptr + offs, mask=real, other=0).to(tl.int64)
    blk = pos // block_size
    # The host validates inputs; this mask only keeps a bad token from reading outside the table.
    ok = real & (req >= 0) & (req < num_rows) & (pos >= 0) & (blk < max_num_blocks)
    block_number = tl.load(
        block_table_ptr + req * block_table_stride + blk, mask=ok, other=0
    ).to(tl.int64)
    slot = tl.where(ok, block_number * block_size + pos % block_size, -1)
    tl.store(slot_mapping_ptr + offs, slot, mask=in_out)


def compute_slot_mapping(
    block_table: torch.Tensor,
    req_indices: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    num_tokens: int | None = None,
    out: torch.Tensor | None = None,
    BLOCK: int = 128,
) -> torch.Tensor:
    """int64 slots for len(out or positions) tokens; the first num_tokens are real."""
    num_padded = positions.numel() if out is None else out.numel()
    num_tokens = positions.numel() if num_tokens is None else num_tokens
    if out is None:
        out = torch.empty(num_padded, dtype=torch.int64, device=positions.device)
    if num_padded:
        _slot_mapping_kernel[(triton.cdiv(num_padded, BLOCK),)](
            block_table,
            block_table.stride(0),
            block_table.shape[0],
            block_table.shape[1],
            req_indices,
            positions,
            out,
            num_tokens,
            num_padded,
            block_size,
            BLOCK=BLOCK,
        )
    return out
