"""Colours shared by every picture, and the matplotlib plumbing of the charts.

Owners (requests) keep one colour across every picture of the course: "A" is always the same
blue. The books are drawn as SVG (``memlab.course.viz.svg``); matplotlib draws the charts
(plots of numbers: chapter 02's bytes, 08's sizing, 10's engine and policies), whose cells and
bars carry a ``gid`` such as ``"page:3"`` so tests can find them without looking at pixels.
"""

from __future__ import annotations

import base64
import io
import zlib

from matplotlib.colors import to_hex, to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#9c755f",
    "#ff9da7",
    "#86bcb6",
)
FREE = "#eeeeee"  # a free slot, page or row
PADDING = "#555555"  # slot 0 / page 0 / row 0: never handed out
STAGED = "#fff2b3"  # freed but staged (need_sort) or queued in a free group
NULL = "#bbbbbb"  # vLLM's null block
EDGE = "#ffffff"
HIGHLIGHT = "#000000"  # the edge of what changed in this step


def owner_color(owner) -> str:
    """The colour of an owner: A, B, C ... in palette order; other names by a stable hash."""
    if owner is None:
        return FREE
    name = str(owner)
    if len(name) == 1 and "A" <= name <= "Z":
        return PALETTE[(ord(name) - ord("A")) % len(PALETTE)]
    return PALETTE[zlib.crc32(name.encode()) % len(PALETTE)]


def text_color(fill: str) -> str:
    """Black or white text, whichever reads better on ``fill``."""
    r, g, b, _ = to_rgba(fill)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def same_color(a, b) -> bool:
    return to_hex(a, keep_alpha=False) == to_hex(b, keep_alpha=False)


def new_figure(width: float, height: float, ncols: int = 1, nrows: int = 1, **kw):
    """A figure outside pyplot: nothing global to leak, nothing shown twice by the inline
    backend."""
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=True, **kw)
    return fig, axes


def grid_axes(ax, title: str | None = None) -> None:
    """An axes for cell drawings: no ticks, y growing downwards, equal aspect."""
    ax.set_axis_off()
    ax.set_aspect("equal")
    ax.invert_yaxis()
    if title:
        ax.set_title(title, fontsize=10, loc="left")


def cell(
    ax,
    x,
    y,
    fill,
    label="",
    gid=None,
    w=1.0,
    h=1.0,
    edge="white",
    lw=1.0,
    alpha=1.0,
    fontsize=8.5,
    hatch=None,
):
    """One labelled box of a chart with its top-left corner at (x, y); ``gid`` names it for the
    tests."""
    r = Rectangle(
        (x, y),
        w,
        h,
        facecolor=fill,
        edgecolor=edge,
        linewidth=lw,
        alpha=alpha,
        hatch=hatch,
    )
    if hatch:
        r.set_hatch_linewidth(0.6) if hasattr(r, "set_hatch_linewidth") else None
    r.set_gid(gid)
    ax.add_patch(r)
    if label != "":
        t = ax.text(
            x + w / 2,
            y + h / 2,
            str(label),
            ha="center",
            va="center",
            fontsize=fontsize,
            color=text_color(fill) if alpha > 0.5 else "black",
        )
        t.set_gid(None if gid is None else f"label:{gid}")
        if hatch:  # a halo keeps the label readable over the hatching
            from matplotlib import patheffects

            ink = t.get_color()
            halo = "white" if same_color(ink, "black") else "black"
            t.set_path_effects([patheffects.withStroke(linewidth=2.2, foreground=halo)])
    return r


def figure_png(fig, dpi: int = 90) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def figure_html(fig, dpi: int = 90) -> str:
    """The figure as an inline <img> (works in ipywidgets.HTML of 7.x and 8.x alike)."""
    data = base64.b64encode(figure_png(fig, dpi)).decode()
    return (
        f'<img class="memlab-view" src="data:image/png;base64,{data}" '
        'style="max-width:100%"/>'
    )


def show(fig_or_html) -> None:
    """Display a drawing (a Figure or an HTML string) in a notebook."""
    from IPython.display import HTML, display

    display(
        HTML(fig_or_html if isinstance(fig_or_html, str) else figure_html(fig_or_html))
    )


def caption_text(caption: str, note: str = "", fig=None, width: int = 125) -> str:
    """A figure's title: the caption wrapped to the figure's width (about 12 characters an inch at
    10 points), then the note, wrapped the same way."""
    import textwrap

    if fig is not None:
        width = max(40, int(fig.get_figwidth() * 12))
    text = "\n".join(textwrap.wrap(caption, width)) or " "
    return text + ("\n" + "\n".join(textwrap.wrap(note, width)) if note else "")
