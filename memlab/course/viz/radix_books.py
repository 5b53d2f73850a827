"""SGLang's radix tree over two tiers (chapter 11): the tree (each node with its tokens, its device
and host slots, its lock count, whether it is an evictable leaf or lives only on the host), the
device pool's pages and the host pool's pages, each page in the colour of what holds it.

The same four parts as every side of memlab.course.viz (see ``sglang_books``): the snapshot
(``RadixBooks``, read by ``read_radix_books``), the scene (``RadixScene`` drives a real
``HiRadixCache`` (memlab.sglang.hicache) over a tiny real KV pool the way SGLang's scheduler does,
through memlab.capstone.prefix_compare.RadixDriver, and snaps ``RadixBooks`` after each step), the
chapter's story (``story``) and the drawing (``draw_radix``, a pure function of one snapshot).

    from memlab.course.viz.radix_books import draw_radix, story
    frames = story()
    draw_radix(frames[3])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from memlab.capstone.prefix_compare import RadixDriver
from memlab.course.viz.style import FREE, HIGHLIGHT, PADDING, owner_color
from memlab.course.viz.svg import CELL, PART_FILL, Canvas, Swatch, esc
from memlab.sglang.allocator import make_allocator
from memlab.sglang.hicache import HiRadixCache, HostKVCache
from memlab.sglang.kv_pool import MHATokenToKVPool

# Node states use colours outside the owners' palette: a request's own pages keep its colour.
LOCKED = "#2b2d6e"  # on the device, locked by running requests
EVICTABLE = "#fdd9a0"  # an unlocked leaf on the device: the next eviction takes these, LRU first
DEVICE = "#c7e9c0"  # on the device, unlocked, with a child on the device
HOST_ONLY = "#c9c9c9"  # evicted from the device, its KV kept on the host


# -- 1. the snapshot --------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    id: int
    parent: int | None  # None: a child of the root
    key: tuple
    value: tuple | None  # device slots (None: evicted)
    host_value: tuple | None  # host slots (None: no host copy)
    lock_ref: int
    evictable: bool
    last_access_time: int

    @property
    def state(self) -> str:
        if self.value is None:
            return "host"
        if self.lock_ref > 0:
            return "locked"
        return "evictable" if self.evictable else "device"


STATE_FILL = {
    "locked": LOCKED,
    "evictable": EVICTABLE,
    "device": DEVICE,
    "host": HOST_ONLY,
}


@dataclass(frozen=True)
class RadixBooks:
    caption: str
    page_size: int
    nodes: tuple  # NodeView per node but the root, parents before children
    device_pages: int  # usable pages 1..device_pages (page 0 is padding)
    free_device: frozenset
    host_pages: int
    free_host: frozenset
    # running request -> the device pages it owns (not the tree's)
    requests: dict = field(default_factory=dict)
    # nodes this step created, split, moved or re-pointed
    highlight: frozenset = frozenset()
    # evictable, protected, available, host available (tokens)
    sizes: dict = field(default_factory=dict)
    words: tuple = ()  # token id -> word, for labels
    note: str = ""

    def node(self, node_id: int) -> NodeView:
        return next(n for n in self.nodes if n.id == node_id)

    def device_owner(self, page: int):
        """('node', id), ('request', rid), 'free' or 'padding' for a device page."""
        if page == 0:
            return "padding"
        if page in self.free_device:
            return "free"
        for n in self.nodes:
            if n.value is not None and page in _pages(n.value, self.page_size):
                return ("node", n.id)
        for rid, pages in self.requests.items():
            if page in pages:
                return ("request", rid)
        return None

    def host_owner(self, page: int):
        if page == 0:
            return "padding"
        if page in self.free_host:
            return "free"
        for n in self.nodes:
            if n.host_value is not None and page in _pages(
                n.host_value, self.page_size
            ):
                return ("node", n.id)
        return None


def _pages(slots, page_size: int) -> set:
    return {s // page_size for s in slots}


def read_radix_books(
    tree, caption: str, requests=None, highlight=(), words=(), note: str = ""
) -> RadixBooks:
    """A frozen snapshot of a (Hi)RadixCache, its allocators, and the running requests' own
    pages."""
    ps = tree.page_size
    nodes, stack = [], [(c, None) for c in tree.root_node.children.values()]
    while stack:
        node, parent = stack.pop(0)
        nodes.append(
            NodeView(
                node.id,
                parent,
                node.key,
                None if node.value is None else tuple(node.value.tolist()),
                None if node.host_value is None else tuple(node.host_value.tolist()),
                node.lock_ref,
                node in tree.evictable_leaves,
                node.last_access_time,
            )
        )
        stack.extend(
            (c, node.id) for c in sorted(node.children.values(), key=lambda c: c.key)
        )
    alloc = tree.token_to_kv_pool_allocator
    host = getattr(tree, "token_to_kv_pool_host", None)
    free_host, host_pages = frozenset(), 0
    if host is not None:
        ha = host.allocator
        free_host, host_pages = (
            frozenset(ha.get_all_free_pages().tolist()),
            ha.num_pages,
        )
    own = {
        rid: frozenset(_pages(r.kv_indices[r.kv.cache_protected_len :].tolist(), ps))
        for rid, r in (requests or {}).items()
    }
    sizes = dict(
        evictable=tree.evictable_size(),
        protected=tree.protected_size(),
        available=alloc.available_size(),
        host_available=host.available_size() if host is not None else 0,
    )
    return RadixBooks(
        caption,
        ps,
        tuple(nodes),
        alloc.num_pages,
        frozenset(alloc.get_all_free_pages().tolist()),
        host_pages,
        free_host,
        own,
        frozenset(highlight),
        sizes,
        tuple(words),
        note,
    )


# -- 2. the scene -----------------------------------------------------------------------------

WORDS = (
    "<s>",
    "You",
    "are",
    "brief",
    ".",
    "What",
    "is",
    "KV",
    "HiCache",
    "?",
    "a",
    "radix",
    "tree",
    "page",
    "Why",
    "terse",
    "host",
)


def encode(text: str) -> list[int]:
    return [WORDS.index(w) for w in text.split()]


class RadixScene:
    """A HiRadixCache over a tiny MHA pool (write-through), driven like SGLang's scheduler."""

    def __init__(
        self,
        device_tokens: int = 24,
        host_tokens: int = 32,
        page_size: int = 1,
        write_policy: str = "write_through",
    ):
        self.pool = MHATokenToKVPool(
            device_tokens, page_size, torch.float32, head_num=1, head_dim=2, layer_num=1
        )
        alloc = make_allocator(
            device_tokens, page_size, kvcache=self.pool, debug_mode=True
        )
        host = HostKVCache(
            self.pool.host_pool_decls()[0],
            host_tokens,
            page_size,
            pin_memory=False,
            debug_mode=True,
        )
        self.tree = HiRadixCache(
            alloc,
            host,
            write_policy=write_policy,
            io_backend="torch",
            load_back_threshold=1,
            debug_mode=True,
        )
        self.driver = RadixDriver(self.tree, self._compute)
        self.running: dict = {}
        self.frames: list[RadixBooks] = []

    def _compute(self, slots, tokens, start):
        """The 'model': token i's K is (its position, its token id), so a picture can be checked."""
        pos = torch.arange(start, start + len(slots), dtype=torch.float32)
        ids = torch.tensor(tokens[start : start + len(slots)], dtype=torch.float32)
        self.pool.set_kv_buffer(
            0,
            slots,
            torch.stack((pos, ids), -1)[:, None],
            torch.zeros(len(slots), 1, 2),
        )

    def _ids(self) -> dict:
        return {
            n.id: (
                n.key,
                n.value is None,
                n.lock_ref,
                None if n.value is None else n.value.tolist(),
            )
            for n in self.tree._all_nodes()
        }

    def snap(
        self, caption: str, before: dict | None = None, note: str = ""
    ) -> RadixBooks:
        changed = set()
        if before is not None:
            changed = {i for i, v in self._ids().items() if before.get(i) != v}
        books = read_radix_books(self.tree, caption, self.running, changed, WORDS, note)
        self.frames.append(books)
        return books

    def arrive(self, rid: str, text: str, caption: str) -> RadixBooks:
        before = self._ids()
        req = self.driver.admit(encode(text))
        if req is None:
            raise RuntimeError(f"{rid} does not fit")
        self.running[rid] = req
        hit = f"hit {req.hit_tokens} tokens" + (
            f" ({req.host_hit_tokens} loaded back from the host)"
            if req.host_hit_tokens
            else ""
        )
        return self.snap(
            caption,
            before,
            f"{rid}: '{text}' - {hit}, computes {len(req.tokens) - req.hit_tokens}",
        )

    def finish(self, rid: str, caption: str) -> RadixBooks:
        before = self._ids()
        self.driver.finish(self.running.pop(rid))
        return self.snap(caption, before)

    def evict(self, num_tokens: int, caption: str) -> RadixBooks:
        before = self._ids()
        n = self.tree.evict(num_tokens).num_tokens_evicted
        return self.snap(caption, before, f"evict({num_tokens}) freed {n} device slots")

    def evict_host(self, num_tokens: int, caption: str) -> RadixBooks:
        before = self._ids()
        n = self.tree.evict_host(num_tokens)
        return self.snap(
            caption, before, f"evict_host({num_tokens}) freed {n} host slots"
        )


# -- 3. the chapter's story -------------------------------------------------------------------


def _shared_pages(a: str, b: str, page_size: int) -> str:
    """The words two prompts share as the tree matches them: whole pages only."""
    n = 0
    for x, y in zip(a.split(), b.split()):
        if x != y:
            break
        n += 1
    return " ".join(a.split()[: n - n % page_size])


def _aligned(a: str, b: str, page_size: int) -> str:
    common = len(_shared_pages(a, b, 1).split())
    kept = len(_shared_pages(a, b, page_size).split())
    return (
        f" (whole pages of {page_size}: {kept} of the {common} shared tokens)"
        if kept < common
        else ""
    )


def story(page_size: int = 1) -> list[RadixBooks]:
    """Inserts, a split, matches with locks, evictions to the host and a load-back, step by step."""
    device, host = 24, 32
    sc = RadixScene(device_tokens=device, host_tokens=host, page_size=page_size)
    a, b, c = (
        "<s> You are brief . What is KV ?",
        "<s> You are brief . What is HiCache ?",
        "<s> You are terse . Why a radix tree ?",
    )
    sc.snap(
        f"An empty tree over an empty device pool ({device} slots) and host pool ({host} slots)."
    )
    tail = "" if page_size == 1 else " (its partial last page stays its own)"
    sc.arrive(
        "A",
        a,
        "A arrives: nothing cached, it computes every token into slots of its own; its prefill "
        f"done, the tree takes them as one node{tail} (a checkpoint) and A locks it; "
        "write-through also copies them to the host at once.",
    )
    sc.finish(
        "A",
        "A finishes: the tree already holds its tokens, A's lock is dropped"
        + ("" if page_size == 1 else " and its partial last page goes back")
        + ".",
    )
    shared_b, shared_c = _shared_pages(a, b, page_size), _shared_pages(a, c, page_size)
    sc.arrive(
        "B",
        b,
        f"B arrives: its prompt matches A's node through '{shared_b}'{_aligned(a, b, page_size)}, "
        "so the match SPLITS the node there; B maps the shared slots, and its checkpoint adds "
        "its own tail as a second leaf under the split node; B locks the path to it.",
    )
    sc.finish(
        "B", "B finishes: its lock is gone; its tail stays a leaf under the split node."
    )
    sc.arrive(
        "C",
        c,
        f"C arrives: shares '{shared_c}'{_aligned(a, c, page_size)} - another split; its tail "
        "becomes a leaf too, and C locks the path it uses (lock counts along it).",
    )
    sc.evict(
        16,
        "Pool pressure: evict(16) takes unlocked leaves, least recently used first. Their KV has a "
        "host copy, so they are DEMOTED: device slots freed, the node stays, host-only (grey).",
    )
    sc.finish(
        "C",
        "C finishes and unlocks; its tail (checkpointed when it arrived, and copied to the host "
        "then) is evictable now.",
    )
    sc.arrive(
        "D",
        a + " a",
        "D asks A's question again: the match runs through "
        "host-only nodes; load-back takes device slots FIRST, copies the KV back into them, and "
        "re-points the nodes.",
    )
    sc.finish(
        "D",
        "D finishes: the nodes on its path are on the device again, each with its host copy; a "
        "node it did not match stays host-only.",
    )
    sc.evict(100, "Evict everything unlocked: all nodes demoted to the host.")
    sc.evict_host(
        8,
        "Host pressure: evict_host(8) drops host-only LEAVES, least recently used first; they "
        "are gone from both tiers.",
    )
    return sc.frames


# -- 4. the drawing ---------------------------------------------------------------------------


def _layout(books: RadixBooks) -> dict:
    """x, y of each node: leaves side by side in tree order, a parent above the middle of its
    children."""
    children: dict = {}
    for n in books.nodes:
        children.setdefault(n.parent, []).append(n.id)
    pos, next_x = {}, [0.0]

    def place(node_id, depth):
        kids = children.get(node_id, [])
        for k in kids:
            place(k, depth + 1)
        x = sum(pos[k][0] for k in kids) / len(kids) if kids else next_x[0]
        if not kids:
            next_x[0] += 1.0
        pos[node_id] = (x, depth)

    for root_child in children.get(None, []):
        place(root_child, 1)
    return pos


def _key_words(books: RadixBooks, key) -> str:
    words = books.words
    return " ".join(words[t] if t < len(words) else str(t) for t in key)


def _label(books: RadixBooks, n: NodeView, chars: int = 24) -> list[str]:
    """A node's lines: its tokens in full, wrapped at ``chars`` characters (never cut: the split
    point a step teaches may be the last word), then where its KV lives and its lock count."""
    import textwrap

    key = _key_words(books, n.key)
    lines = textwrap.wrap(key, chars, break_long_words=True) or ["(empty)"]
    where = []
    if n.value is not None:
        where.append(f"dev {_span(n.value)}")
    if n.host_value is not None:
        where.append(f"host {_span(n.host_value)}")
    lines.append(" | ".join(where))
    if n.lock_ref:
        lines.append(f"lock_ref {n.lock_ref}")
    return lines


def _span(slots) -> str:
    slots = list(slots)
    if slots == list(range(slots[0], slots[0] + len(slots))):
        return f"{slots[0]}-{slots[-1]}" if len(slots) > 1 else str(slots[0])
    return ",".join(map(str, slots[:4])) + ("..." if len(slots) > 4 else "")


def _page_fill(owner, books: RadixBooks):
    if owner == "padding":
        return PADDING
    if owner == "free" or owner is None:
        return FREE
    kind, who = owner
    return STATE_FILL[books.node(who).state] if kind == "node" else owner_color(who)


def node_tip(books: RadixBooks, n: NodeView) -> str:
    state = {
        "locked": "locked (on the device)",
        "evictable": "an evictable leaf (on the device)",
        "device": "on the device, a child on the device",
        "host": "host only (evicted from the device)",
    }[n.state]
    dev = list(n.value) if n.value is not None else "none"
    host = list(n.host_value) if n.host_value is not None else "none"
    return (
        f"node {n.id} · key '{_key_words(books, n.key)}' ({len(n.key)} tokens: ids "
        f"{list(n.key)}) · device slots {dev} · host slots {host} · lock_ref "
        f"{n.lock_ref} · {state} · last access {n.last_access_time}"
    )


def _page_tip(books: RadixBooks, owner, p: int, device: bool) -> tuple[str, str | None]:
    """What a pool's page holds, and the pattern drawn over it."""
    if owner == "padding":
        return "padding: never handed out", None
    if owner == "free" or owner is None:
        return "free", None
    if owner[0] == "request":
        return f"request {owner[1]}'s own (not in the tree yet)", PART_FILL[3]
    nv = books.node(owner[1])
    slots = nv.value if device else nv.host_value
    offs = [i for i, x in enumerate(slots) if x // books.page_size == p]
    words = _key_words(books, [nv.key[i] for i in offs])
    pattern = PART_FILL[1] if nv.state == "host" and device else None
    return f"node {nv.id}'s tokens {offs}: '{words}'", pattern


def draw_radix(books: RadixBooks, still: bool = False) -> str:
    """The tree (every node's whole key, wrapped; its slots and lock), then the device and host
    pools page by page, as inline SVG under the caption; what the step changed has a black
    edge."""
    c = Canvas("hover a node or a slot: its key, slots, lock count, owner")
    y0 = c.caption(4, 4.0, books.caption, books.note, 760)
    s = books.sizes
    c.text(
        4,
        y0 + 13,
        f"radix tree: evictable_size() {s.get('evictable', 0)}, protected_size() "
        f"{s.get('protected', 0)} tokens",
        size=12.5,
        weight="bold",
    )
    pos = _layout(books)
    w, line_h = 170, 13
    labels = {n.id: _label(books, n) for n in books.nodes}
    h = max([len(v) for v in labels.values()] + [2]) * line_h + 8
    dx, dy, top0 = w + 14, h + 30, y0 + 56
    tops = [pos[n.id][0] for n in books.nodes if n.parent is None]
    root_x = 4 + w / 2 + dx * (sum(tops) / len(tops) if tops else 0)
    root_y = y0 + 34
    c.parts.append(
        f'<circle data-gid="node:root" cx="{root_x:.1f}" cy="{root_y:.1f}" r="12" '
        f'fill="{PADDING}"/>'
    )
    c.text(root_x, root_y + 4, "root", size=9, anchor="middle", color="#fff")
    for n in books.nodes:
        x, d = pos[n.id]
        cx, top = 4 + w / 2 + x * dx, top0 + (d - 1) * dy
        if n.parent is None:
            px, py = root_x, root_y + 12
        else:
            px = 4 + w / 2 + pos[n.parent][0] * dx
            py = top0 + (pos[n.parent][1] - 1) * dy + h
        c.parts.append(
            f'<line x1="{px:.1f}" y1="{py:.1f}" x2="{cx:.1f}" y2="{top:.1f}" '
            'stroke="#888"/>'
        )
        new = n.id in books.highlight
        edge = HIGHLIGHT if new else "#333" if n.host_value is not None else "#fff"
        c.cell(
            cx - w / 2,
            top,
            STATE_FILL[n.state],
            "",
            tip=node_tip(books, n),
            gid=f"node:{n.id}",
            w=w,
            h=h,
            stroke=edge,
            stroke_width=2.5 if new else 1,
            pattern=PART_FILL[1] if n.state == "host" else None,
        )
        ink = "#fff" if n.state == "locked" else "#000"
        # over the node's box (the pointer goes through to it), grouped: a test reads it whole
        c.parts.append(f'<g data-label="node:{n.id}">')
        for k, line in enumerate(labels[n.id]):
            c.parts.append(
                f'<text x="{cx - w / 2 + 5:.1f}" y="{top + 14 + k * line_h:.1f}" '
                f'font-size="10.5" fill="{ink}" pointer-events="none">{esc(line)}</text>'
            )
        c.parts.append("</g>")
        c.text(
            cx + w / 2 - 4, top - 3, f"#{n.id}", size=9.5, anchor="end", color="#555"
        )
    depth = max([d for _, d in pos.values()] + [1])
    y = top0 + (depth - 1) * dy + h + 16
    if not books.nodes:
        c.text(4, top0 + 10, "(an empty tree)", size=11, color="#777")
        y = top0 + 24
    pools = (
        ("device pool", books.device_pages, books.device_owner, "dpage"),
        ("host pool", books.host_pages, books.host_owner, "hpage"),
    )
    for name, pages, owner_of, prefix in pools:
        device = prefix == "dpage"
        free = s.get("available" if device else "host_available", 0)
        unit = f"pages of {books.page_size}" if books.page_size > 1 else "slots"
        c.text(
            4,
            y + 13,
            f"{name}: {pages} {unit}, {free} tokens free",
            size=12.5,
            weight="bold",
        )
        y += 20
        per_line = 25
        ps = books.page_size
        for p in range(pages + 1):
            line, col = divmod(p, per_line)
            owner = owner_of(p)
            what, pattern = _page_tip(books, owner, p, device)
            span = f"slot {p}" if ps == 1 else f"slots {p * ps}-{p * ps + ps - 1}"
            c.cell(
                4 + col * CELL,
                y + line * (CELL + 4),
                _page_fill(owner, books),
                p,
                tip=f"{name} page {p} ({span}) · {what}",
                gid=f"{prefix}:{p}",
                stroke="#999",
                pattern=pattern,
            )
        y += ((pages // per_line) + 1) * (CELL + 4) + 8
    c.legend(
        4,
        y,
        [
            Swatch("locked", LOCKED),
            Swatch("evictable leaf", EVICTABLE),
            Swatch("on device", DEVICE),
            Swatch("host only", HOST_ONLY, PART_FILL[1]),
            Swatch("a request's own", "#c8c8c8", PART_FILL[3]),
            Swatch("changed by this step", "#fff", stroke=HIGHLIGHT, stroke_width=2),
        ],
    )
    return c.html(still)


# -- 5. the instrument: the learner's own token strings on a real HiRadixCache --------------------

# story()'s steps
STORY_STEPS = (
    ("arrive", dict(request="A", text="<s> You are brief . What is KV ?")),
    ("finish", dict(request="A")),
    ("arrive", dict(request="B", text="<s> You are brief . What is HiCache ?")),
    ("finish", dict(request="B")),
    ("arrive", dict(request="C", text="<s> You are terse . Why a radix tree ?")),
    ("evict", dict(num_tokens=16)),
    ("finish", dict(request="C")),
    ("arrive", dict(request="D", text="<s> You are brief . What is KV ? a")),
    ("finish", dict(request="D")),
    ("evict", dict(num_tokens=100)),
    ("evict_host", dict(num_tokens=8)),
)


def scene_words(sc: RadixScene) -> list:
    return sc.__dict__.setdefault("words", list(WORDS))


def tokens_of(sc: RadixScene, text) -> list[int]:
    """The learner's words as token ids: the story's words keep theirs, a new word gets the next
    id."""
    from memlab.course.viz.instrument import InputError

    words = scene_words(sc)
    out = []
    for w in str(text).split():
        if not w.isprintable():
            raise InputError(f"{w!r} is not a word")
        if w not in words:
            words.append(w)
        out.append(words.index(w))
    if not out:
        raise InputError("type some words (tokens are separated by spaces)")
    return out


def _words(sc: RadixScene, key) -> str:
    words = scene_words(sc)
    return " ".join(words[t] if t < len(words) else str(t) for t in key)


def _node(sc: RadixScene, node_id):
    from memlab.course.viz.instrument import InputError, integer

    nid = integer(node_id)
    for n in sc.tree._all_nodes():
        if n.id == nid:
            return n
    raise InputError(f"no node {nid} in the tree (the picture names every node)")


def _node_name(sc, n) -> str:
    return "root" if n is sc.tree.root_node else f"node {n.id} ('{_words(sc, n.key)}')"


def _snapshot_ids(sc) -> dict:
    return {
        n.id: (
            n.key,
            n.value is None,
            n.lock_ref,
            None if n.value is None else n.value.tolist(),
            None if n.host_value is None else n.host_value.tolist(),
        )
        for n in sc.tree._all_nodes()
    }


def _changed(sc, before) -> set:
    return {i for i, v in _snapshot_ids(sc).items() if before.get(i) != v}


def _op_arrive(sc: RadixScene, step, request, text) -> None:
    """A request arrives, as SGLang's scheduler admits it: match (loading a host part back), lock,
    allocate, compute, checkpoint its prompt into the tree."""
    from memlab.course.viz.instrument import InputError, recording, spell_value

    if not request or not str(request).isidentifier():
        raise InputError(f"request id {request!r}: type a short name such as E")
    if request in sc.running:
        raise InputError(f"request {request!r} is running: finish it first")
    ids, before = tokens_of(sc, text), _snapshot_ids(sc)
    step.call = f"req = driver.admit({spell_value(ids)})  # '{text}'"
    with recording(sc.tree, "match_prefix") as m:
        req = sc.driver.admit(ids)
    if m:
        r = m[0]["result"]
        step.call += (
            f"\n# called tree.match_prefix(...) -> device_prefix_len={r.device_prefix_len}, "
            f"host_hit_length={r.host_hit_length}"
        )
    if req is None:
        step.result = "None"
        step.refuse(
            f"refused (admit returns None): {len(ids)} tokens do not fit even after evicting "
            f"(available_size() = {sc.tree.token_to_kv_pool_allocator.available_size()})"
        )
        return
    sc.running[request] = req
    step.result = (
        f"hit {req.hit_tokens} tokens ({req.host_hit_tokens} loaded back from the host), "
        f"computed {len(ids) - req.hit_tokens}; locked {_node_name(sc, req.last_node)}"
    )
    step.marks = dict(changed=_changed(sc, before))
    step.caption = f"{request} arrives: '{text}': " + step.result


def _op_finish(sc: RadixScene, step, request) -> None:
    from memlab.course.viz.instrument import InputError

    if request not in sc.running:
        raise InputError(f"{request!r} is not running")
    before = _snapshot_ids(sc)
    step.call = f"release_kv_cache(req, tree, checkpoint=True)  # req = {request}"
    sc.driver.finish(sc.running.pop(request))
    step.result = f"{request}'s lock dropped; its tokens stay in the tree"
    step.marks = dict(changed=_changed(sc, before))
    step.caption = f"{request} finishes"


def _match_text(r, sc) -> str:
    return (
        f"MatchResult(device_prefix_len={r.device_prefix_len}, "
        f"last_device_node={_node_name(sc, r.last_device_node)}, "
        f"last_host_node={_node_name(sc, r.last_host_node)}, host_hit_length={r.host_hit_length})"
    )


def _op_insert(sc: RadixScene, step, text) -> None:
    """``tree.insert(key, value)`` with slots of the learner's own: the caller allocates them,
    writes the KV, inserts, and frees its copies of what the tree held already (the caller's
    job)."""
    from memlab.course.viz.instrument import spell_value

    ids, before = tokens_of(sc, text), _snapshot_ids(sc)
    tree, al = sc.tree, sc.tree.token_to_kv_pool_allocator
    key = tree.page_aligned(ids)
    step.call = (
        f"key = {spell_value(list(key))}  # '{_words(sc, key)}', cut to whole pages\nvalue = "
        f"allocator.alloc({len(key)})"
    )
    if not key:
        step.refuse(
            f"nothing to insert: {len(ids)} token(s) is less than one page of {tree.page_size}"
        )
        return
    value = al.alloc(len(key))
    if value is None:
        step.result = "None"
        step.refuse(
            f"refused (allocator.alloc returns None): {len(key)} slots wanted, available_size() = "
            f"{al.available_size()}; evict first"
        )
        return
    sc._compute(value, list(key), 0)
    result = tree.insert(key, value)
    step.call += "\nresult = tree.insert(key, value)"
    if result.prefix_len:
        al.free_segment(value[: result.prefix_len], start_pos=0)
        step.call += (
            f"\nallocator.free_segment(value[:{result.prefix_len}], start_pos=0)  # duplicates of "
            "the tree's"
        )
    step.result = (
        f"value {spell_value(value)}; InsertResult(prefix_len={result.prefix_len}, "
        f"last_device_node={_node_name(sc, result.last_device_node)})"
    )
    step.marks = dict(changed=_changed(sc, before))
    step.caption = (
        f"insert '{_words(sc, key)}': the tree held {result.prefix_len} of its tokens"
    )


def _op_match(sc: RadixScene, step, text) -> None:
    from memlab.course.viz.instrument import spell_value

    ids, before = tokens_of(sc, text), _snapshot_ids(sc)
    step.call = f"tree.match_prefix({spell_value(ids)})  # '{text}'"
    r = sc.tree.match_prefix(ids)
    step.result = _match_text(r, sc)
    ch = _changed(sc, before)
    step.marks = dict(changed=ch, path={r.last_host_node.id})
    step.caption = (
        f"match '{text}': {r.device_prefix_len} on the device, {r.host_hit_length} on the host only"
        + (" (a node was split)" if ch else "")
    )


def _op_lock(sc: RadixScene, step, text) -> None:
    """What admission does: match, then ``inc_lock_ref`` on the node the device part ends at."""
    from memlab.course.viz.instrument import spell_value

    ids = tokens_of(sc, text)
    r = sc.tree.match_prefix(ids)
    node = r.last_device_node
    step.call = (
        f"node = tree.match_prefix({spell_value(ids)}).last_device_node  # {_node_name(sc, node)}\n"
        "tree.inc_lock_ref(node)"
    )
    if node is sc.tree.root_node:
        step.refuse(
            "nothing of it is on the device: the match ends at the root, there is no node to lock"
        )
        return
    d = sc.tree.inc_lock_ref(node)
    step.result = f"IncLockRefResult(delta={d.delta})"
    step.marks = dict(changed={node.id})
    step.caption = (
        f"lock the path to node {node.id}: evictable_size changes by {d.delta}"
    )


def _op_unlock(sc: RadixScene, step, node) -> None:
    n = _node(sc, node)
    step.call = (
        f"tree.dec_lock_ref(node)  # node = {_node_name(sc, n)}, lock_ref {n.lock_ref}"
    )
    d = sc.tree.dec_lock_ref(n)
    step.result = f"DecLockRefResult(delta={d.delta})"
    step.marks = dict(changed={n.id})
    step.caption = (
        f"unlock the path to node {n.id}: evictable_size changes by +{d.delta}"
    )


def _num_tokens(value) -> int:
    """A count typed into the evict boxes (memlab's tree would take a negative count as zero)."""
    from memlab.course.viz.instrument import InputError, integer

    n = integer(value)
    if n < 0:
        raise InputError(f"num_tokens {n}: a number of tokens is >= 0")
    return n


def _op_evict(sc: RadixScene, step, num_tokens) -> None:
    n = _num_tokens(num_tokens)
    before = _snapshot_ids(sc)
    step.call = f"tree.evict({n})"
    r = sc.tree.evict(n)
    step.result = f"EvictResult(num_tokens_evicted={r.num_tokens_evicted})"
    step.marks = dict(changed=_changed(sc, before))
    step.caption = (
        f"evict({n}): {r.num_tokens_evicted} device slots freed (demoted to the host where backed "
        "up)"
    )


def _op_evict_host(sc: RadixScene, step, host_tokens) -> None:
    n = _num_tokens(host_tokens)
    before = _snapshot_ids(sc)
    step.call = f"tree.evict_host({n})"
    got = sc.tree.evict_host(n)
    step.result = f"{got} host slots freed"
    step.marks = dict(changed=_changed(sc, before))
    step.caption = f"evict_host({n}): {got} host slots freed"


def _op_backup(sc: RadixScene, step, node) -> None:
    """``write_backup(node)``: copy a device node (and, write-through, its unbacked ancestors) to
    the host."""
    from memlab.course.viz.instrument import InputError

    n = _node(sc, node)
    if n.value is None:
        raise InputError(
            f"node {n.id} is not on the device: only a device node can be backed up"
        )
    if n.host_value is not None:
        raise InputError(
            f"node {n.id} has a host copy already (host slots {n.host_value.tolist()})"
        )
    before = _snapshot_ids(sc)
    step.call = f"tree.write_backup(node)  # node = {_node_name(sc, n)}"
    got = sc.tree.write_backup(n)
    step.result = f"{got} tokens backed up" + ("" if got else " (0: the host is full)")
    if not got:
        step.refuse(
            "write_backup returns 0: the host pool has no room even after evict_host"
        )
        return
    step.marks = dict(changed=_changed(sc, before))
    step.caption = f"back up node {n.id} to the host: {got} tokens"


def _op_load_back(sc: RadixScene, step, text) -> None:
    """Match, then ``load_back`` the host-only part of the match onto the device."""
    from memlab.course.viz.instrument import spell_value

    ids, before = tokens_of(sc, text), _snapshot_ids(sc)
    r = sc.tree.match_prefix(ids)
    step.call = (
        f"m = tree.match_prefix({spell_value(ids)})  # host_hit_length={r.host_hit_length}\n"
        "tree.load_back(m.last_host_node)"
    )
    if not r.host_hit_length:
        step.refuse(
            f"nothing to load back: the match ({r.device_prefix_len} tokens) is all on the device"
        )
        return
    got = sc.tree.load_back(r.last_host_node)
    if got is None:
        step.result = "None"
        step.refuse(
            f"load_back returns None: {r.host_hit_length} host tokens, load_back_threshold "
            f"{sc.tree.load_back_threshold}, available_size() "
            f"{sc.tree.token_to_kv_pool_allocator.available_size()} even after evicting"
        )
        return
    step.result = f"device slots {spell_value(got)}"
    step.marks = dict(changed=_changed(sc, before))
    step.caption = f"load back '{text}': {len(got)} tokens copied host -> device"


def radix_view(sc: RadixScene, step=None) -> str:
    """The instrument's picture: the live tree's books, what the last call changed marked."""
    changed = set((step.marks if step is not None else {}).get("changed", ()))
    words = tuple(scene_words(sc))
    return draw_radix(read_radix_books(sc.tree, "", sc.running, changed, words))


def radix_books_of(sc: RadixScene) -> dict:
    """The numbers chapter 11's instrument lists, read from the real tree and its allocators."""
    tree = sc.tree
    out = {
        "evictable_size()": tree.evictable_size(),
        "protected_size()": tree.protected_size(),
        "device available_size()": tree.token_to_kv_pool_allocator.available_size(),
        "host available_size()": tree.token_to_kv_pool_host.available_size(),
        "running": list(sc.running),
    }
    for n in sorted(tree._all_nodes(), key=lambda n: n.id):
        out[f"node {n.id}"] = dict(
            key=_words(sc, n.key),
            lock_ref=n.lock_ref,
            device=None if n.value is None else _span(n.value.tolist()),
            host=None if n.host_value is None else _span(n.host_value.tolist()),
        )
    return out


def radix_instrument(
    page_size: int = 1, opening=STORY_STEPS, text="<s> You are brief . What is KV ?"
):
    """Chapter 11's instrument: arrive/finish requests, insert, match_prefix, lock, unlock, evict,
    write_backup, load_back, evict_host with the learner's own words; page size 1 or 2. Opens on
    the story's last state (everything on the host, a host eviction done)."""
    import ipywidgets as W

    from memlab.course.viz.instrument import Field, Instrument, Operation

    def build(page_size):
        sc = RadixScene(24, 32, page_size)
        sc.words = list(WORDS)
        return sc

    def box(name, value, width="170px"):
        return W.Text(
            value=value,
            description=name,
            layout=W.Layout(width=width),
            style={"description_width": "initial"},
            continuous_update=False,
        )

    def running(sc):
        return list(sc.running)

    def nodes(sc):
        return [str(n.id) for n in sorted(sc.tree._all_nodes(), key=lambda n: n.id)]

    def node_box(name):
        return W.Dropdown(description=name, layout=W.Layout(width="150px"))

    ops = [
        Operation(
            "arrive",
            lambda sc, step, request, text: _op_arrive(sc, step, request, text),
            [
                Field("request", box("request", "E", "120px")),
                Field("text", box("tokens", text, "380px")),
            ],
            label="arrive (admit)",
            help="match, lock, allocate, compute, checkpoint",
        ),
        Operation(
            "finish",
            lambda sc, step, finishing: _op_finish(sc, step, finishing),
            [Field("finishing", node_box("request"), str, options=running)],
            label="finish",
            help="release_kv_cache: unlock, its tail stays in the tree",
        ),
        Operation(
            "insert",
            lambda sc, step, insert_text: _op_insert(sc, step, insert_text),
            [Field("insert_text", box("key", "<s> You are brief . Why ?", "380px"))],
            label="insert",
        ),
        Operation(
            "match",
            lambda sc, step, match_text: _op_match(sc, step, match_text),
            [Field("match_text", box("key", text, "380px"))],
            label="match_prefix",
        ),
        Operation(
            "lock",
            lambda sc, step, lock_text: _op_lock(sc, step, lock_text),
            [Field("lock_text", box("key", "<s> You are", "380px"))],
            label="inc_lock_ref",
        ),
        Operation(
            "unlock",
            lambda sc, step, unlock_node: _op_unlock(sc, step, unlock_node),
            [Field("unlock_node", node_box("node"), str, options=nodes)],
            label="dec_lock_ref",
        ),
        Operation(
            "evict",
            lambda sc, step, num_tokens: _op_evict(sc, step, num_tokens),
            [Field("num_tokens", box("num_tokens", "4", "150px"))],
            label="evict",
        ),
        Operation(
            "backup",
            lambda sc, step, backup_node: _op_backup(sc, step, backup_node),
            [Field("backup_node", node_box("node"), str, options=nodes)],
            label="write_backup",
        ),
        Operation(
            "load_back",
            lambda sc, step, load_text: _op_load_back(sc, step, load_text),
            [Field("load_text", box("key", text, "380px"))],
            label="load_back",
        ),
        Operation(
            "evict_host",
            lambda sc, step, host_tokens: _op_evict_host(sc, step, host_tokens),
            [Field("host_tokens", box("num_tokens", "4", "150px"))],
            label="evict_host",
        ),
    ]
    steps = []
    for op, args in opening:
        args = dict(args)
        if op == "finish":
            args["finishing"] = args.pop("request")
        elif op == "evict_host":
            args["host_tokens"] = args.pop("num_tokens")
        steps.append((op, args))
    ps = W.ToggleButtons(
        options=[1, 2],
        value=page_size,
        description="page_size",
        style={"button_width": "42px"},
    )
    return Instrument(
        build,
        ops,
        radix_view,
        radix_books_of,
        settings={"page_size": ps},
        opening=steps,
        title="the radix tree and HiCache: your own words",
    )
