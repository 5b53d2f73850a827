"""The instruments of chapters 01, 03 and 05: the learner's own calls on the real request table
and the real token and paged allocators (memlab.course.viz.instrument; chapter 04's is in
``sglang_books``).

- ``request_instrument`` (01): take rows for new requests (``req_to_token_pool.alloc``), continue a
  chunked prefill (the request keeps its row), free a request's row, ``clear()``;
- ``token_instrument`` (03): ``alloc(n)`` for a request, free a request, ``merge_and_sort_free``,
  with ``need_sort`` as a setting (every step replayed under the other value);
- ``paged_free_instrument`` (05): decode steps (``alloc_decode``), free a request, free groups,
  ``free_segment`` of a run of a request's positions, and a double free under ``debug_mode``.

Each opens on the state its chapter's story ends in (the story's steps are its opening steps),
drives the scenes of ``sglang_books`` (the real objects) and draws them with ``draw_books``. The
one place that reads an allocator's staged pages is ``staged_pages``.
"""

from __future__ import annotations

import ipywidgets as W
import torch

from memlab.course.viz.instrument import (
    Field,
    InputError,
    Instrument,
    Operation,
    Verbatim,
    integer,
    ints,
    names,
    recording,
    spell,
    spell_value,
)
from memlab.course.viz.sglang_books import Scene, draw_books
from memlab.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from memlab.sglang.req_to_token import Req, ReqToTokenPool


def staged_pages(allocator) -> list[int]:
    """The slots (token allocator: ``release_pages``) or pages (paged: ``staged_pages``, a list of
    tensors) freed but not yet on ``free_pages``: the only read of that state."""
    if isinstance(allocator, PagedTokenToKVPoolAllocator):
        return (
            torch.cat(allocator.staged_pages).tolist() if allocator.staged_pages else []
        )
    return allocator.release_pages.tolist()


def group_state(allocator) -> str:
    """What an open free group holds, in words: the only read of the group's queues."""
    if allocator.free_group is None:
        return "closed"
    return (
        f"open: {len(allocator.free_group)} free() and {len(allocator.free_page_ids_group)} "
        "page-id call(s) queued"
    )


# -- shared pieces -----------------------------------------------------------------------------


def _box(name: str, value: str, width: str = "170px") -> W.Text:
    return W.Text(
        value=value,
        description=name,
        layout=W.Layout(width=width),
        style={"description_width": "initial"},
        continuous_update=False,
    )


def _who(label: str = "request") -> W.Dropdown:
    return W.Dropdown(description=label, layout=W.Layout(width="150px"))


def fit_buttons(inst: Instrument) -> Instrument:
    """Buttons as wide as their words: an engine's name is never cut to an ellipsis."""
    for b in inst.buttons.values():
        b.layout.width = "auto"
    return inst


def _held_reqs(sc: Scene) -> list[str]:
    return list(sc.reqs)


def _draw(panels):
    def draw(sc, step):
        marks = step.marks if step is not None else {}
        return draw_books(sc.books(new_slots=marks.get("new_slots", ())), panels=panels)

    return draw


def _runs(pages: list[int]) -> list[list[int]]:
    """``[3, 4, 5, 9, 10]`` -> ``[[3, 5], [9, 10]]``: runs of consecutive ids in list order."""
    runs = []
    for p in pages:
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return runs


def _runs_text(pages: list[int]) -> str:
    runs = _runs(pages)
    return (
        f"{len(runs)} run{'s' * (len(runs) != 1)}: "
        + " ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
        if runs
        else "0 runs"
    )


def _batch(sc: Scene, requests: list[str]) -> list[Req]:
    """The Req objects of a batch (a name typed twice is the same object: the library judges it)."""
    made: dict[str, Req] = {}
    for r in requests:
        if r not in sc.reqs and r not in made:
            made[r] = Req(r)
    return [sc.reqs.get(r) or made[r] for r in requests]


def _extend(sc: Scene, step, requests, tokens, spy: str):
    """A prefill batch through ``alloc_for_extend`` (the scheduler's path), recording ``spy`` on the
    request table or the allocator; returns (out, calls) and keeps the batch's new requests."""
    from memlab.sglang.allocation import alloc_for_extend

    if len(requests) != len(tokens):
        raise InputError(
            f"{len(requests)} requests, {len(tokens)} token counts: give one count per request"
        )
    batch = _batch(sc, requests)
    obj, method = spy
    with recording(obj, method) as calls:
        out = alloc_for_extend(sc.req_pool, sc.allocator, batch, list(tokens))
    if out is not None:
        sc.reqs.update((r.rid, r) for r in batch)
    return out, calls


def _release(sc: Scene, step, request) -> list[int]:
    """A request ends: ``release_kv_cache`` (its slots back as segments, its row back)."""
    if request not in sc.reqs:
        raise InputError(f"{request!r} holds no row: nothing to free")
    step.call = f"release_kv_cache(req_to_token_pool, allocator, {request})"
    with recording(sc.allocator, "free_segment") as calls:
        slots = sc.finish(request)
    for c in calls:
        step.call += "\n# called " + spell(
            "allocator.free_segment", **c["args"]
        ).replace("\n", "\n#   ")
    return slots


# -- chapter 01: the request table -------------------------------------------------------------


def draw_rows(sc: Scene, step) -> str:
    """The request table, then ``free_slots`` in list order (the tail is taken next)."""
    marks = step.marks if step is not None else {}
    books = sc.books(new_slots=marks.get("new_slots", ()))
    return draw_books(
        books,
        ("table", "rows"),
        readout="hover a cell: its row, generation, position, slot",
    )


def _op_rows(sc: Scene, step, requests, tokens) -> None:
    """New requests arrive: each takes a row (``req_to_token_pool.alloc``) and its first tokens."""
    old = [r for r in requests if r in sc.reqs]
    if old:
        raise InputError(
            f"{', '.join(old)} already hold{'s' * (len(old) == 1)} a row: use 'continue chunk'"
        )
    step.call = spell("req_to_token_pool.alloc", Verbatim(f"[{', '.join(requests)}]"))
    out, calls = _extend(sc, step, requests, tokens, (sc.req_pool, "alloc"))
    rows = calls[0]["result"] if calls else None
    step.result = spell_value(rows)
    if out is None:
        step.refuse(
            f"refused (the library returns None): {len(requests)} new request(s) need a row each, "
            f"{sc.req_pool.available_size()} row(s) are free; all or nothing, so nothing was taken"
        )
        return
    step.marks = dict(new_slots=out.tolist())
    step.caption = ", ".join(
        f"{r} -> row {w} (generation {sc.reqs[r].generation})"
        for r, w in zip(requests, rows)
    )


def _op_chunk(sc: Scene, step, request, tokens) -> None:
    """A chunked prefill continues: the request keeps its row (``alloc`` returns the same one)."""
    if request not in sc.reqs:
        raise InputError(
            f"{request!r} holds no row: a chunk continues a request that has one"
        )
    row = sc.reqs[request].kv.req_pool_idx
    step.call = spell("req_to_token_pool.alloc", Verbatim(f"[{request}]"))
    out, calls = _extend(sc, step, [request], [tokens], (sc.req_pool, "alloc"))
    step.result = spell_value(calls[0]["result"] if calls else None)
    if out is None:
        step.refuse(
            "refused (the library returns None): not enough free KV slots; nothing was taken"
        )
        return
    step.marks = dict(new_slots=out.tolist())
    step.caption = (
        f"{request}'s next chunk of {tokens}: it keeps row {row}, "
        f"{sc.req_pool.available_size()} rows stay free"
    )


def _op_free_row(sc: Scene, step, request) -> None:
    row = sc.reqs[request].kv.req_pool_idx if request in sc.reqs else None
    with recording(sc.req_pool, "free") as calls:
        slots = _release(sc, step, request)
    step.call += "\n# called req_to_token_pool.free(" + request + ")" if calls else ""
    step.result = (
        f"row {row} appended to free_slots (the next handed out); "
        f"its slots {slots} go back"
    )
    step.caption = f"{request} finishes: row {row} goes back to the tail of free_slots"


def _op_clear(sc: Scene, step) -> None:
    step.call = "req_to_token_pool.clear(); allocator.clear()"
    sc.clear()
    step.caption = "clear(): every row free again; the generations stay"


def request_books(sc: Scene) -> dict:
    rp = sc.req_pool
    out = {
        "free_slots": list(rp.free_slots),
        "available_size()": rp.available_size(),
        "req_generation": rp.req_generation.tolist(),
    }
    for rid, r in sc.reqs.items():
        out[f"request {rid}"] = dict(
            row=r.kv.req_pool_idx, generation=r.generation, tokens=r.kv.kv_allocated_len
        )
    return out


# Chapter 01's story (sglang_books.request_table) as operations: its last state is the opening.
REQUEST_STORY = (
    ("alloc", dict(requests=["A", "B"], tokens=[3, 2])),
    ("alloc", dict(requests=["C"], tokens=[4])),
    ("free", dict(free_request="B")),
    ("alloc", dict(requests=["D"], tokens=[2])),
    ("alloc", dict(requests=["E"], tokens=[3])),
    ("continue", dict(request="E", chunk=3)),
    ("clear", {}),
)


def request_scene(rows: int = 5, width: int = 8) -> Scene:
    return Scene(ReqToTokenPool(rows, width), TokenToKVPoolAllocator(rows * width))


def request_instrument(
    rows: int = 5, width: int = 8, opening=REQUEST_STORY
) -> Instrument:
    """Chapter 01: take rows for new requests, continue a chunked prefill, free a request, clear."""
    alloc = Operation(
        "alloc",
        _op_rows,
        [
            Field("requests", _box("requests", "F, G"), names),
            Field("tokens", _box("tokens", "2, 3"), ints),
        ],
        label="alloc (new rows)",
        help="req_to_token_pool.alloc([...]): a row per new request",
    )
    chunk = Operation(
        "continue",
        lambda sc, step, request, chunk: _op_chunk(sc, step, request, chunk),
        [
            Field("request", _who(), str, options=_held_reqs),
            Field("chunk", _box("chunk tokens", "2"), integer),
        ],
        label="continue chunk",
        help="the request's next prefill chunk: it keeps its row",
    )
    free = Operation(
        "free",
        lambda sc, step, free_request: _op_free_row(sc, step, free_request),
        [Field("free_request", _who(), str, options=_held_reqs)],
        label="free row",
        help="the request finishes: its row goes to the tail of free_slots",
    )
    clear = Operation(
        "clear", _op_clear, label="clear()", help="every row free; generations survive"
    )
    return fit_buttons(
        Instrument(
            lambda: request_scene(rows, width),
            [alloc, chunk, free, clear],
            draw_rows,
            request_books,
            opening=opening,
            title="the request table: your own requests",
        )
    )


# -- chapter 03: the token allocator -----------------------------------------------------------


def _op_token_alloc(sc: Scene, step, request, n) -> None:
    """``n`` slots for a request (new: it takes a row), through the scheduler's path to
    ``alloc``."""
    al = sc.allocator
    step.call = spell("allocator.alloc", n)
    if (
        n < 0
        # alloc's own refusal, the one allocator.alloc(n) gives (the batch check would speak
        # of seq_len)
    ):
        al.alloc(n)
    out, calls = _extend(sc, step, [request], [n], (al, "alloc"))
    if calls:
        step.call = spell("allocator.alloc", **calls[0]["args"])
    step.result = spell_value(out)
    if out is None:
        step.refuse(
            f"refused (the library returns None): {n} slots asked, available_size() = "
            f"{al.available_size()}; nothing was taken"
        )
        return
    step.marks = dict(new_slots=out.tolist())
    step.caption = f"{request} takes {n} slots: {out.tolist()}"


def _op_token_free(sc: Scene, step, request) -> None:
    slots = _release(sc, step, request)
    where = (
        "staged (not yet on free_pages)"
        if sc.allocator.need_sort
        else "at the TAIL of free_pages (FIFO)"
    )
    step.result = f"slots {slots} {where}"
    step.marks = dict(new_slots=slots)
    step.caption = f"{request} finishes: its slots {slots} are {where}"


def _op_merge(sc: Scene, step) -> None:
    al = sc.allocator
    before = staged_pages(al)
    step.call = "allocator.merge_and_sort_free()"
    al.merge_and_sort_free()
    step.result = (
        f"None; {len(before)} staged slot(s) merged, free_pages sorted "
        f"({_runs_text(al.free_pages.tolist())})"
    )
    step.caption = (
        f"merge_and_sort_free(): {len(before)} staged slots folded in and sorted"
    )


def token_books(sc: Scene) -> dict:
    al = sc.allocator
    free = al.free_pages.tolist()
    out = {
        "need_sort": al.need_sort,
        "free_pages": free,
        "staged (need_sort)": staged_pages(al),
        "available_size()": al.available_size(),
        "free_pages runs": _runs_text(free),
    }
    for rid in sc.reqs:
        out[f"request {rid}"] = dict(
            row=sc.reqs[rid].kv.req_pool_idx, slots=sc.slots(rid)
        )
    return out


TOKEN_STORY = (
    ("alloc", dict(request="A", n=4)),
    ("alloc", dict(request="B", n=3)),
    ("alloc", dict(request="C", n=6)),
    ("free", dict(free_request="A")),
    ("free", dict(free_request="B")),
    ("alloc", dict(request="D", n=4)),
    ("alloc", dict(request="E", n=2)),
)


def token_scene(need_sort: bool, size: int = 16) -> Scene:
    return Scene(
        ReqToTokenPool(5, 8),
        TokenToKVPoolAllocator(size, need_sort=need_sort, debug_mode=True),
    )


def token_instrument(
    need_sort: bool = True, size: int = 16, opening=TOKEN_STORY
) -> Instrument:
    """Chapter 03: alloc(n) for a request, free a request, merge_and_sort_free; need_sort on and
    off."""
    alloc = Operation(
        "alloc",
        _op_token_alloc,
        [
            Field("request", _box("request", "F", "130px"), str),
            Field("n", _box("n", "3", "90px"), integer),
        ],
        label="alloc(n)",
        help="allocator.alloc(n) for this request (a new one takes a row)",
    )
    free = Operation(
        "free",
        lambda sc, step, free_request: _op_token_free(sc, step, free_request),
        [Field("free_request", _who(), str, options=_held_reqs)],
        label="free request",
        help="release_kv_cache: its slots go back (staged under need_sort)",
    )
    merge = Operation(
        "merge",
        _op_merge,
        label="merge_and_sort_free()",
        help="fold the staged slots in, sorted",
    )
    sort = W.ToggleButtons(
        options=[False, True],
        value=need_sort,
        description="need_sort",
        style={"button_width": "60px"},
    )
    return fit_buttons(
        Instrument(
            lambda need_sort: token_scene(need_sort, size),
            [alloc, free, merge],
            _draw(("table", "slots", "free")),
            token_books,
            settings={"need_sort": sort},
            opening=opening,
            title="the token allocator: your own allocs and frees",
        )
    )


# -- chapter 05: decode and free on the paged allocator ----------------------------------------


def _op_decode(sc: Scene, step, requests) -> None:
    from memlab.sglang.allocation import alloc_for_decode

    gone = [r for r in requests if r not in sc.reqs]
    if gone or not requests:
        raise InputError(
            f"{', '.join(gone)} hold{'s' * (len(gone) == 1)} no row"
            if gone
            else "name a request"
        )
    if len(set(requests)) != len(requests):
        raise InputError("a request appears twice in one decode batch")
    al, ps = sc.allocator, sc.allocator.page_size
    lens = {r: sc.reqs[r].kv.kv_allocated_len + 1 for r in requests}
    step.call = spell(
        "alloc_for_decode",
        Verbatim("req_to_token_pool"),
        Verbatim("allocator"),
        reqs=Verbatim(f"[{', '.join(requests)}]"),
    )
    with recording(al, "alloc_decode") as calls:
        out = alloc_for_decode(sc.req_pool, al, [sc.reqs[r] for r in requests])
    if calls:
        step.call = f"# {step.call} called:\n" + spell(
            "allocator.alloc_decode", **calls[0]["args"]
        )
    step.result = spell_value(out)
    if out is None:
        step.refuse(
            f"refused (the library returns None): {sum((n - 1) % ps == 0 for n in lens.values())} "
            f"request(s) open a page, {len(al.free_pages)} page(s) are free; nothing was taken"
        )
        return
    opened = [r for r, n in lens.items() if (n - 1) % ps == 0]
    step.marks = dict(new_slots=out.tolist())
    step.caption = f"decode: seq_lens {list(lens.values())}; " + (
        f"{', '.join(opened)} open a page" if opened else "every slot is last_loc + 1"
    )


def _op_paged_free(sc: Scene, step, request) -> None:
    slots = _release(sc, step, request)
    sc.finished[request] = slots
    ps = sc.allocator.page_size
    pages = list(dict.fromkeys(s // ps for s in slots))
    queued = group_state(sc.allocator) != "closed"
    step.result = (
        f"pages {pages} queued in the open free group"
        if queued
        else f"pages {pages} back at the head of free_pages"
    )
    step.marks = dict(new_slots=slots)
    step.caption = f"{request} finishes: pages {pages} " + (
        "queued" if queued else "go back"
    )


def _op_group_begin(sc: Scene, step) -> None:
    step.call = "allocator.free_group_begin()"
    sc.allocator.free_group_begin()
    step.result = "None; frees are queued until free_group_end()"
    step.caption = "free_group_begin()"


def _op_group_end(sc: Scene, step) -> None:
    step.call = "allocator.free_group_end()"
    sc.allocator.free_group_end()
    step.result = "None; the group's pages released at once, deduplicated once"
    step.caption = "free_group_end(): one release for the whole group"


def _op_segment(sc: Scene, step, request, start_pos, count) -> None:
    """``free_segment`` over positions ``start_pos .. start_pos + count - 1`` of a request's row
    (as a sliding window gives back what it no longer reads): the library checks the alignment."""
    if request not in sc.reqs:
        raise InputError(f"{request!r} holds no row")
    slots = sc.slots(request)
    if start_pos < 0 or count < 0 or start_pos + count > len(slots):
        raise InputError(
            f"{request} holds positions 0..{len(slots) - 1}: {start_pos}..{start_pos + count - 1} "
            "is not inside them"
        )
    run = torch.tensor(slots[start_pos : start_pos + count], dtype=torch.int64)
    step.call = spell("allocator.free_segment", run, start_pos=start_pos)
    sc.allocator.free_segment(run, start_pos=start_pos)
    ps = sc.allocator.page_size
    pages = run[::ps].div(ps, rounding_mode="floor").tolist()
    step.result = f"None; pages {pages}"
    step.marks = dict(new_slots=run.tolist())
    step.caption = (
        f"free_segment of {request}'s positions {start_pos}..{start_pos + count - 1}"
    )


def _op_double_free(sc: Scene, step, request) -> None:
    """Free a stale copy of a finished request's slots again: debug mode's check raises."""
    if request not in sc.finished:
        raise InputError(
            f"{request!r} has not finished: free it first, then free its old slots again"
        )
    stale = torch.tensor(sc.finished[request], dtype=torch.int64)
    step.call = spell("allocator.free", stale)
    sc.allocator.free(stale)
    step.result = "None (debug_mode off, or the pages were taken again: no error)"
    step.caption = f"a stale copy of {request}'s slots freed again"


def paged_books(sc: Scene) -> dict:
    al = sc.allocator
    out = {
        "free_pages": al.free_pages.tolist(),
        "available_size()": al.available_size(),
        "free group": group_state(al),
        "debug_mode": al.debug_mode,
    }
    ps = al.page_size
    for rid in sc.reqs:
        s = sc.slots(rid)
        out[f"request {rid}"] = dict(
            row=sc.reqs[rid].kv.req_pool_idx,
            tokens=len(s),
            pages=list(dict.fromkeys(x // ps for x in s)),
            last_loc=s[-1] if s else -1,
        )
    return out


# Chapter 05's decode story (sglang_books.decode_steps): the prefill and six decode steps.
DECODE_STORY = (
    ("prefill", dict(new_requests=["A", "B", "C"], tokens=[3, 4, 6])),
    *(("decode", dict(requests=["A", "B", "C"])),) * 6,
)


def _op_prefill(sc: Scene, step, requests, tokens) -> None:
    step.call = spell(
        "alloc_for_extend",
        Verbatim("req_to_token_pool"),
        Verbatim("allocator"),
        reqs=Verbatim(f"[{', '.join(requests)}]"),
        extend_lens=list(tokens),
    )
    out, _ = _extend(sc, step, requests, tokens, (sc.allocator, "alloc_extend"))
    step.result = spell_value(out)
    if out is None:
        step.refuse(
            "refused (the library returns None): not enough pages or rows; nothing was taken"
        )
        return
    step.marks = dict(new_slots=out.tolist())
    step.caption = "prefill: " + ", ".join(f"{r} {n}" for r, n in zip(requests, tokens))


def paged_scene(page_size: int = 4) -> Scene:
    sc = Scene(
        ReqToTokenPool(4, 16),
        PagedTokenToKVPoolAllocator(64, page_size, debug_mode=True),
    )
    sc.finished = {}  # request -> the slots it held when it finished (for the double free)
    return sc


def paged_free_instrument(
    page_size: int = 4, page_sizes=(1, 2, 4, 8), opening=DECODE_STORY
) -> Instrument:
    """Chapter 05: decode steps, free a request, free groups, free_segment, a double free (debug
    mode)."""
    decode = Operation(
        "decode",
        _op_decode,
        [Field("requests", _box("requests", "A, B, C"), names)],
        label="alloc_decode (one step)",
        help="alloc_for_decode: one more token for each request",
    )
    prefill = Operation(
        "prefill",
        _op_prefill,
        [
            Field("new_requests", _box("new requests", "D"), names),
            Field("tokens", _box("tokens", "5", "120px"), ints),
        ],
        label="prefill",
        help="alloc_for_extend: new requests and their prompts",
    )
    prefill.run = lambda sc, step, new_requests, tokens: _op_prefill(
        sc, step, new_requests, tokens
    )
    free = Operation(
        "free",
        _op_paged_free,
        [Field("request", _who(), str, options=_held_reqs)],
        label="free request",
        help="release_kv_cache: the request's pages go back",
    )
    begin = Operation(
        "group_begin",
        _op_group_begin,
        label="free_group_begin()",
        help="queue frees until the end",
    )
    end = Operation(
        "group_end",
        _op_group_end,
        label="free_group_end()",
        help="release the queued frees at once",
    )
    seg = Operation(
        "segment",
        _op_segment,
        [
            Field("seg_request", _who("of"), str, options=_held_reqs),
            Field("start_pos", _box("start_pos", "0", "110px"), integer),
            Field("count", _box("count", "4", "90px"), integer),
        ],
        label="free_segment",
        help="give back a run of a request's positions (must start on a page)",
    )
    seg.run = lambda sc, step, seg_request, start_pos, count: _op_segment(
        sc, step, seg_request, start_pos, count
    )
    again = Operation(
        "double_free",
        _op_double_free,
        [Field("stale", _who("stale"), str, options=lambda sc: list(sc.finished))],
        label="free again (stale copy)",
        help="free a finished request's old slots a second time",
    )
    again.run = lambda sc, step, stale: _op_double_free(sc, step, stale)
    ps = W.ToggleButtons(
        options=list(page_sizes),
        value=page_size,
        description="page_size",
        style={"button_width": "42px"},
    )
    return fit_buttons(
        Instrument(
            lambda page_size: paged_scene(page_size),
            [decode, prefill, free, begin, end, seg, again],
            _draw(("table", "slots", "free")),
            paged_books,
            settings={"page_size": ps},
            opening=opening,
            title="decode and free: your own steps, debug mode on",
        )
    )
