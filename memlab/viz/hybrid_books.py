"""Pictures of the hybrid books (chapter 07): an SWA model's two ledgers with the map between
them, and a Mamba layer's per-request state slots with their ping-pong tracking slots."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memlab.viz.draw import cell, draw_request_table, draw_slot_grid
from memlab.viz.scene import Scene
from memlab.viz.state import Books, RowView, read_books
from memlab.viz.style import FREE, HIGHLIGHT, PADDING, caption_text, grid_axes, new_figure, owner_color


@dataclass(frozen=True)
class SwaFrame:
    caption: str
    full: Books  # the request table and the full-attention ledger
    swa: Books  # the sliding-window ledger, its slots owned through the map
    pairs: tuple  # (full slot, swa slot) for every mapped held slot
    window: int
    note: str = ""


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
                    free_pages=tuple(sw.free_pages.tolist()), staged_pages=tuple(sw.release_pages.tolist()),
                    new_slots=frozenset(new_swa))
        return SwaFrame(caption, full, swa, tuple(pairs), self.window, note)

    def release(self, rid: str) -> list[int]:
        """SWA pages wholly before the request's window go back; the full side keeps its slots."""
        r = self.reqs[rid]
        before = self.swa_evicted_len.get(rid, 0)
        swa = self.allocator.full_to_swa_index_mapping[torch.tensor(self.slots(rid))].tolist()  # before it is cleared
        after = self.allocator.release_out_of_window(self.req_pool.req_to_token, r.req_pool_idx, r.kv_allocated_len,
                                                     before, self.window)
        self.swa_evicted_len[rid] = after
        return swa[before:after]

    def finish(self, rid) -> list[int]:
        self.swa_evicted_len.pop(rid, None)
        return super().finish(rid)


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
    owners = {r.req_pool_idx: str(r.rid) for r in reqs if r.req_pool_idx is not None}
    pp = pool.req_index_to_mamba_ping_pong_track_buffer_mapping
    rows = tuple((row, owners.get(row), int(pool.req_index_to_mamba_index_mapping[row]),
                  tuple(pp[row].tolist()), int(pool.mamba_next_track_idx[row]),
                  int(pool.mamba_last_track_seqlen[row])) for row in range(1, pool.size + 1))
    return MambaFrame(caption, pool.mamba_pool.size, tuple(pool.mamba_pool.allocator.free_slots.tolist()), rows, note)


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


def mamba_track(pool, reqs, rid_rows, seq_lens) -> torch.Tensor:
    """Snapshot the rows' states into their next tracking slots (``HybridReqToTokenPool.track_state``)."""
    return pool.track_state(rid_rows, seq_lens)
