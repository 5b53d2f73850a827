"""Chapter 02's pictures: KV bytes per token for real model configs, and one token's row to
scale."""

from __future__ import annotations

from memlab.common.models import FULL, LINEAR, MODELS, SLIDING
from memlab.course.viz.style import PALETTE, new_figure

GiB = 1 << 30


def kv_summary(
    model: str, dtype_bytes: int = 2, tp_size: int = 1, context: int = 32768
) -> dict:
    """The numbers the picture shows, from memlab.common.models (nothing recomputed here)."""
    m = MODELS[model]
    per_layer = m.kv_bytes_per_token_per_layer(dtype_bytes, tp_size)
    full = m.kv_bytes_per_token(FULL, dtype_bytes, tp_size)
    sliding = (
        m.kv_bytes_per_token(SLIDING, dtype_bytes, tp_size)
        if SLIDING in m.kinds()
        else 0
    )
    window = min(context, m.sliding_window or 0)
    return dict(
        model=m,
        per_layer=per_layer,
        per_token=m.kv_bytes_per_token(None, dtype_bytes, tp_size),
        full=full,
        sliding=sliding,
        layers={k: len(m.layer_ids(k)) for k in m.kinds()},
        request_bytes=full * context + sliding * window,
        state_bytes=m.state_bytes_per_request(tp_size=tp_size),
    )


def kv_text(
    model: str, dtype_bytes: int = 2, tp_size: int = 1, context: int = 32768
) -> str:
    s = kv_summary(model, dtype_bytes, tp_size, context)
    layers = ", ".join(f"{n} {k.split('_')[0]}" for k, n in s["layers"].items())
    extra = (
        f"; + {s['state_bytes'] / 2**20:.1f} MiB linear-attention state per request"
        if s["state_bytes"]
        else ""
    )
    return (
        f"<b>{model}</b> ({layers} layers), per rank: {s['per_layer']:,} B per token per layer, "
        f"<b>{s['per_token']:,} B per token</b>; one request of {context:,} tokens: "
        f"<b>{s['request_bytes'] / GiB:.2f} GiB</b>{extra}"
    )


def draw_kv_bytes(
    model: str = "Llama-3.1-8B",
    dtype_bytes: int = 2,
    tp_size: int = 1,
    context: int = 32768,
):
    """Left: KV bytes per token of every model (``model`` highlighted). Right: one token's row in
    one layer of ``model``, drawn to scale in bytes (K | V, or MLA's latent with V as a view)."""
    fig, (left, right) = new_figure(11, 3.4, ncols=2, width_ratios=[1.2, 1])
    names = list(MODELS)
    vals = [
        MODELS[n].kv_bytes_per_token(None, dtype_bytes, tp_size) / 1024 for n in names
    ]
    bars = left.barh(
        names, vals, color=["#bbbbbb" if n != model else PALETTE[0] for n in names]
    )
    for b, n in zip(bars, names):
        b.set_gid(f"model:{n}")
    for y, v in enumerate(vals):
        left.text(v, y, f" {v:,.0f} KiB", va="center", fontsize=8)
    left.invert_yaxis()
    left.set_xlabel(
        f"KV per token, all layers, KiB ({dtype_bytes} byte{'s' if dtype_bytes > 1 else ''} a "
        f"value, TP {tp_size})"
    )
    left.set_xlim(0, max(vals) * 1.35)
    left.set_title("bytes per token", fontsize=10, loc="left")
    for side in ("top", "right"):
        left.spines[side].set_visible(False)

    m = MODELS[model]
    right.set_title(f"{model}: one token, one layer, to scale", fontsize=10, loc="left")
    right.set_axis_off()
    b = dtype_bytes
    if m.attention == "mla":
        segs = [
            ("V = view of the latent", m.kv_lora_rank * b, PALETTE[2]),
            ("rope part", m.qk_rope_head_dim * b, PALETTE[4]),
        ]
        label = f"kv_buffer row: (1, {m.kv_lora_rank} + {m.qk_rope_head_dim})"
        # DeepSeek sparse attention: the indexer's fp8 key and its scales
        if m.index_head_dim:
            segs.append(
                (
                    "indexer key",
                    m.kv_bytes_per_token_per_layer(b, tp_size)
                    - (m.kv_lora_rank + m.qk_rope_head_dim) * b,
                    PALETTE[6],
                )
            )
            label += f"; index_k_with_scale_buffer: {m.index_head_dim} fp8 + scales"
    else:
        h = m.kv_heads_per_rank(tp_size)
        dv = m.v_head_dim or m.head_dim
        segs = [("K", h * m.head_dim * b, PALETTE[0]), ("V", h * dv * b, PALETTE[1])]
        label = f"k_buffer row: ({h}, {m.head_dim}); v_buffer row: ({h}, {dv})"
    # One scale for every model, so switching models changes the bar's length.
    scale = max(
        MODELS[n].kv_bytes_per_token_per_layer(dtype_bytes, tp_size) for n in names
    )
    x = 0.0
    for i, (name, size, color) in enumerate(segs):
        w = size / scale * 0.95
        r = right.barh(0, w, left=x, height=0.5, color=color)[0]
        r.set_gid(f"seg:{name}")
        right.text(
            x + (w / 2 if w > 0.2 else 0),
            -0.3 - 0.22 * i * (w <= 0.2),
            f"{name}: {size:,} B",
            ha="center" if w > 0.2 else "left",
            va="top",
            fontsize=8,
        )
        x += w
    right.text(0, 0.55, label, fontsize=8)
    kinds = ", ".join(
        f"{n} x {k}" for k, n in ((k, len(m.layer_ids(k))) for k in m.kinds())
    )
    linear = (
        "\n(linear layers keep a per-request state instead)"
        if LINEAR in m.kinds()
        else ""
    )
    right.text(0, -0.85, f"layers: {kinds}{linear}", fontsize=8, va="top")
    right.set_xlim(0, 1)
    right.set_ylim(-1.5, 1)
    return fig
