"""The unified pool's books (chapter 12): one byte buffer, two sub-pools growing from its ends, the
request table in virtual ids, and the page tables that bind virtual pages to physical ones.

The same four parts as every side of memlab.course.viz (see ``sglang_books``):

1. the snapshot: ``UnifiedFrame`` (with a ``SubPoolView`` per side), frozen, read from the real
   objects by ``read_unified``;
2. the scene: ``UnifiedScene`` drives a ``ReqToTokenPool`` and a
   ``UnifiedSWATokenToKVPoolAllocator``
   the way SGLang's scheduler does (``alloc_for_extend`` / ``alloc_for_decode``, a sliding window's
   ``free_swa``, a finished request's ``free``) and snaps a frame after each step; the page moves of
   a step are read off the page tables (a virtual page bound before and after, to another page);
3. the chapter's story: ``unified_story``;
4. the drawing: ``draw_unified(frame)``, inline SVG, a pure function of the frame (cells
   carry gids ``byte:SIDE:PAGE``, ``vpage:ROW:I``, ``v2p:SIDE:VPAGE``); the Stepper, the
   instrument and the static PNG all show it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memlab.course.viz.instrument import (
    InputError,
    Verbatim,
    names,
    recording,
    spell,
    spell_value,
)
from memlab.course.viz.sglang_books import Scene
from memlab.course.viz.style import FREE, HIGHLIGHT, PADDING, owner_color
from memlab.sglang.req_to_token import ReqToTokenPool
from memlab.sglang.unified import (
    MHASubPoolSpec,
    UnifiedKVPool,
    UnifiedSWAKVPool,
    UnifiedSWATokenToKVPoolAllocator,
)

# -- 1. the snapshot --------------------------------------------------------------------------


@dataclass(frozen=True)
class SubPoolView:
    name: str
    grow: str  # "up" (from byte 0) or "down" (from the top)
    page_size: int
    entry_bytes: int
    num_pages: int
    min_page_index: int
    used: tuple  # (first, end): the physical pages in use, one dense run at this end
    bound: tuple  # (virtual page, physical page), ascending virtual page
    available: int  # tokens this side alone could take now

    @property
    def page_bytes(self) -> int:
        return self.entry_bytes * self.page_size


@dataclass(frozen=True)
class UnifiedFrame:
    caption: str
    total_bytes: int
    reserved_floor: int
    page_size: int
    rows: tuple  # (owner, virtual token ids) per running request
    full: SubPoolView
    swa: SubPoolView
    gap_bytes: int
    joint_available: int  # tokens with a full AND an SWA slot
    moves: tuple = ()  # (side, virtual page, from physical page, to physical page) in this step
    new_pages: frozenset = frozenset()  # virtual pages bound by this step
    note: str = ""

    def page_owner(self) -> dict[int, str]:
        ps = self.page_size
        return {t // ps: owner for owner, ids in self.rows for t in ids}


def _side(a) -> SubPoolView:
    v2p = a.virtual_to_physical[:-1]
    bound = torch.nonzero(v2p > 0).flatten()
    return SubPoolView(
        a.sub_pool_name,
        a.grow_direction,
        a.page_size,
        a.entry_bytes,
        a.num_pages,
        a.min_page_index,
        a.used_page_range(),
        tuple(zip(bound.tolist(), v2p[bound].tolist())),
        a.available_size(),
    )


def read_unified(
    caption: str,
    allocator: UnifiedSWATokenToKVPoolAllocator,
    rows: dict,
    before=None,
    note: str = "",
) -> UnifiedFrame:
    """Snapshot: ``rows`` maps an owner to its virtual token ids; ``before`` is the frame of the
    previous step, to read which pages moved and which were bound."""
    fa, sa = allocator.full_attn_allocator, allocator.swa_attn_allocator
    full, swa = _side(fa), _side(sa)
    moves, new = [], set()
    if before is not None:
        for old, now in ((before.full, full), (before.swa, swa)):
            was = dict(old.bound)
            moves += [
                (now.name, v, was[v], p)
                for v, p in now.bound
                if v in was and was[v] != p
            ]
            new |= {v for v, _ in now.bound if v not in was}
    return UnifiedFrame(
        caption,
        allocator.unified_buffer.total_bytes,
        allocator.unified_buffer.reserved_floor,
        allocator.page_size,
        tuple((str(o), tuple(ids)) for o, ids in rows.items()),
        full,
        swa,
        fa._current_gap_bytes(),
        allocator.available_size(),
        tuple(moves),
        frozenset(new),
        note,
    )


# -- 2. the scene -----------------------------------------------------------------------------


class UnifiedScene(Scene):
    """A Scene over a UnifiedSWATokenToKVPoolAllocator; the request table holds virtual ids."""

    def __init__(
        self,
        req_pool: ReqToTokenPool,
        allocator: UnifiedSWATokenToKVPoolAllocator,
        kvcache=None,
    ):
        super().__init__(req_pool, allocator, kvcache)
        self.swa_released: dict[str, int] = {}

    def books(self, caption: str = "", note: str = "", **_) -> UnifiedFrame:
        rows = {rid: self.slots(rid) for rid in self.reqs}
        return read_unified(
            caption,
            self.allocator,
            rows,
            self.frames[-1] if self.frames else None,
            note,
        )

    def snap(self, caption: str, note: str = "", **_) -> UnifiedFrame:
        f = self.books(caption, note)
        self.frames.append(f)
        return f

    def release_window(self, rid: str, window: int) -> list[int]:
        """The request's tokens wholly before its last ``window`` leave the sliding window: their
        SWA pages go back (``free_swa``, whole pages), their full pages and virtual ids stay."""
        ps, ids = self.allocator.page_size, self.slots(rid)
        start, end = self.swa_released.get(rid, 0), (len(ids) - window) // ps * ps
        if end <= start:
            return []
        self.allocator.free_swa(torch.tensor(ids[start:end], dtype=torch.int64))
        self.swa_released[rid] = end
        return ids[start:end]

    def finish(self, rid) -> list[int]:
        self.swa_released.pop(rid, None)
        return super().finish(rid)


# -- 3. the chapter's story -------------------------------------------------------------------


def unified_scene(
    page_size: int = 2, total_bytes: int = 3072, backend: str = "torch"
) -> UnifiedScene:
    """A tiny hybrid model over one buffer: full attention (1 layer of K+V, 16 bf16 values each:
    64 bytes a slot) grows down from the top, the sliding window (2 layers of 8: 64 bytes) up from
    the floor."""
    specs = [
        MHASubPoolSpec(
            name="full",
            layer_num=1,
            head_num=1,
            head_dim=16,
            store_dtype=torch.float16,
            grow_direction="down",
        ),
        MHASubPoolSpec(
            name="swa",
            layer_num=2,
            head_num=1,
            head_dim=8,
            store_dtype=torch.float16,
            grow_direction="up",
        ),
    ]
    pool = UnifiedKVPool(
        total_bytes=total_bytes, sub_pool_specs=specs, page_size=page_size
    )
    kv = UnifiedSWAKVPool(
        unified_buffer=pool,
        full_attention_layer_ids=[1],
        swa_attention_layer_ids=[0, 2],
        page_size=page_size,
        backend=backend,
    )
    al = UnifiedSWATokenToKVPoolAllocator(
        unified_buffer=pool,
        kvcache=kv,
        page_size=page_size,
        debug_mode=True,
        backend=backend,
    )
    return UnifiedScene(ReqToTokenPool(4, 24), al, kv)


def _pages(ids, ps) -> list[int]:
    return sorted({t // ps for t in ids})


def unified_story(
    page_size: int = 2, window: int = 4, backend: str = "torch"
) -> UnifiedScene:
    """Chapter 12: requests in one buffer; a window releasing SWA pages; a free compacting pages
    while the request table keeps its virtual ids; a prompt refused for bytes, not for ids."""
    sc = unified_scene(page_size, backend=backend)
    al = sc.allocator
    fa, sa = al.full_attn_allocator, al.swa_attn_allocator
    e = fa.entry_bytes_per_page + sa.entry_bytes_per_page
    sc.snap(
        f"One buffer of {al.unified_buffer.total_bytes} bytes: full pages "
        f"({fa.entry_bytes_per_page} B) grow down from the top, SWA pages "
        f"({sa.entry_bytes_per_page} B) up from the {al.unified_buffer.reserved_floor}-byte "
        f"padding floor; a token needs both, so {al.available_size()} tokens fit "
        f"({fa._current_gap_bytes()} B of gap // {e} B a page pair, x {page_size})"
    )
    out = sc.extend_batch({"A": 7})
    sc.snap(
        f"A arrives with 7 tokens: chapter 04's alloc_extend hands out virtual ids {out.tolist()} "
        "from the free list of virtual pages; each new virtual page is then bound to a full page "
        "at the top and an SWA page at the bottom"
    )
    out = sc.extend_batch({"B": 5})
    sc.snap(
        f"B arrives with 5: virtual ids {out.tolist()}; both frontiers move inward, the gap "
        f"between them shrinks by {fa.entry_bytes_per_page + sa.entry_bytes_per_page} B a page"
    )
    lens = {r: sc.reqs[r].kv.kv_allocated_len + 1 for r in ("A", "B")}
    out = sc.decode(["A", "B"])
    opened = [r for r, n in lens.items() if (n - 1) % page_size == 0]
    sc.snap(
        f"A decode step: virtual ids {out.tolist()} (chapter 05's alloc_decode); "
        + (
            f"{' and '.join(opened)} opened a page, bound on both sides"
            if opened
            else "nobody opens a page, so nothing new is bound: each id is last_loc + 1"
        )
    )
    gone = sc.release_window("A", window)
    sc.snap(
        f"A's next token reads only its last {window}: the SWA pages of {gone} go back "
        "(free_swa); their SWA v2p entries become -1, their full pages and virtual ids stay, and "
        "the freed SWA pages are compacted at once"
    )
    a_pages = _pages(sc.slots("A"), page_size)
    sc.finish("A")
    f = sc.snap(
        f"A finishes: virtual pages {a_pages} go back; the pages left in the band the full side "
        "gives up move into A's old ones (the black edges), and only the page tables change: B's "
        "virtual ids in the request table stay as they were"
    )
    moved = [m for m in f.moves if m[0] == "full"]
    if moved:
        sc.frames[-1] = UnifiedFrame(
            **{
                **f.__dict__,
                "note": "moved: "
                + ", ".join(
                    f"virtual page {v}: full page {p} -> {q}" for _, v, p, q in moved
                ),
            }
        )
    want = al.available_size() + page_size
    if sc.extend_batch({"C": want}) is None:
        sc.snap(
            f"C asks for {want} tokens: refused, although the full side has {fa.available_size()} "
            "tokens of room and virtual ids to spare: the shared gap pays for "
            f"{al.available_size()} tokens on both sides"
        )
    out = sc.extend_batch({"C": al.available_size()})
    sc.snap(
        f"C takes all {len(out)} that fit: the two frontiers meet and the gap is gone"
    )
    return sc


# -- 4. the drawing: inline SVG, every page saying what it is ----------------------------------


def draw_unified(frame: UnifiedFrame, still: bool = False) -> str:
    """The frame as inline SVG under its caption, every page saying what it is: the byte buffer
    (both sides and the gap), the request table in virtual pages (pale: its SWA page is gone),
    and each side's page table (virtual -> physical; black edge: moved or bound by the step)."""
    from memlab.course.viz.svg import Canvas, Swatch

    c = Canvas("hover a page: its side, bytes, virtual page, owner")
    ps = frame.page_size
    y0 = c.caption(4, 4.0, frame.caption, frame.note, 760)
    owner, moved = frame.page_owner(), {(m[0], m[3]) for m in frame.moves}
    moved_v = {(m[0], m[1]): m for m in frame.moves}
    rows = {v: (o, ids) for o, ids in frame.rows for v in _pages(ids, ps)}
    swa_of, full_of = dict(frame.swa.bound), dict(frame.full.bound)
    lane_w = 760.0
    scale = lane_w / frame.total_bytes
    c.text(
        4,
        y0 + 13,
        f"the byte buffer ({frame.total_bytes} B): SWA pages from byte "
        f"{frame.reserved_floor} up, full pages from the top down; gap {frame.gap_bytes} B",
        size=12.5,
        weight="bold",
        color="#222",
    )
    y = y0 + 36
    c.cell(
        4,
        y,
        PADDING,
        "",
        tip=f"bytes 0-{frame.reserved_floor - 1}: the padding floor (slot 0 of every view)",
        gid="byte:floor",
        w=max(frame.reserved_floor * scale, 3),
        h=30,
    )

    def vwords(v):
        if v not in rows:
            return f"virtual page {v}"
        o, ids = rows[v]
        mine = [t for t in ids if t // ps == v]
        return (
            f"virtual page {v} of {o} (virtual ids {mine[0]}-{mine[-1]})"
            if len(mine) > 1
            else f"virtual page {v} of {o} (virtual id {mine[0]})"
        )

    for side in (frame.swa, frame.full):
        for v, p in side.bound:
            lo = p * side.page_bytes
            edge = (
                dict(stroke=HIGHLIGHT, stroke_width=2.0)
                if (side.name, p) in moved or v in frame.new_pages
                else {}
            )
            how = (
                f" · moved here from page {moved_v[(side.name, v)][2]} by this step"
                if (side.name, v) in moved_v
                else " · bound by this step"
                if v in frame.new_pages
                else ""
            )
            c.cell(
                4 + lo * scale,
                y,
                owner_color(owner.get(v)),
                p,
                gid=f"byte:{side.name}:{p}",
                tip=f"{side.name} page {p}, bytes {lo}-{lo + side.page_bytes - 1} <- "
                f"{vwords(v)}{how}",
                w=side.page_bytes * scale,
                h=30,
                opacity=1.0 if side.name == "full" else 0.75,
                size=9,
                **edge,
            )
    lo = (
        frame.swa.used[1] * frame.swa.page_bytes
        if frame.swa.grow == "up"
        else frame.full.used[1] * frame.full.page_bytes
    )
    if frame.gap_bytes:
        c.cell(
            4 + lo * scale,
            y,
            FREE,
            f"gap {frame.gap_bytes} B" if frame.gap_bytes * scale > 70 else "",
            gid="byte:gap",
            w=frame.gap_bytes * scale,
            h=30,
            stroke="#999",
            tip=f"the gap: bytes {lo}-{lo + frame.gap_bytes - 1} ({frame.gap_bytes} B), where "
            f"both sides grow; {frame.joint_available} tokens fit with a full AND an SWA slot "
            "each",
        )
    # each label outside the gap, at its side's frontier: they cannot overlap however narrow the gap
    up, down = f"{frame.swa.name} grows up ->", f"<- {frame.full.name} grows down"
    c.text(
        max(4 + lo * scale, 4 + 6.2 * len(up)),
        y + 44,
        up,
        size=10,
        anchor="end",
        color="#444",
    )
    c.text(
        min(4 + (lo + frame.gap_bytes) * scale, 4 + lane_w - 6.2 * len(down)),
        y + 44,
        down,
        size=10,
        color="#444",
    )
    y += 62
    c.text(
        4,
        y + 13,
        "request table: virtual ids, one cell per virtual page (pale: its SWA page is gone)",
        size=12.5,
        weight="bold",
        color="#222",
    )
    y += 22
    for o, ids in frame.rows:
        c.text(30, y + 15, o, size=11, anchor="end", color="#444")
        for i, v in enumerate(_pages(ids, ps)):
            mine = [t for t in ids if t // ps == v]
            label = f"{mine[0]}" if len(mine) == 1 else f"{mine[0]}-{mine[-1]}"
            swa = swa_of.get(v, -1)
            tip = f"{o} · {vwords(v)} -> full page {full_of.get(v)}, " + (
                f"SWA page {swa}"
                if swa > 0
                else "SWA page gone (out of the window; v2p = -1)"
            )
            edge = (
                dict(stroke=HIGHLIGHT, stroke_width=2.0) if v in frame.new_pages else {}
            )
            c.cell(
                36 + i * 46,
                y,
                owner_color(o),
                label,
                tip=tip,
                gid=f"vpage:{o}:{i}",
                w=44,
                opacity=1.0 if swa > 0 else 0.4,
                size=9,
                **edge,
            )
        y += CELL_H
    if not frame.rows:
        c.text(36, y + 14, "(no request)", size=11, color="#777")
        y += CELL_H
    for side in (frame.full, frame.swa):
        y += 8
        c.text(
            4,
            y + 13,
            f"{side.name} v2p: virtual page -> {side.name} page ({side.available} tokens of room "
            "alone)",
            size=12.5,
            weight="bold",
            color="#222",
        )
        y += 20
        for i, (v, p) in enumerate(side.bound):
            line, col = divmod(i, 16)
            edge = (
                dict(stroke=HIGHLIGHT, stroke_width=2.0)
                if (side.name, v) in moved_v
                else {}
            )
            c.cell(
                4 + col * 46,
                y + line * CELL_H,
                owner_color(owner.get(v)),
                f"{v}→{p}",
                gid=f"v2p:{side.name}:{v}",
                tip=f"{side.name} v2p[{v}] = {p}: {vwords(v)} lives in {side.name} page {p}",
                w=44,
                size=9,
                **edge,
            )
        if not side.bound:
            c.text(4, y + 14, "(nothing bound)", size=11, color="#777")
        y += max(1, -(-len(side.bound) // 16)) * CELL_H
    c.legend(
        4,
        y + 6,
        [
            Swatch(
                "bound or moved by the last call",
                "#ffffff",
                stroke=HIGHLIGHT,
                stroke_width=2,
            ),
            Swatch("gap", FREE),
            Swatch("padding floor", PADDING),
            Swatch("SWA page gone", "#4e79a7", opacity=0.4),
        ],
    )
    return c.html(still)


CELL_H = 26


def _ureq(sc, request):
    if request not in sc.reqs:
        raise InputError(f"{request!r} holds no row")
    return sc.reqs[request]


def _mark(step, before: UnifiedFrame, sc) -> None:
    after = read_unified("", sc.allocator, {r: sc.slots(r) for r in sc.reqs}, before)
    step.marks = dict(moves=after.moves, new_pages=after.new_pages)


def _op_u_extend(sc, step, request, tokens) -> None:
    """A prefill (or the next chunk) through ``alloc_for_extend``: the recorded ``alloc_extend``."""
    before = sc.books()
    step.call = spell(
        "alloc_for_extend",
        Verbatim("req_to_token_pool"),
        Verbatim("allocator"),
        reqs=Verbatim(f"[{request}]"),
        extend_lens=[tokens],
    )
    with recording(sc.allocator, "alloc_extend") as calls:
        out = sc.extend_batch({request: tokens})
    if calls:
        step.call = f"# {step.call} called:\n" + spell(
            "allocator.alloc_extend", **calls[0]["args"]
        )
    step.result = spell_value(out)
    if out is None:
        step.refuse(
            f"refused (the library returns None): {tokens} tokens asked, available_size() = "
            f"{sc.allocator.available_size()} (a token needs a full AND an SWA slot from the "
            "shared gap); nothing was taken"
        )
        return
    _mark(step, before, sc)
    step.caption = f"{request} +{tokens}: virtual ids {out.tolist()}"


def _op_u_decode(sc, step, requests) -> None:
    for r in requests:
        _ureq(sc, r)
    if not requests or len(set(requests)) != len(requests):
        raise InputError("name each decoding request once")
    before = sc.books()
    with recording(sc.allocator, "alloc_decode") as calls:
        out = sc.decode(requests)
    step.call = (
        (
            f"# alloc_for_decode(req_to_token_pool, allocator, reqs=[{', '.join(requests)}]) "
            "called:\n" + spell("allocator.alloc_decode", **calls[0]["args"])
        )
        if calls
        else "alloc_for_decode(...)"
    )
    step.result = spell_value(out)
    if out is None:
        step.refuse(
            "refused (the library returns None): available_size() = "
            f"{sc.allocator.available_size()}"
        )
        return
    _mark(step, before, sc)
    step.caption = f"decode {', '.join(requests)}: virtual ids {out.tolist()}"


def _op_u_window(sc, step, request, window) -> None:
    _ureq(sc, request)
    if window < 0:
        raise InputError(f"window {window}: a window holds 0 or more tokens")
    before = sc.books()
    with recording(sc.allocator, "free_swa") as calls:
        gone = sc.release_window(request, window)
    step.call = (
        spell("allocator.free_swa", calls[0]["args"]["free_index"])
        if calls
        else f"# nothing of {request} is wholly before its last {window} tokens (and not yet "
        "released)"
    )
    _mark(step, before, sc)
    moves = list(step.marks["moves"])
    step.result = (
        f"SWA pages of virtual ids {gone} back; their full pages and virtual ids stay; "
        + (_moves_text(moves) if moves else "nothing moved")
        if gone
        else "no call"
    )
    step.caption = (
        f"{request}'s window of {window}: "
        + (f"{gone} leave the SWA side" if gone else "nothing leaves")
        + (f"; {len(moves)} page(s) moved" if moves else "")
    )


def _moves_text(moves) -> str:
    """The pages a compaction moved, as the allocator did them: side, page from -> to."""
    return ", ".join(f"{s} page {a} -> {b} (virtual page {v})" for s, v, a, b in moves)


def _op_u_free(sc, step, request) -> None:
    _ureq(sc, request)
    before = sc.books()
    pages = _pages(sc.slots(request), sc.allocator.page_size)
    step.call = f"release_kv_cache(req_to_token_pool, allocator, {request})"
    with recording(sc.allocator, "free_segment") as calls:
        sc.finish(request)
    for c in calls:
        step.call += "\n# called " + spell(
            "allocator.free_segment", **c["args"]
        ).replace("\n", "\n#   ")
    _mark(step, before, sc)
    moves = [m for m in step.marks["moves"]]
    step.result = f"virtual pages {pages} back; " + (
        _moves_text(moves) if moves else "nothing moved"
    )
    step.caption = f"{request} finishes: virtual pages {pages} back" + (
        f"; {len(moves)} page(s) moved" if moves else ""
    )


def _page_span(lo_hi) -> str:
    """A side's pages in use, ``used_page_range()``'s half-open (lo, hi), written as the pages."""
    lo, hi = lo_hi
    if hi <= lo:
        return "none"
    return f"page {lo}" if hi == lo + 1 else f"pages {lo} to {hi - 1}"


def _still_held(sc, typed: str) -> str:
    """The decode field after a step: the requests typed that still hold a row (all that do, when
    none of those typed is left), so it never suggests a request that was just freed."""
    try:
        named = names(typed)
    except InputError:
        return typed
    kept = [r for r in named if r in sc.reqs]
    return ", ".join(kept or list(sc.reqs))


def unified_books_dict(sc) -> dict:
    al = sc.allocator
    fa, sa = al.full_attn_allocator, al.swa_attn_allocator
    out = {
        "available_size()": al.available_size(),
        "full_available_size()": al.full_available_size(),
        "swa_available_size()": al.swa_available_size(),
        "gap bytes": fa._current_gap_bytes(),
        "full pages in use": _page_span(fa.used_page_range()),
        "swa pages in use": _page_span(sa.used_page_range()),
    }
    ps = al.page_size
    full_v2p, swa_v2p = fa.virtual_to_physical.tolist(), sa.virtual_to_physical.tolist()
    for rid in sc.reqs:
        vp = _pages(sc.slots(rid), ps)
        out[f"request {rid}"] = dict(
            tokens=len(sc.slots(rid)),
            virtual_pages=vp,
            full=[full_v2p[v] for v in vp],
            swa=[swa_v2p[v] for v in vp],
        )
    return out


def unified_opening(page_size: int = 2, window: int = 4) -> list:
    """``unified_story``'s steps as the instrument's operations (C takes what fits at the end)."""
    c = unified_story(page_size, window).reqs["C"].kv.kv_allocated_len
    return [
        ("extend", dict(request="A", tokens=7)),
        ("extend", dict(request="B", tokens=5)),
        ("decode", dict(requests=["A", "B"])),
        ("window", dict(win_request="A", window=window)),
        ("free", dict(free_request="A")),
        ("extend", dict(request="C", tokens=c)),
    ]


def unified_instrument(page_size: int = 2, window: int = 4, opening=None):
    """Chapter 12: prefill or extend a request, decode, let a window go (``free_swa``), free a
    request
    (its pages compacted at once): on the real unified allocator, opening on the story's last
    state."""
    import ipywidgets as W

    from memlab.course.viz.instrument import (
        Field,
        Instrument,
        Operation,
        integer,
    )

    def box(name, value, width="150px"):
        return W.Text(
            value=value,
            description=name,
            layout=W.Layout(width=width),
            style={"description_width": "initial"},
            continuous_update=False,
        )

    def who(label):
        return W.Dropdown(description=label, layout=W.Layout(width="150px"))

    held = lambda sc: list(sc.reqs)  # noqa: E731
    ops = [
        Operation(
            "extend",
            _op_u_extend,
            [
                Field("request", box("request", "D", "120px"), str),
                Field("tokens", box("tokens", "3", "100px"), integer),
            ],
            label="alloc_extend",
            help="alloc_for_extend: a new request's prompt, or a chunk more",
        ),
        Operation(
            "decode",
            _op_u_decode,
            [
                Field(
                    "requests",
                    box("decode", "B, C"),
                    names,
                    refresh=_still_held,
                )
            ],
            label="alloc_decode",
            help="one decode step for these requests",
        ),
        Operation(
            "window",
            lambda sc, step, win_request, window: _op_u_window(
                sc, step, win_request, window
            ),
            [
                Field("win_request", who("window of"), str, options=held),
                Field("window", box("window", str(window), "100px"), integer),
            ],
            label="free_swa (window)",
            help="the tokens before the last `window` leave the SWA side",
        ),
        Operation(
            "free",
            lambda sc, step, free_request: _op_u_free(sc, step, free_request),
            [Field("free_request", who("free"), str, options=held)],
            label="free request",
            help="release_kv_cache: both sides' pages back, compacted at once",
        ),
    ]

    def draw(sc, step):
        f = sc.books()
        marks = step.marks if step is not None else {}
        return draw_unified(
            UnifiedFrame(
                **{
                    **f.__dict__,
                    "moves": tuple(marks.get("moves", ())),
                    "new_pages": frozenset(marks.get("new_pages", ())),
                }
            )
        )

    def build():
        return unified_scene(page_size)

    from memlab.course.viz.token_books import fit_buttons

    return fit_buttons(
        Instrument(
            build,
            ops,
            draw,
            unified_books_dict,
            opening=unified_opening(page_size, window) if opening is None else opening,
            title="the unified pool: your own requests in one buffer",
        )
    )
