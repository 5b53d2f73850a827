"""The boundary: the argument checks several core modules share, written once.

A validator that one module uses lives in that module, after the algorithm (``_check_*``); what
is here is shared: counts, lists of ids, tensors, and the allocators' batch and free checks that
the token, paged, sliding-window and unified allocators all run. A core method calls its checks
first and then runs the algorithm the way the engine does, so the algorithm reads top to bottom.
The checks the engines make themselves (SGLang's ``debug_mode`` asserts, the capacity refusal
before anything is taken, vLLM's free-queue errors) stay in the algorithm, where the engine has
them. One rule for errors: a wrong type is a TypeError (a bool is no count), a wrong value a
ValueError.

Cost: these checks read shapes, dtypes and devices, which costs nothing. Checks that must read
id VALUES (ranges, alignment) run only where that costs no host-device sync: when the ids live
on the CPU, or in ``debug_mode`` (which the tests turn on). This module imports nothing of
memlab at module level, so every layer can use it without raising its import floor.
"""

from __future__ import annotations

import numbers

import torch

INDEX_DTYPES = (torch.int32, torch.int64)
# slot ids and rows live in SGLang's int32 request table: no pool or table is larger
INT32_MAX = 2**31 - 1


# ---- shared validators ------------------------------------------------------------------------


class RangeError(ValueError, IndexError):
    """An index outside its range: a ValueError by the rule above, and an IndexError as indexing
    itself would say (numpy's AxisError is both too), so code that catches either sees it."""


def integer(name: str, v, lo: int = 0, hi: int | None = None) -> int:
    """``v`` as a Python int in ``lo..hi``. Any integral number is accepted: int, NumPy integers, a
    0-d integer tensor. A bool is not a count, and neither is a float (even 3.0)."""
    if type(v) is int:  # the common case: one type check
        pass
    elif (
        isinstance(v, torch.Tensor)
        and v.dim() == 0
        and not v.dtype.is_floating_point
        and not v.dtype.is_complex
        and v.dtype != torch.bool
    ):
        v = int(v)
    elif isinstance(v, numbers.Integral) and not isinstance(v, bool):
        v = int(v)
    else:
        raise TypeError(
            f"{name} must be an int (or a NumPy integer, or a 0-d integer tensor), "
            f"got {type(v).__name__} {v!r}"
        )
    if v < lo or (hi is not None and v > hi):
        raise ValueError(
            f"{name} must be an int >= {lo}"
            + ("" if hi is None else f" and <= {hi}")
            + f", got {v}"
        )
    return v


def real(
    name: str, v, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False
) -> float:
    """``v`` a real number (int or float, not a bool) in the interval from ``lo`` to ``hi``."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(v).__name__} {v!r}")
    if not ((lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)):
        raise ValueError(
            f"{name} must lie in {'(' if lo_open else '['}{lo}, {hi}"
            f"{')' if hi_open else ']'}, got {v!r}"
        )
    return v


def int_list(name: str, values, lo: int = 0, hi: int | None = None) -> list[int]:
    """A sequence of ints (a list, a tuple, a range; no str, no tensor), each in ``lo..hi``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, range)):
        raise TypeError(f"{name} must be a list of ints, got {type(values).__name__}")
    for v in values:
        if type(v) is not int:  # a bool or a float is no token id, no block id
            raise TypeError(f"{name} must hold ints, got {type(v).__name__} {v!r}")
    out = [v for v in values if v < lo or (hi is not None and v > hi)]
    if out:
        raise ValueError(
            f"{name} must hold ints >= {lo}"
            + ("" if hi is None else f" and <= {hi}")
            + f", got {out[0]}"
        )
    return list(values)


def each_once(name: str, items, cls, where: str, merge: bool = False) -> list:
    """A list (or tuple) of ``cls`` objects, none of them twice (a request listed twice in one
    batch would take two rows, or two state slots, and leak one); ``merge``: each kept once."""
    instance(name, items, (list, tuple), f"a list of {cls.__name__}")
    seen = {}
    for x in items:
        instance(f"each of {name}", x, cls)
        if id(x) in seen and not merge:
            raise ValueError(f"{x!r} appears twice in one {where}: it would take two")
        seen[id(x)] = x
    return list(seen.values())


def duck(name: str, v, attrs: tuple, what: str, optional: bool = False) -> None:
    """``v`` has every attribute in ``attrs`` (the books object a function drives: a request
    table, an allocator, a prefix cache), or a TypeError names ``what`` it must be; None passes
    where the argument is ``optional``."""
    if not (optional and v is None) and not all(hasattr(v, a) for a in attrs):
        raise TypeError(f"{name} must be {what}, got {type(v).__name__} {v!r}"[:200])


def one_of(name: str, v, choices) -> None:
    if v not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {v!r}")


def instance(name: str, v, types, what: str | None = None) -> None:
    """``v`` an instance of ``types`` (a TypeError naming ``what`` it must be, else the types)."""
    if not isinstance(v, types):
        what = what or " or ".join(
            t.__name__ for t in (types if isinstance(types, tuple) else (types,))
        )
        raise TypeError(f"{name} must be {what}, got {type(v).__name__} {v!r}")


def tensor(
    name: str,
    t,
    dtypes=None,
    ndim: int | None = None,
    device=None,
    shape=None,
    like: str = "",
) -> None:
    """A torch.Tensor of one of ``dtypes`` (when given; a wrong one is a TypeError, ``like`` says
    whose dtype it must share), ``ndim`` dims, exactly ``shape`` and on ``device`` (when given;
    ValueError)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(
            f"{name} must be {' or '.join(str(d).replace('torch.', '') for d in dtypes)}{like}, "
            f"got {t.dtype}"
        )
    if ndim is not None and t.dim() != ndim:
        raise ValueError(
            f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}"
        )
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")


def values_in(name: str, t: torch.Tensor, lo: int, hi) -> None:
    """Every value of ``t`` in ``lo..hi``, read on the CPU (a device tensor only in debug mode,
    where a sync is allowed); ``hi`` a number or a tensor of bounds, one per value. The message
    names the first value outside."""
    v = t.reshape(-1).long().cpu()
    hi = (
        torch.as_tensor(hi, dtype=torch.long).cpu().expand(t.shape).reshape(-1)
        if hi is not None
        else None
    )
    bad = (v < lo) if hi is None else (v < lo) | (v > hi)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"{name}[{i}] = {int(v[i])} is outside {lo}.."
            + ("" if hi is None else f"{int(hi[i])}")
        )


def positive_ints(**values) -> None:
    """Each value a positive integer; the message names the first that is not (a TypeError when
    it is no integer at all)."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(
                f"{name} must be a positive int, got {type(v).__name__} {v!r}"
            )
        # a buffer dimension: anything larger could never be allocated
        if not 0 < v <= INT32_MAX:
            raise ValueError(f"{name} must be a positive int <= {INT32_MAX}, got {v!r}")


def index_tensor(
    name: str, t, device=None, ndim: int | None = None, owner: str = "allocator"
) -> None:
    """A tensor of ids: int32 or int64, on ``device`` (when given: the ``owner``'s), of ``ndim``
    dims (when given)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of ids, got {type(t).__name__}")
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must hold int32/int64 ids, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, the {owner} on {device}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(
            f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}"
        )


def can_read_values(debug_mode: bool, t: torch.Tensor) -> bool:
    """Whether a check may read the values of ``t``: always on the CPU, on a GPU only in debug mode
    (reading them there is a host-device sync)."""
    return t.numel() > 0 and (debug_mode or t.device.type == "cpu")


# ---- layer 2: the KV pools --------------------------------------------------------------------


# ---- hybrid pools: sliding window (chapter 07) ---------------------------------------------------


def swa_kv_pool(
    full_ids: list, swa_ids: list, size_swa, swa_req_ring_size, num_req_rows
) -> None:
    if set(full_ids) & set(swa_ids):
        raise ValueError(
            f"layers {sorted(set(full_ids) & set(swa_ids))} are both full and SWA"
        )
    if not full_ids or not swa_ids:
        raise ValueError("an SWAKVPool needs at least one full and one SWA layer")
    if swa_req_ring_size is not None and (
        isinstance(num_req_rows, bool)
        or not isinstance(num_req_rows, int)
        or num_req_rows <= 0
    ):
        raise ValueError(
            f"ring mode sizes the SWA pool by request rows: num_req_rows={num_req_rows!r}"
        )
    if swa_req_ring_size is None and size_swa is None:
        raise ValueError("size_swa is required unless swa_req_ring_size is given")


def swa_write(layer_id, swa_loc) -> None:
    if swa_loc is None:
        raise ValueError(
            f"SWAKVPool.set_kv_buffer: layer {layer_id} is a sliding-window layer and the "
            "write loc has no swa_loc; pass allocator.write_loc(out_cache_loc)"
        )


# ---- write locations (chapters 07 to 09) --------------------------------------------------------


def physical_write_loc(loc, where: str):
    """The write door of a pool with virtual ids (``requires_physical_write_loc``): only a
    KVWriteLoc marked physical passes; the message says what to pass. A flag read, no sync."""
    if getattr(loc, "physical", False) is True:
        return loc
    got = (
        "a bare tensor"
        if isinstance(loc, torch.Tensor)
        else (
            "a KVWriteLoc not marked physical"
            if hasattr(loc, "physical")
            else repr(type(loc).__name__)
        )
    )
    raise ValueError(
        f"{where}: write loc is not marked physical (got {got}); this pool's ids are virtual. "
        "Pass the batch's plan-bound ids, or KVWriteLoc(loc, physical=True) for ids translated "
        "separately."
    )


def plain_loc(loc, where: str) -> None:
    if not isinstance(loc, torch.Tensor):
        raise TypeError(
            f"{where}: loc must be a tensor of slot ids or a KVWriteLoc, got {type(loc).__name__}"
        )


# ---- layer 3: the allocators -------------------------------------------------------------------


def unit(alloc) -> str:
    """What an allocator's ids are called: chapter 03 speaks of slots (page size 1), 04 of pages."""
    return "slot" if alloc.page_size == 1 else "page"


def alloc(alloc, need_size) -> int:
    need_size = integer("need_size", need_size, 0)
    if need_size % alloc.page_size:
        raise ValueError(
            f"need_size must be whole pages: {need_size} is not a multiple of page_size "
            f"{alloc.page_size}"
        )
    return need_size


def _page_range(alloc, lo: int, hi: int, name: str = "page_ids") -> None:
    first, last = alloc.page_id_range()
    if lo < first or hi > last:
        u = unit(alloc)
        raise ValueError(
            f"{name}: cannot free {u} {lo if lo < first else hi}: {u}s are {first}..{last} "
            f"({u} 0 is padding)"
        )


def free(alloc, free_index, name: str = "free_index") -> None:
    """Slot ids to free. Checked on each call, so one bad id inside a free group is refused at
    once, not at the group's end."""
    index_tensor(name, free_index, alloc.device, ndim=1)
    if can_read_values(alloc.debug_mode, free_index):
        ps = alloc.page_size
        lo, hi = int(free_index.min()) // ps, int(free_index.max()) // ps
        _page_range(alloc, lo, hi, name)


def free_segment(alloc, free_index, start_pos) -> None:
    free(alloc, free_index)
    ps = alloc.page_size
    if integer("start_pos", start_pos) % ps:
        raise ValueError(
            f"free_segment needs a page-aligned start: position {start_pos} is not a "
            f"multiple of page_size {ps}; use free() for unaligned runs"
        )
    if not alloc.debug_mode or free_index.numel() == 0:
        return
    firsts = free_index.cpu()[::ps]
    if (firsts % ps).any():
        bad = int(firsts[firsts % ps != 0][0])
        raise ValueError(
            f"free_segment: slot {bad} should start a page but sits at offset "
            f"{bad % ps}: the run is not page-aligned in memory"
        )
    if not torch.equal(
        torch.sort(firsts // ps).values, torch.unique(free_index.cpu() // ps)
    ):
        raise ValueError("free_segment: the slots are not one page-aligned run")


def segments(alloc, segments) -> list:
    """``(slots, start_pos)`` pairs of one request's row, as a list: each a 1-D id tensor and a
    page-aligned start (the allocator's own check of the seams runs before any is freed)."""
    instance("segments", segments, (list, tuple), "a list of (slots, start_pos) pairs")
    for seg in segments:
        instance("each segment", seg, (list, tuple), "a (slots, start_pos) pair")
        if len(seg) != 2:
            raise TypeError(f"a segment is (slots, start_pos), got {seg!r}")
        index_tensor("a segment's slots", seg[0], alloc.device, ndim=1)
        # an empty segment is skipped, wherever it starts (as SGLang's)
        if seg[0].numel():
            free_segment(alloc, *seg)
    return list(segments)


def counts(**named) -> None:
    """The scheduler's token counts: each an int >= 0, or None where the name ends in ``?``
    (``counts(**{"chunk_size?": None})``)."""
    for name, v in named.items():
        if not (name.endswith("?") and v is None):
            integer(name.rstrip("?"), v)


def budgets(full_tokens, swa_tokens, full_budget, swa_budget) -> None:
    """``prealloc_fits``'s demand (counts) and budgets (ints: what reserves leave may be < 0)."""
    counts(full_tokens=full_tokens, swa_tokens=swa_tokens)
    integer("full_budget_tokens", full_budget, -(2**62))
    if swa_budget is not None:
        integer("swa_budget_tokens", swa_budget, -(2**62))


def token_question(input_tokens, max_new_tokens, token_capacity, window, chunk) -> None:
    """``max_new_tokens_for_memory``'s arguments, the same for every allocator."""
    counts(
        input_tokens=input_tokens,
        max_new_tokens=max_new_tokens,
        token_capacity=token_capacity,
        **{"sliding_window_size?": window, "chunk_size?": chunk},
    )


def free_group_begin(alloc) -> None:
    if alloc.free_group is not None:
        raise RuntimeError(
            "free groups do not nest: free_group_begin called inside an open group"
        )


def free_group_end(alloc) -> None:
    if alloc.free_group is None:
        raise RuntimeError("free_group_end without free_group_begin")


def _batch(alloc, lens: dict, cpu: dict) -> int:
    """1-D id tensors of one batch size on the allocator's device, their host copies on the CPU.
    Each device tensor must equal its copy (the engine counts pages on the copies): checked where
    it costs no sync, on the CPU, and on a GPU in debug mode."""
    for name, t in lens.items():
        index_tensor(name, t, alloc.device, ndim=1)
    for name, t in cpu.items():
        index_tensor(name, t, torch.device("cpu"), ndim=1, owner="host copy (no sync)")
    bs = len(next(iter(lens.values())))
    for name, t in [*lens.items(), *cpu.items()]:
        if len(t) != bs:
            raise ValueError(f"{name} has {len(t)} entries, the batch has {bs}")
    if bs == 0:
        raise ValueError("empty batch")
    for (name, t), dev in zip(cpu.items(), lens.values()):
        if (alloc.debug_mode or dev.device.type == "cpu") and not torch.equal(
            dev.cpu().to(torch.int64), t.to(torch.int64)
        ):
            raise ValueError(
                f"{name} disagrees with its device tensor: {t.tolist()} vs {dev.tolist()}"
            )
    return bs


def _last_loc(alloc, last_loc: torch.Tensor, prefix_cpu: torch.Tensor) -> None:
    """The caller's contract, checked where it costs no sync (CPU, or debug mode): each last_loc
    ends its prefix (SGLang asserts ``(last_loc + 1) % ps == prefix_lens % ps`` in debug mode); in
    debug mode the books tell too whether its page is held (a free or foreign-pool page is not)."""
    if not can_read_values(alloc.debug_mode, last_loc):
        return
    ps, last = alloc.page_size, last_loc.cpu().to(torch.int64)
    empty, last_page = prefix_cpu == 0, alloc.page_id_range()[1]
    held = (last < ps) | (last // ps > last_page) | ((last + 1) % ps != prefix_cpu % ps)
    bad = torch.where(empty, last != -1, held).nonzero()
    if len(bad):
        i = bad[0].item()
        raise ValueError(
            f"request {i}: last_loc {last[i].item()} cannot end a prefix of {prefix_cpu[i].item()} "
            f"tokens with page_size {ps} (an empty prefix has last_loc -1)"
        )
    if alloc.debug_mode and (~empty).any():
        pages, held = last[~empty] // ps, alloc._ledger()
        free = (pages >= len(held)) | ~held[pages.clamp(max=len(held) - 1)]
        if free.any():
            raise ValueError(
                f"last_loc {int(last[~empty][free][0])} lies in page {int(pages[free][0])}, which "
                "no request holds: last_loc must be a slot of the request's own last page"
            )


def held_slots(alloc, name: str, slots: torch.Tensor) -> None:
    """Debug mode: every slot lies in a page the allocator's ledger holds (a free page, padding or a
    page past the pool is no request's)."""
    pages, held = slots.cpu().to(torch.int64) // alloc.page_size, alloc._ledger()
    free = (pages < 0) | (pages >= len(held)) | ~held[pages.clamp(0, len(held) - 1)]
    if free.any():
        raise ValueError(
            f"{name}: slot {int(slots.cpu()[free][0])} lies in page {int(pages[free][0])}, "
            "which no request holds (free, padding or past the pool)"
        )


def alloc_extend(
    alloc,
    prefix_lens,
    prefix_lens_cpu,
    seq_lens,
    seq_lens_cpu,
    last_loc,
    extend_num_tokens,
    num_new_pages=None,
) -> None:
    _batch(
        alloc,
        dict(prefix_lens=prefix_lens, seq_lens=seq_lens, last_loc=last_loc),
        dict(prefix_lens_cpu=prefix_lens_cpu, seq_lens_cpu=seq_lens_cpu),
    )
    short = (seq_lens_cpu < prefix_lens_cpu).nonzero()
    if len(short):
        i = short[0].item()
        raise ValueError(
            f"request {i}: seq_len {seq_lens_cpu[i].item()} is shorter than its "
            f"prefix {prefix_lens_cpu[i].item()}"
        )
    if (prefix_lens_cpu < 0).any():
        raise ValueError(f"prefix lengths must be >= 0, got {prefix_lens_cpu.tolist()}")
    total = int((seq_lens_cpu - prefix_lens_cpu).sum())
    if integer("extend_num_tokens", extend_num_tokens, 0) != total:
        raise ValueError(
            f"extend_num_tokens is {extend_num_tokens} but the lengths add up to {total}"
        )
    if num_new_pages is not None:
        _num_new_pages(alloc, prefix_lens_cpu, seq_lens_cpu, num_new_pages)
    _last_loc(alloc, last_loc, prefix_lens_cpu)


def _num_new_pages(alloc, prefix_cpu, seq_cpu, num_new_pages) -> None:
    """The caller's page count, checked against the lengths (host arithmetic, no sync)."""
    ps = alloc.page_size
    want = int(((seq_cpu + ps - 1) // ps - (prefix_cpu + ps - 1) // ps).sum())
    if integer("num_new_pages", num_new_pages, 0) != want:
        raise ValueError(
            f"num_new_pages is {num_new_pages} but the lengths need {want} new pages"
        )


def alloc_decode(alloc, seq_lens, seq_lens_cpu, last_loc) -> None:
    _batch(
        alloc,
        dict(seq_lens=seq_lens, last_loc=last_loc),
        dict(seq_lens_cpu=seq_lens_cpu),
    )
    if (seq_lens_cpu < 1).any():
        raise ValueError(
            f"decode seq_lens count the new token, so must be >= 1: {seq_lens_cpu.tolist()}"
        )
    _last_loc(alloc, last_loc, seq_lens_cpu - 1)


# ---- vLLM's side: the functions a caller hands in (a hash function, a block hasher) --------------


def function(name: str, fn) -> None:
    """``fn`` callable: a hash function or a block hasher, called later where a wrong one would
    fail far from the call that passed it."""
    if not callable(fn):
        raise TypeError(f"{name} must be a function, got {type(fn).__name__} {fn!r}")


def on_kernel_device(name: str, device) -> None:
    """A 'triton' backend's tensors live where the kernels run: compiled kernels read GPU memory
    only (the interpreter, on a machine without one, reads the CPU's)."""
    from memlab.common.env import kernel_device

    want = kernel_device()
    try:
        kind = torch.device(device).type
    # not a device: the caller's device check names it
    except (RuntimeError, TypeError):
        return
    if kind != want:
        raise ValueError(
            f"{name}='triton' runs the Triton kernels on {want}, but the tensors are on "
            f"{device}: build them with device=memlab.common.env.kernel_device(), or use 'torch'"
        )
