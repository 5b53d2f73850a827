"""The hybrid books (chapter 07): a sliding-window model's two ledgers (full and SWA) with the map
between them, and a Mamba layer's per-request state slots with their ping-pong tracking slots.

The same four parts as every side of memlab.course.viz (see ``sglang_books``): the snapshots
(``SwaFrame``, ``MambaFrame`` and ``read_mamba``), the scene (``SwaScene``, a ``Scene`` over an
``SWATokenToKVPoolAllocator`` that also releases out-of-window pages), the chapter's stories
(``sliding_window``, ``mamba_slots``) and the drawings (``draw_swa``, ``draw_mamba``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memlab.sglang.allocation import release_kv_row
from memlab.sglang.mamba import HybridReqToTokenPool
from memlab.sglang.swa import SWATokenToKVPoolAllocator
from memlab.sglang.req_to_token import Req, ReqToTokenPool
from memlab.course.viz.sglang_books import (Books, RowView, Scene, _slots, draw_request_table, draw_slot_grid,
                                     read_books)
from memlab.course.viz.style import FREE, HIGHLIGHT, PADDING, caption_text, cell, grid_axes, new_figure, owner_color


# -- 1. the snapshots -------------------------------------------------------------------------

@dataclass(frozen=True)
class SwaFrame:
    caption: str
    full: Books  # the request table and the full-attention ledger
    swa: Books  # the sliding-window ledger, its slots owned through the map
    pairs: tuple  # (full slot, swa slot) for every mapped held slot
    window: int
    note: str = ""


@dataclass(frozen=True)
class MambaFrame:
    caption: str
    size: int  # state slots 1..size; 0 is padding
    free_slots: tuple
    rows: tuple  # (row, owner, state slot, tracking slots tuple, next_track_idx, last_track_seqlen)
    note: str = ""

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
    owners = {r.kv.req_pool_idx: str(r.rid) for r in reqs if r.kv.req_pool_idx is not None}
    pp = pool.req_index_to_mamba_ping_pong_track_buffer_mapping
    rows = tuple((row, owners.get(row), int(pool.req_index_to_mamba_index_mapping[row]),
                  tuple(pp[row].tolist()), int(pool.mamba_next_track_idx[row]),
                  int(pool.mamba_last_track_seqlen[row])) for row in range(1, pool.size + 1))
    return MambaFrame(caption, pool.mamba_pool.size, tuple(pool.mamba_allocator.free_slots.tolist()), rows, note)


# -- 2. the scene -----------------------------------------------------------------------------

class SwaScene(Scene):
    """A Scene over an ``SWATokenToKVPoolAllocator``; it also releases out-of-window pages."""

    def __init__(self, req_pool, allocator, window: int):
        super().__init__(req_pool, allocator)
        self.window = window
        self.swa_evicted_len: dict[str, int] = {}

    def books(self, caption: str = "", new_slots=(), part_of=None, note: str = "") -> SwaFrame:
        al = self.allocator
        full = read_books(caption, self.req_pool, al.full_attn_allocator, self.reqs.values(), new_slots)
        mapping = al.full_to_swa_index_mapping
        rows, pairs = [], []
        for r in full.rows:
            if r.owner is None:
                rows.append(r)
                continue
            swa = [int(mapping[s]) for s in r.slots]
            pairs += [(s, m) for s, m in zip(r.slots, swa) if m > 0]
            rows.append(RowView(r.row, r.owner, tuple(m for m in swa if m > 0), r.generation))
        sw = al.swa_attn_allocator
        new_swa = {int(mapping[s]) for s in new_slots if int(mapping[s]) > 0}
        swa = Books(caption, sw.page_size, sw.num_pages, full.row_width, tuple(rows),
                    free_pages=tuple(sw.free_pages.tolist()), staged_pages=tuple(sw.get_all_free_pages()[len(sw.free_pages):].tolist()),
                    new_slots=frozenset(new_swa))
        return SwaFrame(caption, full, swa, tuple(pairs), self.window, note)

    def release(self, rid: str) -> list[int]:
        """SWA pages wholly before the request's window go back; the full side keeps its slots."""
        r = self.reqs[rid]
        before = self.swa_evicted_len.get(rid, 0)
        swa = self.allocator.full_to_swa_index_mapping[torch.tensor(self.slots(rid))].tolist()  # before it is cleared
        after = self.allocator.release_out_of_window(self.req_pool.req_to_token, r.kv.req_pool_idx, r.kv.kv_allocated_len,
                                                     before, self.window)
        self.swa_evicted_len[rid] = after
        return swa[before:after]

    def finish(self, rid) -> list[int]:
        """The request ends: the part the window released goes back on the full side only."""
        evicted = self.swa_evicted_len.pop(rid, 0)
        return release_kv_row(self.req_pool, self.allocator, self.reqs.pop(rid), evicted).tolist()


# -- 3. the chapter's stories -----------------------------------------------------------------

def sliding_window(page_size: int = 2, size: int = 32, size_swa: int = 12, window: int = 4) -> SwaScene:
    """Chapter 07: a sliding-window model's two ledgers; out-of-window SWA pages go back early."""
    al = SWATokenToKVPoolAllocator(size, size_swa, page_size, debug_mode=True)
    sc = SwaScene(ReqToTokenPool(4, 16), al, window)
    sc.snap(f"Two ledgers: {size // page_size} full pages, {size_swa // page_size} SWA pages (window {window} tokens)")
    out = sc.extend_batch({"A": 6, "B": 4})
    sc.snap("A (6 tokens) and B (4) arrive: every token gets a full slot AND an SWA slot, paired in the map",
            new_slots=_slots(out))
    for rid in ("A", "B"):
        freed = sc.release(rid)
        sc.snap(f"{rid}'s next token reads only the last {window}: SWA slots {freed} go back (whole pages); "
                "the full side keeps them" if freed else f"{rid}: nothing wholly outside the window yet")
    for step in (1, 2, 3):
        out = sc.decode(["A", "B"])
        freed = [s for rid in ("A", "B") for s in sc.release(rid)]
        sc.snap(f"decode step {step}: new full slots {_slots(out)}; out of window, SWA slots {freed} released",
                new_slots=_slots(out))
    slots = sc.finish("B")
    sc.snap(f"B finishes: SWA side first (it reads the map), then its full slots {slots}")
    return sc


def mamba_slots(extra_buffer: bool = True, overlap: bool = True, rows: int = 3,
                mamba_size: int = 9) -> list[MambaFrame]:
    """Chapter 07: a hybrid request table; each row owns a state slot and its tracking slots.
    Returns the frames (``MambaFrame``s), not a scene: the pool is driven directly."""
    pool = HybridReqToTokenPool(rows, 16, mamba_size, conv_state_shape=[(8, 3)], temporal_state_shape=(2, 4, 4),
                                mamba_layer_ids=[0], enable_mamba_extra_buffer=extra_buffer,
                                enable_overlap_schedule=overlap, debug_mode=True)
    reqs = {}
    frames = []

    def snap(caption, note=""):
        frames.append(read_mamba(caption, pool, reqs.values(), note))

    per_row = 1 + pool.mamba_initial_tracking_slots
    snap(f"{mamba_size} state slots (0 is padding); each request takes {per_row}: its state"
         + (f" and {per_row - 1} tracking slot{'s' if per_row > 2 else ''}" if per_row > 1 else ""))
    for rid in ("A", "B"):
        r = Req(rid)
        pool.alloc([r])
        reqs[rid] = r
        pool.execute_deferred_mamba_cow_and_clear([r])  # before its first extend
        snap(f"{rid} arrives: row {r.kv.req_pool_idx}, state slot {int(pool.get_mamba_indices([r.kv.req_pool_idx])[0])} "
             "(marked new, zeroed before its first extend: no stale recurrent state)")
    if extra_buffer:
        row = reqs["A"].kv.req_pool_idx
        for seq in (16, 32, 48):
            dst = int(pool.track_state([row], [seq])[0])
            snap(f"A snapshots its state at {seq} tokens into tracking slot {dst}; the * moves to the other "
                 "slot (ping-pong: the next write never hits the one still being read)")
    a = reqs.pop("A")
    row = a.kv.req_pool_idx
    pool.free_mamba_cache(a)  # the state and tracking slots (the row is freed apart)
    pool.free(a)
    snap(f"A finishes: its slots go back (to the tail), then row {row}; every tracking field reset")
    c = Req("C")
    if pool.alloc([c]) is None:
        snap("C arrives but the state slots are short: no row is taken")
    else:
        reqs["C"] = c
        pp = pool.req_index_to_mamba_ping_pong_track_buffer_mapping[c.kv.req_pool_idx].tolist()
        state = int(pool.get_mamba_indices([c.kv.req_pool_idx])[0])
        snap(f"C arrives: row {c.kv.req_pool_idx} again, but slots {[state] + pp} "
             "from the head of the free list (A's went to the tail)")
    return frames


# -- 4. the drawings --------------------------------------------------------------------------

def draw_swa(frame: SwaFrame, width: float = 11.5):
    """Request table (full-side slots), the full ledger, the SWA ledger, and the full -> SWA map."""
    fig = new_figure(width, 4.6)[0]
    fig.clear()
    top, bottom = fig.subfigures(2, 1, height_ratios=[4, 1])
    a1, a2, a3 = top.subplots(1, 3, width_ratios=[frame.full.row_width + 5, 12, 9])
    draw_request_table(a1, frame.full, show_generation=False)
    draw_slot_grid(a2, frame.full, pages_per_line=4, title=f"full-attention ledger ({frame.full.num_pages} pages)")
    draw_slot_grid(a3, frame.swa, pages_per_line=3, title=f"sliding-window ledger ({frame.swa.num_pages} pages)")
    ax = bottom.subplots()
    grid_axes(ax, f"full_to_swa_index_mapping (window {frame.window} tokens): full slot -> SWA slot")
    owner = frame.full.slot_owner
    for i, (f, s) in enumerate(frame.pairs[:20]):
        cell(ax, i * 1.3, 0, owner_color(owner.get(f)), f"{f}\n{s}", gid=f"pair:{f}:{s}", w=1.1, fontsize=6)
    if not frame.pairs:
        ax.text(0, 0.5, "(no mapped slot)", fontsize=8, va="center")
    ax.set_xlim(-0.2, 26)
    ax.set_ylim(1.2, -0.5)
    fig.suptitle(caption_text(frame.caption, frame.note, fig), fontsize=10, x=0.01, ha="left")
    return fig


def draw_mamba(frame: MambaFrame, width: float = 10.0):
    """The state slots coloured by owner and role, the free slots in order, and the rows' fields."""
    fig, (ax, fx, tx) = new_figure(width, 3.6, nrows=3, height_ratios=[1.3, 0.8, 1.6])
    grid_axes(ax, "mamba state slots (conv + temporal state per layer, one set per slot)")
    roles = frame.slot_roles()
    for s in range(frame.size + 1):
        if s == 0:
            fill, label = PADDING, "0\npad"
        elif s in roles:
            owner, role = roles[s]
            fill, label = owner_color(owner), f"{s}\n{role}"
        else:
            fill, label = FREE, str(s)
        star = s in roles and roles[s][1].endswith("*")
        cell(ax, s * 1.15, 0, fill, label, gid=f"mslot:{s}", fontsize=6, edge=HIGHLIGHT if star else "white",
             lw=1.5 if star else 1)
    ax.set_xlim(-0.2, (frame.size + 1) * 1.15)
    ax.set_ylim(1.2, -0.6)
    grid_axes(fx, "free slots: head (taken next) -> tail")
    for i, s in enumerate(frame.free_slots):
        cell(fx, i, 0, FREE, s, gid=f"mfree:{i}", edge="#999")
    fx.set_xlim(-0.2, max(frame.size, 8))
    fx.set_ylim(1.2, -0.6)
    tx.set_axis_off()
    head = f"{'row':>4} {'owner':>6} {'state':>6} {'tracking':>10} {'next':>5} {'last snapshot at':>17}"
    lines = [head] + [f"{row:>4} {owner or '-':>6} {state:>6} {str(list(tr)):>10} {nxt:>5} {last:>17}"
                      for row, owner, state, tr, nxt, last in frame.rows]
    tx.text(0, 1, "\n".join(lines), family="monospace", fontsize=7, va="top")
    fig.suptitle(caption_text(frame.caption, frame.note, fig), fontsize=10, x=0.01, ha="left")
    return fig
