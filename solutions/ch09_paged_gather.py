"""Chapter 09 exercise (Triton): the gather inside paged decode attention.

One query token per request attends over its KV, which lies scattered over the pool's slots.
The kernel is complete except for the gather: fill in the marked section, set
``GATHER_WRITTEN = True``, and grade with ``./course grade 09``.
"""

import math

import torch
import triton
import triton.language as tl

# ===== EXERCISE 09: set to True once the gather below is written =====
# BEGIN SOLUTION (stub: GATHER_WRITTEN = False)
GATHER_WRITTEN = True
# END SOLUTION
# ===== END EXERCISE 09 =====


@triton.jit
def decode_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    req_to_token_ptr,
    req_pool_indices_ptr,
    seq_lens_ptr,
    sm_scale,
    kv_group_num,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_ob,
    stride_oh,
    stride_r2t,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Program (b, h): query head h of batch entry b over that request's seq_len tokens."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    # BEGIN SOLUTION (stub: h // kv_group_num  # grouped query heads share a KV head)
    kv_h = h // kv_group_num  # grouped query heads share a KV head
    # END SOLUTION
    seq_len = tl.load(seq_lens_ptr + b)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + d).to(tl.float32)

    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)  # token positions in the request
        live = pos < seq_len
        # ===== EXERCISE 09: gather this block of the request's KV =====
        # The request's row of the request table is req_pool_indices[b] (NOT b); its token at
        # position p lives in slot req_to_token[row, p] (row r starts at
        # req_to_token_ptr + r * stride_r2t). Load the BLOCK_N slots (masked by `live`, as int64),
        # then the K rows, a (BLOCK_N, HEAD_DIM) tile: k_ptr + slot * stride_ks + kv_h * stride_kh
        # + d, and the V rows the same way from v_ptr (V has strides of its own); masked loads,
        # other=0.0. Name the tiles k and v: the code after this section uses them.
        # Why int64: req_to_token is int32 and a stride fits in 32 bits, so slot * stride_ks is
        # computed in 32 bits unless the slot was cast first. Past 2^31 elements (a pool of 2
        # million tokens at 8 KV heads x 128 dims) it wraps to a negative offset: the kernel reads
        # another token's KV or faults. Cast the slots, not the product (too late).
        # BEGIN SOLUTION (stub: # YOUR CODE HERE)
        row = tl.load(req_pool_indices_ptr + b).to(tl.int64)
        slots = tl.load(
            req_to_token_ptr + row * stride_r2t + pos, mask=live, other=0
        ).to(tl.int64)
        k = tl.load(
            k_ptr + slots[:, None] * stride_ks + kv_h * stride_kh + d[None, :],
            mask=live[:, None],
            other=0.0,
        )
        v = tl.load(
            v_ptr + slots[:, None] * stride_vs + kv_h * stride_vh + d[None, :],
            mask=live[:, None],
            other=0.0,
        )
        # END SOLUTION
        # ===== END EXERCISE 09 =====
        s = tl.sum(q[None, :] * k.to(tl.float32), 1) * sm_scale
        s = tl.where(live, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    out = acc / tl.maximum(l_i, 1e-30)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + d, out.to(o_ptr.dtype.element_ty))


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Attention output (bs, heads, head_dim) for one query token per request.

    q (bs, heads, head_dim); k_buffer / v_buffer (slots, kv_heads, head_dim), fp16 or fp32;
    req_to_token (rows, max_context_len) int32; req_pool_indices and seq_lens (bs,) integer
    tensors (every seq_len >= 1); head_dim a power of two; all on one device.
    """
    if not GATHER_WRITTEN:
        raise NotImplementedError(
            "decode_attention_kernel: write the gather (EXERCISE 09), "
            "then set GATHER_WRITTEN = True"
        )
    bs, heads, head_dim = q.shape
    o = torch.empty_like(q)
    sm_scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    decode_attention_kernel[(bs, heads)](
        q,
        k_buffer,
        v_buffer,
        o,
        req_to_token,
        req_pool_indices,
        seq_lens,
        sm_scale,
        heads // k_buffer.shape[1],
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        o.stride(0),
        o.stride(1),
        req_to_token.stride(0),
        HEAD_DIM=head_dim,
        BLOCK_N=16,
    )
    return o
