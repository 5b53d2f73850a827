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
from matplotlib.patches import Circle

from memlab.sglang.allocator import make_allocator
from memlab.sglang.hicache import HiRadixCache, HostKVCache
from memlab.sglang.kv_pool import MHATokenToKVPool
from memlab.capstone.prefix_compare import RadixDriver
from memlab.course.viz.style import FREE, HIGHLIGHT, PADDING, caption_text, cell, grid_axes, new_figure, owner_color

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


STATE_FILL = {"locked": LOCKED, "evictable": EVICTABLE, "device": DEVICE, "host": HOST_ONLY}


@dataclass(frozen=True)
class RadixBooks:
    caption: str
    page_size: int
    nodes: tuple  # NodeView per node but the root, parents before children
    device_pages: int  # usable pages 1..device_pages (page 0 is padding)
    free_device: frozenset
    host_pages: int
    free_host: frozenset
    requests: dict = field(default_factory=dict)  # running request -> the device pages it owns (not the tree's)
    highlight: frozenset = frozenset()  # nodes this step created, split, moved or re-pointed
    sizes: dict = field(default_factory=dict)  # evictable, protected, available, host available (tokens)
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
            if n.host_value is not None and page in _pages(n.host_value, self.page_size):
                return ("node", n.id)
        return None


def _pages(slots, page_size: int) -> set:
    return {s // page_size for s in slots}


def read_radix_books(tree, caption: str, requests=None, highlight=(), words=(), note: str = "") -> RadixBooks:
    """A frozen snapshot of a (Hi)RadixCache, its allocators, and the running requests' own pages."""
    ps = tree.page_size
    nodes, stack = [], [(c, None) for c in tree.root_node.children.values()]
    while stack:
        node, parent = stack.pop(0)
        nodes.append(NodeView(node.id, parent, node.key, None if node.value is None else tuple(node.value.tolist()),
                              None if node.host_value is None else tuple(node.host_value.tolist()), node.lock_ref,
                              node in tree.evictable_leaves, node.last_access_time))
        stack.extend((c, node.id) for c in sorted(node.children.values(), key=lambda c: c.key))
    alloc = tree.token_to_kv_pool_allocator
    host = getattr(tree, "token_to_kv_pool_host", None)
    free_host, host_pages = frozenset(), 0
    if host is not None:
        ha = host.allocator
        free_host, host_pages = frozenset(ha.get_all_free_pages().tolist()), ha.num_pages
    own = {rid: frozenset(_pages(r.kv_indices[r.kv.cache_protected_len:].tolist(), ps)) for rid, r in (requests or {}).items()}
    sizes = dict(evictable=tree.evictable_size(), protected=tree.protected_size(), available=alloc.available_size(),
                 host_available=host.available_size() if host is not None else 0)
    return RadixBooks(caption, ps, tuple(nodes), alloc.num_pages, frozenset(alloc.get_all_free_pages().tolist()), host_pages, free_host, own, frozenset(highlight), sizes,
                      tuple(words), note)


# -- 2. the scene -----------------------------------------------------------------------------

WORDS = ("<s>", "You", "are", "brief", ".", "What", "is", "KV", "HiCache", "?", "a", "radix", "tree", "page",
         "Why", "terse", "host")


def encode(text: str) -> list[int]:
    return [WORDS.index(w) for w in text.split()]


class RadixScene:
    """A HiRadixCache over a tiny MHA pool (write-through), driven like SGLang's scheduler."""

    def __init__(self, device_tokens: int = 24, host_tokens: int = 32, page_size: int = 1,
                 write_policy: str = "write_through"):
        self.pool = MHATokenToKVPool(device_tokens, page_size, torch.float32, head_num=1, head_dim=2, layer_num=1)
        alloc = make_allocator(device_tokens, page_size, kvcache=self.pool, debug_mode=True)
        host = HostKVCache(self.pool.host_pool_decls()[0], host_tokens, page_size, pin_memory=False, debug_mode=True)
        self.tree = HiRadixCache(alloc, host, write_policy=write_policy, io_backend="torch", load_back_threshold=1,
                                 debug_mode=True)
        self.driver = RadixDriver(self.tree, self._compute)
        self.running: dict = {}
        self.frames: list[RadixBooks] = []

    def _compute(self, slots, tokens, start):
        """The 'model': token i's K is (its position, its token id), so a picture can be checked."""
        pos = torch.arange(start, start + len(slots), dtype=torch.float32)
        ids = torch.tensor(tokens[start:start + len(slots)], dtype=torch.float32)
        self.pool.set_kv_buffer(0, slots, torch.stack((pos, ids), -1)[:, None], torch.zeros(len(slots), 1, 2))

    def _ids(self) -> dict:
        return {n.id: (n.key, n.value is None, n.lock_ref, None if n.value is None else n.value.tolist())
                for n in self.tree._all_nodes()}

    def snap(self, caption: str, before: dict | None = None, note: str = "") -> RadixBooks:
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
        hit = f"hit {req.hit_tokens} tokens" + (f" ({req.host_hit_tokens} loaded back from the host)"
                                                 if req.host_hit_tokens else "")
        return self.snap(caption, before, f"{rid}: '{text}' - {hit}, computes {len(req.tokens) - req.hit_tokens}")

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
        return self.snap(caption, before, f"evict_host({num_tokens}) freed {n} host slots")


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
    return f" (whole pages of {page_size}: {kept} of the {common} shared tokens)" if kept < common else ""


def story(page_size: int = 1) -> list[RadixBooks]:
    """Inserts, a split, matches with locks, evictions to the host and a load-back, step by step."""
    device, host = 24, 32
    sc = RadixScene(device_tokens=device, host_tokens=host, page_size=page_size)
    a, b, c = "<s> You are brief . What is KV ?", "<s> You are brief . What is HiCache ?", "<s> You are terse . Why a radix tree ?"
    sc.snap(f"An empty tree over an empty device pool ({device} slots) and host pool ({host} slots).")
    tail = "" if page_size == 1 else " (its partial last page stays its own)"
    sc.arrive("A", a, "A arrives: nothing cached, it computes every token into slots of its own; its prefill "
              f"done, the tree takes them as one node{tail} (a checkpoint) and A locks it; write-through also "
              "copies them to the host at once.")
    sc.finish("A", "A finishes: the tree already holds its tokens, A's lock is dropped"
              + ("" if page_size == 1 else " and its partial last page goes back") + ".")
    shared_b, shared_c = _shared_pages(a, b, page_size), _shared_pages(a, c, page_size)
    sc.arrive("B", b, f"B arrives: its prompt matches A's node through '{shared_b}'{_aligned(a, b, page_size)}, so "
              "the match SPLITS the node there; B maps the shared slots, and its checkpoint adds its own tail "
              "as a second leaf under the split node; B locks the path to it.")
    sc.finish("B", "B finishes: its lock is gone; its tail stays a leaf under the split node.")
    sc.arrive("C", c, f"C arrives: shares '{shared_c}'{_aligned(a, c, page_size)} - another split; its tail "
              "becomes a leaf too, and C locks the path it uses (lock counts along it).")
    sc.evict(16, "Pool pressure: evict(16) takes unlocked leaves, least recently used first. Their KV has a "
             "host copy, so they are DEMOTED: device slots freed, the node stays, host-only (grey).")
    sc.finish("C", "C finishes and unlocks; its tail (checkpointed when it arrived, and copied to the host "
              "then) is evictable now.")
    sc.arrive("D", a + " a", "D asks A's question again: the match runs through "
              "host-only nodes; load-back takes device slots FIRST, copies the KV back into them, and "
              "re-points the nodes.")
    sc.finish("D", "D finishes: the nodes on its path are on the device again, each with its host copy; a "
              "node it did not match stays host-only.")
    sc.evict(100, "Evict everything unlocked: all nodes demoted to the host.")
    sc.evict_host(8, "Host pressure: evict_host(8) drops host-only LEAVES, least recently used first; they "
                  "are gone from both tiers.")
    return sc.frames


# -- 4. the drawing ---------------------------------------------------------------------------


def _layout(books: RadixBooks) -> dict:
    """x, y of each node: leaves side by side in tree order, a parent above the middle of its children."""
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


def _label(books: RadixBooks, n: NodeView, width: int = 22) -> str:
    """A node's tokens in full, wrapped at ``width`` characters (never cut: the split point a step
    teaches may be the last word), then where its KV lives and its lock count."""
    import textwrap

    words = " ".join(books.words[t] if t < len(books.words) else str(t) for t in n.key)
    words = "\n".join(textwrap.wrap(words, width, break_long_words=True)) or "(empty)"
    where = []
    if n.value is not None:
        where.append(f"dev {_span(n.value)}")
    if n.host_value is not None:
        where.append(f"host {_span(n.host_value)}")
    lock = f"  lock {n.lock_ref}" if n.lock_ref else ""
    return f"{words}\n{' | '.join(where)}{lock}"


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


def draw_radix(books: RadixBooks, width: float = 12.0):
    """The tree (left), the device pool's pages (top right) and the host pool's pages (bottom right)."""
    fig, axes = new_figure(width, 5.6, ncols=2, nrows=2, width_ratios=[1.9, 1], height_ratios=[1, 1])
    gs = axes[0, 0].get_gridspec()
    axes[0, 0].remove()
    axes[1, 0].remove()
    tree_ax = fig.add_subplot(gs[:, 0])
    dev_ax, host_ax = axes[0, 1], axes[1, 1]

    s = books.sizes
    grid_axes(tree_ax, f"radix tree: evictable {s.get('evictable', 0)}, protected {s.get('protected', 0)} tokens")
    pos = _layout(books)
    labels = {n.id: _label(books, n) for n in books.nodes}
    lines = max([lb.count("\n") + 1 for lb in labels.values()] + [2])
    w, h, dx = 2.7, 0.2 + 0.4 * lines, 3.0  # every node as tall as the tallest label
    dy = h + 0.8
    top = [pos[n.id][0] for n in books.nodes if n.parent is None]
    root_x = dx * sum(top) / len(top) if top else 0.0
    right = max([x * dx for x, _ in pos.values()] + [(len(STATE_FILL) + 1) * 2.0 - w])
    tree_ax.add_patch(Circle((root_x, 0.3), 0.3, facecolor=PADDING, gid="node:root"))
    tree_ax.text(root_x, 0.3, "root", color="white", ha="center", va="center", fontsize=6)
    for n in books.nodes:
        x, d = pos[n.id]
        cx, top = x * dx, d * dy
        px, pbottom = (root_x, 0.6) if n.parent is None else (pos[n.parent][0] * dx, pos[n.parent][1] * dy + h)
        tree_ax.plot([px, cx], [pbottom, top], color="#888", lw=0.8, zorder=0)
        new = n.id in books.highlight
        cell(tree_ax, cx - w / 2, top, STATE_FILL[n.state], labels[n.id], gid=f"node:{n.id}", w=w, h=h,
             edge=HIGHLIGHT if new else ("#333" if n.host_value is not None else "white"), lw=2.0 if new else 1.0,
             hatch="///" if n.state == "host" else None, fontsize=6)
    depth = max([d for _, d in pos.values()] + [1])
    tree_ax.set_xlim(-w / 2 - 0.3, right + w / 2 + 0.3)
    legend_y = depth * dy + h + 0.4  # a row of its own below the deepest nodes
    tree_ax.set_ylim(legend_y + 0.5, -0.2)
    for i, (state, fill) in enumerate(STATE_FILL.items()):
        label = {"locked": "locked", "evictable": "evictable leaf", "device": "on device", "host": "host only"}[state]
        cell(tree_ax, -w / 2 + i * 2.0, legend_y, fill, label, gid=f"legend:{state}", w=1.9, h=0.3,
             fontsize=6, hatch="///" if state == "host" else None)
    # the pools' cross-hatched pages, drawn like them (in a request's colour on the right)
    cell(tree_ax, -w / 2 + len(STATE_FILL) * 2.0, legend_y, "#c8c8c8", "a request's own", gid="legend:request",
         w=1.9, h=0.3, fontsize=6, hatch="xx")

    for ax, name, pages, owner_of, prefix in ((dev_ax, "device pool", books.device_pages, books.device_owner, "dpage"),
                                              (host_ax, "host pool", books.host_pages, books.host_owner, "hpage")):
        free = s.get("available" if prefix == "dpage" else "host_available", 0)
        unit = f"pages of {books.page_size}" if books.page_size > 1 else "slots"
        grid_axes(ax, f"{name}: {pages} {unit}, {free} tokens free")
        per_line = 8
        for p in range(pages + 1):
            y, x = divmod(p, per_line)
            owner = owner_of(p)
            label = p if books.page_size == 1 else f"p{p}"
            hatch = None
            if isinstance(owner, tuple):
                hatch = "xx" if owner[0] == "request" else "///" if books.node(owner[1]).state == "host" else None
            cell(ax, x * 1.05, y * 1.05, _page_fill(owner, books), label, gid=f"{prefix}:{p}", hatch=hatch)
        ax.set_xlim(-0.1, per_line * 1.05)
        ax.set_ylim((pages // per_line + 1) * 1.05 + 0.1, -0.4)
    fig.suptitle(caption_text(books.caption, books.note, fig), fontsize=10, x=0.01, ha="left")
    return fig
