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

def integer(name: str, v, lo: int = 0, hi: int | None = None) -> int:
    """``v`` as a Python int in ``lo..hi``. Any integral number is accepted: int, NumPy integers, a
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
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{name} must be an int >= {lo}" + ("" if hi is None else f" and <= {hi}") + f", got {v}")
    return v


def real(name: str, v, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> float:
    """``v`` a real number (int or float, not a bool) in the interval from ``lo`` to ``hi``."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(v).__name__} {v!r}")
    if not ((lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)):
        raise ValueError(f"{name} must lie in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}, got {v!r}")
    return v


def int_list(name: str, values, lo: int = 0, hi: int | None = None) -> list[int]:
    """A sequence of ints (a list, a tuple, a range; not a str, not a tensor), each in ``lo..hi``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, range)):
        raise TypeError(f"{name} must be a list of ints, got {type(values).__name__}")
    for v in values:
        if type(v) is not int:  # a bool or a float is no token id, no block id
            raise TypeError(f"{name} must hold ints, got {type(v).__name__} {v!r}")
    out = [v for v in values if v < lo or (hi is not None and v > hi)]
    if out:
        raise ValueError(f"{name} must hold ints >= {lo}" + ("" if hi is None else f" and <= {hi}") + f", got {out[0]}")
    return list(values)


def nonneg_ints(**values) -> None:
    """Each value an int >= 0 (as ``integer``); the message names the first that is not."""
    for name, v in values.items():
        integer(name, v, 0)


def one_of(name: str, v, choices) -> None:
    if v not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {v!r}")


def instance(name: str, v, types, what: str | None = None) -> None:
    """``v`` an instance of ``types`` (a TypeError naming ``what`` it must be, else the types)."""
    if not isinstance(v, types):
        what = what or " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise TypeError(f"{name} must be {what}, got {type(v).__name__} {v!r}")


def tensor(name: str, t, dtypes=None, ndim: int | None = None, device=None, shape=None, like: str = "") -> None:
    """A torch.Tensor of one of ``dtypes`` (when given; a wrong one is a TypeError, ``like`` says
    whose dtype it must share), ``ndim`` dims, exactly ``shape`` and on ``device`` (when given; ValueError)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must be {' or '.join(str(d).replace('torch.', '') for d in dtypes)}{like}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")


def values_in(name: str, t: torch.Tensor, lo: int, hi) -> None:
    """Every value of ``t`` (read on the CPU: callers skip device tensors) in ``lo..hi``; ``hi`` a
    number or a tensor of bounds, one per value. The message names the first value outside."""
    v = t.reshape(-1).long()
    hi = torch.as_tensor(hi, dtype=torch.long).expand_as(t).reshape(-1) if hi is not None else None
    bad = (v < lo) if hi is None else (v < lo) | (v > hi)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"{name}[{i}] = {int(v[i])} is outside {lo}.." + ("" if hi is None else f"{int(hi[i])}"))


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


# ---- layer 1: the request table ---------------------------------------------------------------

def req_to_token_pool(size, max_context_len) -> tuple[int, int]:
    return integer("size", size, 1), integer("max_context_len", max_context_len, 1)


def alloc_rows(n) -> int:
    return integer("n (rows to allocate)", n, 0)


def alloc_reqs(reqs: list) -> None:
    """Each request once; a request that keeps its row (a chunked prefill) must already own KV."""
    if len({id(r) for r in reqs}) != len(reqs):
        dup = next(r for i, r in enumerate(reqs) if any(r is q for q in reqs[:i]))
        raise ValueError(f"{dup!r} appears twice in one alloc: it would take two rows and leak one")
    for r in reqs:
        if r.req_pool_idx is not None and r.kv_allocated_len <= 0:
            raise ValueError(f"{r!r} holds row {r.req_pool_idx} but owns no KV yet: "
                             "only a chunked prefill that already wrote KV may keep its row")


def free_row(pool, row) -> None:
    if isinstance(row, bool) or not isinstance(row, numbers.Integral) or not 1 <= row <= pool.size:
        raise ValueError(f"cannot free row {row!r}: rows are 1..{pool.size} (row 0 is padding)")
    if pool._row_free[row]:
        raise ValueError(f"double free: row {row} is already free")


# ---- layer 2: the KV pools --------------------------------------------------------------------

def kv_cache(size, page_size, dtype, layer_num, start_layer: int, end_layer: int) -> None:
    positive_ints(size=size, page_size=page_size, layer_num=layer_num)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
    if not dtype.is_floating_point:
        raise TypeError(f"a KV pool stores floating-point K/V: dtype {dtype} is not one "
                        "(use float16, bfloat16, float32 or an fp8 type)")
    if end_layer - start_layer + 1 != layer_num or start_layer < 0:
        raise ValueError(f"layers {start_layer}..{end_layer} do not make {layer_num} layers")


def dsa_index_head_dim(index_head_dim) -> None:
    positive_ints(index_head_dim=index_head_dim)
    if index_head_dim != 128:  # SGLang's DSATokenToKVPool asserts it: one head of 128 for DeepSeek's indexer
        raise ValueError(f"the DSA indexer keeps one key of 128 values per token and layer, got index_head_dim "
                         f"{index_head_dim}")


def layer_id(pool, layer_id) -> None:
    if not pool.start_layer <= layer_id <= pool.end_layer:
        raise IndexError(f"layer {layer_id} is not in this pool (layers {pool.start_layer}..{pool.end_layer})")


def kv_write(pool, loc, **rows) -> torch.Tensor:
    """A pool's write door: ``loc`` (slot ids, or a KVWriteLoc whose generic ids are used) and the
    rows to write, each given as ``name=(tensor, row shape the pool stores, names of its dims)``.
    Returns the slot ids."""
    where = f"{type(pool).__name__}.set_kv_buffer"
    if pool.requires_physical_write_loc:
        physical_write_loc(loc, where)
    if not isinstance(loc, torch.Tensor):
        # A KVWriteLoc (chapters 07 to 09) is read by its fields, so this module imports no later
        # chapter: a plain pool writes its generic ids ``loc``.
        loc = getattr(loc, "loc", loc)
        plain_loc(loc, where)
    if loc.dtype not in INDEX_DTYPES:
        raise TypeError(f"loc must be an int32/int64 tensor of slot ids, got {loc.dtype}")
    if loc.device != pool.device:
        raise ValueError(f"loc is on {loc.device}, the pool on {pool.device}")
    n = loc.numel()
    for name, (x, row_shape, dims) in rows.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a tensor, got {type(x).__name__}")
        if tuple(x.shape[1:]) != tuple(row_shape):
            raise ValueError(f"{where}: {name} has shape {tuple(x.shape)}; this pool stores rows of "
                             f"(tokens, {dims}) = (tokens, {', '.join(map(str, row_shape))})")
        if x.shape[0] != n:
            raise ValueError(f"{n} slots for {x.shape[0]} tokens")
    if loc.device.type == "cpu" and n:  # on a GPU this check would cost a sync per write
        bad = ((loc < 0) | (loc >= pool.size + pool.page_size)).nonzero()
        if len(bad):
            i = bad[0].item()
            raise ValueError(f"token {i} has slot {loc[i].item()}, outside 0..{pool.size + pool.page_size - 1}")
    return loc


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


def swa_layer(pool, layer_id) -> None:
    if layer_id not in pool.layers_mapping:
        raise IndexError(f"layer {layer_id} is in neither sub-pool (layers: {sorted(pool.layers_mapping)})")


def swa_write(layer_id, swa_loc) -> None:
    if swa_loc is None:
        raise ValueError(f"SWAKVPool.set_kv_buffer: layer {layer_id} is a sliding-window layer and the "
                         "write loc has no swa_loc; pass allocator.write_loc(out_cache_loc)")


def swa_allocator(kvcache, pool_type, size_swa, swa_req_ring_size, req_to_token_pool) -> None:
    if kvcache is not None and not isinstance(kvcache, pool_type):
        raise TypeError(f"kvcache must be an SWAKVPool, got {type(kvcache).__name__}")
    if kvcache is not None and swa_req_ring_size is None:
        swa_req_ring_size = kvcache.swa_req_ring_size
    if kvcache is not None and swa_req_ring_size != kvcache.swa_req_ring_size:
        raise ValueError(f"the allocator asks for SWA ring size {swa_req_ring_size}, the SWAKVPool was built "
                         f"with ring size {kvcache.swa_req_ring_size}")
    if swa_req_ring_size is not None and req_to_token_pool is None:
        raise ValueError("per-request SWA ring: capacity is counted in request rows, "
                         "so req_to_token_pool is required")
    if swa_req_ring_size is None and size_swa is None:
        raise ValueError("size_swa is required unless a per-request ring is used")


def swa_kvcache_sizes(alloc, kvcache) -> None:
    """The pool sizes its buffers on its own (ring mode: from num_req_rows); an allocator that
    counts more slots than the buffers hold would hand out ids past their end."""
    if kvcache.page_size != alloc.page_size:
        raise ValueError(f"the SWAKVPool has page_size {kvcache.page_size}, the allocator page_size {alloc.page_size}")
    for side, pool_n, own_n in (("full", kvcache.size, alloc.size_full), ("SWA", kvcache.size_swa, alloc.size_swa)):
        if pool_n != own_n:
            raise ValueError(f"the {side} pool holds {pool_n} slots but the allocator's {side} side {own_n}")


def swa_ring(alloc, message: str) -> None:
    if not alloc._swa_req_ring:
        raise ValueError(message)


def swa_not_ring(alloc, message: str) -> None:
    if alloc._swa_req_ring:
        raise ValueError(f"ring mode: {message}")


def swa_ring_write_loc(req_pool_indices, positions) -> None:
    if req_pool_indices is None or positions is None:
        raise ValueError("ring mode: write_loc needs req_pool_indices and positions for the SWA ids")


def swa_free(alloc, free_index) -> None:
    """Full-side slots to free. In debug mode the full side's double-free check runs here, before
    the SWA side gives anything back: a refused free must change neither side."""
    mapping = alloc.full_to_swa_index_mapping
    if not isinstance(free_index, torch.Tensor) or free_index.dtype not in INDEX_DTYPES:
        raise TypeError(f"free_index must be an int32/int64 tensor of full-side slots, got {free_index!r}")
    if free_index.device != mapping.device:  # a concrete device: cuda:0, not cuda
        raise ValueError(f"free_index is on {free_index.device}, the allocator on {mapping.device}")
    ps = alloc.page_size
    if can_read_values(alloc.debug_mode, free_index):
        lo, hi = int(free_index.min()), int(free_index.max())
        if lo < ps or hi >= alloc.size + ps:
            raise ValueError(f"cannot free slot {lo if lo < ps else hi}: slots are {ps}..{alloc.size + ps - 1} "
                             "(the first page is padding)")
    if alloc.debug_mode and free_index.numel():
        full = alloc.full_attn_allocator
        pages = free_index.to(torch.int64) // ps
        already = torch.isin(pages, torch.cat((full.free_pages, full.release_pages)))
        if already.any():
            raise ValueError(f"double free: full-side slot {int(free_index[already][0])} (page "
                             f"{int(pages[already][0])}) is already free")


def swa_segment(alloc, start_pos) -> None:
    if start_pos % alloc.page_size:
        raise ValueError(f"free_swa_segment needs a page-aligned start: position {start_pos} is not a "
                         f"multiple of page_size {alloc.page_size}")


def swa_release(alloc, swa_evicted_len, cache_protected_len) -> None:
    for name, v in (("swa_evicted_len", swa_evicted_len), ("cache_protected_len", cache_protected_len)):
        if v % alloc.page_size:
            raise ValueError(f"{name} {v} is not page-aligned (page_size {alloc.page_size})")


# ---- hybrid pools: Mamba state (chapter 07) -----------------------------------------------------

def mamba_layers(num_mamba_layers, conv_state_shape) -> None:
    if isinstance(num_mamba_layers, bool) or not isinstance(num_mamba_layers, int) or num_mamba_layers <= 0:
        raise ValueError(f"a MambaPool needs at least one mamba layer, got num_mamba_layers={num_mamba_layers!r}")
    if len(conv_state_shape) == 0:
        raise ValueError("conv_state_shape lists the conv-state components: at least one shape")


# ---- write locations (chapters 07 to 09) --------------------------------------------------------

def _write_ids(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor of slot ids, got {type(t).__name__}")
    if t.dtype not in INDEX_DTYPES or t.dim() != 1:
        raise TypeError(f"{name} must be a 1-D int32/int64 tensor, got {t.dtype} of shape {tuple(t.shape)}")


def kv_write_loc(w) -> None:
    """A KVWriteLoc: 1-D id tensors; side ids at least as many as ``loc`` (they are cut to it)."""
    _write_ids("loc", w.loc)
    n = w.loc.shape[0]
    for name in ("swa_loc", "full_loc"):
        side = getattr(w, name)
        if side is not None:
            _write_ids(name, side)
            if side.shape[0] < n:
                raise ValueError(f"{name} has {side.shape[0]} ids for {n} tokens")
    if not isinstance(w.physical, bool):
        raise TypeError(f"physical must be a bool, got {w.physical!r}")


def physical_write_loc(loc, where: str) -> None:
    """The write door of a pool with virtual ids (``requires_physical_write_loc``): only a
    KVWriteLoc marked physical passes; the message says what to pass. A flag read, no sync."""
    if getattr(loc, "physical", False) is True:
        return
    got = "a bare tensor" if isinstance(loc, torch.Tensor) else (
        "a KVWriteLoc not marked physical" if hasattr(loc, "physical") else repr(type(loc).__name__))
    raise ValueError(
        f"{where}: write loc is not marked physical (got {got}); this pool's ids are virtual. Pass the "
        "batch's plan-bound ids, or KVWriteLoc(loc, physical=True) for ids translated separately.")


def plain_loc(loc, where: str) -> None:
    if not isinstance(loc, torch.Tensor):
        raise TypeError(f"{where}: loc must be a tensor of slot ids or a KVWriteLoc, got {type(loc).__name__}")


# ---- layer 3: the allocators -------------------------------------------------------------------

def _unit(alloc) -> str:
    """What an allocator's ids are called: chapter 03 speaks of slots (page size 1), 04 of pages."""
    return "slot" if alloc.page_size == 1 else "page"


def allocator(size, page_size) -> tuple[int, int]:
    size, page_size = integer("size", size, 1), integer("page_size", page_size, 1)
    if size // page_size < 1:
        raise ValueError(f"size {size} holds no whole page of {page_size} slots")
    return size, page_size


def backend(backend: str, choices) -> None:
    if backend not in choices:
        raise ValueError(f"backend must be one of {choices}, got {backend!r}")


def alloc(alloc, need_size) -> int:
    need_size = integer("need_size", need_size, 0)
    if need_size % alloc.page_size:
        raise ValueError(f"alloc needs whole pages: {need_size} is not a multiple of {alloc.page_size}")
    return need_size


def _page_range(alloc, lo: int, hi: int) -> None:
    first, last = alloc.page_id_range()
    if lo < first or hi > last:
        u = _unit(alloc)
        raise ValueError(f"cannot free {u} {lo if lo < first else hi}: {u}s are {first}..{last} "
                         f"({u} 0 is padding)")


def free(alloc, free_index, name: str = "free_index") -> None:
    """Slot ids to free. Checked on each call, so one bad id inside a free group is refused at
    once, not at the group's end."""
    index_tensor(name, free_index, alloc.device)
    if can_read_values(alloc.debug_mode, free_index):
        ps = alloc.page_size
        _page_range(alloc, int(free_index.min()) // ps, int(free_index.max()) // ps)


def free_page_ids(alloc, page_ids) -> None:
    index_tensor("page_ids", page_ids, alloc.device)
    if can_read_values(alloc.debug_mode, page_ids):
        _page_range(alloc, int(page_ids.min()), int(page_ids.max()))


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
    bs = None
    for name, t in lens.items():
        index_tensor(name, t, alloc.device)
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
        bs = len(t) if bs is None else bs
        if len(t) != bs:
            raise ValueError(f"{name} has {len(t)} entries, the batch has {bs}")
    for name, t in cpu.items():
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or len(t) != bs:
            got = (f"a {t.device} tensor of {len(t)}" if isinstance(t, torch.Tensor) else type(t).__name__)
            raise ValueError(f"{name} must be a CPU tensor of {bs} lengths (a host copy: no sync), got {got}")
    if bs == 0:
        raise ValueError("empty batch")
    return bs


def _last_loc(alloc, last_loc: torch.Tensor, prefix_cpu: torch.Tensor) -> None:
    """Where it costs no sync (CPU, or debug mode): each last_loc must sit where its prefix ends
    (SGLang asserts ``(last_loc + 1) % ps == prefix_lens % ps`` in debug mode)."""
    if not can_read_values(alloc.debug_mode, last_loc):
        return
    ps, last = alloc.page_size, last_loc.cpu().to(torch.int64)
    empty = prefix_cpu == 0
    bad = torch.where(empty, last != -1, (last < ps) | ((last + 1) % ps != prefix_cpu % ps)).nonzero()
    if len(bad):
        i = bad[0].item()
        raise ValueError(f"request {i}: last_loc {last[i].item()} cannot end a prefix of {prefix_cpu[i].item()} "
                         f"tokens with page_size {ps} (an empty prefix has last_loc -1)")


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


# The allocator's debug-mode books: a ledger of held pages (memlab's; SGLang's debug mode asserts
# that the free list holds no page twice). Called from the algorithm under ``if debug_mode``.

def debug_taken(alloc, pages: torch.Tensor) -> None:
    p = pages.cpu()
    bad = p[alloc._held[p] | (p == 0)]
    if len(bad):
        raise AssertionError(f"{_unit(alloc)} {bad[0].item()} handed out while held (or padding): "
                             "the free list is corrupt")
    alloc._held[p] = True


def debug_released(alloc, page_ids: torch.Tensor) -> None:
    p = page_ids.cpu()
    uniq, counts = torch.unique(p, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"double free: {_unit(alloc)} {uniq[counts > 1][0].item()} is freed twice in one release")
    not_held = p[~alloc._held[p]]
    if len(not_held):
        raise ValueError(f"double free: {_unit(alloc)} {not_held[0].item()} is already free")
    alloc._held[p] = False


def allocator_books(alloc) -> None:
    """Free + staged + held == capacity, nothing listed twice, padding never free."""
    if not alloc.debug_mode:
        raise RuntimeError("check_books needs debug_mode=True")
    u = _unit(alloc)
    free = torch.cat((alloc.free_pages, alloc.release_pages)).cpu()
    if (free == 0).any():
        raise AssertionError(f"padding {u} 0 is on the free list")
    if len(torch.unique(free)) != len(free):
        raise AssertionError(f"a {u} is on the free list twice")
    held = int(alloc._held.sum())
    if len(free) + held != alloc.num_pages:
        raise AssertionError(f"books do not balance: {len(free)} free + {held} held != {alloc.num_pages} {u}s")


# ---- the unified pool (chapter 12) -----------------------------------------------------------------

def sub_pool_spec(spec) -> None:
    if not isinstance(spec.name, str) or not spec.name:
        raise ValueError(f"a sub-pool needs a name, got {spec.name!r}")
    positive_ints(layer_num=spec.layer_num)
    if spec.grow_direction not in ("up", "down"):
        raise ValueError(f"sub-pool {spec.name!r}: grow_direction must be 'up' or 'down', got "
                         f"{spec.grow_direction!r} (SGLang's 'float' middle pool is not part of memlab)")


def mha_sub_pool_spec(spec) -> None:
    positive_ints(head_num=spec.head_num, head_dim=spec.head_dim, v_head_dim=spec.v_head_dim)
    want = torch.uint8 if spec.kv_cache_dtype in _fp8_dtypes() else spec.kv_cache_dtype
    if spec.store_dtype != want:
        raise ValueError(f"sub-pool {spec.name!r}: a {spec.kv_cache_dtype} cache is stored as {want}, "
                         f"got store_dtype {spec.store_dtype}")


def _fp8_dtypes() -> tuple:
    return tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
                 if hasattr(torch, n))


def unified_kv_pool(total_bytes, specs: list, page_size) -> None:
    integer("total_bytes", total_bytes, 1)
    integer("page_size", page_size, 1)
    names = [getattr(s, "name", None) for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"sub-pool names must be unique, got {names}")
    directions = sorted(getattr(s, "grow_direction", None) for s in specs)
    if directions != ["down", "up"]:
        raise ValueError(f"a UnifiedKVPool needs exactly one 'up' and one 'down' sub-pool, got {directions}")


def unified_row_alignment(spec, align: int) -> None:
    for part, nbytes in (("K", spec.k_row_bytes()), ("V", spec.v_row_bytes())):
        if nbytes % align:
            raise ValueError(f"the unified pool needs every per-layer row to be a multiple of {align} bytes; "
                             f"sub-pool {spec.name!r} has a {nbytes}-byte {part} row. Run this model without "
                             "--enable-unified-memory.")


def unified_swa_kv_pool(buffer, full_ids: list, swa_ids: list) -> None:
    swa_kv_pool(full_ids, swa_ids, 0, None, None)
    for name, ids in (("full", full_ids), ("swa", swa_ids)):
        spec = buffer._specs_by_name.get(name)
        if spec is None or not hasattr(spec, "head_num"):
            raise ValueError(f"a UnifiedSWAKVPool needs an MHA sub-pool named {name!r}; the buffer has "
                             f"{sorted(buffer._specs_by_name)}")
        if spec.layer_num != len(ids):
            raise ValueError(f"sub-pool {name!r} holds {spec.layer_num} layers, {len(ids)} layer ids given")


def multi_ended_allocator(buffer, name, is_id_owner, virtual_num_pages, page_size) -> None:
    if name not in buffer._specs_by_name:
        raise ValueError(f"no sub-pool {name!r} in this buffer (it has {sorted(buffer._specs_by_name)})")
    integer("page_size", page_size, 1)
    if virtual_num_pages is not None and is_id_owner:
        raise ValueError("only a non-owner allocator may use another pool's virtual-id space")
    if virtual_num_pages is not None:
        integer("virtual_num_pages", virtual_num_pages, 1)


def multi_ended_books(alloc) -> None:
    """Debug mode: the two page tables are inverse, the bound pages are exactly the dense run at
    this sub-pool's end, and (an owner) every virtual page is free or bound, once."""
    if not alloc.debug_mode:
        raise RuntimeError("check_books needs debug_mode=True")
    v2p, p2v = alloc.virtual_to_physical[:-1].cpu(), alloc.physical_to_virtual[:-1].cpu()
    v = torch.nonzero(v2p > 0).flatten()  # page 0 <-> 0 is the sink
    name = alloc.sub_pool_name
    if not torch.equal(p2v[v2p[v]], v):
        raise AssertionError(f"[{name}] v2p and p2v disagree")
    lo, hi = alloc.used_page_range()
    if not torch.equal(torch.sort(v2p[v]).values, torch.arange(lo, hi)):
        raise AssertionError(f"[{name}] bound pages {sorted(v2p[v].tolist())} are not the run {lo}..{hi - 1}")
    if int((p2v[1:] >= 0).sum()) != hi - lo:
        raise AssertionError(f"[{name}] p2v marks {int((p2v[1:] >= 0).sum())} pages used, the run holds {hi - lo}")
    if alloc.is_id_owner:
        free = alloc.free_pages.cpu()
        if len(torch.unique(free)) != len(free) or bool(torch.isin(free, v).any()):
            raise AssertionError(f"[{name}] a virtual page is free twice, or free and bound")
        if len(free) + len(v) != alloc.num_virtual_ids - alloc.min_page_index:
            raise AssertionError(f"[{name}] {len(free)} free + {len(v)} bound virtual pages != "
                                 f"{alloc.num_virtual_ids - alloc.min_page_index}")


def unified_swa_books(full_v2p: torch.Tensor, swa_v2p: torch.Tensor) -> None:
    orphan = torch.nonzero((swa_v2p[:-1] > 0) & (full_v2p[:-1] <= 0)).flatten()
    if len(orphan):
        raise AssertionError(f"virtual page {orphan[0].item()} holds an SWA page but no full page")
