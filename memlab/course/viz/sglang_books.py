"""SGLang's books (chapters 00 to 05): the request table (``ReqToTokenPool``), the token and
paged allocators with their free lists, and the KV pool's buffers.

Every side of the books in memlab.course.viz (this module, ``vllm_books``, ``hybrid_books``,
``radix_books``) is one module in the same four parts, in this order:

1. the snapshot: ``Books``, frozen, read from the real objects by ``read_books``; a drawing
   never looks at live objects, so every picture is a pure function of a state and a widget can
   step back through states the library has left behind;
2. the scene: ``Scene`` drives the real objects the way SGLang's scheduler does (a row per new
   request, ``alloc_extend`` / ``alloc_decode``, the slots written into the row, a free when the
   request ends) and snaps ``Books`` after each step;
3. the chapters' stories, each built by driving the real library: ``orientation`` (00),
   ``request_table`` (01), ``token_allocator`` (03), ``paged_extend`` (04), ``decode_steps`` and
   ``paged_free`` (05). Each returns the scene, whose live objects the chapter keeps using, so
   "the real code on the same state" is literally the same state;
4. the drawings, inline SVG (``memlab.course.viz.svg``): ``draw_request_table``,
   ``draw_row_list``, ``draw_slot_grid``, ``draw_buffers``, ``draw_free_list``, each a panel
   of cells that carry a gid (``row:R:P``, ``freerow:I``, ``slot:S``, ``buf:NAME:S``,
   ``free:I``) and say what they are when hovered; ``draw_books`` stacks the panels under the
   caption. The Steppers, the instruments and the static PNGs all show this one drawing;
5. the instruments (memlab.course.viz.instrument): ``extend_instrument`` (04), the learner's own
   prefill batches through ``alloc_for_extend`` on the real allocator, with the kernel and both
   references run on each batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import ipywidgets as W
import torch

from memlab.common.utils import ceil_align, ceil_div
from memlab.course.viz.instrument import (
    BOX,
    Field,
    InputError,
    Instrument,
    Operation,
    Verbatim,
    ints,
    names,
    recording,
    spell,
    spell_value,
    table_html,
)
from memlab.course.viz.style import (
    FREE,
    HIGHLIGHT,
    PADDING,
    PALETTE,
    STAGED,
    owner_color,
)
from memlab.course.viz.svg import CELL, PART_FILL, Canvas, Swatch, esc
from memlab.sglang.allocation import alloc_for_decode, alloc_for_extend, release_kv_row
from memlab.sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from memlab.sglang.allocator.reference import num_new_pages
from memlab.sglang.kv_pool import MHATokenToKVPool
from memlab.sglang.req_to_token import Req, ReqToTokenPool

# -- 1. the snapshot --------------------------------------------------------------------------


@dataclass(frozen=True)
class RowView:
    row: int
    owner: str | None  # None: a free row (or the padding row 0)
    # req_to_token[row, :len], the physical slot of each position
    slots: tuple[int, ...]
    generation: int


@dataclass(frozen=True)
class Buffer:
    name: str  # e.g. "k_buffer[0]"
    shape: tuple[int, ...]
    row_bytes: int  # bytes of one slot's row


@dataclass(frozen=True)
class Books:
    caption: str
    page_size: int
    num_pages: int  # usable pages are 1..num_pages; page 0 is padding
    row_width: int
    rows: tuple[RowView, ...]  # request-table rows 0..size
    free_rows: tuple[int, ...] = ()  # ReqToTokenPool.free_slots, in list order
    free_pages: tuple[int, ...] = ()  # the allocator's free list, head first
    # released but not yet on the free list (need_sort, free group)
    staged_pages: tuple[int, ...] = ()
    # slots handed out (or freed) by the step this snapshot follows
    new_slots: frozenset = frozenset()
    # slot -> alloc_extend part (1, 2, 3), when shown
    part_of: dict = field(default_factory=dict)
    buffers: tuple[Buffer, ...] = ()  # the KV pool's per-layer tensors, when shown
    note: str = ""
    # "new": new_slots were handed out by the step; "freed": they were given back by it;
    # "read": a query read them (chapter 09)
    new_kind: str = "new"

    @property
    def slot_owner(self) -> dict[int, str]:
        """Held slots -> owner (slots whose page went back to the allocator are not held)."""
        gone = set(self.free_pages) | set(self.staged_pages)
        return {
            s: r.owner
            for r in self.rows
            if r.owner is not None
            for s in r.slots
            if s // self.page_size not in gone
        }

    @property
    def page_owner(self) -> dict[int, str]:
        return {s // self.page_size: o for s, o in self.slot_owner.items()}

    @property
    def released_slots(self) -> frozenset:
        """Slots still written in a row whose page was already given back (e.g. out of a window)."""
        gone = set(self.free_pages) | set(self.staged_pages)
        return frozenset(
            s
            for r in self.rows
            if r.owner is not None
            for s in r.slots
            if s // self.page_size in gone
        )

    @property
    def num_slots(self) -> int:
        """Rows of every KV buffer: the usable slots plus the padding page."""
        return (self.num_pages + 1) * self.page_size


def read_buffers(kvcache) -> tuple[Buffer, ...]:
    """The pool's tensors in layer order, K before V (MHA) or the one latent buffer (MLA)."""
    if kvcache is None:
        return ()
    out = []
    for i in range(kvcache.layer_num):
        layer = kvcache.start_layer + i
        if hasattr(kvcache, "kv_buffer"):
            t = kvcache.kv_buffer[i]
            out.append(Buffer(f"kv_buffer[{layer}]", tuple(t.shape), t[0].nbytes))
        else:
            for kind in ("k", "v"):
                t = getattr(kvcache, f"{kind}_buffer")[i]
                out.append(
                    Buffer(f"{kind}_buffer[{layer}]", tuple(t.shape), t[0].nbytes)
                )
    return tuple(out)


def read_books(
    caption: str,
    req_pool,
    allocator,
    reqs=(),
    new_slots=(),
    part_of=None,
    kvcache=None,
    note: str = "",
) -> Books:
    """Snapshot the books: each Req's row holds its first ``kv_allocated_len`` slots."""
    owners = {}
    for r in reqs:
        if r.kv.req_pool_idx is not None:
            owners[r.kv.req_pool_idx] = (str(r.rid), r.kv.kv_allocated_len)
    table = req_pool.req_to_token
    gens = req_pool.req_generation.tolist()
    rows = []
    for row in range(table.shape[0]):
        owner, n = owners.get(row, (None, 0))
        slots = tuple(table[row, :n].tolist()) if n else ()
        rows.append(RowView(row, owner, slots, gens[row]))
    staged = allocator.get_all_free_pages()[len(allocator.free_pages) :].tolist()
    # an open group queues slots and page ids
    if getattr(allocator, "free_group", None) is not None:
        ps = allocator.page_size
        queued = {s // ps for t in allocator.free_group for s in t.tolist()}
        # paged only
        queued |= {
            p for t in getattr(allocator, "free_page_ids_group", ()) for p in t.tolist()
        }
        staged += sorted(queued)
    return Books(
        caption=caption,
        page_size=allocator.page_size,
        num_pages=allocator.num_pages,
        row_width=table.shape[1],
        rows=tuple(rows),
        free_rows=tuple(req_pool.free_slots),
        free_pages=tuple(allocator.free_pages.tolist()),
        staged_pages=tuple(staged),
        new_slots=frozenset(int(s) for s in new_slots),
        part_of=dict(part_of or {}),
        buffers=read_buffers(kvcache),
        note=note,
    )


# -- 2. the scene -----------------------------------------------------------------------------


class Scene:
    def __init__(self, req_pool: ReqToTokenPool, allocator, kvcache=None):
        self.req_pool, self.allocator, self.kvcache = req_pool, allocator, kvcache
        self.reqs: dict[str, Req] = {}
        self.frames: list[Books] = []

    # -- reading -----------------------------------------------------------------------------
    def books(
        self, caption: str = "", new_slots=(), part_of=None, note: str = ""
    ) -> Books:
        return read_books(
            caption,
            self.req_pool,
            self.allocator,
            self.reqs.values(),
            new_slots,
            part_of,
            self.kvcache,
            note,
        )

    def snap(self, caption: str, new_slots=(), part_of=None, note: str = "") -> Books:
        b = self.books(caption, new_slots, part_of, note)
        self.frames.append(b)
        return b

    def slots(self, rid) -> list[int]:
        r = self.reqs[rid]
        return self.req_pool.req_to_token[
            r.kv.req_pool_idx, : r.kv.kv_allocated_len
        ].tolist()

    def last_loc(self, rid) -> int:
        s = self.slots(rid)
        return s[-1] if s else -1

    # -- scheduling ----------------------------------------------------------------------------
    def extend_batch(self, lens: dict) -> torch.Tensor | None:
        """One prefill batch: request ``rid`` gets ``lens[rid]`` new tokens (new requests get a
        row),
        through the scheduler's ``alloc_for_extend`` (pages checked first, then rows). Returns the
        new slots in batch order, or None when pages or rows are short; a refused batch changes
        nothing."""
        batch = [self.reqs.get(rid) or Req(rid) for rid in lens]
        out = alloc_for_extend(
            self.req_pool, self.allocator, batch, list(lens.values())
        )
        if out is not None:
            self.reqs.update((r.rid, r) for r in batch)
        return out

    def decode(self, rids) -> torch.Tensor | None:
        """One decode step: each request in ``rids`` gets one more token (``alloc_for_decode``)."""
        return alloc_for_decode(
            self.req_pool, self.allocator, [self.reqs[r] for r in rids]
        )

    def clear(self) -> None:
        """Both tables back to empty (generations survive: ``ReqToTokenPool.clear`` never resets
        them)."""
        for r in self.reqs.values():
            r.kv.req_pool_idx, r.kv.kv_allocated_len = None, 0
        self.reqs.clear()
        self.req_pool.clear()
        self.allocator.clear()

    def finish(self, rid) -> list[int]:
        """The request ends: its slots go back to the allocator, its row to the request table."""
        return release_kv_row(
            self.req_pool, self.allocator, self.reqs.pop(rid)
        ).tolist()


# -- 3. the chapters' stories -----------------------------------------------------------------


def _nth(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ... 11th, 12th, 21st."""
    return f"{n}" + (
        "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    )


def _every(n: int) -> str:
    return "every slot" if n == 1 else f"every {_nth(n)} slot"


def _slot_span(first: int, last: int) -> str:
    return f"slot {first}" if first == last else f"slots {first}-{last}"


def _pages_word(pages) -> str:
    return "page" if len(pages) == 1 else "pages"


def orientation(
    page_size: int = 4,
    size: int = 32,
    rows: int = 4,
    width: int = 12,
    dtype=torch.float16,
    head_dim: int = 8,
) -> Scene:
    """Chapter 00: three requests arrive, decode one token each, one leaves, a fourth reuses its
    room."""
    kv = MHATokenToKVPool(
        size, page_size, dtype, head_num=2, head_dim=head_dim, layer_num=2
    )
    sc = Scene(
        ReqToTokenPool(rows, width),
        PagedTokenToKVPoolAllocator(size, page_size, kvcache=kv),
        kv,
    )
    sc.snap(
        f"Empty books: row 0, page 0 and {_slot_span(0, page_size - 1)} are padding and never "
        "handed out"
    )
    for rid, n in (("A", 5), ("B", 3), ("C", 8)):
        out = sc.extend_batch({rid: n})
        r = sc.reqs[rid]
        sc.snap(
            f"{rid} arrives with {n} tokens: row {r.kv.req_pool_idx} (taken from the tail of the "
            f"free rows), slots {out.tolist()}",
            new_slots=out.tolist(),
        )
    lens = [sc.reqs[r].kv.kv_allocated_len + 1 for r in "ABC"]
    out = sc.decode(["A", "B", "C"])
    opened = [r for r, n in zip("ABC", lens) if (n - 1) % page_size == 0]
    sc.snap(
        f"One decode step: A, B, C each add a token, in slots {out.tolist()}"
        + (f"; {', '.join(opened)} opened a new page" if opened else ""),
        new_slots=out.tolist(),
    )
    slots = sc.finish("B")
    b_pages = {s // page_size for s in slots}
    sc.snap(
        f"B finishes: its row and its {_pages_word(b_pages)} go back (slots {slots} are free again)"
    )
    out = sc.extend_batch({"D": 4})
    again = (
        f"B's row and B's {_pages_word(b_pages)} again"
        if {s // page_size for s in out.tolist()} == b_pages
        else "B's row again"
    )
    sc.snap(
        f"D arrives with 4 tokens: row {sc.reqs['D'].kv.req_pool_idx}, slots {out.tolist()}: "
        f"{again} (freed rows and pages are the next handed out)",
        new_slots=out.tolist(),
    )
    return sc


def _slots(out) -> list[int]:
    return [] if out is None else out.tolist()


def request_table(rows: int = 5, width: int = 8) -> Scene:
    """Chapter 01: rows from the tail, reuse and generations, a chunked prefill keeping its row,
    clear()."""
    sc = Scene(ReqToTokenPool(rows, width), TokenToKVPoolAllocator(rows * width))
    sc.snap(
        f"{rows} free rows; alloc_rows takes from the tail of free_slots, so row {rows} goes first"
    )
    sc.extend_batch({"A": 3, "B": 2})
    sc.snap(
        "A and B arrive together: alloc_rows(2) takes the last two free rows, A -> row "
        f"{sc.reqs['A'].kv.req_pool_idx}, B -> row {sc.reqs['B'].kv.req_pool_idx}; each "
        "generation is now 1"
    )
    sc.extend_batch({"C": 4})
    sc.snap(f"C arrives: row {sc.reqs['C'].kv.req_pool_idx}")
    b_row = sc.reqs["B"].kv.req_pool_idx
    sc.finish("B")
    sc.snap(
        f"B finishes: row {b_row} is appended to free_slots, so it is the next one handed out"
    )
    sc.extend_batch({"D": 2})
    d = sc.reqs["D"]
    sc.snap(
        f"D arrives and gets row {d.kv.req_pool_idx} again, generation {d.generation}: a reader "
        f"that stored (row {d.kv.req_pool_idx}, generation 1) for B now sees the row was reused"
    )
    sc.extend_batch({"E": 3})
    e_row = sc.reqs["E"].kv.req_pool_idx
    sc.snap(
        f"E's long prompt is prefilled in chunks; the first chunk (3 tokens) takes row {e_row}"
    )
    before = sc.req_pool.available_size()
    sc.extend_batch({"E": 3})
    sc.snap(
        f"E's second chunk: alloc([E]) keeps row {e_row} (E already owns KV); free rows stay at "
        f"{before}"
    )
    rows0 = sc.req_pool.alloc_rows(0)
    sc.snap(
        f"alloc_rows(0) returns {rows0}: free_slots[-0:] would have been the whole list"
    )
    short = sc.extend_batch({"F": 1, "G": 1, "H": 1})
    sc.snap(
        f"F, G, H arrive together but only {sc.req_pool.available_size()} row is free: alloc "
        f"returns {short}, and nothing changes (all or nothing)"
    )
    sc.clear()
    sc.snap(
        "clear(): every row is free again, but the generations stay: a reused row never repeats one"
    )
    return sc


def token_allocator(need_sort: bool, size: int = 16) -> Scene:
    """Chapter 03: one slot per token; FIFO reuse, or staged frees merged and sorted on demand."""
    sc = Scene(ReqToTokenPool(5, 8), TokenToKVPoolAllocator(size, need_sort=need_sort))
    mode = "need_sort=True" if need_sort else "need_sort=False"
    sc.snap(
        f"{mode}: slots 1..{size} free, slot 0 is padding; allocation takes the head of free_pages"
    )
    for rid, n in (("A", 4), ("B", 3), ("C", 6)):
        out = sc.extend_batch({rid: n})
        sc.snap(
            f"{rid} takes {n} slots from the head: {_slots(out)}", new_slots=_slots(out)
        )
    for rid in ("A", "B"):
        freed = sc.finish(rid)
        where = (
            "are staged in release_pages"
            if need_sort
            else "join the TAIL of free_pages (FIFO)"
        )
        sc.snap(f"{rid} finishes: its slots {freed} {where}")
    free_now = len(sc.allocator.free_pages)
    out = sc.extend_batch({"D": 4})
    if need_sort:
        how = (
            f"only {free_now} slots are on free_pages, so the staged ones are merged and sorted "
            "first"
            if free_now < 4
            else "free_pages is deep enough: nothing is merged"
        )
    else:
        how = "the oldest free slots go first"
    sc.snap(f"D takes 4 slots: {_slots(out)} ({how})", new_slots=_slots(out))
    out = sc.extend_batch({"E": 2})
    sc.snap(f"E takes 2 slots: {_slots(out)}", new_slots=_slots(out))
    return sc


PART_NAMES = {
    1: "part 1: the rest of its old page",
    2: "part 2: whole new pages",
    3: "part 3: a new partial page",
}


def extend_parts(prefix: int, seq: int, page_size: int) -> list[int]:
    """Which part (1, 2, 3) each new token of one request falls in: for colouring, not
    allocating."""
    old_end = ceil_align(prefix, page_size)
    full_end = seq // page_size * page_size
    return [
        1 if pos < old_end else 2 if pos < full_end else 3 for pos in range(prefix, seq)
    ]


# Chapter 04's three prefill batches (new tokens per request): the story, the instrument's opening.
EXTEND_BATCHES = ({"A": 6, "B": 3}, {"A": 5, "B": 9, "C": 4}, {"C": 7})


def extend_scene(
    page_size: int = 4,
    size: int = 48,
    backend: str = "torch",
    device="cpu",
    rows: int = 4,
    width: int = 24,
) -> Scene:
    """Chapter 04's books before any batch: a request table and a paged allocator."""
    return Scene(
        ReqToTokenPool(rows, width),
        PagedTokenToKVPoolAllocator(size, page_size, device=device, backend=backend),
    )


def extend_marks(
    prefix: dict, batch: dict, out, page_size: int
) -> tuple[dict, list[str]]:
    """Which part each slot an extend handed out falls in (slot -> 1, 2, 3), and a line per request
    (``A 6->11 (parts 2/4/1)``); ``prefix``: each request's length before, ``batch``: its new
    tokens."""
    part_of, i, desc = {}, 0, []
    for r, n in batch.items():
        parts = extend_parts(prefix[r], prefix[r] + n, page_size)
        for s, p in zip(_slots(out)[i : i + n], parts):
            part_of[s] = p
        i += n
        counts = [parts.count(k) for k in (1, 2, 3)]
        desc.append(
            f"{r} {prefix[r]}->{prefix[r] + n} (parts {counts[0]}/{counts[1]}/{counts[2]})"
        )
    return part_of, desc


def paged_extend(
    page_size: int = 4, size: int = 48, backend: str = "torch", device="cpu"
) -> Scene:
    """Chapter 04: prefill batches on a paged allocator, each new token coloured by its part.

    ``device``: where the allocator's free list lives (the kernel's device for backend="triton")."""
    sc = extend_scene(page_size, size, backend, device)
    sc.snap(
        f"page_size {page_size}: pages 1..{size // page_size} free; part colours: 1 = rest of the "
        "old page, 2 = whole new pages, 3 = a new partial page"
    )
    for batch in EXTEND_BATCHES:
        pre = {r: sc.reqs[r].kv.kv_allocated_len if r in sc.reqs else 0 for r in batch}
        out = sc.extend_batch(batch)
        part_of, desc = extend_marks(pre, batch, out, page_size)
        sc.snap(
            "alloc_extend: " + ", ".join(desc),
            new_slots=_slots(out),
            part_of=part_of,
            note=f"slots in batch order: {_slots(out)}",
        )
    return sc


def decode_steps(
    page_size: int = 4, steps: int = 6, prompts=(("A", 3), ("B", 4), ("C", 6))
) -> Scene:
    """Chapter 05: decode steps; a request opens a page exactly when its new length % page_size ==
    1."""
    sc = Scene(ReqToTokenPool(4, 16), PagedTokenToKVPoolAllocator(64, page_size))
    out = sc.extend_batch(dict(prompts))
    sc.snap(
        "Prefill: " + ", ".join(f"{r} has {n} tokens" for r, n in prompts),
        new_slots=_slots(out),
    )
    rids = [r for r, _ in prompts]
    for step in range(1, steps + 1):
        lens = {r: sc.reqs[r].kv.kv_allocated_len + 1 for r in rids}
        out = sc.decode(rids)
        opened = [r for r in rids if (lens[r] - 1) % page_size == 0]
        rule = (
            f"seq_len % {page_size} == 1"
            if page_size > 1
            else "page_size 1: every token is a page"
        )
        what = (
            f"{', '.join(opened)} open{'s' if len(opened) == 1 else ''} a page ({rule})"
            if opened
            else "nobody crosses a page boundary: every slot is last_loc + 1"
        )
        sc.snap(
            f"decode step {step}: seq_lens {list(lens.values())}; {what}",
            new_slots=_slots(out),
        )
    return sc


def _error(fn) -> str:
    try:
        fn()
    except (ValueError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def paged_free(story: str, page_size: int = 4) -> Scene:
    """Chapter 05: four ways to give pages back, on the state ``decode_steps`` leaves behind."""
    stories = ("free", "free_segment", "free group", "double free")
    if story not in stories:
        raise ValueError(f"story must be one of {stories}, got {story!r}")
    sc = Scene(
        ReqToTokenPool(4, 16),
        PagedTokenToKVPoolAllocator(64, page_size, debug_mode=True),
    )
    sc.extend_batch({"A": 6, "B": 9, "C": 13})
    sc.snap(
        "A, B and C hold 6, 9 and 13 tokens; the allocator runs in debug mode (it checks its books)"
    )
    al = sc.allocator
    if story == "free":
        slots = sc.slots("A")
        pages = sorted({s // page_size for s in slots})
        sc.finish("A")
        sc.snap(
            f"A finishes: free({slots}) releases each page once, pages {pages} = unique(slot // "
            f"{page_size}), at the HEAD of the free list (LIFO: the next allocation reuses them)"
        )
        out = sc.extend_batch({"D": 5})
        sc.snap(f"D takes A's pages again: slots {_slots(out)}", new_slots=_slots(out))
    elif story == "free_segment":
        c = sc.slots("C")
        n = max(page_size, 8 - 8 % page_size)  # whole pages
        run = c[:n]
        al.free_segment(torch.tensor(run, dtype=torch.int64), start_pos=0)
        sc.snap(
            f"C's first {n} positions leave a sliding window: free_segment(slots {run}, "
            f"start_pos=0) takes {_every(page_size)} ({run[::page_size]}), one per page, with no "
            "unique()"
        )
        # a run that starts mid-page
        start = next((p for p in range(10, n, -1) if p % page_size), None)
        if start is None:
            sc.snap(
                f"With page_size {page_size} no run of C's starts mid-page: nothing to refuse"
            )
        else:
            err = _error(
                lambda: al.free_segment(
                    torch.tensor(c[start : start + 3], dtype=torch.int64),
                    start_pos=start,
                )
            )
            sc.snap(
                f"An unaligned run (positions {start}..{start + 2}) is refused: "
                f"{_every(page_size)} from there would not be one per page",
                note=err,
            )
    elif story == "free group":
        al.free_group_begin()
        sc.finish("A")
        sc.snap(
            "free_group_begin(), then A finishes: its slots are only queued (yellow), not released"
        )
        sc.finish("B")
        sc.snap("B finishes inside the same group: queued too")
        c = sc.slots("C")
        # mid-page where there are pages
        cut = next((p for p in range(10, 0, -1) if p % page_size), 10)
        al.free(torch.tensor(c[:cut], dtype=torch.int64))
        # as a scheduler frees a request and its over-allocated tail apart
        al.free(torch.tensor(c[cut:], dtype=torch.int64))
        r = sc.reqs.pop("C")
        sc.req_pool.free(r)
        r.kv.kv_allocated_len = 0
        both = sorted(
            {s // page_size for s in c[:cut]} & {s // page_size for s in c[cut:]}
        )
        sc.snap(
            f"C finishes, freed in two pieces ({c[:cut]} and {c[cut:]}): "
            + (f"page {both[0]} is under both" if both else "no page is under both")
        )
        al.free_group_end()
        sc.snap(
            "free_group_end(): one release for the whole group, its pages deduplicated once, "
            "one concatenation instead of three"
        )
        sc.snap(
            "Groups do not nest",
            note=_error(lambda: (al.free_group_begin(), al.free_group_begin())),
        )
        al.free_group_end()  # close the group the refused call left open
    else:
        slots = sc.slots("A")
        sc.finish("A")
        sc.snap("A finishes: its pages go back")
        sc.snap(
            "A stale copy of A's slots is freed again: debug mode catches the double free",
            note=_error(lambda: al.free(torch.tensor(slots, dtype=torch.int64))),
        )
    return sc


# -- 4. the drawings: inline SVG, every cell saying what it is -----------------------------------


def _slot_words(books: Books, s: int) -> str:
    ps = books.page_size
    return (
        f"slot {s}"
        if ps == 1
        else f"slot {s} = page {s // ps} × {ps} + offset {s % ps}"
    )


def _positions(books: Books) -> dict[int, tuple[str, int]]:
    """slot -> (owner, position) for every slot written in a held row."""
    return {
        s: (r.owner, pos)
        for r in books.rows
        if r.owner is not None
        for pos, s in enumerate(r.slots)
    }


def _new_edge(books: Books, s) -> dict:
    """The edge of a slot the last step touched: solid when handed out, dashed when given
    back."""
    if s not in books.new_slots:
        return {}
    dash = "4 2" if books.new_kind == "freed" else None
    return dict(stroke=HIGHLIGHT, stroke_width=2.0, dash=dash)


# what a black edge means: the last step handed the slot out, gave it back, or read it
NEW_WORDS = {
    "new": "handed out by the last call",
    "freed": "given back by the last call",
    "read": "read by the query in this step",
}


def _new_tip(books: Books) -> str:
    return "read by the query" if books.new_kind == "read" else "new"


def _title(c: Canvas, x, y, words: str) -> None:
    c.text(x, y + 13, words, size=12.5, weight="bold", color="#222")


def draw_request_table(
    c: Canvas, books: Books, x: float, y: float, max_cols: int | None = None
) -> float:
    """req_to_token as rows of cells (the slot of each position); returns the y below it."""
    cols = min(books.row_width, max_cols or books.row_width)
    _title(c, x, y, "request table: req_to_token[row, position] = slot")
    x0, y0 = x + 58, y + 36
    for pos in range(cols):
        c.text(
            x0 + pos * CELL + CELL / 2,
            y0 - 5,
            pos,
            size=9,
            anchor="middle",
            color="#888",
        )
    released, free_rows = books.released_slots, set(books.free_rows)
    for r in books.rows:
        ry = y0 + r.row * (CELL + 2)
        name = "pad" if r.row == 0 else f"row {r.row}"
        c.text(x0 - 6, ry + 15, name, size=10.5, anchor="end", color="#444")
        if r.owner is not None:
            who = f"row {r.row} · {r.owner} (generation {r.generation}, "
            who += f"{len(r.slots)} tokens)"
        elif r.row == 0:
            who = "row 0 · padding: padded batch entries point here; never handed out"
        else:
            who = f"row {r.row} · free (generation {r.generation})"
        for pos in range(cols):
            gid = f"row:{r.row}:{pos}"
            if r.row == 0:
                c.cell(x0 + pos * CELL, ry, PADDING, tip=who, gid=gid)
            elif r.owner is not None and pos < len(r.slots):
                s = r.slots[pos]
                part = books.part_of.get(s) if s in books.new_slots else None
                tip = f"{who} · position {pos} -> {_slot_words(books, s)}"
                if part:
                    tip += f" · new: {PART_NAMES[part]}"
                elif s in books.new_slots:
                    tip += " · " + _new_tip(books)
                tip += " · its page was given back" if s in released else ""
                c.cell(
                    x0 + pos * CELL,
                    ry,
                    owner_color(r.owner),
                    s,
                    tip=tip,
                    gid=gid,
                    opacity=0.3 if s in released else 1.0,
                    pattern=PART_FILL.get(part),
                    **_new_edge(books, s),
                )
            else:
                tip = f"{who} · position {pos}: no slot"
                c.cell(x0 + pos * CELL, ry, FREE, tip=tip, gid=gid)
        if r.owner is not None:
            tag = f"{r.owner} · gen {r.generation}"
        else:
            tag = f"free · gen {r.generation}" if r.row in free_rows else ""
        c.text(x0 + cols * CELL + 8, ry + 15, tag, size=10.5, color="#444")
    return y0 + len(books.rows) * (CELL + 2) + 6


def _slot_cell(books: Books, s: int, where, free_at) -> dict:
    """How slot ``s`` is drawn: its fill, its opacity and pattern, and its description."""
    page, words = s // books.page_size, _slot_words(books, s)
    if page == 0:
        return dict(fill=PADDING, tip=f"{words} · padding: never handed out")
    if page in set(books.staged_pages):
        return dict(
            fill=STAGED, tip=f"{words} · freed, staged (not yet on the free list)"
        )
    if page in free_at:
        back = " · given back by the last call" if s in books.new_slots else ""
        return dict(fill=FREE, tip=f"{words} · free: free_pages[{free_at[page]}]{back}")
    if s in where and s not in books.released_slots:
        owner, pos = where[s]
        part = books.part_of.get(s) if s in books.new_slots else None
        tip = f"{words} · {owner}, position {pos}"
        if part:
            tip += f" · new: {PART_NAMES[part]}"
        elif s in books.new_slots:
            tip += " · " + _new_tip(books)
        return dict(fill=owner_color(owner), tip=tip, pattern=PART_FILL.get(part))
    owner = books.page_owner.get(page)
    if owner is not None:  # the unwritten tail of a page some request holds
        tip = f"{words} · {owner}'s page, not written yet (its next token lands here)"
        return dict(fill=owner_color(owner), opacity=0.3, tip=tip)
    return dict(fill=FREE, tip=f"{words} · not on the free list and held by no row")


def draw_slot_grid(
    c: Canvas,
    books: Books,
    x: float,
    y: float,
    width: float = 640,
    title: str | None = None,
    where: dict | None = None,
    prefix: str = "slot",
) -> float:
    """The KV slots page by page, coloured by who holds them; returns the y below it.
    ``where``: slot -> (owner, position) when the rows do not hold these slots (another
    ledger's); ``prefix``: the cells' gid, ``slot:S`` by default."""
    ps, gap = books.page_size, (10 if books.page_size > 1 else 0)
    if title is None:
        title = (
            f"KV slots, {ps} per page: slot = page × {ps} + offset"
            if ps > 1
            else "KV slots (one per page)"
        )
    _title(c, x, y, title)
    per_line = max(1, int((width + gap) // (ps * CELL + gap)))
    line_h = CELL + (16 if ps > 1 else 4)
    y0 = y + 22 + (12 if ps > 1 else 0)
    where = _positions(books) if where is None else where
    free_at = {p: i for i, p in enumerate(books.free_pages)}
    for page in range(books.num_pages + 1):
        line, col = divmod(page, per_line)
        px, py = x + col * (ps * CELL + gap), y0 + line * line_h
        if ps > 1:
            c.text(
                px + ps * CELL / 2,
                py - 4,
                f"page {page}",
                size=9,
                anchor="middle",
                color="#777",
            )
        for off in range(ps):
            s = page * ps + off
            edge = _new_edge(books, s) if page else {}
            kw = {**_slot_cell(books, s, where, free_at), **edge}
            c.cell(px + off * CELL, py, label=s, gid=f"{prefix}:{s}", **kw)
    lines = ceil_div(books.num_pages + 1, per_line)
    return y0 + lines * line_h - (12 if ps > 1 else 0) + 8


def draw_free_list(
    c: Canvas, books: Books, x: float, y: float, width: float = 640
) -> float:
    """free_pages head first, then what is staged; returns the y below it."""
    unit = "slots" if books.page_size == 1 else "pages"
    _title(
        c,
        x,
        y,
        f"free_pages: {len(books.free_pages)} free {unit}, head (taken next) -> tail",
    )
    per_line = max(1, int(width // CELL))
    items = [(p, FREE, f"free_pages[{i}]") for i, p in enumerate(books.free_pages)]
    # the token and the paged allocator's names for what is staged
    staged = "release_pages" if books.page_size == 1 else "staged_pages"
    items += [
        (p, STAGED, f"{staged}: {i} (staged)") for i, p in enumerate(books.staged_pages)
    ]
    y0 = y + 20
    ps = books.page_size
    for i, (p, fill, name) in enumerate(items):
        line, col = divmod(i, per_line)
        span = f"slot {p}" if ps == 1 else f"slots {p * ps}-{p * ps + ps - 1}"
        nxt = " · taken next" if i == 0 and fill == FREE else ""
        c.cell(
            x + col * CELL,
            y0 + line * (CELL + 4),
            fill,
            p,
            tip=f"{name} = {unit[:-1]} {p} ({span}){nxt}",
            gid=f"free:{i}",
            stroke="#999",
        )
    if not items:
        c.text(x, y0 + 15, "(empty: nothing free)", size=11, color="#777")
    lines = max(1, ceil_div(len(items), per_line))
    return y0 + lines * (CELL + 4) + 4


def draw_row_list(c: Canvas, books: Books, x: float, y: float) -> float:
    """ReqToTokenPool.free_slots in list order: alloc_rows takes from the tail, free appends to the
    tail; returns the y below it."""
    free = books.free_rows
    _title(
        c,
        x,
        y,
        f"free_slots: {len(free)} free rows, in list order; alloc_rows takes from the tail",
    )
    gens = {r.row: r.generation for r in books.rows}
    for i, row in enumerate(free):
        nxt = " · the tail: taken next" if i == len(free) - 1 else ""
        c.cell(
            x + i * (CELL + 4),
            y + 20,
            FREE,
            row,
            tip=f"free_slots[{i}] = row {row} (generation {gens[row]}){nxt}",
            gid=f"freerow:{i}",
            stroke="#999",
        )
    if free:
        c.text(
            x + (len(free) - 1) * (CELL + 4) + CELL / 2,
            y + 20 + CELL + 12,
            "tail: next",
            size=9.5,
            anchor="middle",
            color="#444",
        )
    else:
        c.text(x, y + 35, "(empty: every row is taken)", size=11, color="#777")
    return y + 20 + CELL + 20


def draw_buffers(
    c: Canvas, books: Books, x: float, y: float, slot: int | None = None
) -> float:
    """Every layer's KV tensor as a strip of slot rows, coloured by owner; ``slot`` traced to
    its bytes. Returns the y below it."""
    _title(c, x, y, "KV buffers: slot s is row s of every layer's tensor")
    n, ps = books.num_slots, books.page_size
    w = max(8.0, min(16.0, 560 / max(n, 1)))
    x0, y0, owner = x + 96, y + 34, books.slot_owner
    for s in range(0, n, max(1, ps)):
        c.text(x0 + s * w + w / 2, y0 - 4, s, size=9, anchor="middle", color="#777")
    for j, b in enumerate(books.buffers):
        by = y0 + j * 18
        c.text(x0 - 6, by + 12, b.name, size=10.5, anchor="end", color="#444")
        for s in range(n):
            who = (
                "padding"
                if s < ps
                else (f"{owner[s]}'s" if s in owner else "no request's")
            )
            lo = s * b.row_bytes
            c.cell(
                x0 + s * w,
                by,
                PADDING if s < ps else owner_color(owner.get(s)),
                tip=f"{b.name}[{s}]: bytes {lo}-{lo + b.row_bytes - 1}, {who} slot {s}",
                gid=f"buf:{b.name}:{s}",
                w=w,
                h=16,
                stroke=HIGHLIGHT if s == slot else "#fff",
                stroke_width=2 if s == slot else 0.5,
            )
    y = y0 + len(books.buffers) * 18 + 4
    if slot is not None and books.buffers:
        b = books.buffers[0]
        c.text(
            x0,
            y + 13,
            f"slot {slot} -> bytes [{slot * b.row_bytes}, {(slot + 1) * b.row_bytes}) "
            f"of each tensor ({b.row_bytes} B a row, shape {b.shape})",
            size=11,
        )
        y += 20
    return y + 4


def draw_legend(c: Canvas, books: Books, x: float, y: float, panels) -> float:
    """Swatches for what the panels show; returns the y below them."""
    sw = []
    if books.part_of:
        sw += [Swatch(PART_NAMES[k], PALETTE[0], PART_FILL[k]) for k in (1, 2, 3)]
    if books.new_slots:
        freed = books.new_kind == "freed"
        words = NEW_WORDS.get(books.new_kind, NEW_WORDS["new"])
        dash = "4 2" if freed else None
        sw.append(Swatch(words, "#ffffff", stroke=HIGHLIGHT, stroke_width=2, dash=dash))
    pages = {"slots", "buffers", "free"} & set(panels)
    sw += [
        Swatch("free", FREE),
        Swatch("padding" if pages else "row 0: padding, never handed out", PADDING),
    ]
    if "slots" in panels and books.page_size > 1:
        sw.append(Swatch("a held page's unwritten tail", PALETTE[0], opacity=0.3))
    if books.staged_pages and pages:
        sw.append(Swatch("staged", STAGED))
    return c.legend(x, y, sw)


PANELS = ("table", "rows", "slots", "buffers", "free")


def draw_books(
    books: Books,
    panels=("table", "slots", "free"),
    slot: int | None = None,
    readout: str = "hover a cell: its row, position, slot, page",
    still: bool = False,
) -> str:
    """The books as one inline SVG, its caption (and note) on top, then the panels stacked in
    the order given: ``table`` (req_to_token), ``rows`` (the free rows), ``slots`` (the KV
    slots page by page), ``buffers`` (every layer's tensor, ``slot`` traced to its bytes),
    ``free`` (the free list), and a legend. ``still``: no read-out strip (a PNG)."""
    unknown = [p for p in panels if p not in PANELS]
    if unknown:
        raise ValueError(f"unknown panel {unknown[0]!r}; known: {PANELS}")
    c = Canvas(readout)
    y = c.caption(4, 4.0, books.caption, books.note, _width(books, panels))
    draw_books_on(c, books, panels, y, slot)
    return c.html(still)


def _width(books: Books, panels) -> float:
    return max(58 + books.row_width * CELL + 90, 560) if "table" in panels else 640


def draw_books_on(
    c: Canvas, books: Books, panels, y: float, slot: int | None = None
) -> float:
    """``draw_books``'s panels and legend on a canvas from ``y`` down; returns the y below."""
    width = _width(books, panels)
    for p in panels:
        if p == "table":
            y = draw_request_table(c, books, 4, y)
        elif p == "rows":
            y = draw_row_list(c, books, 4, y)
        elif p == "slots":
            y = draw_slot_grid(c, books, 4, y, width=width)
        elif p == "buffers":
            y = draw_buffers(c, books, 4, y, slot)
        else:
            y = draw_free_list(c, books, 4, y, width=width)
        y += 8
    return draw_legend(c, books, 4, y, panels) + 8


# -- 5. the instruments: the learner's own calls on the real objects ----------------------------


def _batch_fields(requests: str, prefix: str, seq: str) -> list:
    """The three text boxes of a prefill batch; prefix_lens follows the requests typed (what each
    holds)."""

    def box(name, value):
        return W.Text(
            value=value,
            description=name,
            layout=W.Layout(width="170px"),
            style={"description_width": "initial"},
            continuous_update=False,
        )

    return [
        Field("requests", box("requests", requests), names),
        Field(
            "prefix_lens",
            box("prefix_lens", prefix),
            ints,
            follow=(
                "requests",
                lambda sc, rids: ", ".join(str(_held(sc, r)) for r in rids),
            ),
        ),
        Field("seq_lens", box("seq_lens", seq), ints),
    ]


def _held(sc: Scene, rid) -> int:
    return sc.reqs[rid].kv.kv_allocated_len if rid in sc.reqs else 0


def extend_refusal(sc: Scene, prefix: list, seq: list, new_rows: int) -> str:
    """Why ``alloc_for_extend`` returned None, in the library's own numbers."""
    ps, al = sc.allocator.page_size, sc.allocator
    need = num_new_pages(
        torch.tensor(prefix, dtype=torch.int64),
        torch.tensor(seq, dtype=torch.int64),
        ps,
    )
    free = al.available_size() // ps
    if need > free:
        return (
            f"refused (the library returns None): the batch needs {need} new "
            f"page{'s' * (need != 1)} (num_new_pages), the allocator has {free} free "
            f"(available_size() = {al.available_size()} slots); capacity is checked before "
            "anything is taken, so nothing was taken"
        )
    return (
        f"refused (the library returns None): {new_rows} new requests need a row each, "
        f"{sc.req_pool.available_size()} row(s) are free; nothing was taken"
    )


def three_way(
    args: dict, free_pages: torch.Tensor, page_size: int, out: torch.Tensor
) -> tuple[str, bool]:
    """The Triton kernel, the torch and the Python references on one batch's arguments, next to the
    slots the allocator handed out: an HTML table and whether all agree."""
    from memlab.common.env import kernel_device
    from memlab.kernels import alloc_extend as kernel
    from memlab.sglang.allocator import reference as ref

    pre, seq, last, n = (
        args["prefix_lens"],
        args["seq_lens"],
        args["last_loc"],
        int(args["extend_num_tokens"]),
    )
    dev = kernel_device()
    got = {
        "Triton kernel (memlab.kernels.alloc_extend)": kernel.alloc_extend(
            pre.to(dev), seq.to(dev), last.to(dev), free_pages.to(dev), page_size, n
        )
        .cpu()
        .tolist(),
        "torch reference (alloc_extend_torch)": ref.alloc_extend_torch(
            pre, seq, last, free_pages, page_size, n
        ).tolist(),
        "Python reference (alloc_extend_python)": ref.alloc_extend_python(
            pre.tolist(), seq.tolist(), last.tolist(), free_pages.tolist(), page_size
        ),
    }
    want = out.tolist()
    rows, agree = [], True
    for name, v in got.items():
        diff = next((i for i, (a, b) in enumerate(zip(v, want)) if a != b), None)
        if diff is None and len(v) != len(want):
            diff = min(len(v), len(want))
        agree &= diff is None
        verdict = (
            "same"
            if diff is None
            else (
                f"first difference at output {diff}: {v[diff] if diff < len(v) else 'nothing'} "
                f"instead of {want[diff] if diff < len(want) else 'nothing'}"
            )
        )
        rows.append((name, v, verdict))
    head = (
        '<b style="color:#2e7d32">all three agree with the allocator</b>'
        if agree
        else '<b style="color:#c62828">the three do not agree</b>'
    )
    mode = "the interpreter" if str(dev) == "cpu" else "compiled"
    return (
        f'<div class="memlab-three-way" style="{BOX};margin-top:4px">{head} '
        f"(the kernel on {esc(dev)}: {mode})"
        f"{table_html(('', 'slots', ''), rows)}</div>",
        agree,
    )


def prefix_sums_html(rids, args: dict, free_pages: torch.Tensor, page_size: int) -> str:
    """Each request's output start and free-list start (the two prefix sums) and its three parts."""
    pre, seq, last = (
        args["prefix_lens"].tolist(),
        args["seq_lens"].tolist(),
        args["last_loc"].tolist(),
    )
    new_tok = [s - p for p, s in zip(pre, seq)]
    new_pages = [
        ceil_div(s, page_size) - ceil_div(p, page_size) for p, s in zip(pre, seq)
    ]
    out_start = [sum(new_tok[:i]) for i in range(len(rids))]
    page_start = [sum(new_pages[:i]) for i in range(len(rids))]
    head = (
        "request",
        "prefix -> seq",
        "last_loc",
        "new tokens",
        "output starts at",
        "new pages",
        "free-list starts at",
        "pages taken",
        "part 1 / 2 / 3",
    )
    rows = []
    for i, r in enumerate(rids):
        parts = extend_parts(pre[i], seq[i], page_size)
        taken = free_pages[page_start[i] : page_start[i] + new_pages[i]].tolist()
        rows.append(
            (
                r,
                f"{pre[i]} -> {seq[i]}",
                last[i],
                new_tok[i],
                out_start[i],
                new_pages[i],
                page_start[i],
                taken,
                " / ".join(str(parts.count(k)) for k in (1, 2, 3)),
            )
        )
    return (
        table_html(head, rows, "memlab-prefix-sums")
        + f'<div style="{BOX};font-size:11px;color:#555">output start = the new tokens of the '
        "requests before it; free-list start = their new pages (two exclusive prefix "
        "sums)</div>"
    )


def _op_alloc_extend(sc: Scene, step, requests, prefix_lens, seq_lens) -> None:
    """A prefill batch through the scheduler's ``alloc_for_extend``, which calls the allocator's
    ``alloc_extend``; the call shown is the recorded one."""
    if not (len(requests) == len(prefix_lens) == len(seq_lens)):
        raise InputError(
            f"{len(requests)} requests, {len(prefix_lens)} prefix_lens, {len(seq_lens)} seq_lens: "
            "give one of each per request"
        )
    if len(set(requests)) != len(requests):
        raise InputError("a request appears twice in one batch")
    held = {r: _held(sc, r) for r in requests}
    wrong = [(r, p) for r, p in zip(requests, prefix_lens) if p != held[r]]
    if wrong:
        says = "; ".join(
            f"you gave {r} a prefix of {p}, but {r} "
            + (f"holds {held[r]} tokens" if r in sc.reqs else "is new (0 tokens)")
            for r, p in wrong
        )
        raise InputError(
            f"prefix_lens: {says} (a request's prefix is the tokens it already holds: chapter 04 "
            "has no prefix cache)"
        )
    batch = {r: s - p for r, p, s in zip(requests, prefix_lens, seq_lens)}
    al, ps = sc.allocator, sc.allocator.page_size
    free_before = al.free_pages.clone()
    new_rows = sum(r not in sc.reqs for r in requests)
    step.call = spell(
        "alloc_for_extend",
        Verbatim("req_to_token_pool"),
        Verbatim("allocator"),
        reqs=Verbatim(f"[{', '.join(requests)}]"),
        extend_lens=list(batch.values()),
    )
    with recording(al, "alloc_extend") as calls:
        try:
            out = sc.extend_batch(batch)
        finally:
            # the scheduler reached the allocator: show that call, the engine's own
            if calls:
                step.call = f"# {step.call} called:\n" + spell(
                    "allocator.alloc_extend", **calls[0]["args"]
                )
    if out is None:
        step.result = "None"
        step.refuse(extend_refusal(sc, prefix_lens, seq_lens, new_rows))
        return
    step.result = spell_value(out)
    part_of, desc = extend_marks(held, batch, out, ps)
    step.marks = dict(new_slots=_slots(out), part_of=part_of)
    step.caption = "alloc_extend: " + ", ".join(desc)
    if not step.replay:
        args = calls[0]["args"]
        table = prefix_sums_html(requests, args, free_before, ps)
        step.details = table + (
            three_way(args, free_before, ps, out)[0] if len(out) else ""
        )


def _op_release(sc: Scene, step, request) -> None:
    """A request ends: ``release_kv_cache`` frees its slots (``free_kv_row`` hands each piece of the
    row to ``allocator.free_segment``) and its row."""
    if request not in sc.reqs:
        raise InputError(f"{request!r} holds no row: nothing to release")
    step.call = f"release_kv_cache(req_to_token_pool, allocator, {request})"
    with recording(sc.allocator, "free_segment") as calls:
        slots = sc.finish(request)
    ps = sc.allocator.page_size
    pages = list(dict.fromkeys(s // ps for s in slots))
    for c in calls:  # each line commented: the call itself stays the one to paste
        step.call += "\n# called " + spell(
            "allocator.free_segment", **c["args"]
        ).replace("\n", "\n#   ")
    step.result = f"pages {pages} back at the head of free_pages; its row is free"
    # every slot of the pages given back, the unwritten tail of the last one included
    freed = [p * ps + off for p in pages for off in range(ps)]
    step.marks = dict(new_slots=freed, new_kind="freed")
    step.caption = f"{request} finishes: its pages {pages} go back"


def extend_books(sc: Scene) -> dict:
    """The books chapter 04's instrument lists, read from the real allocator and request table."""
    al, ps = sc.allocator, sc.allocator.page_size
    out = {
        "free_pages": al.free_pages.tolist(),
        "available_size()": al.available_size(),
        "free rows": list(sc.req_pool.free_slots),
    }
    for rid, r in sc.reqs.items():
        slots = sc.slots(rid)
        out[f"request {rid}"] = dict(
            row=r.kv.req_pool_idx,
            tokens=r.kv.kv_allocated_len,
            pages=list(dict.fromkeys(s // ps for s in slots)),
            last_loc=slots[-1] if slots else -1,
        )
    return out


def extend_instrument(
    page_size: int = 4,
    page_sizes=(1, 2, 4, 8),
    size: int = 48,
    opening=EXTEND_BATCHES,
    batch=("A, D", None, "14, 6"),
):
    """Chapter 04's instrument: type a prefill batch (requests, prefix_lens, seq_lens), press
    ``alloc_extend``; free a request; pick the page size. Opens on the story's last state
    (``paged_extend``'s three batches). ``batch``: the fields' first values (prefix_lens None: what
    each request holds)."""

    def build(page_size):
        return extend_scene(page_size, size)

    def draw(sc, step):
        marks = step.marks if step is not None else {}
        books = sc.books(
            new_slots=marks.get("new_slots", ()), part_of=marks.get("part_of")
        )
        return draw_books(replace(books, new_kind=marks.get("new_kind", "new")))

    rids, prefix, seq = batch
    if prefix is None:
        prefix = ", ".join(
            str(_sum_before(opening, len(opening), r)) for r in names(rids)
        )
    extend = Operation(
        "alloc_extend",
        _op_alloc_extend,
        _batch_fields(rids, prefix, seq),
        help="alloc_for_extend(...) -> allocator.alloc_extend(...) on this batch",
    )
    who = W.Dropdown(description="request", layout=W.Layout(width="160px"))
    release = Operation(
        "release",
        _op_release,
        [Field("request", who, str, options=lambda sc: list(sc.reqs))],
        label="release_kv_cache",
        help="the request finishes: its pages and its row go back",
    )
    ps = W.ToggleButtons(
        options=list(page_sizes),
        value=page_size,
        description="page_size",
        style={"button_width": "42px"},
    )
    opening_steps = [
        (
            "alloc_extend",
            dict(
                requests=list(b),
                prefix_lens=[_sum_before(opening, i, r) for r in b],
                seq_lens=[_sum_before(opening, i, r) + n for r, n in b.items()],
            ),
        )
        for i, b in enumerate(opening)
    ]
    return Instrument(
        build,
        [extend, release],
        draw,
        extend_books,
        settings={"page_size": ps},
        opening=opening_steps,
        title="alloc_extend on your own batch",
    )


def _sum_before(batches, i: int, rid) -> int:
    """Tokens request ``rid`` holds before batch ``i``."""
    return sum(b.get(rid, 0) for b in batches[:i])
