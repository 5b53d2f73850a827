"""Snapshots of the SGLang-side books, read from the real objects.

A drawing never looks at live objects: it gets a frozen ``Books`` read by ``read_books`` from a
``ReqToTokenPool``, an allocator and (optionally) a KV pool. That keeps every picture a pure
function of a state, and lets a widget step back through states the library has left behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RowView:
    row: int
    owner: str | None  # None: a free row (or the padding row 0)
    slots: tuple[int, ...]  # req_to_token[row, :len], the physical slot of each position
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
    staged_pages: tuple[int, ...] = ()  # released but not yet on the free list (need_sort, free group)
    new_slots: frozenset = frozenset()  # slots handed out (or freed) by the step this snapshot follows
    part_of: dict = field(default_factory=dict)  # slot -> alloc_extend part (1, 2, 3), when shown
    buffers: tuple[Buffer, ...] = ()  # the KV pool's per-layer tensors, when shown
    note: str = ""

    @property
    def slot_owner(self) -> dict[int, str]:
        """Held slots -> owner (slots whose page went back to the allocator are not held)."""
        gone = set(self.free_pages) | set(self.staged_pages)
        return {s: r.owner for r in self.rows if r.owner is not None
                for s in r.slots if s // self.page_size not in gone}

    @property
    def page_owner(self) -> dict[int, str]:
        return {s // self.page_size: o for s, o in self.slot_owner.items()}

    @property
    def released_slots(self) -> frozenset:
        """Slots still written in a row whose page was already given back (e.g. out of a window)."""
        gone = set(self.free_pages) | set(self.staged_pages)
        return frozenset(s for r in self.rows if r.owner is not None for s in r.slots if s // self.page_size in gone)

    @property
    def num_slots(self) -> int:
        """Rows of every KV buffer: the usable slots plus the padding page."""
        return (self.num_pages + 1) * self.page_size

    def owner_of_row(self, row: int) -> str | None:
        return self.rows[row].owner


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
                out.append(Buffer(f"{kind}_buffer[{layer}]", tuple(t.shape), t[0].nbytes))
    return tuple(out)


def read_books(caption: str, req_pool, allocator, reqs=(), new_slots=(), part_of=None, kvcache=None,
               note: str = "") -> Books:
    """Snapshot the books: each Req's row holds its first ``kv_allocated_len`` slots."""
    owners = {}
    for r in reqs:
        if r.req_pool_idx is not None:
            owners[r.req_pool_idx] = (str(r.rid), r.kv_allocated_len)
    table = req_pool.req_to_token
    gens = req_pool.req_generation.tolist()
    rows = []
    for row in range(table.shape[0]):
        owner, n = owners.get(row, (None, 0))
        slots = tuple(table[row, :n].tolist()) if n else ()
        rows.append(RowView(row, owner, slots, gens[row]))
    staged = allocator.release_pages.tolist()
    if getattr(allocator, "free_group", None) is not None:  # an open group queues slots and page ids
        ps = allocator.page_size
        queued = {s // ps for t in allocator.free_group for s in t.tolist()}
        queued |= {p for t in allocator.free_page_ids_group for p in t.tolist()}
        staged += sorted(queued)
    return Books(caption=caption, page_size=allocator.page_size, num_pages=allocator.num_pages,
                 row_width=table.shape[1], rows=tuple(rows), free_rows=tuple(req_pool.free_slots),
                 free_pages=tuple(allocator.free_pages.tolist()), staged_pages=tuple(staged),
                 new_slots=frozenset(int(s) for s in new_slots), part_of=dict(part_of or {}),
                 buffers=read_buffers(kvcache), note=note)
