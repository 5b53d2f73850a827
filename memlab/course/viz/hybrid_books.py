"""The hybrid books (chapter 07): a sliding-window model's two ledgers (full and SWA) with the map
between them, and a Mamba layer's per-request state slots with their ping-pong tracking slots.

The same four parts as every side of memlab.course.viz (see ``sglang_books``): the snapshots
(``SwaFrame``, ``MambaFrame`` and ``read_mamba``), the scene (``SwaScene``, a ``Scene`` over an
``SWATokenToKVPoolAllocator`` that also releases out-of-window pages), the chapter's stories
(``sliding_window``, ``mamba_slots``) and the drawings (``draw_swa``, ``draw_mamba``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from memlab.course.viz.instrument import Verbatim
from memlab.course.viz.sglang_books import (
    Books,
    RowView,
    Scene,
    _slots,
    draw_request_table,
    draw_slot_grid,
    read_books,
)
from memlab.course.viz.style import FREE, HIGHLIGHT, PADDING, owner_color
from memlab.course.viz.svg import CELL, Canvas, Swatch
from memlab.sglang.allocation import release_kv_row
from memlab.sglang.mamba import HybridReqToTokenPool
from memlab.sglang.req_to_token import Req, ReqToTokenPool
from memlab.sglang.swa import SWATokenToKVPoolAllocator

# -- 1. the snapshots -------------------------------------------------------------------------


@dataclass(frozen=True)
class SwaFrame:
    caption: str
    full: Books  # the request table and the full-attention ledger
    swa: Books  # the sliding-window ledger, its slots owned through the map
    pairs: tuple  # (full slot, swa slot) for every mapped held slot
    window: int
    note: str = ""
    swa_evicted_len: dict = field(default_factory=dict)  # rid -> positions released


@dataclass(frozen=True)
class MambaFrame:
    caption: str
    size: int  # state slots 1..size; 0 is padding
    free_slots: tuple
    # (row, owner, state slot, tracking slots tuple, next_track_idx, last_track_seqlen)
    rows: tuple
    note: str = ""
    hot: frozenset = frozenset()  # slots the step wrote (a snapshot's target)

    def slot_roles(self) -> dict[int, tuple[str, str]]:
        """slot -> (owner, role): 'state', 'track 0', 'track 1' (a * marks the next snapshot's)."""
        roles = {}
        for _, owner, state, tracks, nxt, _ in self.rows:
            if owner is None:
                continue
            if state:
                roles[state] = (owner, "state")
            for i, t in enumerate(tracks):
                if t:
                    roles[t] = (owner, f"track {i}" + ("*" if i == nxt else ""))
        return roles


def read_mamba(caption: str, pool, reqs, note: str = "") -> MambaFrame:
    owners = {
        r.kv.req_pool_idx: str(r.rid) for r in reqs if r.kv.req_pool_idx is not None
    }
    pp = pool.req_index_to_mamba_ping_pong_track_buffer_mapping
    rows = tuple(
        (
            row,
            owners.get(row),
            int(pool.req_index_to_mamba_index_mapping[row]),
            tuple(pp[row].tolist()),
            int(pool.mamba_next_track_idx[row]),
            int(pool.mamba_last_track_seqlen[row]),
        )
        for row in range(1, pool.size + 1)
    )
    return MambaFrame(
        caption,
        pool.mamba_pool.size,
        tuple(pool.mamba_allocator.free_slots.tolist()),
        rows,
        note,
    )


# -- 2. the scene -----------------------------------------------------------------------------


class SwaScene(Scene):
    """A Scene over an ``SWATokenToKVPoolAllocator``; it also releases out-of-window pages."""

    def __init__(self, req_pool, allocator, window: int):
        super().__init__(req_pool, allocator)
        self.window = window
        self.swa_evicted_len: dict[str, int] = {}

    def books(
        self, caption: str = "", new_slots=(), part_of=None, note: str = ""
    ) -> SwaFrame:
        al = self.allocator
        full = read_books(
            caption,
            self.req_pool,
            al.full_attn_allocator,
            self.reqs.values(),
            new_slots,
        )
        mapping = al.full_to_swa_index_mapping
        rows, pairs = [], []
        for r in full.rows:
            if r.owner is None:
                rows.append(r)
                continue
            swa = [int(mapping[s]) for s in r.slots]
            pairs += [(s, m) for s, m in zip(r.slots, swa) if m > 0]
            rows.append(
                RowView(r.row, r.owner, tuple(m for m in swa if m > 0), r.generation)
            )
        sw = al.swa_attn_allocator
        new_swa = {int(mapping[s]) for s in new_slots if int(mapping[s]) > 0}
        swa = Books(
            caption,
            sw.page_size,
            sw.num_pages,
            full.row_width,
            tuple(rows),
            free_pages=tuple(sw.free_pages.tolist()),
            staged_pages=tuple(sw.get_all_free_pages()[len(sw.free_pages) :].tolist()),
            new_slots=frozenset(new_swa),
        )
        return SwaFrame(
            caption,
            full,
            swa,
            tuple(pairs),
            self.window,
            note,
            dict(self.swa_evicted_len),
        )

    def release(self, rid: str) -> list[int]:
        """SWA pages wholly before the request's window go back; the full side keeps its slots."""
        r = self.reqs[rid]
        before = self.swa_evicted_len.get(rid, 0)
        # before it is cleared
        swa = self.allocator.full_to_swa_index_mapping[
            torch.tensor(self.slots(rid), dtype=torch.int64)
        ].tolist()
        after = self.allocator.release_out_of_window(
            self.req_pool.req_to_token,
            r.kv.req_pool_idx,
            r.kv.kv_allocated_len,
            before,
            self.window,
        )
        self.swa_evicted_len[rid] = after
        return swa[before:after]

    def finish(self, rid) -> list[int]:
        """The request ends: the part the window released goes back on the full side only."""
        evicted = self.swa_evicted_len.pop(rid, 0)
        return release_kv_row(
            self.req_pool, self.allocator, self.reqs.pop(rid), evicted
        ).tolist()


# -- 3. the chapter's stories -----------------------------------------------------------------


def sliding_window(
    page_size: int = 2, size: int = 32, size_swa: int = 12, window: int = 4
) -> SwaScene:
    """Chapter 07: a sliding-window model's two ledgers; out-of-window SWA pages go back early."""
    al = SWATokenToKVPoolAllocator(size, size_swa, page_size, debug_mode=True)
    sc = SwaScene(ReqToTokenPool(4, 16), al, window)
    sc.snap(
        f"Two ledgers: {size // page_size} full pages, {size_swa // page_size} SWA pages (window "
        f"{window} tokens)"
    )
    out = sc.extend_batch({"A": 6, "B": 4})
    sc.snap(
        "A (6 tokens) and B (4) arrive: every token gets a full slot AND an SWA slot, paired in "
        "the map",
        new_slots=_slots(out),
    )
    for rid in ("A", "B"):
        freed = sc.release(rid)
        sc.snap(
            f"{rid}'s next token reads only the last {window}: SWA slots {freed} go back (whole "
            "pages); the full side keeps them"
            if freed
            else f"{rid}: nothing wholly outside the window yet"
        )
    for step in (1, 2, 3):
        out = sc.decode(["A", "B"])
        freed = [s for rid in ("A", "B") for s in sc.release(rid)]
        sc.snap(
            f"decode step {step}: new full slots {_slots(out)}; out of window, SWA slots {freed} "
            "released",
            new_slots=_slots(out),
        )
    slots = sc.finish("B")
    sc.snap(
        f"B finishes: SWA side first (it reads the map), then its full slots {slots}"
    )
    return sc


def mamba_slots(
    extra_buffer: bool = True, overlap: bool = True, rows: int = 3, mamba_size: int = 9
) -> list[MambaFrame]:
    """Chapter 07: a hybrid request table; each row owns a state slot and its tracking slots.
    Returns the frames (``MambaFrame``s), not a scene: the pool is driven directly."""
    pool = HybridReqToTokenPool(
        rows,
        16,
        mamba_size,
        conv_state_shape=[(8, 3)],
        temporal_state_shape=(2, 4, 4),
        mamba_layer_ids=[0],
        enable_mamba_extra_buffer=extra_buffer,
        enable_overlap_schedule=overlap,
        debug_mode=True,
    )
    reqs = {}
    frames = []

    def snap(caption, note="", hot=()):
        frame = read_mamba(caption, pool, reqs.values(), note)
        frames.append(replace(frame, hot=frozenset(hot)))

    per_row = 1 + pool.mamba_initial_tracking_slots
    snap(
        f"{mamba_size} state slots (0 is padding); each request takes {per_row}: its state"
        + (
            f" and {per_row - 1} tracking slot{'s' if per_row > 2 else ''}"
            if per_row > 1
            else ""
        )
    )
    for rid in ("A", "B"):
        r = Req(rid)
        pool.alloc([r])
        reqs[rid] = r
        pool.execute_deferred_mamba_cow_and_clear([r])  # before its first extend
        snap(
            f"{rid} arrives: row {r.kv.req_pool_idx}, state slot "
            f"{int(pool.get_mamba_indices([r.kv.req_pool_idx])[0])} (marked new, zeroed before "
            "its first extend: no stale recurrent state)"
        )
    if extra_buffer:
        row = reqs["A"].kv.req_pool_idx
        for seq in (16, 32, 48):
            dst = int(pool.track_state([row], [seq])[0])
            snap(
                f"A snapshots its state at {seq} tokens into tracking slot {dst}; the * "
                "moves to the other slot (ping-pong: the next write never hits the one "
                "still being read)",
                hot=[dst],
            )
    a = reqs.pop("A")
    row = a.kv.req_pool_idx
    pool.free_mamba_cache(a)  # the state and tracking slots (the row is freed apart)
    pool.free(a)
    snap(
        f"A finishes: its slots go back (to the tail), then row {row}; every tracking field reset"
    )
    c = Req("C")
    if pool.alloc([c]) is None:
        snap("C arrives but the state slots are short: no row is taken")
    else:
        reqs["C"] = c
        pp = pool.req_index_to_mamba_ping_pong_track_buffer_mapping[
            c.kv.req_pool_idx
        ].tolist()
        state = int(pool.get_mamba_indices([c.kv.req_pool_idx])[0])
        snap(
            f"C arrives: row {c.kv.req_pool_idx} again, but slots {[state] + pp} "
            "from the head of the free list (A's went to the tail)"
        )
    return frames


# -- 4. the drawings: inline SVG, every cell saying what it is -----------------------------------


def _swa_map(frame: SwaFrame) -> dict:
    """rid -> [(position, full slot, SWA slot or 0: released)] for every running request."""
    pairs = dict(frame.pairs)
    return {
        r.owner: [(pos, s, pairs.get(s, 0)) for pos, s in enumerate(r.slots)]
        for r in frame.full.rows
        if r.owner is not None
    }


def draw_swa(frame: SwaFrame, still: bool = False) -> str:
    """Left, the request table (full-side slots); middle and right, the two ledgers, each with
    its own slot numbers; below, the map: each position's full slot over its SWA slot (a dot:
    released); then both free lists. Inline SVG under the caption."""
    full, swa, ps = frame.full, frame.swa, frame.full.page_size
    c = Canvas("hover a cell: request, position, full slot, SWA slot")
    y = c.caption(4, 4.0, frame.caption, frame.note, 860)
    table_w = 58 + full.row_width * CELL + 90
    x_full = 4 + table_w + 12
    x_swa = x_full + 4 * (ps * CELL + 10) + 6
    rows = _swa_map(frame)
    on_swa = {m: (rid, pos) for rid, cells in rows.items() for pos, _, m in cells if m}
    bottom = draw_request_table(c, full, 4, y)
    full_title = f"full ledger ({full.num_pages} pages)"
    bottom = max(
        bottom,
        draw_slot_grid(c, full, x_full, y, 4 * (ps * CELL + 10) - 10, full_title),
    )
    swa_title = f"SWA ledger ({swa.num_pages} pages)"
    bottom = max(
        bottom,
        draw_slot_grid(
            c, swa, x_swa, y, 3 * (ps * CELL + 10) - 10, swa_title, on_swa, "swaslot"
        ),
    )
    y = bottom + 8
    c.text(
        4,
        y + 13,
        f"full_to_swa_index_mapping, window {frame.window} tokens: each position's full "
        "slot (top) and SWA slot (bottom)",
        size=12.5,
        weight="bold",
    )
    y += 28.0
    if not rows:
        c.text(4, y + 14, "(no running request)", size=11, color="#777")
        y += 24
    for rid, cells in rows.items():
        ev = frame.swa_evicted_len.get(rid, 0)
        c.text(4, y + 15, rid, size=12, weight="bold")
        c.text(4, y + 15 + CELL + 2, "swa", size=9, color="#555")
        n = len(cells)
        for pos, s, m in cells:
            x = 34 + pos * CELL
            in_window = pos >= n - frame.window
            tip = f"{rid}, position {pos} · full slot {s} (page {s // ps}) · SWA slot "
            tip += (
                f"{m} (page {m // ps})"
                if m
                else f"none: released (position < swa_evicted_len {ev})"
            )
            tip += (
                " · in the window of the next token"
                if in_window
                else " · out of the window"
            )
            new = s in full.new_slots
            c.cell(
                x,
                y,
                owner_color(rid),
                s,
                tip=tip,
                gid=f"full:{rid}:{pos}",
                stroke=HIGHLIGHT if new else "#fff",
                stroke_width=2 if new else 1,
            )
            c.cell(
                x,
                y + CELL + 2,
                owner_color(rid) if m else FREE,
                m if m else "·",
                tip=tip,
                gid=f"swa:{rid}:{pos}",
                stroke="#999" if not in_window else "#000",
            )
        c.text(
            38 + n * CELL,
            y + 15,
            f"{n} tokens, swa_evicted_len {ev}",
            size=10.5,
            color="#555",
        )
        y += 2 * CELL + 12
    for name, books in (("full", full), ("SWA", swa)):
        free = books.free_pages
        available = (len(free) + len(books.staged_pages)) * ps
        c.text(
            4,
            y + 13,
            f"{name} free_pages: {len(free)} of {books.num_pages} pages free "
            f"(available_size() = {available})",
            size=12,
            weight="bold",
        )
        y += 18
        for i, p in enumerate(free):
            c.cell(
                4 + i * CELL,
                y,
                FREE,
                p,
                tip=f"{name} free_pages[{i}] = page {p} (slots {p * ps}-{p * ps + ps - 1})",
                gid=f"{name.lower()}free:{i}",
                stroke="#999",
            )
        if not free:
            c.text(4, y + 15, "(empty)", size=11, color="#777")
        y += CELL + 8
    c.legend(
        4,
        y,
        [
            Swatch("a request's slot", owner_color("A")),
            Swatch("free, or SWA slot released", FREE),
            Swatch("padding", PADDING),
            Swatch("in the next token's window", "#fff", stroke="#000"),
            Swatch("handed out by this call", "#fff", stroke=HIGHLIGHT, stroke_width=2),
        ],
    )
    return c.html(still)


def draw_mamba(frame: MambaFrame, still: bool = False) -> str:
    """The state slots coloured by owner and role (* marks the next snapshot's), the free list
    in order, and each row's fields, as inline SVG under the caption."""
    roles = frame.slot_roles()
    tracks = max((len(r[3]) for r in frame.rows), default=0)
    c = Canvas("hover a slot: its owner and role")
    y = c.caption(4, 4.0, frame.caption, frame.note, 600)
    c.text(
        4,
        y + 13,
        f"Mamba state slots (0 is padding): {len(frame.free_slots)} free · "
        f"{tracks} tracking slot(s) per request",
        size=12.5,
        weight="bold",
    )
    y += 22
    for s in range(frame.size + 1):
        x = 4 + s * (CELL + 12)
        if s == 0:
            fill, tip, lab = PADDING, "slot 0: padding, never handed out", ""
        elif s in roles:
            owner, role = roles[s]
            fill = owner_color(owner)
            lab = role.replace("track ", "t").replace("state", "S")
            tip = f"slot {s} · {owner}'s {role.rstrip('*')}"
            if role.endswith("*"):
                tip += " · the next snapshot's target (*)"
        else:
            fill, lab = FREE, ""
            tip = f"slot {s}"
            if s in frame.free_slots:
                tip += f" · free (free list position {frame.free_slots.index(s)})"
        hot = s in frame.hot
        c.cell(
            x,
            y,
            fill,
            s,
            tip=tip,
            gid=f"mslot:{s}",
            w=CELL + 8,
            stroke=HIGHLIGHT if hot else "#999",
            stroke_width=2.5 if hot else 1,
        )
        c.text(x + (CELL + 8) / 2, y + CELL + 12, lab, size=10, anchor="middle")
    y += CELL + 24
    c.text(
        4,
        y + 13,
        "free slots: head (taken next) -> tail",
        size=12,
        weight="bold",
    )
    y += 18
    for i, s in enumerate(frame.free_slots):
        tip = f"free list position {i}: slot {s}" + (" · taken next" if i == 0 else "")
        c.cell(4 + i * CELL, y, FREE, s, tip=tip, gid=f"mfree:{i}", stroke="#999")
    if not frame.free_slots:
        c.text(4, y + 15, "(empty)", size=11, color="#777")
    y += CELL + 8
    c.text(
        4,
        y + 13,
        "rows: state slot, tracking slots (* = next), last_track_seqlen",
        size=12,
        weight="bold",
    )
    y += 18
    for row, owner, state, tr, nxt, last in frame.rows:
        text = f"row {row}: "
        if owner is None:
            text += "free"
        else:
            marked = ", ".join(
                f"{t}*" if i == nxt else str(t) for i, t in enumerate(tr)
            )
            text += f"{owner} · state {state} · tracks [{marked}] · "
            text += f"last_track_seqlen {last}"
        c.text(4, y + 13, text, size=11)
        y += 17
    c.legend(
        4,
        y + 4,
        [
            Swatch("free", FREE),
            Swatch("padding", PADDING),
            Swatch("a request's", owner_color("A")),
            Swatch("written by this call", "#fff", stroke=HIGHLIGHT, stroke_width=2),
        ],
    )
    return c.html(still)


# -- 5. the instruments: the learner's own steps on the real allocators --------------------------

SWA_STORY = (
    ("extend", dict(requests="A, B", extend_lens="6, 4")),
    ("decode", dict(decoding="A, B")),
    ("decode", dict(decoding="A, B")),
    ("decode", dict(decoding="A, B")),
    ("finish", dict(finishing="B")),
)


def _release_all(sc: SwaScene, rids, step_lines: list) -> dict:
    """The scheduler's out-of-window release for each request, recorded: rid -> SWA slots freed."""
    from memlab.course.viz.instrument import recording

    freed = {}
    with recording(sc.allocator, "release_out_of_window") as calls:
        for rid in rids:
            freed[rid] = sc.release(rid)
    for rid, c in zip(rids, calls):
        a = c["args"]
        step_lines.append(
            f"allocator.release_out_of_window(req_to_token, {a['req_pool_idx']}, {a['pre_len']}, "
            f"{a['swa_evicted_len']}, {a['sliding_window']})  # {rid} -> swa_evicted_len "
            f"{c['result']}"
        )
    return freed


def _op_swa_extend(sc: SwaScene, step, requests, extend_lens) -> None:
    from memlab.course.viz.instrument import InputError, ints, names, spell

    rids, lens = names(requests), ints(extend_lens)
    if not rids or len(rids) != len(lens):
        raise InputError(
            f"{len(rids)} requests, {len(lens)} extend_lens: give one of each per request"
        )
    if len(set(rids)) != len(rids):
        raise InputError("a request appears twice in one batch")
    step.call = spell(
        "alloc_for_extend",
        Verbatim("req_to_token_pool"),
        Verbatim("allocator"),
        reqs=Verbatim(f"[{', '.join(rids)}]"),
        extend_lens=lens,
    )
    out = sc.extend_batch(dict(zip(rids, lens)))
    if out is None:
        step.result = "None"
        al = sc.allocator
        step.refuse(
            "refused (alloc_for_extend returns None): full side "
            f"{al.full_attn_allocator.available_size()} slots free, SWA side "
            f"{al.swa_attn_allocator.available_size()}, {sc.req_pool.available_size()} row(s); "
            "nothing was taken"
        )
        return
    _release_after(sc, step, rids, out, f"extend {dict(zip(rids, lens))}")


def _op_swa_decode(sc: SwaScene, step, decoding) -> None:
    from memlab.course.viz.instrument import InputError, names

    rids = names(decoding)
    missing = [r for r in rids if r not in sc.reqs]
    if not rids or missing:
        raise InputError(
            f"not running: {missing or 'no request'}; running: {list(sc.reqs)}"
        )
    step.call = f"alloc_for_decode(req_to_token_pool, allocator, [{', '.join(rids)}])"
    out = sc.decode(rids)
    if out is None:
        step.result = "None"
        step.refuse(
            "refused (alloc_for_decode returns None): no free slot on one side; nothing was taken"
        )
        return
    _release_after(sc, step, rids, out, f"decode {rids}")


def _release_after(sc: SwaScene, step, rids, out, what: str) -> None:
    """After an allocation: release what fell out of the window, and show both calls."""
    from memlab.course.viz.instrument import spell_value

    lines = [step.call + f"  # -> {spell_value(out)}"]
    released = sum(_release_all(sc, rids, lines).values(), [])
    step.call = "\n".join(lines)
    step.result = f"full slots {out.tolist()}; SWA slots released {released}"
    step.marks = dict(new_slots=set(out.tolist()))
    step.caption = f"{what}: out of window, SWA slots {released} released"


def _op_swa_finish(sc: SwaScene, step, finishing) -> None:
    from memlab.course.viz.instrument import InputError

    if finishing not in sc.reqs:
        raise InputError(f"{finishing!r} is not running")
    ev = sc.swa_evicted_len.get(finishing, 0)
    step.call = f"release_kv_row(req_to_token_pool, allocator, {finishing}, swa_evicted_len={ev})"
    slots = sc.finish(finishing)
    step.result = (
        f"full slots {slots} back; the SWA side frees what the window still held"
    )
    step.caption = f"{finishing} finishes"


def swa_books(sc: SwaScene) -> dict:
    al = sc.allocator
    m = al.full_to_swa_index_mapping
    out = {
        "full available_size()": al.full_attn_allocator.available_size(),
        "SWA available_size()": al.swa_attn_allocator.available_size(),
        "full free_pages": al.full_attn_allocator.free_pages.tolist(),
        "SWA free_pages": al.swa_attn_allocator.free_pages.tolist(),
    }
    for rid in sc.reqs:
        slots = sc.slots(rid)
        out[f"request {rid}"] = dict(
            tokens=len(slots),
            swa_evicted_len=sc.swa_evicted_len.get(rid, 0),
            full=slots,
            swa=[int(m[s]) for s in slots],
        )
    return out


def swa_instrument(
    window: int = 4,
    page_size: int = 2,
    size: int = 32,
    size_swa: int = 12,
    opening=SWA_STORY,
):
    """Chapter 07's sliding-window instrument: extend, decode, finish on a real
    SWATokenToKVPoolAllocator; pick the window. Opens on the story's last state."""
    import ipywidgets as W

    from memlab.course.viz.instrument import Field, Instrument, Operation

    def build(window):
        # the story's pool (12 SWA slots) cannot hold its own steps under a wider
        # window: 3 windows' worth
        al = SWATokenToKVPoolAllocator(
            size, max(size_swa, 3 * window), page_size, debug_mode=True
        )
        return SwaScene(ReqToTokenPool(4, 16), al, window)

    def box(name, value, width="190px"):
        return W.Text(
            value=value,
            description=name,
            layout=W.Layout(width=width),
            style={"description_width": "initial"},
            continuous_update=False,
        )

    ops = [
        Operation(
            "extend",
            lambda sc, step, requests, extend_lens: _op_swa_extend(
                sc, step, requests, extend_lens
            ),
            [
                Field("requests", box("requests", "C")),
                Field("extend_lens", box("extend_lens", "3")),
            ],
            label="extend",
            help="alloc_for_extend, then release_out_of_window",
        ),
        Operation(
            "decode",
            lambda sc, step, decoding: _op_swa_decode(sc, step, decoding),
            [Field("decoding", box("requests", "A"))],
            label="decode step",
            help="alloc_for_decode, then release_out_of_window",
        ),
        Operation(
            "finish",
            lambda sc, step, finishing: _op_swa_finish(sc, step, finishing),
            [
                Field(
                    "finishing",
                    W.Dropdown(description="request", layout=W.Layout(width="160px")),
                    str,
                    options=lambda sc: list(sc.reqs),
                )
            ],
            label="finish",
        ),
    ]
    win = W.ToggleButtons(
        options=[1, 2, 3, 4, 6, 8],
        value=window,
        description="window",
        style={"button_width": "42px"},
    )
    return Instrument(
        build,
        ops,
        lambda sc, step: draw_swa(
            sc.books(new_slots=(step.marks if step else {}).get("new_slots", ()))
        ),
        swa_books,
        settings={"window": win},
        opening=opening,
        title="sliding window: your own steps on both ledgers",
    )


MAMBA_STORY = (
    ("arrive", dict(request="A")),
    ("arrive", dict(request="B")),
    ("track", dict(tracking="A", seq_len="16")),
    ("track", dict(tracking="A", seq_len="32")),
    ("track", dict(tracking="A", seq_len="48")),
    ("free", dict(freeing="A")),
    ("arrive", dict(request="C")),
)


class MambaWorld:
    def __init__(self, overlap: bool, rows: int = 3, mamba_size: int = 9):
        self.pool = HybridReqToTokenPool(
            rows,
            16,
            mamba_size,
            conv_state_shape=[(8, 3)],
            temporal_state_shape=(2, 4, 4),
            mamba_layer_ids=[0],
            enable_mamba_extra_buffer=True,
            enable_overlap_schedule=overlap,
            debug_mode=True,
        )
        self.reqs: dict = {}


def _op_mamba_arrive(w: MambaWorld, step, request) -> None:
    from memlab.course.viz.instrument import InputError

    if not request or not str(request).isidentifier():
        raise InputError(f"request id {request!r}: type a short name such as D")
    if request in w.reqs:
        raise InputError(f"{request!r} is running")
    r = Req(request)
    step.call = f"req_to_token_pool.alloc([{request}])"
    got = w.pool.alloc([r])
    if got is None:
        step.result = "None"
        step.refuse(
            f"refused (alloc returns None): {w.pool.available_size()} row(s), "
            f"{w.pool.mamba_allocator.available_size()} state slot(s) free, each request takes "
            f"{1 + w.pool.mamba_initial_tracking_slots}; nothing was taken"
        )
        return
    w.reqs[request] = r
    w.pool.execute_deferred_mamba_cow_and_clear([r])
    step.call += (
        f"\nreq_to_token_pool.execute_deferred_mamba_cow_and_clear([{request}])"
    )
    row = r.kv.req_pool_idx
    pp = w.pool.req_index_to_mamba_ping_pong_track_buffer_mapping[row].tolist()
    state = int(w.pool.get_mamba_indices([row])[0])
    step.result = f"row {got[0]}; state slot {state}, tracking slots {pp}"
    step.caption = f"{request} arrives: " + step.result


def _op_mamba_track(w: MambaWorld, step, tracking, seq_len) -> None:
    from memlab.course.viz.instrument import InputError, integer

    if tracking not in w.reqs:
        raise InputError(f"{tracking!r} is not running")
    n = integer(seq_len)
    row = w.reqs[tracking].kv.req_pool_idx
    step.call = f"req_to_token_pool.track_state([{row}], [{n}])"
    dst = w.pool.track_state([row], [n])
    nxt = int(w.pool.mamba_next_track_idx[row])
    step.result = f"tensor({dst.tolist()}); next_track_idx now {nxt}"
    step.marks = dict(slots={int(dst[0])})
    step.caption = (
        f"{tracking} snapshots its state at {n} tokens into slot {int(dst[0])}"
    )


def _op_mamba_free(w: MambaWorld, step, freeing) -> None:
    from memlab.course.viz.instrument import InputError

    if freeing not in w.reqs:
        raise InputError(f"{freeing!r} is not running")
    r = w.reqs.pop(freeing)
    row = r.kv.req_pool_idx
    step.call = f"req_to_token_pool.free_mamba_cache({freeing})\nreq_to_token_pool.free({freeing})"
    w.pool.free_mamba_cache(r)
    w.pool.free(r)
    step.result = f"its slots to the tail of the free list, then row {row}"
    step.caption = f"{freeing} finishes"


def mamba_books(w: MambaWorld) -> dict:
    p = w.pool
    out = {
        "free state slots": p.mamba_allocator.free_slots.tolist(),
        "free rows": p.available_size(),
        "ping-pong slots per request": p.mamba_ping_pong_track_buffer_size,
    }
    for rid, r in w.reqs.items():
        row = r.kv.req_pool_idx
        out[f"request {rid}"] = dict(
            row=row,
            state=int(p.req_index_to_mamba_index_mapping[row]),
            tracks=p.req_index_to_mamba_ping_pong_track_buffer_mapping[row].tolist(),
            next_track_idx=int(p.mamba_next_track_idx[row]),
            last_track_seqlen=int(p.mamba_last_track_seqlen[row]),
        )
    return out


def mamba_instrument(overlap: bool = True, opening=MAMBA_STORY):
    """Chapter 07's Mamba instrument: arrive, track_state, free on a real HybridReqToTokenPool
    with the extra buffer; the overlap scheduler on (2 ping-pong slots) or off (1)."""
    import ipywidgets as W

    from memlab.course.viz.instrument import Field, Instrument, Operation

    def running(w):
        return list(w.reqs)

    def dd():
        return W.Dropdown(description="request", layout=W.Layout(width="160px"))

    ops = [
        Operation(
            "arrive",
            lambda w, step, request: _op_mamba_arrive(w, step, request),
            [
                Field(
                    "request",
                    W.Text(
                        value="D",
                        description="request",
                        layout=W.Layout(width="150px"),
                        continuous_update=False,
                    ),
                )
            ],
            label="alloc",
        ),
        Operation(
            "track",
            lambda w, step, tracking, seq_len: _op_mamba_track(
                w, step, tracking, seq_len
            ),
            [
                Field("tracking", dd(), str, options=running),
                Field(
                    "seq_len",
                    W.Text(
                        value="64",
                        description="seq_len",
                        layout=W.Layout(width="150px"),
                        continuous_update=False,
                    ),
                ),
            ],
            label="track_state",
        ),
        Operation(
            "free",
            lambda w, step, freeing: _op_mamba_free(w, step, freeing),
            [Field("freeing", dd(), str, options=running)],
            label="free",
            help="free_mamba_cache, then free (the row)",
        ),
    ]
    ov = W.ToggleButtons(
        options=["on", "off"],
        value="on" if overlap else "off",
        description="overlap",
        style={"button_width": "42px"},
    )
    return Instrument(
        lambda overlap: MambaWorld(overlap == "on"),
        ops,
        lambda w, step: draw_mamba(
            replace(
                read_mamba("", w.pool, w.reqs.values()),
                hot=frozenset((step.marks if step else {}).get("slots", ())),
            )
        ),
        mamba_books,
        settings={"overlap": ov},
        opening=opening,
        title="Mamba slots: your own requests",
    )
