"""Chapter 10's live view: the capstone engine's pool, page by page, and its occupancy over the
steps so far. ``engine_frames`` runs a real ``memlab.capstone.engine.Engine`` and snapshots it per
step."""

from __future__ import annotations

from dataclasses import dataclass

from memlab.common.utils import ceil_div
from memlab.course.viz.style import (
    FREE,
    PADDING,
    PALETTE,
    caption_text,
    cell,
    grid_axes,
    new_figure,
    owner_color,
)

CACHED = "#e8dcc0"  # a cached page (evictable when nobody maps it)


def rid_name(rid) -> str:
    return chr(ord("A") + rid % 26) if isinstance(rid, int) else str(rid)


@dataclass(frozen=True)
class EngineFrame:
    caption: str
    step: int
    num_pages: int
    page_owner: dict  # page -> request name, for pages a running request owns
    shared: dict  # cached page -> number of running requests mapping it (prefix hits)
    cached: frozenset  # every cached page (mapped or not)
    history: tuple  # per step so far: (running, waiting, owned, cached, free) pages


def read_engine(engine, caption: str, step: int, history: list) -> EngineFrame:
    """The engine's pages now; appends this step's (running, waiting, owned, cached, free) pages
    to ``history``."""
    owned, cached, shared = engine.page_books()  # the books engine.check_books audits
    free = len(engine.allocator.get_all_free_pages())
    num_pages = engine.allocator.num_pages
    history.append(
        (
            len(engine.running),
            len(engine.waiting),
            num_pages - free - len(cached),
            len(cached),
            free,
        )
    )
    owner = {page: rid_name(rid) for page, rid in owned.items()}
    return EngineFrame(
        caption, step, num_pages, owner, shared, frozenset(cached), tuple(history)
    )


def engine_frames(engine, prompts, max_new_tokens: int) -> list[EngineFrame]:
    """Add the prompts, step the engine to the end, one frame per step (the first: before any)."""
    for p in prompts:
        engine.add_request(p, max_new_tokens)
    history = []

    def snap(caption, step):
        return read_engine(engine, caption, step, history)

    frames = [
        snap(
            f"{len(prompts)} requests waiting; {engine.allocator.num_pages} pages of "
            f"{engine.page_size}",
            0,
        )
    ]
    step = 0
    while True:
        before = dict(engine.stats)
        if not engine.step():
            break
        step += 1
        pre = engine.stats["prefill_tokens"] - before.get("prefill_tokens", 0)
        dec = engine.stats["decode_tokens"] - before.get("decode_tokens", 0)
        ret = engine.stats["retracted"] - before.get("retracted", 0)
        kind = (
            f"prefill batch of {pre} tokens"
            if pre
            else f"decode batch of {dec} requests"
        )
        extra = f", {ret} retracted" if ret else ""
        frames.append(
            snap(
                f"step {step}: {kind}{extra}; {len(engine.running)} running, "
                f"{len(engine.waiting)} waiting",
                step,
            )
        )
    return frames


def draw_engine(frame: EngineFrame, width: float = 11.0):
    """Left: every page (owner colour, cached teal, hatched when a running request maps a cached
    page). Right: running requests and the pool's pages over the steps so far."""
    fig, (grid, plot) = new_figure(width, 3.4, ncols=2, width_ratios=[1, 1.2])
    grid_axes(grid, "the pool's pages")
    per_line = 16
    for p in range(frame.num_pages + 1):
        y, x = divmod(p, per_line)
        if p == 0:
            fill, label = PADDING, ""
        elif p in frame.page_owner:
            fill, label = owner_color(frame.page_owner[p]), frame.page_owner[p]
        elif p in frame.cached:
            fill, label = CACHED, (f"x{frame.shared[p]}" if p in frame.shared else "")
        else:
            fill, label = FREE, ""
        cell(
            grid,
            x,
            y,
            fill,
            label,
            gid=f"page:{p}",
            hatch="///" if p in frame.shared else None,
            fontsize=8.5,
        )
    lines = ceil_div(frame.num_pages + 1, per_line)
    grid.set_xlim(-0.2, per_line + 0.2)
    grid.set_ylim(lines + 0.2, -0.5)
    h = frame.history
    steps = range(len(h))
    plot.stackplot(
        steps,
        [x[2] for x in h],
        [x[3] for x in h],
        [x[4] for x in h],
        colors=[PALETTE[0], CACHED, FREE],
        labels=["owned", "cached", "free"],
    )
    plot.set_xlim(0, max(len(h) - 1, 1))
    plot.set_ylim(0, frame.num_pages)
    plot.set_xlabel("step")
    plot.set_ylabel("pages")
    twin = plot.twinx()
    twin.step(
        steps, [x[0] for x in h], where="post", color="black", lw=1, label="running"
    )
    twin.step(
        steps, [x[1] for x in h], where="post", color="#e15759", lw=1, label="waiting"
    )
    twin.set_ylim(0, max(max(x[0] + x[1] for x in h), 1) + 1)
    twin.set_ylabel("requests")
    plot.legend(loc="upper left", fontsize=8.5)
    twin.legend(loc="upper right", fontsize=8.5)
    fig.suptitle(caption_text(frame.caption, fig=fig), fontsize=10, x=0.01, ha="left")
    return fig
