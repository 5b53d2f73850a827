"""Decode attention through the mappings (sglang/kernels/ops/attention/decode_attention.py).

One query token per request attends over that request's tokens, which sit in scattered slots
of a KV pool. The slots are found through one of two spellings of the same mapping:

- SGLang: ``req_to_token[req_pool_indices[b], t]`` (the request table of
  memlab.sglang.req_to_token);
- vLLM: ``block_table[b, t // block_size] * block_size + t % block_size``.

The KV is memlab.sglang.kv_pool's flat slot layout, ``(slots, kv_heads, head_dim)`` per
layer. For the block-table spelling the cache is given as ``(num_blocks, block_size,
kv_heads, head_dim)``, the layout of vLLM's FlashAttention and Triton backends: it is a
free view of the flat layout (slot = block * block_size + offset), so one pool can be
read through both spellings. (vLLM's CUDA paged-attention kernel splits head_dim once
more for vectorised loads; that is a GPU detail.)

Three implementations that must agree: the Triton kernel (``kernels/paged_decode_attention.py``,
launched by the functions below), a torch reference over KV gathered into dense tensors, and a
plain-Python reference (loops; tiny sizes only). All accumulate in fp32.
"""

from __future__ import annotations

import math

import torch

from memlab.common import _checks

__all__ = [
    "decode_attention_fwd",
    "paged_attention",
    "mla_decode_attention_fwd",
    "mla_paged_attention",
    "slots_from_req_to_token",
    "slots_from_block_table",
    "attention_over_slots",
    "python_slots_from_req_to_token",
    "python_slots_from_block_table",
    "python_attention_over_slots",
]


# ---------------------------------------------------------------------------------------------
# The mappings, gathered on the host: (bs, max_len) slot ids and a mask of real tokens.
# ---------------------------------------------------------------------------------------------
def slots_from_req_to_token(req_to_token, req_pool_indices, seq_lens):
    """Slots of every request's tokens via SGLang's request table: ``(slots, mask)``, (bs, L)."""
    _check_slots(req_to_token, seq_lens, req_pool_indices)
    seq_lens = seq_lens.long()
    max_len = int(seq_lens.max()) if seq_lens.numel() else 0
    pos = torch.arange(max_len, device=seq_lens.device)
    mask = pos[None, :] < seq_lens[:, None]
    slots = req_to_token[req_pool_indices.long()][:, :max_len].long()
    return torch.where(mask, slots, 0), mask


def slots_from_block_table(block_table, seq_lens, block_size):
    """Slots of every request's tokens via vLLM's block table: ``(slots, mask)``, each (bs, L)."""
    _check_slots(block_table, seq_lens, block_size=block_size)
    seq_lens = seq_lens.long()
    max_len = int(seq_lens.max()) if seq_lens.numel() else 0
    pos = torch.arange(max_len, device=seq_lens.device)
    mask = pos[None, :] < seq_lens[:, None]
    blocks = block_table.long()[
        :, (pos // block_size).clamp(max=max(block_table.shape[1] - 1, 0))
    ]
    slots = blocks * block_size + pos % block_size
    return torch.where(mask, slots, 0), mask


def attention_over_slots(q, k_buffer, v_buffer, slots, mask, sm_scale):
    """Torch reference: gather each request's K/V rows into dense tensors, attend in fp32.

    q (bs, H, Dk); k_buffer (slots, KVH, Dk); v_buffer (slots, KVH, Dv); slots/mask (bs, L).
    Returns (bs, H, Dv) in q's dtype; a request with no tokens gets zeros.
    """
    _check_over_slots(q, k_buffer, v_buffer, slots, mask, sm_scale)
    bs, num_heads, _ = q.shape
    group = num_heads // k_buffer.shape[1]
    # padding positions may hold anything (NaN included): drop them
    keep = mask[:, :, None, None]
    # (bs, L, H, Dk)
    k = torch.where(keep, k_buffer[slots].float(), 0.0).repeat_interleave(group, dim=2)
    v = torch.where(keep, v_buffer[slots].float(), 0.0).repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,blhd->bhl", q.float(), k) * sm_scale
    scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all-masked rows: 0, not nan
    return torch.einsum("bhl,blhd->bhd", probs, v).to(q.dtype)


# ---------------------------------------------------------------------------------------------
# Plain-Python references: lists and loops, nothing vectorised (tiny sizes only).
# ---------------------------------------------------------------------------------------------
def python_slots_from_req_to_token(req_to_token, req_pool_indices, seq_lens):
    """Per request, the list of its slots, read position by position from its table row."""
    table = req_to_token.tolist()
    return [
        [table[row][t] for t in range(n)]
        for row, n in zip(req_pool_indices.tolist(), seq_lens.tolist())
    ]


def python_slots_from_block_table(block_table, seq_lens, block_size):
    """Per request, the list of its slots: block id * block_size + offset in the block."""
    table = block_table.tolist()
    return [
        [table[b][t // block_size] * block_size + t % block_size for t in range(n)]
        for b, n in enumerate(seq_lens.tolist())
    ]


def python_attention_over_slots(q, k_buffer, v_buffer, slot_lists, sm_scale):
    """Plain-Python reference of ``attention_over_slots``; returns a float32 tensor (bs, H, Dv)."""
    qs, ks, vs = (
        q.float().tolist(),
        k_buffer.float().tolist(),
        v_buffer.float().tolist(),
    )
    num_heads, group = q.shape[1], q.shape[1] // k_buffer.shape[1]
    out = []
    for b, slots in enumerate(slot_lists):
        per_head = []
        for h in range(num_heads):
            kv_h = h // group
            scores = [
                sm_scale * sum(a * c for a, c in zip(qs[b][h], ks[s][kv_h]))
                for s in slots
            ]
            top = max(scores, default=0.0)
            weights = [math.exp(x - top) for x in scores]
            total = sum(weights)
            per_head.append(
                [
                    sum(w * vs[s][kv_h][d] for w, s in zip(weights, slots)) / total
                    if slots
                    else 0.0
                    for d in range(v_buffer.shape[2])
                ]
            )
        out.append(per_head)
    return torch.tensor(out, dtype=torch.float32).reshape(
        q.shape[0], num_heads, v_buffer.shape[2]
    )


# ---------------------------------------------------------------------------------------------
# What the kernel wrappers share (their argument checks close this module).
# ---------------------------------------------------------------------------------------------
def _out(o, q, d_v):
    return (
        torch.empty((q.shape[0], q.shape[1], d_v), dtype=q.dtype, device=q.device)
        if o is None
        else o
    )


def _flat_cache(cache):
    """(num_blocks, block_size, [kv_heads,] dim) -> flat (slots, kv_heads, dim) view, block_size."""
    if cache.dim() == 3:  # vLLM's MLA layout has no head axis
        cache = cache.unsqueeze(2)
    return cache.view(
        cache.shape[0] * cache.shape[1], cache.shape[2], cache.shape[3]
    ), cache.shape[1]


def _scale(sm_scale, dim):
    return 1.0 / math.sqrt(dim) if sm_scale is None else float(sm_scale)


def _launch(**kw):
    # lazy: memlab imports without Triton
    from memlab.kernels import paged_decode_attention as kernel

    return kernel.launch(**kw)


# ---------------------------------------------------------------------------------------------
# The kernel, in each engine's spelling.
# ---------------------------------------------------------------------------------------------
def decode_attention_fwd(
    q,
    k_buffer,
    v_buffer,
    req_to_token,
    req_pool_indices,
    seq_lens,
    sm_scale=None,
    o=None,
):
    """SGLang spelling, MHA/GQA: q (bs, H, D); k_buffer/v_buffer (slots, KVH, D / Dv).

    Request b's token t is in slot ``req_to_token[req_pool_indices[b], t]``, t < seq_lens[b].
    ``sm_scale`` defaults to 1/sqrt(D). Returns o (bs, H, Dv), written in place when given.
    """
    _check_decode_attention(
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, o
    )
    if sm_scale is not None:
        _scale_arg("sm_scale", sm_scale)
    o = _out(o, q, v_buffer.shape[-1])
    return _launch(
        q=q,
        q_pe=q,
        k=k_buffer,
        v=v_buffer,
        o=o,
        table=req_to_token,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        sm_scale=_scale(sm_scale, q.shape[-1]),
        page_size=1,
        d_main=q.shape[-1],
        d_pe=0,
        d_v=v_buffer.shape[-1],
        use_block_table=False,
        v_from_k=False,
    )


def paged_attention(
    query, key_cache, value_cache, block_table, seq_lens, scale=None, out=None
):
    """vLLM spelling, MHA/GQA: key/value_cache (num_blocks, block_size, KVH, D); block_table
    (bs, blocks).

    Request b's token t is in slot ``block_table[b, t // block_size] * block_size + t %
    block_size``.
    """
    _check_paged_attention(query, key_cache, value_cache, block_table, seq_lens, out)
    if scale is not None:
        _scale_arg("scale", scale)
    k, block_size = _flat_cache(key_cache)
    v, _ = _flat_cache(value_cache)
    out = _out(out, query, v.shape[-1])
    return _launch(
        q=query,
        q_pe=query,
        k=k,
        v=v,
        o=out,
        table=block_table,
        req_pool_indices=seq_lens,
        seq_lens=seq_lens,
        sm_scale=_scale(scale, query.shape[-1]),
        page_size=block_size,
        d_main=query.shape[-1],
        d_pe=0,
        d_v=v.shape[-1],
        use_block_table=True,
        v_from_k=False,
    )


def mla_decode_attention_fwd(
    q_nope,
    q_rope,
    kv_buffer,
    req_to_token,
    req_pool_indices,
    seq_lens,
    sm_scale,
    o=None,
):
    """SGLang spelling, MLA (absorbed): kv_buffer (slots, 1, r + d_r), V = its first r columns.

    q_nope (bs, H, r) is the query already multiplied into the latent space; q_rope (bs, H, d_r).
    ``sm_scale`` is required: models scale by the original head dim (DeepSeek-V3: 1/sqrt(192)),
    not by r + d_r. Returns o (bs, H, r), the latent output (the caller applies W_UV).
    """
    _check_mla_decode_attention(
        q_nope, q_rope, kv_buffer, req_to_token, req_pool_indices, seq_lens, o
    )
    _scale_arg("sm_scale", sm_scale)
    r = q_nope.shape[-1]
    o = _out(o, q_nope, r)
    return _launch(
        q=q_nope,
        q_pe=q_rope,
        k=kv_buffer,
        v=kv_buffer,
        o=o,
        table=req_to_token,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        sm_scale=float(sm_scale),
        page_size=1,
        d_main=r,
        d_pe=q_rope.shape[-1],
        d_v=r,
        use_block_table=False,
        v_from_k=True,
    )


def mla_paged_attention(
    q_nope, q_rope, kv_c_and_k_pe_cache, block_table, seq_lens, scale, out=None
):
    """vLLM spelling, MLA: kv_c_and_k_pe_cache (num_blocks, block_size, r + d_r) (vLLM's layout, no
    head axis; (num_blocks, block_size, 1, r + d_r) is accepted too)."""
    _check_mla_paged_attention(
        q_nope, q_rope, kv_c_and_k_pe_cache, block_table, seq_lens, out
    )
    _scale_arg("scale", scale)
    kv, block_size = _flat_cache(kv_c_and_k_pe_cache)
    r = q_nope.shape[-1]
    out = _out(out, q_nope, r)
    return _launch(
        q=q_nope,
        q_pe=q_rope,
        k=kv,
        v=kv,
        o=out,
        table=block_table,
        req_pool_indices=seq_lens,
        seq_lens=seq_lens,
        sm_scale=float(scale),
        page_size=block_size,
        d_main=r,
        d_pe=q_rope.shape[-1],
        d_v=r,
        use_block_table=True,
        v_from_k=True,
    )


# ---------------------------------------------------------------------------------------------
# Argument checks: shapes, dtypes and devices; ids are read only on the CPU (on a GPU it would be
# a sync).
# ---------------------------------------------------------------------------------------------
ATTN_DTYPES = (torch.float16, torch.float32)


def _scale_arg(name, v) -> None:
    _checks.real(name, v, 0.0, float("inf"), lo_open=True)


def _float(name, t, like=None) -> None:
    # float16/32: the portable kernels' dtypes; every other tensor shares q's (and its device)
    dtypes, what = (ATTN_DTYPES, "") if like is None else ((like.dtype,), " like q")
    _checks.tensor(
        name, t, dtypes, like=what, device=None if like is None else like.device
    )


# the block-table spelling has no row indices (None is a bad argument)
_NO_ROWS = object()


def _ids(q, table, table_name, seq_lens, rows=_NO_ROWS, dtypes=(torch.int32,)) -> None:
    """One length (and one row) per query, int ids on q's device; the table 2-D and int32 for
    the kernels, as the engines keep it, with a row per query when it has no row indices (vLLM's
    spelling)."""
    _checks.tensor(table_name, table, dtypes, 2, device=q.device)
    ids = {"seq_lens": seq_lens} | (
        {} if rows is _NO_ROWS else {"req_pool_indices": rows}
    )
    for name, t in ids.items():
        _checks.tensor(name, t, _checks.INDEX_DTYPES, 1, device=q.device)
    per_query = {n: len(t) for n, t in ids.items()}
    per_query |= {table_name: len(table)} if rows is _NO_ROWS else {}
    for name, n in per_query.items():
        if n != q.shape[0]:
            raise ValueError(f"{name} has {n} entries for a batch of {q.shape[0]}")


def _ids_in_range(
    seq_lens, table, table_name, num_slots, rows=None, block_size=1
) -> None:
    """On the CPU, every row, length and slot (block) the kernel will read inside its table and
    the cache."""
    if not seq_lens.numel() or table.device.type != "cpu":
        return
    _checks.values_in("seq_lens", seq_lens, 0, table.shape[1] * block_size)
    if rows is not None:
        _checks.values_in("req_pool_indices", rows, 0, table.shape[0] - 1)
    picked = table if rows is None else table[rows.long()]
    used = torch.arange(table.shape[1])[None, :] * block_size < seq_lens[:, None].long()
    what = f"{table_name} (the {'blocks' if block_size > 1 else 'slots'} read)"
    _checks.values_in(what, picked[used], 0, num_slots // block_size - 1)


def _attn_out(o, q, d_v) -> None:
    if o is not None:
        _float("o", o, q)
        _checks.tensor("o", o, shape=(q.shape[0], q.shape[1], d_v))


def _paged_cache(name, cache, q, heads_axis: bool = True) -> torch.Tensor:
    """A paged cache (num_blocks, block_size, kv_heads, dim) (MLA: the head axis may be missing)
    like q that views flat as (slots, kv_heads, dim); returns that view."""
    _float(name, cache, q)
    cache = cache.unsqueeze(2) if cache.dim() == 3 and not heads_axis else cache
    if cache.dim() != 4:
        raise ValueError(f"{name} must be (num_blocks, block_size, kv_heads, head_dim)")
    try:  # slot = block * block_size + offset needs the blocks laid out one after another
        return cache.view(cache.shape[0] * cache.shape[1], *cache.shape[2:])
    except RuntimeError:
        raise ValueError(f"{name}'s blocks must be laid out contiguously") from None


def _mha(q, k, v, names=("q", "k_buffer", "v_buffer")) -> None:
    """q (bs, H, D) of a kernel dtype; k and v like it, (slots, kv_heads, D / Dv); H a multiple
    of kv_heads (GQA)."""
    for name, t in zip(names, (q, k, v)):
        _float(name, t, None if t is q else q)
    same = q.dim() == k.dim() == v.dim() == 3 and k.shape[-1] == q.shape[-1]
    if not same or v.shape[:2] != k.shape[:2]:
        shapes = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(names, (q, k, v)))
        raise ValueError(f"shapes disagree: {shapes}")
    if not k.shape[1] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"q heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[1]})"
        )


def _check_decode_attention(q, k, v, req_to_token, rows, seq_lens, o) -> None:
    _mha(q, k, v)
    _ids(q, req_to_token, "req_to_token", seq_lens, rows)
    _ids_in_range(seq_lens, req_to_token, "req_to_token", k.shape[0], rows)
    _attn_out(o, q, v.shape[-1])


def _check_paged_attention(
    query, key_cache, value_cache, block_table, seq_lens, out
) -> None:
    _float("query", query)
    k = _paged_cache("key_cache", key_cache, query)
    v = _paged_cache("value_cache", value_cache, query)
    _mha(query, k, v, ("query", "key_cache", "value_cache"))
    _ids(query, block_table, "block_table", seq_lens)
    bs = key_cache.shape[1]
    _ids_in_range(seq_lens, block_table, "block_table", k.shape[0], block_size=bs)
    _attn_out(out, query, v.shape[-1])


def _mla(q_nope, q_rope, kv) -> None:
    """q_nope (bs, H, kv_lora_rank) and q_rope (bs, H, qk_rope_head_dim) of a kernel dtype, the
    latent buffer like them, (slots, 1, kv_lora_rank + qk_rope_head_dim)."""
    _float("q_nope", q_nope)
    _float("q_rope", q_rope, q_nope)
    _float("kv_buffer", kv, q_nope)
    _checks.tensor("q_nope", q_nope, ndim=3)
    _checks.tensor("q_rope", q_rope, ndim=3)
    latent = (len(kv) if kv.dim() else 0, 1, q_nope.shape[2] + q_rope.shape[2])
    if q_rope.shape[:2] != q_nope.shape[:2] or tuple(kv.shape) != latent:
        raise ValueError(
            f"q_nope, q_rope and the latent buffer {tuple(kv.shape)} disagree"
        )


def _check_mla_decode_attention(
    q_nope, q_rope, kv, req_to_token, rows, seq_lens, o
) -> None:
    _mla(q_nope, q_rope, kv)
    _ids(q_nope, req_to_token, "req_to_token", seq_lens, rows)
    _ids_in_range(seq_lens, req_to_token, "req_to_token", kv.shape[0], rows)
    _attn_out(o, q_nope, q_nope.shape[-1])


def _check_mla_paged_attention(
    q_nope, q_rope, cache, block_table, seq_lens, out
) -> None:
    kv = _paged_cache("kv_c_and_k_pe_cache", cache, q_nope, heads_axis=False)
    _mla(q_nope, q_rope, kv)
    _ids(q_nope, block_table, "block_table", seq_lens)
    bs = cache.shape[1]
    _ids_in_range(seq_lens, block_table, "block_table", kv.shape[0], block_size=bs)
    _attn_out(out, q_nope, q_nope.shape[-1])


def _check_slots(table, seq_lens, rows=_NO_ROWS, block_size=1) -> None:
    """The references' mappings: int tables (int32 or int64: torch reads either), one length
    (and row) per request, inside them. The slot ids' bound is the cache's, which
    attention_over_slots checks."""
    _checks.index_tensor("seq_lens", seq_lens, ndim=1)
    _ids(
        torch.empty((len(seq_lens), 0, 0), device=seq_lens.device),
        table,
        "table",
        seq_lens,
        rows,
        _checks.INDEX_DTYPES,
    )
    _checks.integer("block_size", block_size, 1, _checks.INT32_MAX)
    rows = None if rows is _NO_ROWS else rows
    any_id = (_checks.INT32_MAX + 1) * block_size
    _ids_in_range(seq_lens, table, "table", any_id, rows, block_size)


def _check_over_slots(q, k_buffer, v_buffer, slots, mask, sm_scale) -> None:
    _mha(q, k_buffer, v_buffer)
    _checks.tensor("slots", slots, _checks.INDEX_DTYPES, 2, device=q.device)
    _checks.tensor("mask", mask, (torch.bool,), shape=slots.shape, device=q.device)
    if slots.shape[0] != q.shape[0]:
        raise ValueError(f"slots has {slots.shape[0]} rows for a batch of {q.shape[0]}")
    if slots.device.type == "cpu" and slots.numel():
        _checks.values_in("slots", slots[mask], 0, k_buffer.shape[0] - 1)
    _scale_arg("sm_scale", sm_scale)
