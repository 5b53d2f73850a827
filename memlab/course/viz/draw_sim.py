"""Chapter 10's pictures of simulator results (memlab.capstone.sim): the pool split per policy, a
block-size sweep, a timeline, the vLLM paper's Figure 2 beside memlab's, and ``draw_policies``
(the chapter's explorer: a named workload replayed under every policy).

Each ``plot_*`` draws on ``ax`` when given, else on a new figure, and returns the figure.
"""

from __future__ import annotations

import numpy as np

from memlab.capstone.sim import DEFAULT_POOL_SIZE, load_workload, simulate
from memlab.capstone.sim.figure2 import (
    CATEGORIES,
    PAPER_FIG2,
    SYSTEMS,
    paper_categories,
)
from memlab.capstone.sim.replay import SHARES, bin_timeline
from memlab.course.viz.style import FREE, new_figure

COLORS = {
    "used": "#59a14f",
    "reserved": "#a0cbe8",
    "internal": "#f28e2b",
    "rounding": "#e15759",
    "free": FREE,
}
LABELS = {
    "used": "used (real token state)",
    "reserved": "reserved, not yet used",
    "internal": "internal fragmentation",
    "rounding": "buddy rounding to a power of two",
    "free": "free / external fragmentation",
}
FIG2_COLORS = dict(zip(CATEGORIES, ("#59a14f", "#a0cbe8", "#f28e2b", "#bab0ac")))


def _axes(ax, width, height):
    if ax is None:
        fig, ax = new_figure(width, height)
        return fig, ax
    return ax.figure, ax


def plot_breakdown(results, ax=None, title=None):
    """One horizontal bar per result: the pool split into the shares (%); on the right the
    average batch and, where paging preempted, how many times."""
    fig, ax = _axes(ax, 8, 0.6 * len(results) + 1.4)
    y = np.arange(len(results))
    left = np.zeros(len(results))
    for share in SHARES:
        width = np.array([100 * r.shares[share] for r in results])
        ax.barh(
            y,
            width,
            left=left,
            color=COLORS[share],
            edgecolor="white",
            label=LABELS[share],
        )
        for yi, (l, w) in enumerate(zip(left, width)):
            if w >= 6:
                ax.text(
                    l + w / 2, yi, f"{w:.0f}%", ha="center", va="center", fontsize=8
                )
        left += width
    for yi, r in enumerate(results):
        note = f"batch {r.avg_batch:.1f}" + (
            f"\n{r.preemptions:,} preempted" if r.preemptions else ""
        )
        ax.text(101, yi, note, va="center", fontsize=8)
    ax.set_yticks(y, [r.policy for r in results])
    ax.invert_yaxis()
    ax.set_xlim(0, 122)
    ax.set_xticks(range(0, 101, 20))
    ax.set_xlabel("% of the pool's slots, averaged over iterations")
    ax.set_title(title or results[0].workload)
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.25 - 0.1 / max(len(results), 1)),
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    return fig


def plot_sweep(results, ax=None, title=None):
    """Shares (stacked bars) and average batch (line) against block size, for a paged sweep.

    Paging keeps the used share between about 80 and 100 %, so the axis starts at the tens below
    the smallest used share (80 when all are above it): the differences between block sizes are
    what the picture is for. Each bar's used share is written on it.
    """
    fig, ax = _axes(ax, 8, 4)
    labels = [r.policy.replace("paged B=", "") for r in results]
    x = np.arange(len(results))
    bottom = np.zeros(len(results))
    used = np.array([100 * r.shares["used"] for r in results])
    lo = min(80, 10 * int(used.min() // 10))
    for share in SHARES:
        h = np.array([100 * r.shares[share] for r in results])
        ax.bar(
            x,
            h,
            bottom=bottom,
            color=COLORS[share],
            edgecolor="white",
            label=LABELS[share],
        )
        bottom += h
    for xi, u in zip(x, used):
        ax.text(
            xi, u - 0.5, f"{u:.1f}", ha="center", va="top", fontsize=8.5, rotation=90
        )
    ax.set_xticks(x, labels)
    ax.set_xlabel("block size B (slots)")
    ax.set_ylabel(f"% of the pool (axis from {lo} %)")
    ax.set_ylim(lo, 100)
    twin = ax.twinx()
    twin.plot(x, [r.avg_batch for r in results], "k.-", label="avg batch")
    twin.set_ylabel("average batch (requests)")
    twin.set_ylim(0, None)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(
        handles + twin.get_legend_handles_labels()[0],
        names + ["avg batch"],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.15),
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    ax.set_title(title or f"{results[0].workload}: paged allocation by block size")
    return fig


def plot_timeline(result, ax=None, title=None, bins: int = 300):
    """The pool over iterations (stacked shares) with the running batch, averaged over ``bins``
    equal stretches of iterations (``bin_timeline``): a replay of 200,000+ iterations draws as
    many points as a short one. The grey band is the batch's range within each bin; the title
    counts the preemptions (``bin_timeline`` has them per bin)."""
    b = bin_timeline(result, bins)
    fig, ax = _axes(ax, 9, 3.5)
    edges = b["edges"]
    t = np.repeat(edges, 2)[1:-1]  # each bin drawn flat: two points
    ax.stackplot(
        t,
        *[np.repeat(b[s], 2) for s in SHARES],
        colors=[COLORS[s] for s in SHARES],
        labels=[LABELS[s] for s in SHARES],
    )
    ax.set_xlim(0, edges[-1])
    ax.set_ylim(0, result.pool_size)
    ax.set_xlabel("iteration")
    ax.set_ylabel("slots")
    twin = ax.twinx()
    twin.fill_between(
        t,
        np.repeat(b["running_min"], 2),
        np.repeat(b["running_max"], 2),
        color="black",
        alpha=0.2,
        lw=0,
        label="running requests: range in the bin",
    )
    twin.plot(
        t,
        np.repeat(b["running"], 2),
        color="black",
        lw=1,
        label="running requests: mean",
    )
    twin.set_ylabel("requests")
    twin.set_ylim(0, None)
    handles, names = ax.get_legend_handles_labels()
    more, more_names = twin.get_legend_handles_labels()
    ax.legend(
        handles + more,
        names + more_names,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        ncol=4,
        fontsize=8.5,
        frameon=False,
    )
    preempted = f", {result.preemptions:,} preemptions" if result.preemptions else ""
    ax.set_title(title or f"{result.workload} | {result.policy}{preempted}")
    return fig


def plot_figure2(*runs, ax=None, title=None):
    """The vLLM paper's Figure 2 (top bar of each group) beside memlab's ``figure2()`` runs.

    For vLLM the paper prints only the token states; its rest (3.7 %) is drawn hatched.
    """
    fig, ax = _axes(ax, 9, 1.0 + 0.45 * len(SYSTEMS) * (1 + len(runs)))
    rows, labels, groups = [], [], []
    for i, system in enumerate(SYSTEMS):
        rows.append(PAPER_FIG2[system])
        labels.append(f"{system}: paper")
        # paging has no placement: draw it once
        mine = runs if system != "vLLM" else runs[:1]
        for run in mine:
            rows.append(paper_categories(run[i]))
            labels.append(f"memlab: {run[i].policy}")
        groups += [i] * (1 + len(mine))
    y = np.arange(len(rows)) + 0.6 * np.array(groups)  # a gap between systems
    for yi, row in zip(y, rows):
        left = 0.0
        for cat, w in zip(CATEGORIES, row):
            if w is None:
                continue
            ax.barh(yi, w, left=left, color=FIG2_COLORS[cat], edgecolor="white")
            if w >= 6:
                ax.text(
                    left + w / 2, yi, f"{w:.1f}", ha="center", va="center", fontsize=8.5
                )
            left += w
        if left < 99.95:
            ax.barh(
                yi,
                100 - left,
                left=left,
                color=FIG2_COLORS[CATEGORIES[-1]],
                hatch="///",
                edgecolor="white",
            )
    for cat in CATEGORIES:
        ax.barh(np.nan, 0, color=FIG2_COLORS[cat], label=cat)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of KV cache memory, averaged over the run")
    ax.set_title(
        title or "vLLM paper, Fig. 2 (OPT-13B, A100-40GB, ShareGPT) beside memlab"
    )
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12),
        ncol=4,
        fontsize=8,
        frameon=False,
    )
    return fig


def draw_policies(
    workload_name: str = "ShareGPT-like",
    block_size: int = 16,
    n: int = 1000,
    pool_size: int | None = None,
    placement: str = "buddy",
):
    """The pool's slots split per allocation policy, replayed on the same request stream.

    ``workload_name`` is one of memlab.capstone.sim.WORKLOADS. Reservations are placed
    by ``placement`` ('buddy' or 'first_fit'). A policy that cannot run (a buddy block
    larger than the pool's largest power-of-two block) is named under the bars.
    """
    wl = load_workload(workload_name, n)
    pool = pool_size or DEFAULT_POOL_SIZE
    results, refused = [], []
    for policy in ("max", "pow2", "oracle", "paged"):
        try:
            results.append(
                simulate(
                    wl, pool, policy, block_size, placement=placement, progress=False
                )
            )
        except ValueError as e:  # the policy's largest request never fits this pool
            refused.append(f"{policy}: {e}")
    fig, ax = new_figure(9, 3.4 + 0.3 * len(refused))
    plot_breakdown(
        results,
        ax=ax,
        title=f"{wl.name}, {n:,} requests, {pool:,} slots, "
        f"{placement.replace('_', ' ')} placement",
    )
    if refused:
        fig.text(
            0.01, 0.01, "cannot run: " + "; ".join(refused), fontsize=8.5, wrap=True
        )
    return fig
