"""Pictures of the SGLang-side books: the request table, the slot/page grid, the free list, the
KV buffers. Each ``draw_*`` takes an axes and a ``Books`` and draws cells that carry a gid
(``row:R:P``, ``slot:S``, ``free:I``, ``buf:NAME:S``); ``draw_books`` puts panels side by side.
"""

from __future__ import annotations

from matplotlib.patches import Rectangle

from memlab.viz.state import Books
from memlab.viz.style import (FREE, HIGHLIGHT, PADDING, PART_HATCH, STAGED, caption_text, grid_axes, new_figure,
                              owner_color, text_color)


def cell(ax, x, y, fill, label="", gid=None, w=1.0, h=1.0, edge="white", lw=1.0, alpha=1.0, fontsize=7,
         hatch=None):
    """One labelled box with its top-left corner at (x, y)."""
    r = Rectangle((x, y), w, h, facecolor=fill, edgecolor=edge, linewidth=lw, alpha=alpha, hatch=hatch)
    if hatch:
        r.set_hatch_linewidth(0.6) if hasattr(r, "set_hatch_linewidth") else None
    r.set_gid(gid)
    ax.add_patch(r)
    if label != "":
        t = ax.text(x + w / 2, y + h / 2, str(label), ha="center", va="center", fontsize=fontsize,
                    color=text_color(fill) if alpha > 0.5 else "black")
        t.set_gid(None if gid is None else f"label:{gid}")
    return r


def _frame(ax, width, height, pad=0.3):
    ax.set_xlim(-pad, width + pad)
    ax.set_ylim(height + pad, -pad - 0.6)


def draw_request_table(ax, books: Books, max_cols: int | None = None, show_generation: bool = True) -> None:
    """req_to_token as a grid: a row per request-table row, the slot id of each position in it."""
    cols = min(books.row_width, max_cols or books.row_width)
    grid_axes(ax, "request table  req_to_token[row, pos] = slot")
    released = books.released_slots
    x0 = 1.6
    for r in books.rows:
        y = r.row
        free = r.row in set(books.free_rows)
        name = "pad" if r.row == 0 else f"row {r.row}"
        ax.text(x0 - 0.15, y + 0.5, name, ha="right", va="center", fontsize=7)
        for pos in range(cols):
            if r.row == 0:
                fill, label = PADDING, ""
            elif r.owner is not None and pos < len(r.slots):
                fill, label = owner_color(r.owner), r.slots[pos]
            else:
                fill, label = FREE, ""
            edge = HIGHLIGHT if label != "" and label in books.new_slots else "white"
            cell(ax, x0 + pos, y, fill, label, gid=f"row:{r.row}:{pos}", edge=edge, lw=1.5 if edge == HIGHLIGHT else 1,
                 alpha=0.3 if label in released else 1.0)
        tag = r.owner if r.owner is not None else ("free" if free else "")
        right = f"{tag}" + (f"  gen {r.generation}" if show_generation and r.row else "")
        ax.text(x0 + cols + 0.2, y + 0.5, right, ha="left", va="center", fontsize=7)
    for pos in range(cols):
        ax.text(x0 + pos + 0.5, -0.25, str(pos), ha="center", va="bottom", fontsize=6, color="#666")
    _frame(ax, x0 + cols + 3.2, len(books.rows))


def _page_layout(books: Books, pages_per_line: int | None):
    ps = books.page_size
    if pages_per_line is None:
        pages_per_line = min(books.num_pages + 1, 20) if ps == 1 else (max(1, 16 // ps) if ps < 16 else 1)
    return ps, pages_per_line, (0.4 if ps > 1 else 0.0)


def draw_slot_grid(ax, books: Books, pages_per_line: int | None = None, title: str | None = None) -> None:
    """Physical slots grouped by page: owner colours, pale for a held page's unused tail."""
    ps, ppl, gap = _page_layout(books, pages_per_line)
    title = title or (f"KV slots, {ps} per page (slot = page * {ps} + offset)" if ps > 1 else "KV slots")
    if books.part_of:
        title += "\n/// part 1 · plain: part 2 · ... part 3"
    grid_axes(ax, title)
    slot_owner = books.slot_owner
    page_owner = books.page_owner
    staged, free = set(books.staged_pages), set(books.free_pages)
    lines = (books.num_pages + 1 + ppl - 1) // ppl
    for page in range(books.num_pages + 1):
        line, col = divmod(page, ppl)
        x = col * (ps + gap)
        y = line * 1.5
        if ps > 1:
            ax.text(x + ps / 2, y - 0.05, f"page {page}", ha="center", va="bottom", fontsize=6, color="#666")
        for off in range(ps):
            s = page * ps + off
            alpha, hatch = 1.0, None
            if page == 0:
                fill = PADDING
            elif page in staged:
                fill = STAGED
            elif page in free:
                fill = FREE
            elif s in slot_owner:
                fill = owner_color(slot_owner[s])
                hatch = PART_HATCH.get(books.part_of.get(s))
            elif page in page_owner:  # the unused tail of a page some request holds
                fill, alpha = owner_color(page_owner[page]), 0.3
            else:
                fill = FREE
            new = s in books.new_slots
            cell(ax, x + off, y, fill, s, gid=f"slot:{s}", alpha=alpha, hatch=hatch,
                 edge=HIGHLIGHT if new else "white", lw=1.5 if new else 1.0)
    width = ppl * (ps + gap) - gap if books.num_pages + 1 >= ppl else (books.num_pages + 1) * (ps + gap) - gap
    _frame(ax, width, lines * 1.5 - 0.5)


def draw_free_list(ax, books: Books, title: str | None = None, max_items: int = 24) -> None:
    """The free list head first, then what is staged (released but not merged yet)."""
    unit = "slots" if books.page_size == 1 else "pages"
    grid_axes(ax, title or f"free {unit}: head (taken next) -> tail")
    items = [(p, FREE, "free") for p in books.free_pages] + [(p, STAGED, "staged") for p in books.staged_pages]
    shown = items[:max_items]
    for i, (p, fill, kind) in enumerate(shown):
        cell(ax, i, 0, fill, p, gid=f"free:{i}:{kind}", edge="#999")
    if len(items) > max_items:
        ax.text(max_items + 0.2, 0.5, f"... {len(items) - max_items} more", va="center", fontsize=7)
    if not items:
        ax.text(0, 0.5, "(empty)", va="center", fontsize=8)
    if books.staged_pages:
        ax.text(len(books.free_pages) + 0.1, 1.35, "staged ->", fontsize=7, color="#996600")
    _frame(ax, max(len(shown), 1) + (3 if len(items) > max_items else 0), 1.6)


def draw_row_list(ax, books: Books) -> None:
    """ReqToTokenPool.free_slots: alloc_rows takes from the tail, free appends to the tail."""
    grid_axes(ax, "free rows (alloc takes the tail)")
    for i, row in enumerate(books.free_rows):
        cell(ax, i, 0, FREE, row, gid=f"freerow:{i}", edge="#999")
    if not books.free_rows:
        ax.text(0, 0.5, "(no free row)", va="center", fontsize=8)
    _frame(ax, max(len(books.free_rows), 1), 1)


def draw_buffers(ax, books: Books, slot: int | None = None) -> None:
    """Every layer's KV tensor as a strip of slot rows, coloured by owner; one slot traced to bytes."""
    grid_axes(ax, "KV buffers: slot s is row s of every layer's tensor")
    slot_owner = books.slot_owner
    n = books.num_slots
    x0 = 3.2
    for j, b in enumerate(books.buffers):
        ax.text(x0 - 0.2, j + 0.5, b.name, ha="right", va="center", fontsize=7)
        for s in range(n):
            fill = PADDING if s < books.page_size else owner_color(slot_owner.get(s))
            mark = s == slot
            cell(ax, x0 + s, j, fill, gid=f"buf:{b.name}:{s}", edge=HIGHLIGHT if mark else "white",
                 lw=1.5 if mark else 0.3)
    for s in range(0, n, max(1, books.page_size)):
        ax.text(x0 + s + 0.5, -0.15, str(s), ha="center", va="bottom", fontsize=6, color="#666")
    if slot is not None and books.buffers:
        b = books.buffers[0]
        ax.text(x0 + n + 0.5, len(books.buffers) / 2, f"slot {slot} -> bytes\n[{slot * b.row_bytes}, "
                f"{(slot + 1) * b.row_bytes})\nof each tensor\n({b.row_bytes} B a row,\nshape {b.shape})",
                fontsize=7, va="center")
    _frame(ax, x0 + n + (9 if slot is not None else 0), max(len(books.buffers), 1))


PANELS = {"table": draw_request_table, "slots": draw_slot_grid, "free": draw_free_list,
          "rows": draw_row_list, "buffers": draw_buffers}


def draw_books(books: Books, panels=("table", "slots", "free"), width: float = 11.0, height: float = 3.6,
               slot: int | None = None):
    """Panels side by side (``table``, ``slots``, ``buffers`` in a row; ``free``/``rows`` strips below)."""
    top = [p for p in panels if p in ("table", "slots")]
    strips = [p for p in panels if p in ("free", "rows", "buffers")]
    unknown = [p for p in panels if p not in PANELS]
    if unknown:
        raise ValueError(f"unknown panel {unknown[0]!r}; known: {sorted(PANELS)}")
    extra = sum(0.35 * max(len(books.buffers), 2) if p == "buffers" else 0.7 for p in strips)
    if top == ["table"]:
        width = min(width, 2.5 + 0.45 * books.row_width)
    fig, _ = new_figure(width, height * bool(top) + extra, ncols=1)
    fig.clear()
    tall = {"free": 1, "rows": 1, "buffers": 0.4 * max(len(books.buffers), 2)}
    ratios = [4] * bool(top) + [tall[p] for p in strips]
    sub = fig.subfigures(len(ratios), 1, height_ratios=ratios, squeeze=False)[:, 0]
    i = 0
    if top:
        widths = {"table": books.row_width + 5, "slots": 17.5}
        axes = sub[0].subplots(1, len(top), width_ratios=[widths[p] for p in top], squeeze=False)[0]
        for ax, p in zip(axes, top):
            PANELS[p](ax, books)
        i = 1
    for p in strips:
        ax = sub[i].subplots()
        draw_buffers(ax, books, slot) if p == "buffers" else PANELS[p](ax, books)
        i += 1
    fig.suptitle(caption_text(books.caption, books.note, fig), fontsize=10, x=0.01, ha="left")
    return fig
