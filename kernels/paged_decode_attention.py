"""Paged decode attention: one query token per request attends over KV read through a mapping.

The KV pool is the flat slot layout of memlab.sglang.kv_pool: a buffer (slots, kv_heads,
dim) per layer. A request's t-th token lives in some slot; which slot is the whole point
of the course. Two spellings of that mapping are read here:

- SGLang: ``req_to_token[req_pool_indices[b], t]`` is the slot (one row per request).
- vLLM:   ``block_table[b, t // page_size] * page_size + t % page_size`` (one block id per page).

One program per (request, query head). Grouped query heads share a KV head (``h // group``).
MLA's absorbed decode is the same loop with one KV head whose key row is
``[latent (kv_lora_rank) | rope (qk_rope_head_dim)]`` and whose value is the latent part of the
very same row, so V is not loaded a second time (``V_FROM_K``).

Softmax is computed online (running max ``m_i``, running sum ``l_i``) in fp32 whatever the
storage dtype (fp16 or fp32). No tl.dot, no block pointers: the portable subset that runs in the
Triton interpreter and on a T4 (sm_75). One pass over the KV, no split-KV (flash-decoding) stage:
a long request with few heads leaves the GPU underused, which is fine at teaching sizes.
"""

import triton
import triton.language as tl


# ----------------------------------------------------------------------------------------------
# The gather: logical token positions of one request -> physical slots.
# These two helpers are the only places that read a mapping; everything after them is plain
# attention over rows of the KV buffers. (A later exercise asks learners to write the first.)
# ----------------------------------------------------------------------------------------------
@triton.jit
def _slots_from_req_to_token(req_to_token_ptr, stride_req_to_token, row, pos, mask):
    # SGLang: the request's row of the request table lists its slots, position by position.
    slots = tl.load(
        req_to_token_ptr + row * stride_req_to_token + pos, mask=mask, other=0
    )
    return slots.to(tl.int64)  # slot * row stride can pass 2**31 in a large pool


@triton.jit
def _slots_from_block_table(
    block_table_ptr, stride_block_table, req, pos, mask, page_size
):
    # vLLM: one block id per page; the offset inside the page is the position modulo page size.
    block = tl.load(
        block_table_ptr + req * stride_block_table + pos // page_size,
        mask=mask,
        other=0,
    )
    return block.to(tl.int64) * page_size + pos % page_size


@triton.jit
def _paged_decode_kernel(
    q_ptr,
    q_pe_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    table_ptr,
    req_pool_indices_ptr,
    seq_lens_ptr,
    sm_scale,
    page_size,
    kv_group_num,
    d_main,
    d_pe,
    d_v,
    stride_qb,
    stride_qh,
    stride_qpb,
    stride_qph,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_ob,
    stride_oh,
    stride_table,
    USE_BLOCK_TABLE: tl.constexpr,
    V_FROM_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DPE: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    kv_h = h // kv_group_num
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    if USE_BLOCK_TABLE:
        row = b.to(tl.int64)  # vLLM's block table has one row per batch entry
    else:
        row = tl.load(req_pool_indices_ptr + b).to(tl.int64)

    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < d_main
    q = tl.load(
        q_ptr + b * stride_qb + h * stride_qh + offs_d, mask=mask_d, other=0.0
    ).to(tl.float32)
    if BLOCK_DPE > 0:
        offs_dpe = tl.arange(0, BLOCK_DPE)
        mask_dpe = offs_dpe < d_pe
        q_pe = tl.load(
            q_pe_ptr + b * stride_qpb + h * stride_qph + offs_dpe,
            mask=mask_dpe,
            other=0.0,
        ).to(tl.float32)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_dv = offs_dv < d_v

    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        mask_n = pos < seq_len

        # ---- BEGIN GATHER: this request's tokens start..start+BLOCK_N -> slots -> K rows ----
        if USE_BLOCK_TABLE:
            slots = _slots_from_block_table(
                table_ptr, stride_table, row, pos, mask_n, page_size
            )
        else:
            slots = _slots_from_req_to_token(table_ptr, stride_table, row, pos, mask_n)
        k_rows = k_ptr + slots[:, None] * stride_ks + kv_h * stride_kh
        k = tl.load(
            k_rows + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :], other=0.0
        )
        # ---- END GATHER ----

        s = tl.sum(q[None, :] * k.to(tl.float32), 1)
        if BLOCK_DPE > 0:
            # MLA: the rope part of the key sits after the latent part in the same row.
            k_pe = tl.load(
                k_rows + d_main + offs_dpe[None, :],
                mask=mask_n[:, None] & mask_dpe[None, :],
                other=0.0,
            )
            s += tl.sum(q_pe[None, :] * k_pe.to(tl.float32), 1)
        s = tl.where(mask_n, s * sm_scale, -float("inf"))

        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp(m_i - m_new)  # rescales what was summed under the old maximum
        p = tl.exp(s - m_new)
        if V_FROM_K:
            v = k  # MLA: V is the latent part already loaded as K
        else:
            v = tl.load(
                v_ptr
                + slots[:, None] * stride_vs
                + kv_h * stride_vh
                + offs_dv[None, :],
                mask=mask_n[:, None] & mask_dv[None, :],
                other=0.0,
            )
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new

    # l_i >= 1 whenever the request has a token (the maximum contributes exp(0) = 1); an empty
    # request (a padded batch entry, seq_len 0) gets zeros instead of 0/0.
    out = acc / tl.maximum(l_i, 1.0)
    tl.store(
        o_ptr + b * stride_ob + h * stride_oh + offs_dv,
        out.to(o_ptr.dtype.element_ty),
        mask=mask_dv,
    )


def launch(
    q,
    q_pe,
    k,
    v,
    o,
    table,
    req_pool_indices,
    seq_lens,
    sm_scale,
    page_size,
    d_main,
    d_pe,
    d_v,
    use_block_table,
    v_from_k,
):
    """Launch on checked, flat-slot-layout tensors (memlab.common.attention does the checking).

    q (bs, H, >= d_main), q_pe (bs, H, >= d_pe) or q when d_pe == 0, k/v (slots, kv_heads, dim),
    o (bs, H, >= d_v); table: req_to_token or block_table; req_pool_indices ignored with a block
    table (pass seq_lens).
    """
    bs, num_heads = q.shape[0], q.shape[1]
    kv_group_num = num_heads // k.shape[1]
    block_d = triton.next_power_of_2(d_main)
    block_dpe = triton.next_power_of_2(d_pe) if d_pe > 0 else 0
    block_dv = triton.next_power_of_2(d_v)
    # Keep a K tile (BLOCK_N x BLOCK_D fp32 values) within a T4's registers: wide MLA rows
    # take shorter tiles.
    block_n = 32 if block_d <= 128 else 16
    for name, t in (("q", q), ("q_pe", q_pe), ("k", k), ("v", v), ("o", o)):
        if t.stride(-1) != 1:
            raise ValueError(
                f"{name} must be contiguous in its last dimension, got strides {t.stride()}"
            )
    _paged_decode_kernel[(bs, num_heads)](
        q,
        q_pe,
        k,
        v,
        o,
        table,
        req_pool_indices,
        seq_lens,
        sm_scale,
        page_size,
        kv_group_num,
        d_main,
        d_pe,
        d_v,
        q.stride(0),
        q.stride(1),
        q_pe.stride(0),
        q_pe.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        o.stride(0),
        o.stride(1),
        table.stride(0),
        USE_BLOCK_TABLE=use_block_table,
        V_FROM_K=v_from_k,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        BLOCK_DPE=block_dpe,
        BLOCK_DV=block_dv,
        num_warps=4 if block_d <= 128 else 8,
    )
    return o
