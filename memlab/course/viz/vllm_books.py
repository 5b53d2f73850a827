"""vLLM's books (chapter 06): the block pool, each request's blocks (its block-table row), and the
free queue as the linked list it is.

The same four parts as every side of memlab.course.viz (see ``sglang_books``): the snapshot
(``VllmBooks``), the scene (``VllmScene`` drives a real ``KVCacheManager`` the way vLLM's
scheduler does and snaps ``VllmBooks`` after each step), the chapter's story (``prefix_cache``)
and the drawing (``draw_vllm``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memlab.common.utils import ceil_div
from memlab.course.viz.style import FREE, HIGHLIGHT, NULL, caption_text, cell, grid_axes, new_figure, owner_color
from memlab.vllm.kv_cache_manager import KVCacheManager
from memlab.vllm.request import Request

CACHED = "#b9e0dc"  # a free block that still carries a hash: a prefix hit can revive it
EVICTED = "#e15759"


# -- 1. the snapshot --------------------------------------------------------------------------

@dataclass(frozen=True)
class VllmBooks:
    caption: str
    block_size: int
    num_blocks: int
    null_block: int
    queue: tuple[int, ...]  # the free queue, head (reused first) to tail
    ref_cnt: tuple[int, ...]  # per block id
    hashes: dict = field(default_factory=dict)  # block id -> short label of the hash it carries
    req_blocks: dict = field(default_factory=dict)  # request id -> its block ids, block-table order
    new: frozenset = frozenset()  # blocks popped from the free queue by this step
    hit: frozenset = frozenset()  # blocks a prefix-cache hit took by this step
    evicted: frozenset = frozenset()  # blocks whose hash this step dropped (lazy eviction)
    note: str = ""

    def owner(self, block_id: int) -> str | None:
        """The first request (in table order) that holds the block."""
        return next((r for r, ids in self.req_blocks.items() if block_id in ids), None)


# -- 2. the scene -----------------------------------------------------------------------------

class VllmScene:
    """A KVCacheManager driven like vLLM's scheduler: arrive (lookup, allocate), decode, finish."""

    def __init__(self, num_blocks: int, block_size: int = 4, enable_caching: bool = True):
        self.manager = KVCacheManager(num_blocks, block_size=block_size, enable_caching=enable_caching)
        self.requests: dict[str, Request] = {}
        self.frames: list[VllmBooks] = []
        self._labels: dict = {}  # hash -> "h1", "h2", ... in order of first appearance

    def label(self, block_hash) -> str:
        return self._labels.setdefault(block_hash, f"h{len(self._labels) + 1}")

    def books(self, caption: str, new=(), hit=(), evicted=(), note: str = "") -> VllmBooks:
        pool = self.manager.block_pool
        for r in self.requests.values():  # label hashes in the order requests made them
            for h in r.block_hashes:
                self.label(h)
        hashes = {b.block_id: self.label(b.block_hash) for b in pool.blocks if b.block_hash is not None}
        return VllmBooks(caption, self.manager.block_size, pool.num_gpu_blocks, pool.null_block.block_id,
                         tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks()),
                         tuple(b.ref_cnt for b in pool.blocks), hashes,
                         {rid: tuple(self.manager.get_block_ids(rid)) for rid in self.requests},
                         frozenset(new), frozenset(hit), frozenset(evicted), note)

    def snap(self, caption: str, **kw) -> VllmBooks:
        b = self.books(caption, **kw)
        self.frames.append(b)
        return b

    def arrive(self, rid: str, token_ids) -> dict | None:
        """Look the prompt up in the prefix cache, then allocate its blocks; None when short."""
        req = Request(rid, list(token_ids), block_hasher=self.manager.request_block_hasher)
        hashed_before = {b.block_id for b in self.manager.block_pool.blocks if b.block_hash is not None}
        hits, n = self.manager.get_computed_blocks(req)
        new = self.manager.allocate_slots(req, req.num_tokens - n, n, hits)
        if new is None:
            return None
        req.num_computed_tokens = req.num_tokens
        self.requests[rid] = req
        new_ids = [b.block_id for b in new]  # in the order they left the free queue
        return dict(hit={b.block_id for b in hits}, new=new_ids, hit_tokens=n,
                    evicted={b for b in new_ids if b in hashed_before})

    def decode(self, rid: str, token_id: int) -> set[int] | None:
        req = self.requests[rid]
        req.append_output_token_ids(token_id)
        new = self.manager.allocate_slots(req, 1)
        if new is None:
            return None
        req.num_computed_tokens = req.num_tokens
        return {b.block_id for b in new}

    def finish(self, rid: str) -> list[int]:
        blocks = self.manager.get_block_ids(rid)
        self.manager.free(self.requests.pop(rid))
        return blocks


# -- 3. the chapter's story -------------------------------------------------------------------

def prefix_cache(enable_caching: bool = True, num_blocks: int = 12, block_size: int = 4) -> VllmScene:
    """Chapter 06: vLLM's block pool; a prefix hit, reverse-order frees, lazy eviction."""
    sc = VllmScene(num_blocks, block_size, enable_caching)
    mode = "prefix caching on" if enable_caching else "prefix caching off"
    sc.snap(f"{mode}: block 0 is the null block, popped at start; blocks 1..{num_blocks - 1} are free")

    def arrive(rid, tokens, what):
        r = sc.arrive(rid, tokens)
        if r is None:
            sc.snap(f"{rid} needs more blocks than are free: allocate_slots returns None, nothing changes")
            return
        hit = f"; {r['hit_tokens']} tokens hit the cache (blocks {sorted(r['hit'])})" if r["hit"] else ""
        ev = f"; block {sorted(r['evicted'])} still carried a hash: evicted now" if r["evicted"] else ""
        sc.snap(f"{rid} arrives with {len(tokens)} tokens{what}: new blocks {r['new']}{hit}{ev}",
                new=r["new"], hit=r["hit"], evicted=r["evicted"])

    prompt = list(range(10))
    arrive("A", prompt, "")
    for t in (100, 101):
        sc.decode("A", t)
    full_before, full = len(prompt) // block_size, (len(prompt) + 2) // block_size
    if full > full_before:
        chained = f" (chained on the {full - 1} before it)" if full > 1 else ""
        sc.snap(f"A decodes 2 tokens: its block number {full} fills up"
                + (f" and gets a hash{chained}" if enable_caching else ""))
    else:
        sc.snap("A decodes 2 tokens: no block of A's fills up")
    freed = sc.finish("A")
    where = ("in reverse, hashed ones to the TAIL: the prefix's end will be evicted before its start"
             if enable_caching else "in reverse, to the head (nothing is cached)")
    sc.snap(f"A finishes: blocks {freed[::-1]} are freed {where}")
    arrive("B", prompt[:8] + [50, 51, 52], " (its first 8 are A's)")
    arrive("C", list(range(200, 224)), "")
    arrive("D", list(range(300, 308)), "")
    freed = sc.finish("B")
    sc.snap(f"B finishes: reversed {freed[::-1]}; "
            + ("the unhashed partial block goes to the head, hashed ones to the tail" if enable_caching
               else "all to the head, in that order"))
    return sc


# -- 4. the drawing ---------------------------------------------------------------------------

def _block_fill(books: VllmBooks, b: int):
    if b == books.null_block:
        return NULL, 1.0
    if books.ref_cnt[b] > 0:
        return owner_color(books.owner(b)), 1.0
    return (CACHED, 1.0) if b in books.hashes else (FREE, 1.0)


def draw_vllm(books: VllmBooks, width: float = 11.0):
    """Blocks (top left), each request's blocks (top right), the free queue head -> tail (bottom)."""
    fig, axes = new_figure(width, 4.2, ncols=2, nrows=2, height_ratios=[2.2, 1],
                           width_ratios=[1, 1])
    pool_ax, table_ax = axes[0]
    gs = axes[1, 0].get_gridspec()
    axes[1, 0].remove()
    axes[1, 1].remove()
    queue_ax = fig.add_subplot(gs[1, :])

    grid_axes(pool_ax, f"block pool: {books.num_blocks} blocks of {books.block_size} tokens")
    per_line = 8
    for b in range(books.num_blocks):
        y, x = divmod(b, per_line)
        fill, _ = _block_fill(books, b)
        label = "null" if b == books.null_block else f"{b}\n{books.hashes.get(b, '')}".rstrip()
        edge = EVICTED if b in books.evicted else HIGHLIGHT if b in books.new | books.hit else "white"
        cell(pool_ax, x * 1.1, y * 1.1, fill, label, gid=f"block:{b}", edge=edge,
             lw=2 if edge != "white" else 1, hatch="///" if b in books.hit else None)
        if books.ref_cnt[b] > 1:
            pool_ax.text(x * 1.1 + 0.95, y * 1.1 + 0.1, f"x{books.ref_cnt[b]}", fontsize=6, ha="right", va="top")
    lines = ceil_div(books.num_blocks, per_line)
    pool_ax.set_xlim(-0.2, per_line * 1.1)
    pool_ax.set_ylim(lines * 1.1 + 0.1, -0.4)

    grid_axes(table_ax, "requests' blocks (block-table rows)")
    for i, (rid, ids) in enumerate(books.req_blocks.items()):
        table_ax.text(-0.2, i * 1.2 + 0.5, rid, ha="right", va="center", fontsize=8)
        for j, b in enumerate(ids):
            fill = NULL if b == books.null_block else owner_color(rid)
            cell(table_ax, j, i * 1.2, fill, b, gid=f"table:{rid}:{j}", hatch="///" if b in books.hit else None)
    if not books.req_blocks:
        table_ax.text(0, 0.5, "(no running request)", fontsize=8, va="center")
    cols = max([len(v) for v in books.req_blocks.values()] + [8])
    table_ax.set_xlim(-1.2, cols + 0.2)
    table_ax.set_ylim(max(len(books.req_blocks), 2) * 1.2, -0.4)

    grid_axes(queue_ax, "free queue: head (reused, and evicted, first) <-> ... <-> tail")
    for i, b in enumerate(books.queue):
        fill, _ = _block_fill(books, b)
        cell(queue_ax, i * 1.6, 0, fill, f"{b}\n{books.hashes.get(b, '')}".rstrip(), gid=f"queue:{i}:{b}",
             w=1.1, edge="#999")
        if i:
            queue_ax.annotate("", xy=(i * 1.6, 0.5), xytext=(i * 1.6 - 0.5, 0.5),
                              arrowprops=dict(arrowstyle="<->", lw=0.8, color="#666"))
    if not books.queue:
        queue_ax.text(0, 0.5, "(empty)", fontsize=8, va="center")
    queue_ax.set_xlim(-0.3, max(len(books.queue), 12) * 1.6)
    queue_ax.set_ylim(1.3, -0.4)
    fig.suptitle(caption_text(books.caption, books.note, fig), fontsize=10, x=0.01, ha="left")
    return fig
