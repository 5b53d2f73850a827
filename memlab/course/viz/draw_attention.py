"""Chapter 09's picture: one request's decode query reading its KV page by page, scattered over
the pool, next to the attention weight each position gets."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from memlab.course.viz.sglang_books import Books
from memlab.course.viz.style import PADDING, owner_color


@dataclass(frozen=True)
class AttnFrame:
    caption: str
    books: Books  # the pool's books; new_slots = the slots read in this step
    rid: str
    positions: tuple  # positions read in this step
    weights: tuple  # the query's attention weight on each of the request's positions
    note: str = ""
    layer: int = 0
    head: int = 0


def attention_frames(
    scene, q, layer: int = 0, head: int = 0, block: int | None = None
) -> dict:
    """Per request, the steps of reading its KV ``block`` positions at a time (default: a page)."""
    kv = scene.kvcache
    k = kv.get_key_buffer(layer).float()
    group = q.shape[1] // k.shape[1]
    block = block or scene.allocator.page_size
    stories = {}
    for b, (rid, req) in enumerate(scene.reqs.items()):
        slots = scene.slots(rid)
        scores = [
            float(q[b, head].float() @ k[s, head // group]) / math.sqrt(q.shape[-1])
            for s in slots
        ]
        top = max(scores)
        e = [math.exp(x - top) for x in scores]
        # for the picture only; the kernels compute their own
        weights = tuple(x / sum(e) for x in e)
        frames = []
        for start in range(0, len(slots), block):
            pos = tuple(range(start, min(start + block, len(slots))))
            read = [slots[p] for p in pos]
            books = dataclasses.replace(scene.books(), new_slots=frozenset(read))
            frames.append(
                AttnFrame(
                    f"{rid} (row {req.kv.req_pool_idx}): positions {pos[0]}..{pos[-1]} -> "
                    f"req_to_token gives slots {read}",
                    books,
                    rid,
                    pos,
                    weights,
                )
            )
        stories[f"request {rid}"] = frames
    return stories


def draw_attention(frame: AttnFrame, still: bool = False) -> str:
    """The pool (the slots read in this step: black edges), then the weight of each of the
    request's positions: read before (dark), now (its colour), later (light). Inline SVG under
    the caption; without weights, the pool alone."""
    from memlab.course.viz.sglang_books import draw_books_on
    from memlab.course.viz.svg import CELL, Canvas

    c = Canvas("hover a slot or a bar: its request, position, slot, page, weight")
    y = c.caption(4, 4.0, frame.caption, frame.note, 640)
    books = frame.books  # with weights, the black edges are the slots the query read
    books = dataclasses.replace(books, new_kind="read") if frame.weights else books
    y = draw_books_on(c, books, ("table", "slots"), y)
    if not frame.weights:
        return c.html(still)
    rid, ws, ps = frame.rid, frame.weights, frame.books.page_size
    row = next(r for r in frame.books.rows if r.owner == rid)
    c.text(
        4,
        y + 13,
        f"{rid}'s query, layer {frame.layer}, head {frame.head}: the weight of each "
        "position it reads",
        size=12.5,
        weight="bold",
    )
    c.text(
        4,
        y + 28,
        "read before (dark), in this step (colour), later (light); the slots read in this "
        "step have a black edge above",
        size=10.5,
        color="#555",
    )
    top, hmax = y + 36, 90
    big = max(ws) or 1.0
    for p, (wt, s) in enumerate(zip(ws, row.slots)):
        h = max(2.0, hmax * wt / big)
        x = 4 + p * (CELL + 4)
        if p in frame.positions:
            fill, when = owner_color(rid), "read in this step"
        elif p < frame.positions[0]:
            fill, when = PADDING, "read before"
        else:
            fill, when = "#dddddd", "read later"
        c.cell(
            x,
            top + hmax - h,
            fill,
            "",
            tip=f"{rid} position {p} · slot {s} = page {s // ps} × {ps} + offset "
            f"{s % ps} · weight {wt:.4f} · {when}",
            gid=f"weight:{p}",
            h=h,
            stroke="#fff",
        )
        c.text(x + CELL / 2, top + hmax + 12, p, size=9.5, anchor="middle")
        page = f"p{s // ps}"
        c.text(
            x + CELL / 2, top + hmax + 24, page, size=9, anchor="middle", color="#555"
        )
    c.text(
        4, top + hmax + 38, "position (top) and page (bottom)", size=10, color="#555"
    )
    return c.html(still)


def fill_kv(scene, seed: int = 0) -> None:
    """Write random K and V for every held slot of every layer, through ``set_kv_buffer``."""
    kv = scene.kvcache
    g = torch.Generator().manual_seed(seed)
    slots = torch.tensor(
        [s for rid in scene.reqs for s in scene.slots(rid)], dtype=torch.int64
    )
    for layer in range(kv.layer_num):
        shape = (len(slots), kv.head_num, kv.head_dim)
        kv.set_kv_buffer(
            layer,
            slots,
            torch.randn(shape, generator=g),
            torch.randn(shape, generator=g),
        )


# -- the instrument: the learner picks a request, a layer, a head; the kernel runs on THAT ---------


class AttnWorld:
    """Chapter 09's books (chapter 00's scene after A and D's chunked prefill, random K and V in
    every held slot) and one decode query per request (4 query heads over 2 KV heads)."""

    def __init__(self):
        from memlab.course.viz.sglang_books import orientation

        self.scene = orientation(dtype=torch.float32, head_dim=16)
        self.scene.extend_batch({"A": 6, "D": 3})
        fill_kv(self.scene)
        rids = list(self.scene.reqs)
        # the chapter's q
        q = torch.randn(len(rids), 4, 16, generator=torch.Generator().manual_seed(1))
        self.q = {r: q[i] for i, r in enumerate(rids)}
        # K, V and queries of what the learner adds
        self.gen = torch.Generator().manual_seed(2)


def _read_args(w: AttnWorld):
    sc = w.scene
    rids = list(sc.reqs)
    q = torch.stack([w.q[r] for r in rids])
    rows = torch.tensor([sc.reqs[r].kv.req_pool_idx for r in rids], dtype=torch.int64)
    seq_lens = torch.tensor(
        [sc.reqs[r].kv.kv_allocated_len for r in rids], dtype=torch.int64
    )
    return rids, q, rows, seq_lens


def dense_attention(q, k, v):
    """One head over one request's K and V copied into dense (L, D) tensors: softmax(q k^T /
    sqrt(D)) v."""
    w = torch.softmax((k.float() @ q.float()) / math.sqrt(q.shape[-1]), dim=0)
    return w, w @ v.float()


def _op_read(w: AttnWorld, step, request, layer, head) -> None:
    """The request's decode query for ``layer`` and ``head``: the slots it reads (req_to_token),
    their pages, its weights; the Triton kernel's output next to dense attention's."""
    from memlab.course.viz.instrument import (
        InputError,
        Verbatim,
        integer,
        spell,
        spell_value,
    )

    sc, kv = w.scene, w.scene.kvcache
    if request not in sc.reqs:
        raise InputError(f"{request!r} holds no row")
    layer, head = integer(layer), integer(head)
    if not 0 <= layer < kv.layer_num:
        raise InputError(f"layer {layer}: the pool has layers 0..{kv.layer_num - 1}")
    if not 0 <= head < 4:
        raise InputError(f"head {head}: the query has heads 0..3")
    rids, q, rows, seq_lens = _read_args(w)
    b = rids.index(request)
    slots = sc.slots(request)
    group = q.shape[1] // kv.head_num
    k = kv.get_key_buffer(layer)[slots, head // group]
    v = kv.get_value_buffer(layer)[slots, head // group]
    weights, dense = dense_attention(q[b, head], k, v)
    ps = sc.allocator.page_size
    pages = list(dict.fromkeys(s // ps for s in slots))
    step.call = spell(
        "decode_attention_fwd",
        Verbatim("q"),
        Verbatim(f"kv.get_key_buffer({layer})"),
        Verbatim(f"kv.get_value_buffer({layer})"),
        Verbatim("req_to_token"),
        rows,
        seq_lens,
    )
    step.call += f"[{b}, {head}]  # request {request} is batch entry {b}; KV head {head // group}"
    step.marks = dict(
        read=set(slots),
        request=request,
        weights=weights.tolist(),
        slots=slots,
        head=head,
        layer=layer,
    )
    step.caption = (
        f"{request}, layer {layer}, head {head}: reads slots {slots} (pages {pages})"
    )
    step.result = f"reads pages {pages}"
    if step.replay:
        return
    from memlab.common import attention
    from memlab.common.env import kernel_device

    dev = kernel_device()
    o = attention.decode_attention_fwd(
        q.to(dev),
        kv.get_key_buffer(layer).to(dev),
        kv.get_value_buffer(layer).to(dev),
        sc.req_pool.req_to_token.to(dev),
        rows.to(dev),
        seq_lens.to(dev),
    ).cpu()
    got = o[b, head].float()
    diff = float((got - dense).abs().max())
    step.marks["diff"] = diff
    step.result = (
        f"reads pages {pages}; output {spell_value([round(x, 4) for x in got.tolist()[:4]])}... ; "
        f"max |paged - dense| = {diff:.2e}"
    )
    verdict = (
        '<b style="color:#2e7d32">paged and dense agree</b>'
        if diff < 1e-4
        else f'<b style="color:#c62828">they differ by {diff:.2e}</b>'
    )
    from memlab.course.viz.instrument import BOX, table_html

    rows_ = [
        (
            f"{name}, dims {a}-{a + 7}",
            " ".join(f"{x:+.4f}" for x in vec.tolist()[a : a + 8]),
        )
        for a in (0, 8)
        for name, vec in (
            ("paged (Triton kernel through req_to_token)", got),
            ("dense (K, V copied out, softmax(qK^T/sqrt(d)) V)", dense),
        )
    ]
    mode = "the interpreter" if str(dev) == "cpu" else "compiled"
    step.details = (
        f'<div class="memlab-attn-compare" style="{BOX}">{verdict} (max |difference| {diff:.2e}; '
        f"the kernel on {dev}: {mode}){table_html(('', f'output of head {head}'), rows_)}</div>"
    )


def _op_extend(w: AttnWorld, step, requests, extend_lens) -> None:
    """More tokens for a request (a new one gets a row): ``alloc_for_extend``, then random K and V
    written into the new slots through ``set_kv_buffer``."""
    from memlab.course.viz.instrument import (
        InputError,
        Verbatim,
        ints,
        names,
        spell,
        spell_value,
    )

    rids, lens = names(requests), ints(extend_lens)
    if not rids or len(rids) != len(lens):
        raise InputError(
            f"{len(rids)} requests, {len(lens)} extend_lens: give one of each per request"
        )
    if len(set(rids)) != len(rids):
        raise InputError("a request appears twice in one batch")
    sc, kv = w.scene, w.scene.kvcache
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
        step.refuse(
            f"refused (alloc_for_extend returns None): {sc.allocator.available_size()} slots free, "
            f"{sc.req_pool.available_size()} row(s); nothing was taken"
        )
        return
    for r in rids:
        w.q.setdefault(r, torch.randn(4, 16, generator=w.gen))
    shape = (len(out), kv.head_num, kv.head_dim)
    for layer in range(kv.layer_num):
        kv.set_kv_buffer(
            layer,
            out,
            torch.randn(shape, generator=w.gen),
            torch.randn(shape, generator=w.gen),
        )
    step.call += (
        "\n# then, per layer: kv.set_kv_buffer(layer, out_cache_loc, k, v) "
        "with random k, v"
    )
    step.result = spell_value(out)
    step.marks = dict(new=set(out.tolist()))
    step.caption = f"extend {dict(zip(rids, lens))}: slots {out.tolist()}"


def _op_finish(w: AttnWorld, step, finishing) -> None:
    from memlab.course.viz.instrument import InputError

    if finishing not in w.scene.reqs:
        raise InputError(f"{finishing!r} holds no row")
    step.call = f"release_kv_row(req_to_token_pool, allocator, {finishing})"
    slots = w.scene.finish(finishing)
    w.q.pop(finishing, None)
    step.result = f"slots {slots} back"
    step.caption = f"{finishing} finishes"


def attention_view(w: AttnWorld, step=None) -> str:
    """The instrument's picture: the pool with the slots the last call read or took, and the
    weights of the query it ran (every position read at once)."""
    marks = step.marks if step is not None else {}
    read = marks.get("read", set()) | marks.get("new", set())
    books = dataclasses.replace(w.scene.books(), new_slots=frozenset(read))
    if "weights" not in marks:
        return draw_attention(AttnFrame("", books, "", (), ()))
    weights = tuple(marks["weights"])
    frame = AttnFrame(
        "",
        books,
        marks["request"],
        tuple(range(len(weights))),
        weights,
        layer=marks["layer"],
        head=marks["head"],
    )
    return draw_attention(frame)


def attn_books(w: AttnWorld) -> dict:
    sc = w.scene
    ps = sc.allocator.page_size
    out = {
        "available_size()": sc.allocator.available_size(),
        "free_pages": sc.allocator.free_pages.tolist(),
    }
    for rid, r in sc.reqs.items():
        slots = sc.slots(rid)
        out[f"request {rid}"] = dict(
            row=r.kv.req_pool_idx,
            tokens=len(slots),
            pages=list(dict.fromkeys(s // ps for s in slots)),
        )
    return out


def attention_instrument(request: str = "A", layer: int = 0, head: int = 0):
    """Chapter 09's instrument: pick a request, a layer and a head and press ``read``; extend or
    finish requests and read again. Opens on the story's books, reading A (layer 0, head 0)."""
    import ipywidgets as W

    from memlab.course.viz.instrument import Field, Instrument, Operation

    def dd(name, width="150px", **kw):
        return W.Dropdown(description=name, layout=W.Layout(width=width), **kw)

    def box(name, value, width="180px"):
        return W.Text(
            value=value,
            description=name,
            layout=W.Layout(width=width),
            style={"description_width": "initial"},
            continuous_update=False,
        )

    ops = [
        Operation(
            "read",
            lambda w, step, request, layer, head: _op_read(
                w, step, request, layer, head
            ),
            [
                Field(
                    "request", dd("request"), str, options=lambda w: list(w.scene.reqs)
                ),
                Field("layer", dd("layer", options=[0, 1], value=layer), int),
                Field("head", dd("head", options=[0, 1, 2, 3], value=head), int),
            ],
            label="read",
            help="decode_attention_fwd (the kernel) and dense attention on this request",
        ),
        Operation(
            "extend",
            lambda w, step, requests, extend_lens: _op_extend(
                w, step, requests, extend_lens
            ),
            [
                Field("requests", box("requests", "B")),
                Field("extend_lens", box("extend_lens", "5")),
            ],
            label="extend",
        ),
        Operation(
            "finish",
            lambda w, step, finishing: _op_finish(w, step, finishing),
            [
                Field(
                    "finishing",
                    dd("request", "160px"),
                    str,
                    options=lambda w: list(w.scene.reqs),
                )
            ],
            label="finish",
        ),
    ]
    inst = Instrument(
        lambda: AttnWorld(),
        ops,
        attention_view,
        attn_books,
        title="attention through the pages: your request, layer, head",
    )
    inst.fields["request"].widget.value = request
    # a first read, kernel included (an opening step would replay without it)
    inst.press("read")
    return inst
