"""Chapter 08's picture: a GPU's memory split into what was in use before the weights loaded, the
weights, the KV pools and the share left to activations, and how many requests of each length fit.
Every number comes from ``memlab.sglang.sizing``."""

from __future__ import annotations

from memlab.common.models import FULL, LINEAR, MODELS, SLIDING
from memlab.course.viz.style import PALETTE, new_figure
from memlab.sglang.sizing import (
    GiB,
    GPUConfig,
    ParallelConfig,
    ScheduleConfig,
    ServingConfig,
    SpeculativeConfig,
    alloc_page_size,
    alloc_reserve_per_decode,
    max_requests_at,
    report,
)

GPUS = {
    "T4 (16 GB)": 15.0,
    "L4 (24 GB)": 22.0,
    "A100 40GB": 39.4,
    "A100 / H100 80GB": 79.1,
    "H200 (141 GB)": 139.8,
}
SPECS = {
    "none": SpeculativeConfig(),
    "EAGLE chain, 3 steps": SpeculativeConfig(
        "EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=4
    ),
    "EAGLE tree, 3 steps x topk 4": SpeculativeConfig(
        "EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8
    ),
}
COLORS = {
    "in use before load": "#bab0ac",
    "weights": "#9c755f",
    FULL: PALETTE[0],
    SLIDING: PALETTE[2],
    LINEAR: PALETTE[4],
    "rounding": "#dddddd",
    "activations, not static": "#f4f4f4",
}


def serving_config(
    model="Llama-3.1-8B",
    gpu="A100 / H100 80GB",
    page_size=16,
    kv_dtype_bytes=2,
    tp_size=1,
    spec="none",
    mem_fraction=0.88,
    in_use_gib=0.5,
) -> ServingConfig:
    schedule = ScheduleConfig(
        page_size=page_size,
        mem_fraction_static=mem_fraction,
        kv_dtype_bytes=kv_dtype_bytes,
    )
    return ServingConfig(
        MODELS[model],
        GPUConfig.gib(GPUS[gpu], gpu, in_use_gib),
        schedule,
        SPECS[spec],
        ParallelConfig(tp_size),
    )


def sizing_text(seq_len=8192, **kw) -> str:
    cfg = serving_config(**kw)
    r = report(cfg.model, cfg.gpu, seq_len, cfg.schedule, cfg.spec, cfg.parallel)
    ps = alloc_page_size(cfg.schedule, cfg.parallel)
    if not r.sizes.fits:
        return (
            f"<b>{cfg.model.name} does not fit on {cfg.gpu.name}</b> (per rank, TP "
            f"{cfg.parallel.tp_size})"
        )
    # SGLang reads the decode reserve on its speculative paths only
    if cfg.spec.algorithm is None:
        step = "a decode step takes <b>1</b> token a request (a new page only on a page boundary)"
    else:
        step = (
            f"reserve per decode step <b>{alloc_reserve_per_decode(cfg.spec, ps)}</b> slots a "
            "request"
        )
    return (
        f"<b>{r.sizes.full_tokens + r.sizes.swa_tokens:,} tokens</b> of KV ({r.pages:,} pages of "
        f"{ps}); <b>{r.requests:,} requests</b> of {seq_len:,} tokens at once; {step}; "
        f"request-table row {r.row_width:,} wide"
    )


def draw_sizing(seq_len=8192, **kw):
    """Left: the GPU's bytes, stacked. Right: requests that fit at once against their length."""
    cfg = serving_config(**kw)
    r = report(cfg.model, cfg.gpu, seq_len, cfg.schedule, cfg.spec, cfg.parallel)
    z = r.sizes
    total, in_use = cfg.gpu.total_bytes, cfg.gpu.in_use_bytes
    # SGLang: weights and KV pools take mem_fraction_static of the memory free before the load
    static = in_use + int(
        cfg.gpu.free_before_load_bytes * cfg.schedule.mem_fraction_static
    )
    parts = [("in use before load", in_use), ("weights", min(z.weight_bytes, total))]
    parts += [(k, b) for k, b in z.bytes_by_kind.items()]
    used = sum(b for _, b in parts)
    parts += [
        ("rounding", max(0, static - used)),
        ("activations, not static", max(0, total - max(static, used))),
    ]
    fig, (left, right) = new_figure(11, 3.3, ncols=2, width_ratios=[1.1, 1])
    x = 0.0
    for name, b in parts:
        if b <= 0:
            continue
        bar = left.barh(
            0, b / GiB, left=x, color=COLORS[name], edgecolor="white", label=name
        )[0]
        bar.set_gid(f"mem:{name}")
        if b / total > 0.07:
            left.text(
                x + b / GiB / 2,
                0,
                f"{b / GiB:.1f}",
                ha="center",
                va="center",
                fontsize=8,
            )
        x += b / GiB
    left.set_xlim(0, max(total, used) / GiB)
    left.set_yticks([])
    left.set_xlabel(f"GiB of {cfg.gpu.name}, per rank (TP {cfg.parallel.tp_size})")
    left.set_title(
        f"{cfg.model.name}: where the memory goes"
        + ("" if z.fits else " (does not fit)"),
        fontsize=10,
        loc="left",
    )
    left.set_ylim(-0.5, 1.25)
    left.legend(loc="upper left", ncol=3, fontsize=8.5, frameon=False)
    for side in ("top", "right", "left"):
        left.spines[side].set_visible(False)

    lens = [2**k for k in range(10, 18)]
    reqs = [max_requests_at(cfg, n, z) if z.fits else 0 for n in lens]
    right.plot(lens, reqs, "o-", color=PALETTE[0])
    right.axvline(seq_len, color="#999", linestyle="--", lw=1)
    right.set_xscale("log", base=2)
    right.set_yscale("symlog", linthresh=1)
    right.set_ylim(bottom=0)
    right.set_xlabel("tokens per request")
    right.set_ylabel("requests at once")
    right.set_title(
        "requests that fit (the tightest ledger decides)", fontsize=10, loc="left"
    )
    right.grid(True, alpha=0.3)
    return fig
