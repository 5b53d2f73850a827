"""The boundary: argument checks for the core layers, written once, one validator per entry point.

A core method calls its validator first and then runs the algorithm the way the engine does, so
the algorithm reads top to bottom without the checks interleaved. What lives here gives a
learner a clear error for a bad argument (types, ranges, devices, lengths), naming the bad
value. What does NOT live here: the checks the engines make themselves (SGLang's ``debug_mode``
asserts, the capacity refusal before anything is taken, vLLM's free-queue errors); those stay in
the algorithm, where the engine has them.

Cost: these checks read shapes, dtypes and devices, which costs nothing. Checks that must read
id VALUES (ranges, alignment) run only where that costs no host-device sync: when the ids live
on the CPU, or in ``debug_mode`` (which the tests turn on). Scans of whole books run only in
``debug_mode``.

Sections follow the teaching order: request table, KV pools, allocators, the vLLM side, hybrid
pools, write locations, attention. This module imports nothing of memlab at module level, so
every layer can use it without raising its import floor.
"""

from __future__ import annotations

import numbers

import torch

INDEX_DTYPES = (torch.int32, torch.int64)


# ---- shared validators ------------------------------------------------------------------------

def integer(name: str, v, lo: int = 0) -> int:
    """``v`` as a Python int >= ``lo``. Any integral number is accepted: int, NumPy integers, a
    0-d integer tensor. A bool is not a count, and neither is a float (even 3.0)."""
    if type(v) is int:  # the common case: one type check
        pass
    elif isinstance(v, torch.Tensor) and v.dim() == 0 and not v.dtype.is_floating_point \
            and not v.dtype.is_complex and v.dtype != torch.bool:
        v = int(v)
    elif isinstance(v, numbers.Integral) and not isinstance(v, bool):
        v = int(v)
    else:
        raise TypeError(f"{name} must be an int (or a NumPy integer, or a 0-d integer tensor), "
                        f"got {type(v).__name__} {v!r}")
    if v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v}")
    return v


def positive_ints(**values) -> None:
    """Each value a positive integer; the message names the first that is not (a TypeError when
    it is no integer at all)."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name} must be a positive int, got {type(v).__name__} {v!r}")
        if v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def index_tensor(name: str, t, device=None, ndim: int | None = None, owner: str = "allocator") -> None:
    """A tensor of ids: int32 or int64, on ``device`` (when given: the ``owner``'s), of ``ndim``
    dims (when given)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of ids, got {type(t).__name__}")
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must hold int32/int64 ids, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, the {owner} on {device}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")


def can_read_values(debug_mode: bool, t: torch.Tensor) -> bool:
    """Whether a check may read the values of ``t``: always on the CPU, on a GPU only in debug mode
    (reading them there is a host-device sync)."""
    return t.numel() > 0 and (debug_mode or t.device.type == "cpu")


# ---- layer 2: the KV pools --------------------------------------------------------------------


# ---- the vLLM side (chapter 06) --------------------------------------------------------------------

VLLM_BACKENDS = ("triton", "torch", "python")


def vllm_request(request_id, prompt_token_ids, mm_features: list, cache_salt) -> None:
    if prompt_token_ids is None:  # vLLM's message; an empty prompt is a request, as in vLLM
        raise ValueError("Neither prompt_token_ids nor prompt_embeds were defined.")
    bad = [t for t in prompt_token_ids if not isinstance(t, int) or isinstance(t, bool) or t < 0]
    if bad:
        raise ValueError(f"request {request_id!r}: token ids must be ints >= 0, got {bad[:3]!r}")
    for prev, item in zip(mm_features, mm_features[1:]):
        if item.offset < prev.offset + prev.length:
            raise ValueError(f"request {request_id!r}: multimodal items must be sorted and disjoint, "
                             f"got {prev} then {item}")
    for item in mm_features:
        if item.offset < 0 or item.length <= 0 or item.offset + item.length > len(prompt_token_ids):
            raise ValueError(f"request {request_id!r}: multimodal item {item} lies outside the "
                             f"{len(prompt_token_ids)}-token prompt")
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise TypeError(f"cache_salt must be a str or None, got {cache_salt!r}")


def cache_full_blocks(request, blocks, num_full_blocks: int) -> None:
    if num_full_blocks > len(blocks) or num_full_blocks > len(request.block_hashes):
        raise ValueError(f"cannot cache {num_full_blocks} full blocks: the request holds {len(blocks)} "
                         f"blocks and {len(request.block_hashes)} block hashes")


def blocks_to_cache(todo: list) -> None:
    """(block, hash) pairs about to be cached: none hashed already, none twice."""
    for block, _ in todo:
        block.check_unhashed()
    if len(todo) > 1:
        ids = [block.block_id for block, _ in todo]
        if len(set(ids)) != len(ids):
            dup = next(b for k, b in enumerate(ids) if b in ids[:k])
            raise ValueError(f"block {dup} appears twice among the blocks to cache")


def compute_slot_mapping(block_table, req_indices, positions, block_size, num_tokens: int, backend: str,
                         num_blocks_per_row=None) -> None:
    """Host-side validation (CPU tensors: no device sync). Errors name the first bad token."""
    if backend not in VLLM_BACKENDS:
        raise ValueError(f"backend must be one of {VLLM_BACKENDS}, got {backend!r}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise TypeError(f"block_table must be a 2-D int32 tensor, got {block_table.dtype} {tuple(block_table.shape)}")
    if req_indices.shape != positions.shape or positions.dim() != 1:
        raise ValueError(f"req_indices {tuple(req_indices.shape)} and positions {tuple(positions.shape)} "
                         "must be 1-D and of one length")
    if not 0 <= num_tokens <= positions.numel():
        raise ValueError(f"num_tokens={num_tokens} outside 0..{positions.numel()}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
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


def store_kv(key, value, key_cache, value_cache, slot_mapping, backend: str) -> None:
    if backend not in VLLM_BACKENDS:
        raise ValueError(f"backend must be one of {VLLM_BACKENDS}, got {backend!r}")
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
    if slot_mapping.dtype not in INDEX_DTYPES:
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


def block_row(table, row_idx) -> None:
    if isinstance(row_idx, bool) or not isinstance(row_idx, numbers.Integral) or not 0 <= row_idx < table.max_num_reqs:
        raise ValueError(f"row_idx {row_idx!r} outside 0..{table.max_num_reqs - 1}")


def append_row(table, block_ids, row_idx, start: int) -> None:
    """New block ids for a row that holds ``start`` blocks: they must fit and be ids."""
    if not block_ids:
        return
    if start + len(block_ids) > table.max_num_blocks_per_req:
        raise ValueError(f"row {row_idx} holds {start} blocks; {len(block_ids)} more exceed "
                         f"max_num_blocks_per_req={table.max_num_blocks_per_req}")
    if min(block_ids) < 0:
        raise ValueError(f"block ids must be >= 0, got {list(block_ids)}")


def block_table_slot_mapping(table, req_indices, positions, num_padded: int, backend: str) -> None:
    num_tokens = positions.numel()
    if not num_tokens <= num_padded <= table.slot_mapping.numel():
        raise ValueError(f"num_padded={num_padded} must lie in {num_tokens}..{table.slot_mapping.numel()}")
    compute_slot_mapping(table.block_table, req_indices, positions, table.block_size, num_tokens, backend,
                         table.num_blocks_per_row)


# ---- hybrid pools: sliding window (chapter 07) ---------------------------------------------------

def swa_kv_pool(full_ids: list, swa_ids: list, size_swa, swa_req_ring_size, num_req_rows) -> None:
    if set(full_ids) & set(swa_ids):
        raise ValueError(f"layers {sorted(set(full_ids) & set(swa_ids))} are both full and SWA")
    if not full_ids or not swa_ids:
        raise ValueError("an SWAKVPool needs at least one full and one SWA layer")
    if swa_req_ring_size is not None and (isinstance(num_req_rows, bool) or not isinstance(num_req_rows, int)
                                          or num_req_rows <= 0):
        raise ValueError(f"ring mode sizes the SWA pool by request rows: num_req_rows={num_req_rows!r}")
    if swa_req_ring_size is None and size_swa is None:
        raise ValueError("size_swa is required unless swa_req_ring_size is given")


def swa_write(layer_id, swa_loc) -> None:
    if swa_loc is None:
        raise ValueError(f"SWAKVPool.set_kv_buffer: layer {layer_id} is a sliding-window layer and the "
                         "write loc has no swa_loc; pass allocator.write_loc(out_cache_loc)")


# ---- write locations (chapters 07 to 09) --------------------------------------------------------


def physical_write_loc(loc, where: str):
    """The write door of a pool with virtual ids (``requires_physical_write_loc``): only a
    KVWriteLoc marked physical passes; the message says what to pass. A flag read, no sync."""
    if getattr(loc, "physical", False) is True:
        return loc
    got = "a bare tensor" if isinstance(loc, torch.Tensor) else (
        "a KVWriteLoc not marked physical" if hasattr(loc, "physical") else repr(type(loc).__name__))
    raise ValueError(
        f"{where}: write loc is not marked physical (got {got}); this pool's ids are virtual. Pass the "
        "batch's plan-bound ids, or KVWriteLoc(loc, physical=True) for ids translated separately.")


def plain_loc(loc, where: str) -> None:
    if not isinstance(loc, torch.Tensor):
        raise TypeError(f"{where}: loc must be a tensor of slot ids or a KVWriteLoc, got {type(loc).__name__}")


# ---- layer 3: the allocators -------------------------------------------------------------------

def unit(alloc) -> str:
    """What an allocator's ids are called: chapter 03 speaks of slots (page size 1), 04 of pages."""
    return "slot" if alloc.page_size == 1 else "page"


def alloc(alloc, need_size) -> int:
    need_size = integer("need_size", need_size, 0)
    if need_size % alloc.page_size:
        raise ValueError(f"alloc needs whole pages: {need_size} is not a multiple of {alloc.page_size}")
    return need_size


def _page_range(alloc, lo: int, hi: int) -> None:
    first, last = alloc.page_id_range()
    if lo < first or hi > last:
        u = unit(alloc)
        raise ValueError(f"cannot free {u} {lo if lo < first else hi}: {u}s are {first}..{last} "
                         f"({u} 0 is padding)")


def free(alloc, free_index, name: str = "free_index") -> None:
    """Slot ids to free. Checked on each call, so one bad id inside a free group is refused at
    once, not at the group's end."""
    index_tensor(name, free_index, alloc.device)
    if can_read_values(alloc.debug_mode, free_index):
        ps = alloc.page_size
        _page_range(alloc, int(free_index.min()) // ps, int(free_index.max()) // ps)


def free_segment(alloc, free_index, start_pos) -> None:
    free(alloc, free_index)
    ps = alloc.page_size
    if start_pos % ps:
        raise ValueError(f"free_segment needs a page-aligned start: position {start_pos} is not a "
                         f"multiple of page_size {ps}; use free() for unaligned runs")
    firsts = free_index[::ps]
    if alloc.debug_mode and (firsts % ps).any():
        bad = int(firsts[firsts % ps != 0][0])
        raise ValueError(f"free_segment: slot {bad} should start a page but sits at offset "
                         f"{bad % ps}: the run is not page-aligned in memory")


def free_group_begin(alloc) -> None:
    if alloc.free_group is not None:
        raise RuntimeError("free groups do not nest: free_group_begin called inside an open group")


def free_group_end(alloc) -> None:
    if alloc.free_group is None:
        raise RuntimeError("free_group_end without free_group_begin")


def _batch(alloc, lens: dict, cpu: dict) -> int:
    """1-D id tensors of one batch size on the allocator's device, their host copies on the CPU; in
    debug mode each device tensor must equal its copy (the engine counts pages on the copies)."""
    bs = len(next(iter(lens.values()))) if isinstance(next(iter(lens.values())), torch.Tensor) else None
    for name, t in lens.items():
        index_tensor(name, t, alloc.device, ndim=1)
        if len(t) != bs:
            raise ValueError(f"{name} has {len(t)} entries, the batch has {bs}")
    for (name, t), dev in zip(cpu.items(), lens.values()):
        index_tensor(name, t, torch.device("cpu"), ndim=1, owner="host copy (no sync)")
        if len(t) != bs:
            raise ValueError(f"{name} must hold {bs} lengths, got {len(t)}")
        if alloc.debug_mode and not torch.equal(dev.cpu().to(torch.int64), t.to(torch.int64)):
            raise ValueError(f"{name} disagrees with its device tensor: {t.tolist()} vs {dev.tolist()}")
    if bs == 0:
        raise ValueError("empty batch")
    return bs


def _last_loc(alloc, last_loc: torch.Tensor, prefix_cpu: torch.Tensor) -> None:
    """The caller's contract, checked where it costs no sync (CPU, or debug mode): each last_loc
    ends its prefix (SGLang asserts ``(last_loc + 1) % ps == prefix_lens % ps`` in debug mode); in
    debug mode the books tell too whether its page is held (a free or foreign-pool page is not)."""
    if not can_read_values(alloc.debug_mode, last_loc):
        return
    ps, last = alloc.page_size, last_loc.cpu().to(torch.int64)
    empty = prefix_cpu == 0
    bad = torch.where(empty, last != -1, (last < ps) | ((last + 1) % ps != prefix_cpu % ps)).nonzero()
    if len(bad):
        i = bad[0].item()
        raise ValueError(f"request {i}: last_loc {last[i].item()} cannot end a prefix of {prefix_cpu[i].item()} "
                         f"tokens with page_size {ps} (an empty prefix has last_loc -1)")
    if alloc.debug_mode and (~empty).any():
        pages, held = last[~empty] // ps, alloc._ledger()
        free = (pages >= len(held)) | ~held[pages.clamp(max=len(held) - 1)]
        if free.any():
            raise ValueError(f"last_loc {int(last[~empty][free][0])} lies in page {int(pages[free][0])}, which no "
                             "request holds: last_loc must be a slot of the request's own last page")


def alloc_extend(alloc, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens) -> None:
    _batch(alloc, dict(prefix_lens=prefix_lens, seq_lens=seq_lens, last_loc=last_loc),
           dict(prefix_lens_cpu=prefix_lens_cpu, seq_lens_cpu=seq_lens_cpu))
    short = (seq_lens_cpu < prefix_lens_cpu).nonzero()
    if len(short):
        i = short[0].item()
        raise ValueError(f"request {i}: seq_len {seq_lens_cpu[i].item()} is shorter than its "
                         f"prefix {prefix_lens_cpu[i].item()}")
    if (prefix_lens_cpu < 0).any():
        raise ValueError(f"prefix lengths must be >= 0, got {prefix_lens_cpu.tolist()}")
    total = int((seq_lens_cpu - prefix_lens_cpu).sum())
    if integer("extend_num_tokens", extend_num_tokens, 0) != total:
        raise ValueError(f"extend_num_tokens is {extend_num_tokens} but the lengths add up to {total}")
    _last_loc(alloc, last_loc, prefix_lens_cpu)


def alloc_decode(alloc, seq_lens, seq_lens_cpu, last_loc) -> None:
    _batch(alloc, dict(seq_lens=seq_lens, last_loc=last_loc), dict(seq_lens_cpu=seq_lens_cpu))
    if (seq_lens_cpu < 1).any():
        raise ValueError(f"decode seq_lens count the new token, so must be >= 1: {seq_lens_cpu.tolist()}")
    _last_loc(alloc, last_loc, seq_lens_cpu - 1)


# ---- the unified pool (chapter 12) -----------------------------------------------------------------


# ---- attention through the mappings (chapter 09): shapes and dtypes only, no device sync ----------

ATTN_DTYPES = (torch.float16, torch.float32)


def _float(name, t, like=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if like is None and t.dtype not in ATTN_DTYPES:
        raise TypeError(f"{name} must be float16 or float32 (portable kernels), got {t.dtype}")
    if like is not None and t.dtype != like:
        raise TypeError(f"{name} must be {like} like q, got {t.dtype}")


def _attn_ids(name, t, ndim) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")


def _heads(q, num_kv_heads) -> None:
    if q.dim() != 3:
        raise ValueError(f"q must be (batch, q_heads, head_dim), got shape {tuple(q.shape)}")
    if num_kv_heads < 1 or q.shape[1] % num_kv_heads:
        raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of kv heads ({num_kv_heads})")


def _attn_batch(q, seq_lens, table, table_name, rows=None) -> None:
    if rows is not None:
        _attn_ids("req_pool_indices", rows, 1)
    _attn_ids("seq_lens", seq_lens, 1)
    _attn_ids(table_name, table, 2)
    if table.dtype != torch.int32:
        raise TypeError(f"{table_name} must be int32 (as the engines keep it), got {table.dtype}")
    if seq_lens.shape[0] != q.shape[0] or (rows is not None and rows.shape[0] != q.shape[0]):
        raise ValueError(f"batch sizes differ: q {q.shape[0]}, seq_lens {seq_lens.shape[0]}"
                         + ("" if rows is None else f", req_pool_indices {rows.shape[0]}"))


def _attn_out(o, q, d_v) -> None:
    if o is None:
        return
    _float("o", o, q.dtype)
    shape = (q.shape[0], q.shape[1], d_v)
    if tuple(o.shape) != shape:
        raise ValueError(f"o must have shape {shape}, got {tuple(o.shape)}")


def _paged_cache(name, cache, heads_axis: bool = True) -> torch.Tensor:
    """A paged cache (num_blocks, block_size, kv_heads, dim) (MLA: the head axis may be missing)
    that views flat as (slots, kv_heads, dim); returns that view for the shape checks."""
    if cache.dim() == 3 and not heads_axis:
        cache = cache.unsqueeze(2)
    if cache.dim() != 4:
        raise ValueError(f"{name} must be (num_blocks, block_size, kv_heads, head_dim), got {tuple(cache.shape)}")
    try:
        return cache.view(cache.shape[0] * cache.shape[1], cache.shape[2], cache.shape[3])
    except RuntimeError as exc:
        raise ValueError(f"{name}'s blocks must be laid out contiguously (slot = block * block_size "
                         f"+ offset), got strides {cache.stride()}") from exc


def _mha(q, k, v, k_name, v_name, full_k_shape, full_v_shape) -> None:
    if k.shape[-1] != q.shape[-1] or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"shapes disagree: q {tuple(q.shape)}, {k_name} {full_k_shape}, {v_name} {full_v_shape}")


def decode_attention(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, o) -> None:
    _float("q", q)
    _float("k_buffer", k_buffer, q.dtype)
    _float("v_buffer", v_buffer, q.dtype)
    _heads(q, k_buffer.shape[1])
    _attn_batch(q, seq_lens, req_to_token, "req_to_token", req_pool_indices)
    _mha(q, k_buffer, v_buffer, "k_buffer", "v_buffer", tuple(k_buffer.shape), tuple(v_buffer.shape))
    _attn_out(o, q, v_buffer.shape[-1])


def paged_attention(query, key_cache, value_cache, block_table, seq_lens, out) -> None:
    _float("query", query)
    _float("key_cache", key_cache, query.dtype)
    _float("value_cache", value_cache, query.dtype)
    k = _paged_cache("key_cache", key_cache)
    v = _paged_cache("value_cache", value_cache)
    _heads(query, k.shape[1])
    _attn_batch(query, seq_lens, block_table, "block_table")
    _mha(query, k, v, "key_cache", "value_cache", tuple(key_cache.shape), tuple(value_cache.shape))
    _attn_out(out, query, v.shape[-1])


def _mla(q_nope, q_rope, kv) -> None:
    _float("q_nope", q_nope)
    _float("q_rope", q_rope, q_nope.dtype)
    _float("kv_buffer", kv, q_nope.dtype)
    if q_nope.dim() != 3 or q_rope.shape[:2] != q_nope.shape[:2]:
        raise ValueError(f"q_nope (bs, H, kv_lora_rank) and q_rope (bs, H, qk_rope_head_dim) disagree: "
                         f"{tuple(q_nope.shape)} vs {tuple(q_rope.shape)}")
    if kv.shape[1] != 1 or kv.shape[2] != q_nope.shape[2] + q_rope.shape[2]:
        raise ValueError(f"the latent buffer must be (slots, 1, kv_lora_rank + qk_rope_head_dim) = "
                         f"(slots, 1, {q_nope.shape[2] + q_rope.shape[2]}), got {tuple(kv.shape)}")


def mla_decode_attention(q_nope, q_rope, kv_buffer, req_to_token, req_pool_indices, seq_lens, o) -> None:
    _mla(q_nope, q_rope, kv_buffer)
    _attn_batch(q_nope, seq_lens, req_to_token, "req_to_token", req_pool_indices)
    _attn_out(o, q_nope, q_nope.shape[-1])


def mla_paged_attention(q_nope, q_rope, kv_c_and_k_pe_cache, block_table, seq_lens, out) -> None:
    kv = _paged_cache("kv_c_and_k_pe_cache", kv_c_and_k_pe_cache, heads_axis=False)
    _mla(q_nope, q_rope, kv)
    _attn_batch(q_nope, seq_lens, block_table, "block_table")
    _attn_out(out, q_nope, q_nope.shape[-1])
