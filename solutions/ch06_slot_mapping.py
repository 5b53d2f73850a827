"""Chapter 06 exercise (Triton): vLLM's ``slot_mapping`` from the block table.

Fill in the marked section of ``slot_mapping_kernel``, set ``SECTION_WRITTEN = True``, and grade
with ``./course grade 06``. It runs compiled on a GPU and in the Triton interpreter on a CPU.
"""

import torch
import triton
import triton.language as tl

# padded tokens write nowhere: the KV-store kernel skips negative slots
PAD_SLOT_ID = -1

# ===== EXERCISE 06c: set to True once the section below is written =====
# BEGIN SOLUTION (stub: SECTION_WRITTEN = False)
SECTION_WRITTEN = True
# END SOLUTION
# ===== END EXERCISE 06c =====


@triton.jit
def slot_mapping_kernel(
    block_table_ptr,
    block_table_stride,
    query_start_loc_ptr,
    positions_ptr,
    out_ptr,
    num_reqs,
    num_tokens_padded,
    block_size,
    BLOCK: tl.constexpr,
):
    """Programs 0..num_reqs-1: one request's tokens each; program num_reqs: the padding."""
    req = tl.program_id(0)
    start = tl.load(query_start_loc_ptr + req).to(tl.int64)
    if req == num_reqs:
        # Tokens past the last request's are padding: slot -1.
        for t in range(start, num_tokens_padded, BLOCK):
            i = t + tl.arange(0, BLOCK)
            # PAD_SLOT_ID
            tl.store(
                out_ptr + i, tl.full((BLOCK,), -1, tl.int64), mask=i < num_tokens_padded
            )
    else:
        # BEGIN SOLUTION (stub: tl.load(query_start_loc_ptr + req + 1).to(tl.int64))
        end = tl.load(query_start_loc_ptr + req + 1).to(tl.int64)
        # END SOLUTION
        # ===== EXERCISE 06c: the slots of this request's tokens =====
        # For each token index i in [start, end), BLOCK at a time (masked):
        #   pos = positions[i]; the token's block is block_table[req, pos // block_size]
        #   (row req starts at block_table_ptr + req * block_table_stride); its slot is
        #   block * block_size + pos % block_size. Store it, as int64, at out_ptr + i.
        # BEGIN SOLUTION (stub: # YOUR CODE HERE)
        for t in range(start, end, BLOCK):
            i = t + tl.arange(0, BLOCK)
            live = i < end
            pos = tl.load(positions_ptr + i, mask=live, other=0).to(tl.int64)
            block = tl.load(
                block_table_ptr + req * block_table_stride + pos // block_size,
                mask=live,
                other=0,
            )
            tl.store(
                out_ptr + i,
                block.to(tl.int64) * block_size + pos % block_size,
                mask=live,
            )
        # END SOLUTION
        # ===== END EXERCISE 06c =====


def compute_slot_mapping(
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    num_tokens_padded: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The int64 slot of every token of a batch (-1 for padding), ``num_tokens_padded`` of them.

    ``block_table`` (int32, one row per request), ``query_start_loc`` (num_reqs + 1 token
    offsets: request r's tokens are [qsl[r], qsl[r+1])) and ``positions`` (each token's position
    in its request) on one device: the GPU, or the CPU in the interpreter. ``out``: where to
    write (a fresh tensor when None).
    """
    if not SECTION_WRITTEN:
        raise NotImplementedError(
            "slot_mapping_kernel: write EXERCISE 06c, then set SECTION_WRITTEN = True"
        )
    if out is None:
        out = torch.empty(num_tokens_padded, dtype=torch.int64, device=positions.device)
    num_reqs = len(query_start_loc) - 1
    slot_mapping_kernel[(num_reqs + 1,)](
        block_table,
        block_table.stride(0),
        query_start_loc,
        positions,
        out,
        num_reqs,
        num_tokens_padded,
        block_size,
        BLOCK=64,
    )
    return out
