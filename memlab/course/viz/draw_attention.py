"""Chapter 09's picture: one request's decode query reading its KV page by page, scattered over
the pool, next to the attention weight each position gets."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from memlab.course.viz.sglang_books import Books, draw_slot_grid
from memlab.course.viz.style import caption_text, new_figure, owner_color


@dataclass(frozen=True)
class AttnFrame:
    caption: str
    books: Books  # the pool's books; new_slots = the slots read in this step
    rid: str
    positions: tuple  # positions read in this step
    weights: tuple  # the query's attention weight on each of the request's positions (head 0)
    note: str = ""


def attention_frames(scene, q, layer: int = 0, head: int = 0, block: int | None = None) -> dict:
    """Per request, the steps of reading its KV ``block`` positions at a time (default: a page)."""
    kv = scene.kvcache
    k = kv.get_key_buffer(layer).float()
    group = q.shape[1] // k.shape[1]
    block = block or scene.allocator.page_size
    stories = {}
    for b, (rid, req) in enumerate(scene.reqs.items()):
        slots = scene.slots(rid)
        scores = [float(q[b, head].float() @ k[s, head // group]) / math.sqrt(q.shape[-1]) for s in slots]
        top = max(scores)
        e = [math.exp(x - top) for x in scores]
        weights = tuple(x / sum(e) for x in e)  # for the picture only; the kernels compute their own
        frames = []
        for start in range(0, len(slots), block):
            pos = tuple(range(start, min(start + block, len(slots))))
            read = [slots[p] for p in pos]
            books = dataclasses.replace(scene.books(), new_slots=frozenset(read))
            frames.append(AttnFrame(f"{rid} (row {req.kv.req_pool_idx}): positions {pos[0]}..{pos[-1]} -> "
                                    f"req_to_token gives slots {read}", books, rid, pos, weights))
        stories[f"request {rid}"] = frames
    return stories


def draw_attention(frame: AttnFrame, width: float = 11.0):
    fig, (grid, bars) = new_figure(width, 3.4, ncols=2, width_ratios=[1.4, 1])
    draw_slot_grid(grid, frame.books, title="the pool: slots read in this step have a black edge")
    n = len(frame.weights)
    color = owner_color(frame.rid)
    cols = [color if p in frame.positions else ("#555555" if p < frame.positions[0] else "#dddddd") for p in range(n)]
    rects = bars.bar(range(n), frame.weights, color=cols)
    for p, r in enumerate(rects):
        r.set_gid(f"weight:{p}")
    bars.set_xlabel(f"position in request {frame.rid}")
    bars.set_ylabel("attention weight (head 0)")
    bars.set_title("weights: read before (dark), now (colour), later (light)", fontsize=9,
                   loc="left")
    bars.set_ylim(0, max(frame.weights) * 1.15)
    fig.suptitle(caption_text(frame.caption, frame.note, fig), fontsize=10, x=0.01, ha="left")
    return fig


def fill_kv(scene, seed: int = 0) -> None:
    """Write random K and V for every held slot of every layer, through ``set_kv_buffer``."""
    kv = scene.kvcache
    g = torch.Generator().manual_seed(seed)
    slots = torch.tensor([s for rid in scene.reqs for s in scene.slots(rid)], dtype=torch.int64)
    for layer in range(kv.layer_num):
        shape = (len(slots), kv.head_num, kv.head_dim)
        kv.set_kv_buffer(layer, slots, torch.randn(shape, generator=g), torch.randn(shape, generator=g))
