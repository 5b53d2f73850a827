"""Pictures of simulator results: the pool split per policy, a block-size sweep, a timeline.

Each function draws on ``ax`` when given, else on a new figure, and returns the figure.
"""

from __future__ import annotations

import numpy as np

from memlab.viz.style import FREE, new_figure

COLORS = {"used": "#59a14f", "reserved": "#a0cbe8", "internal": "#f28e2b", "free": FREE}
LABELS = {"used": "used (real token state)", "reserved": "reserved, not yet used",
          "internal": "internal fragmentation", "free": "free / external fragmentation"}


def _axes(ax, width, height):
    if ax is None:
        fig, ax = new_figure(width, height)
        return fig, ax
    return ax.figure, ax


def plot_breakdown(results, ax=None, title=None):
    """One horizontal bar per result: the pool split into the four shares (%), avg batch on the right."""
    fig, ax = _axes(ax, 8, 0.6 * len(results) + 1.4)
    names = [r.policy for r in results]
    y = np.arange(len(results))
    left = np.zeros(len(results))
    for share, color in COLORS.items():
        width = np.array([100 * r.shares[share] for r in results])
        ax.barh(y, width, left=left, color=color, edgecolor="white", label=LABELS[share])
        for yi, (l, w) in enumerate(zip(left, width)):
            if w >= 6:
                ax.text(l + w / 2, yi, f"{w:.0f}%", ha="center", va="center", fontsize=8)
        left += width
    for yi, r in enumerate(results):
        ax.text(101, yi, f"batch {r.avg_batch:.1f}", va="center", fontsize=8)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlim(0, 115)
    ax.set_xlabel("% of the pool's slots, averaged over iterations")
    ax.set_title(title or results[0].workload)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.1 / max(len(results), 1)), ncol=2,
              fontsize=8, frameon=False)
    return fig


def plot_sweep(results, ax=None, title=None):
    """Shares (stacked bars) and average batch (line) against block size, for a paged sweep."""
    fig, ax = _axes(ax, 8, 4)
    labels = [r.policy.replace("paged B=", "") for r in results]
    x = np.arange(len(results))
    bottom = np.zeros(len(results))
    for share, color in COLORS.items():
        h = np.array([100 * r.shares[share] for r in results])
        ax.bar(x, h, bottom=bottom, color=color, edgecolor="white", label=LABELS[share])
        bottom += h
    ax.set_xticks(x, labels)
    ax.set_xlabel("block size B (slots)")
    ax.set_ylabel("% of the pool")
    ax.set_ylim(0, 100)
    twin = ax.twinx()
    twin.plot(x, [r.avg_batch for r in results], "k.-", label="avg batch")
    twin.set_ylabel("average batch (requests)")
    twin.set_ylim(0, None)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles + twin.get_legend_handles_labels()[0], labels + ["avg batch"], loc="upper center",
              bbox_to_anchor=(0.5, -0.15), ncol=3, fontsize=8, frameon=False)
    ax.set_title(title or f"{results[0].workload}: paged allocation by block size")
    return fig


def plot_timeline(result, ax=None, title=None):
    """The pool over iterations (stacked shares) with the running batch, from ``result.timeline``."""
    if result.timeline is None or not len(result.timeline):
        raise ValueError("this result has no timeline (simulate(..., timeline=True) records one)")
    fig, ax = _axes(ax, 9, 3.5)
    tl = result.timeline
    # each stretch of iterations becomes two points so the steps stay flat
    t = np.repeat(tl[:, 0], 2) + np.tile([0, 1], len(tl)) * np.repeat(tl[:, 1], 2)
    parts = [np.repeat(tl[:, i], 2) for i in range(3, 7)]
    ax.stackplot(t, *parts, colors=list(COLORS.values()), labels=list(LABELS.values()))
    ax.set_xlim(0, t[-1])
    ax.set_ylim(0, result.pool_size)
    ax.set_xlabel("iteration")
    ax.set_ylabel("slots")
    twin = ax.twinx()
    twin.step(tl[:, 0], tl[:, 2], where="post", color="black", lw=0.8, label="running requests")
    twin.set_ylabel("running requests")
    twin.set_ylim(0, None)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4, fontsize=7, frameon=False)
    ax.set_title(title or f"{result.workload} | {result.policy}")
    return fig
