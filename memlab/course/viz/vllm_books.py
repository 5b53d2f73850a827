"""vLLM's books (chapter 06): the block pool, each request's blocks (its block-table row), and the
free queue as the linked list it is.

The same four parts as every side of memlab.course.viz (see ``sglang_books``): the snapshot
(``VllmBooks``), the scene (``VllmScene`` drives a real ``KVCacheManager`` the way vLLM's
scheduler does and snaps ``VllmBooks`` after each step), the chapter's story (``prefix_cache``)
and the drawing (``draw_vllm``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memlab.course.viz.style import FREE, HIGHLIGHT, NULL, owner_color
from memlab.course.viz.svg import PART_FILL, Canvas, Swatch
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
    # block id -> short label of the hash it carries
    hashes: dict = field(default_factory=dict)
    # request id -> its block ids, block-table order
    req_blocks: dict = field(default_factory=dict)
    new: frozenset = frozenset()  # blocks popped from the free queue by this step
    hit: frozenset = frozenset()  # blocks a prefix-cache hit took by this step
    # blocks whose hash this step dropped (lazy eviction)
    evicted: frozenset = frozenset()
    note: str = ""
    # block id -> its hash's first 16 hex digits
    hash_hex: dict = field(default_factory=dict)
    # block id -> (prev, next) block ids in the free queue (None: the fake head or tail)
    links: dict = field(default_factory=dict)
    # request id -> (num_tokens, number of block hashes)
    req_tokens: dict = field(default_factory=dict)

    def owner(self, block_id: int) -> str | None:
        """The first request (in table order) that holds the block."""
        return next((r for r, ids in self.req_blocks.items() if block_id in ids), None)


# -- 2. the scene -----------------------------------------------------------------------------


class VllmScene:
    """A KVCacheManager driven like vLLM's scheduler: arrive (lookup, allocate), decode, finish."""

    def __init__(
        self, num_blocks: int, block_size: int = 4, enable_caching: bool = True
    ):
        self.manager = KVCacheManager(
            num_blocks, block_size=block_size, enable_caching=enable_caching
        )
        self.requests: dict[str, Request] = {}
        self.frames: list[VllmBooks] = []
        self._labels: dict = {}  # hash -> "h1", "h2", ... in order of first appearance

    def label(self, block_hash) -> str:
        return self._labels.setdefault(block_hash, f"h{len(self._labels) + 1}")

    def books(
        self, caption: str, new=(), hit=(), evicted=(), note: str = ""
    ) -> VllmBooks:
        pool = self.manager.block_pool
        for r in self.requests.values():  # label hashes in the order requests made them
            for h in r.block_hashes:
                self.label(h)
        hashes = {
            b.block_id: self.label(b.block_hash)
            for b in pool.blocks
            if b.block_hash is not None
        }
        return VllmBooks(
            caption,
            self.manager.block_size,
            pool.num_gpu_blocks,
            pool.null_block.block_id,
            tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks()),
            tuple(b.ref_cnt for b in pool.blocks),
            hashes,
            {rid: tuple(self.manager.get_block_ids(rid)) for rid in self.requests},
            frozenset(new),
            frozenset(hit),
            frozenset(evicted),
            note,
            {
                b.block_id: _hash_hex(b.block_hash)
                for b in pool.blocks
                if b.block_hash is not None
            },
            {
                b.block_id: (_link(b.prev_free_block), _link(b.next_free_block))
                for b in pool.free_block_queue.get_all_free_blocks()
            },
            {
                rid: (r.num_tokens, len(r.block_hashes))
                for rid, r in self.requests.items()
            },
        )

    def snap(self, caption: str, **kw) -> VllmBooks:
        b = self.books(caption, **kw)
        self.frames.append(b)
        return b

    def arrive(self, rid: str, token_ids) -> dict | None:
        """Look the prompt up in the prefix cache, then allocate its blocks; None when short."""
        req = Request(
            rid, list(token_ids), block_hasher=self.manager.request_block_hasher
        )
        hashed_before = {
            b.block_id
            for b in self.manager.block_pool.blocks
            if b.block_hash is not None
        }
        hits, n = self.manager.get_computed_blocks(req)
        new = self.manager.allocate_slots(req, req.num_tokens - n, n, hits)
        if new is None:
            return None
        req.num_computed_tokens = req.num_tokens
        self.requests[rid] = req
        new_ids = [b.block_id for b in new]  # in the order they left the free queue
        return dict(
            hit={b.block_id for b in hits},
            new=new_ids,
            hit_tokens=n,
            evicted={b for b in new_ids if b in hashed_before},
        )

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


def prefix_cache(
    enable_caching: bool = True, num_blocks: int = 12, block_size: int = 4
) -> VllmScene:
    """Chapter 06: vLLM's block pool; a prefix hit, reverse-order frees, lazy eviction."""
    sc = VllmScene(num_blocks, block_size, enable_caching)
    mode = "prefix caching on" if enable_caching else "prefix caching off"
    sc.snap(
        f"{mode}: block 0 is the null block, popped at start; blocks 1..{num_blocks - 1} are free"
    )

    def arrive(rid, tokens, what):
        r = sc.arrive(rid, tokens)
        if r is None:
            sc.snap(
                f"{rid} needs more blocks than are free: allocate_slots returns None, nothing "
                "changes"
            )
            return
        hit = (
            f"; {r['hit_tokens']} tokens hit the cache (blocks {sorted(r['hit'])})"
            if r["hit"]
            else ""
        )
        ev = (
            f"; block {sorted(r['evicted'])} still carried a hash: evicted now"
            if r["evicted"]
            else ""
        )
        sc.snap(
            f"{rid} arrives with {len(tokens)} tokens{what}: new blocks {r['new']}{hit}{ev}",
            new=r["new"],
            hit=r["hit"],
            evicted=r["evicted"],
        )

    prompt = list(range(10))
    arrive("A", prompt, "")
    for t in (100, 101):
        sc.decode("A", t)
    full_before, full = len(prompt) // block_size, (len(prompt) + 2) // block_size
    if full > full_before:
        chained = f" (chained on the {full - 1} before it)" if full > 1 else ""
        sc.snap(
            f"A decodes 2 tokens: its block number {full} fills up"
            + (f" and gets a hash{chained}" if enable_caching else "")
        )
    else:
        sc.snap("A decodes 2 tokens: no block of A's fills up")
    freed = sc.finish("A")
    where = (
        "in reverse, hashed ones to the TAIL: the prefix's end will be evicted before its start"
        if enable_caching
        else "in reverse, to the head (nothing is cached)"
    )
    sc.snap(f"A finishes: blocks {freed[::-1]} are freed {where}")
    arrive("B", prompt[:8] + [50, 51, 52], " (its first 8 are A's)")
    arrive("C", list(range(200, 224)), "")
    arrive("D", list(range(300, 308)), "")
    freed = sc.finish("B")
    sc.snap(
        f"B finishes: reversed {freed[::-1]}; "
        + (
            "the unhashed partial block goes to the head, hashed ones to the tail"
            if enable_caching
            else "all to the head, in that order"
        )
    )
    return sc


# -- 4. the drawing ---------------------------------------------------------------------------


def _block_fill(books: VllmBooks, b: int):
    if b == books.null_block:
        return NULL, 1.0
    if books.ref_cnt[b] > 0:
        return owner_color(books.owner(b)), 1.0
    return (CACHED, 1.0) if b in books.hashes else (FREE, 1.0)


def _link(block) -> int | None:
    """A free-queue neighbour's block id; None for the queue's fake head or tail."""
    return block.block_id if block is not None and block.block_id >= 0 else None


def _hash_hex(h) -> str:
    return h.hex()[:16] if isinstance(h, bytes) else f"{h:016x}"[:16]


def block_tip(books: VllmBooks, b: int) -> str:
    """What block ``b`` is: its id, ref count, hash, who holds it and where, its place in the
    queue."""
    if b == books.null_block:
        return f"block {b}: the null block (popped at start, never freed)"
    words = [f"block {b}", f"ref_cnt {books.ref_cnt[b]}"]
    words.append(
        f"hash {books.hashes[b]} = {books.hash_hex[b]}…"
        if b in books.hashes
        else "no hash"
    )
    bs = books.block_size
    for rid, ids in books.req_blocks.items():
        for j, x in enumerate(ids):
            if x == b:
                words.append(f"{rid}'s block {j} (tokens {j * bs}-{j * bs + bs - 1})")
    if b in books.queue:
        i = books.queue.index(b)
        prev, nxt = books.links.get(b, (None, None))
        if i == 0:
            where = "head: reused first"
        else:
            where = "tail" if i == len(books.queue) - 1 else "middle"
        prev = "fake head" if prev is None else prev
        nxt = "fake tail" if nxt is None else nxt
        words.append(f"free queue #{i} ({where}; prev {prev}, next {nxt})")
        if b in books.hashes:
            words.append("cached: a hit revives it, a reuse evicts its hash")
    return " · ".join(words)


def draw_vllm(books: VllmBooks, still: bool = False) -> str:
    """The pool (every block with its hash and ref count), each request's block table, and the
    free queue as the linked list it is, head -> tail, as inline SVG under the caption; the
    step's new blocks (black edge), cache hits (hatched) and evictions (red edge) marked."""
    c = Canvas(
        "hover a block: its id, ref_cnt, hash, owner and place in the free queue"
    )
    new, hit, evicted = books.new, books.hit, books.evicted
    w = 34

    def block_cell(x, y, b, gid):
        fill, _ = _block_fill(books, b)
        edge = EVICTED if b in evicted else HIGHLIGHT if b in new | hit else "#999"
        c.cell(
            x,
            y,
            fill,
            "null" if b == books.null_block else b,
            tip=block_tip(books, b),
            gid=gid,
            w=w,
            h=w,
            stroke=edge,
            stroke_width=2.5 if edge != "#999" else 1,
            pattern=PART_FILL[1] if b in hit else None,
        )

    y = c.caption(4, 4.0, books.caption, books.note, 600)
    c.text(
        4,
        y + 13,
        f"block pool: {books.num_blocks} blocks of {books.block_size} tokens · "
        f"get_num_free_blocks() = {len(books.queue)}",
        size=12.5,
        weight="bold",
    )
    y += 22
    for b in range(books.num_blocks):
        x = 4 + b * (w + 6)
        block_cell(x, y, b, f"block:{b}")
        c.text(
            x + w / 2,
            y + w + 12,
            books.hashes.get(b, ""),
            size=10,
            anchor="middle",
            color="#00695c",
        )
        if b != books.null_block:
            rc = f"rc {books.ref_cnt[b]}"
            c.text(x + w / 2, y + w + 24, rc, size=9.5, anchor="middle", color="#555")
    y += w + 36
    c.text(4, y + 13, "requests' blocks (block-table rows)", size=12.5, weight="bold")
    y += 20
    if not books.req_blocks:
        c.text(4, y + 14, "(no running request)", size=11, color="#777")
        y += 24
    for rid, ids in books.req_blocks.items():
        c.text(4, y + 22, rid, size=12, weight="bold")
        for j, b in enumerate(ids):
            block_cell(40 + j * (w + 2), y, b, f"table:{rid}:{j}")
        if rid in books.req_tokens:
            tokens, hashed = books.req_tokens[rid]
            c.text(
                44 + len(ids) * (w + 2),
                y + 22,
                f"{tokens} tokens, {hashed} hashed",
                size=10.5,
                color="#555",
            )
        y += w + 6
    y += 8
    c.text(
        4,
        y + 13,
        "free queue: a doubly linked list, head (taken first) <-> ... <-> tail",
        size=12.5,
        weight="bold",
    )
    y += 20
    step_x = w + 22
    per_line = max(1, int((max(c.width, 560) - 80) // step_x))
    if not books.queue:
        empty = "head <-> tail: empty, every block but the null one is held"
        c.text(4, y + 22, empty, size=11, color="#777")
    else:
        c.text(4, y + 22, "head", size=11, color="#555")
    for i, b in enumerate(books.queue):
        line, col = divmod(i, per_line)
        x, yy = 44 + col * step_x, y + line * (w + 10)
        if col:
            c.text(x - 11, yy + 21, "⇄", size=13, anchor="middle", color="#666")
        block_cell(x, yy, b, f"queue:{i}:{b}")
    last_line = max(0, (len(books.queue) - 1) // per_line)
    if books.queue:
        end_x = 44 + ((len(books.queue) - 1) % per_line + 1) * step_x
        c.text(end_x - 14, y + last_line * (w + 10) + 22, "tail", size=11, color="#555")
    y += (last_line + 1) * (w + 10) + 6
    sw = [
        Swatch("free", FREE),
        Swatch("free, cached (a hash)", CACHED),
        Swatch("null block", NULL),
        Swatch("held (owner's colour)", owner_color("A")),
    ]
    if hit:
        sw.append(Swatch("taken by a cache hit", owner_color("A"), PART_FILL[1]))
    if new:
        sw.append(
            Swatch(
                "taken or freed by this call", "#fff", stroke=HIGHLIGHT, stroke_width=2
            )
        )
    if evicted:
        sw.append(
            Swatch("its hash evicted now", "#ffffff", stroke=EVICTED, stroke_width=2.5)
        )
    c.legend(4, y, sw)
    return c.html(still)


# -- 5. the instrument: the learner's own prompts on a real KVCacheManager --------------------

# prefix_cache(True)'s steps, in the instrument's words
STORY_STEPS = (
    ("submit", dict(request="A", prompt="0 1 2 3 4 5 6 7 8 9")),
    ("decode", dict(request="A", tokens="100")),
    ("decode", dict(request="A", tokens="101")),
    ("finish", dict(request="A")),
    ("submit", dict(request="B", prompt="0 1 2 3 4 5 6 7 50 51 52")),
    ("submit", dict(request="C", prompt=" ".join(map(str, range(200, 224))))),
    ("submit", dict(request="D", prompt=" ".join(map(str, range(300, 308))))),
    ("finish", dict(request="B")),
)


def prompt_ids(sc: VllmScene, text) -> list[int]:
    """Token ids from what the learner typed: whole numbers as they are; words get ids 1000, 1001,
    ... in order of first appearance (the same word, the same id, so words can share a prefix)."""
    from memlab.course.viz.instrument import InputError

    if isinstance(text, (list, tuple)):
        return [int(t) for t in text]
    vocab = sc.__dict__.setdefault("vocab", {})
    out = []
    for w in str(text).replace(",", " ").split():
        try:
            out.append(int(w))
        except ValueError:
            if not w.isprintable():
                raise InputError(f"{w!r} is not a word") from None
            out.append(vocab.setdefault(w, 1000 + len(vocab)))
    return out


def _ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def _op_submit(sc: VllmScene, step, request, prompt) -> None:
    """A prompt arrives: the scheduler looks it up (``get_computed_blocks``), then allocates the
    rest after the hits (``allocate_slots``); the calls shown are the recorded ones."""
    from memlab.course.viz.instrument import InputError, recording, spell_value

    if not request or not str(request).isidentifier():
        raise InputError(f"request id {request!r}: type a short name such as E")
    if request in sc.requests:
        raise InputError(
            f"request {request!r} is running: finish it first (a request id is unique)"
        )
    tokens = prompt_ids(sc, prompt)
    step.call = (
        f"req = Request({request!r}, {spell_value(tokens)}, "
        "block_hasher=manager.request_block_hasher)"
    )
    m = sc.manager
    with (
        recording(m, "get_computed_blocks") as looked,
        recording(m, "allocate_slots") as alloc,
    ):
        got = sc.arrive(request, tokens)
    if looked:
        hits, n = looked[0]["result"]
        step.call += (
            f"\nhits, num_hit_tokens = manager.get_computed_blocks(req)  # blocks {_ids(hits)}, "
            f"{n} tokens"
        )
    if alloc:
        a = alloc[0]["args"]
        step.call += (
            f"\nmanager.allocate_slots(req, {a['num_new_tokens']}, "
            f"{a.get('num_new_computed_tokens', 0)}"
            + (", hits)" if a.get("new_computed_blocks") else ")")
        )
        new = alloc[0]["result"]
        step.result = "None" if new is None else f"blocks {_ids(new)}"
    if got is None:
        pool = m.block_pool
        step.refuse(
            f"refused (allocate_slots returns None): the prompt needs more blocks than the "
            f"{pool.get_num_free_blocks()} free (get_num_free_blocks()); nothing was taken"
        )
        return
    # names the new hashes h1, h2, ... in the order they appear, as the story does
    sc.books("")
    step.marks = dict(new=set(got["new"]), hit=got["hit"], evicted=got["evicted"])
    ev = (
        f"; block {sorted(got['evicted'])} carried a hash: evicted"
        if got["evicted"]
        else ""
    )
    step.caption = (
        f"{request} arrives with {len(tokens)} tokens: {got['hit_tokens']} hit (blocks "
        f"{sorted(got['hit'])}), new blocks {got['new']}{ev}"
    )


def _op_decode(sc: VllmScene, step, request, tokens) -> None:
    """The request decodes: each token is appended and ``allocate_slots(req, 1)`` makes room."""
    from memlab.course.viz.instrument import InputError, recording

    if request not in sc.requests:
        raise InputError(f"{request!r} is not running")
    ids = prompt_ids(sc, tokens)
    if not ids:
        raise InputError("type at least one token to decode")
    req = sc.requests[request]
    hashed_before = {
        b.block_id for b in sc.manager.block_pool.blocks if b.block_hash is not None
    }
    lines, new_all, done = [], [], 0
    with recording(sc.manager, "allocate_slots") as calls:
        for t in ids:
            got = sc.decode(request, t)
            if got is None:
                # vLLM's scheduler would preempt; here the token that found no block is taken back
                req.all_token_ids.pop()
                break
            done += 1
            new_all += sorted(got)
    for t, c in zip(ids, calls):
        res = c["result"]
        lines.append(
            f"req.append_output_token_ids({t}); manager.allocate_slots(req, 1)  # -> "
            + ("None" if res is None else f"blocks {_ids(res)}")
        )
    step.call = "\n".join(lines)
    if done < len(ids):
        step.refuse(
            f"refused (allocate_slots returns None) at token {ids[done]}: no free block for it "
            f"(get_num_free_blocks() = {sc.manager.block_pool.get_num_free_blocks()}); vLLM would "
            "preempt a request"
        )
        return
    sc.books("")
    step.result = f"new blocks {new_all}; {request} holds {req.num_tokens} tokens"
    step.marks = dict(
        new=set(new_all), evicted={b for b in new_all if b in hashed_before}
    )
    step.caption = f"{request} decodes {len(ids)} token(s): new blocks {new_all}"


def _op_finish(sc: VllmScene, step, request) -> None:
    """The request finishes: ``manager.free(req)`` frees its blocks in reverse order."""
    from memlab.course.viz.instrument import InputError

    if request not in sc.requests:
        raise InputError(f"{request!r} is not running")
    step.call = f"manager.free(req)  # req = the Request {request!r}"
    freed = sc.finish(request)
    q = [
        b.block_id for b in sc.manager.block_pool.free_block_queue.get_all_free_blocks()
    ]
    step.result = f"blocks {freed[::-1]} freed, in that order; free queue {q}"
    step.marks = dict(new=set(freed))
    step.caption = (
        f"{request} finishes: blocks {freed[::-1]} go back (hashed ones to the tail)"
    )


def vllm_books(sc: VllmScene) -> dict:
    """The numbers chapter 06's instrument lists, read from the real KVCacheManager."""
    pool = sc.manager.block_pool
    books = sc.books("")
    out = {
        "get_num_free_blocks()": pool.get_num_free_blocks(),
        "free queue (head -> tail)": [
            b.block_id for b in pool.free_block_queue.get_all_free_blocks()
        ],
        "ref_cnt": {b.block_id: b.ref_cnt for b in pool.blocks if b.ref_cnt},
        "hashed blocks": dict(sorted(books.hashes.items())),
        "num_evictions": pool.num_evictions,
    }
    for rid, req in sc.requests.items():
        out[f"request {rid}"] = dict(
            blocks=sc.manager.get_block_ids(rid),
            tokens=req.num_tokens,
            num_computed_tokens=req.num_computed_tokens,
            hashes=len(req.block_hashes),
        )
    return out


def block_pool_instrument(
    enable_caching: bool = True,
    num_blocks: int = 12,
    block_size: int = 4,
    opening=STORY_STEPS,
    prompt="0 1 2 3 4 5 6 7 60 61",
):
    """Chapter 06's instrument: submit a prompt (token ids or words), decode, finish, on a real
    KVCacheManager; prefix caching on or off. Opens on the story's last state."""
    import ipywidgets as W

    from memlab.course.viz.instrument import Field, Instrument, Operation

    def build(prefix_caching):
        sc = VllmScene(num_blocks, block_size, prefix_caching == "on")
        sc.vocab = {}
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
        return list(sc.requests)

    submit = Operation(
        "submit",
        _op_submit,
        [
            Field("request", box("request", "E", "130px"), str),
            Field("prompt", box("prompt", prompt, "330px"), str),
        ],
        label="submit",
        help="get_computed_blocks, then allocate_slots",
    )
    who = W.Dropdown(description="request", layout=W.Layout(width="160px"))
    # field names are the instrument's (one widget each), so the two dropdowns have their own
    decode = Operation(
        "decode",
        lambda sc, step, running, tokens: _op_decode(sc, step, running, tokens),
        [
            Field("running", who, str, options=running),
            Field("tokens", box("tokens", "70", "150px"), str),
        ],
        label="decode",
        help="append each token, allocate_slots(req, 1)",
    )
    who2 = W.Dropdown(description="request", layout=W.Layout(width="160px"))
    finish = Operation(
        "finish",
        lambda sc, step, finishing: _op_finish(sc, step, finishing),
        [Field("finishing", who2, str, options=running)],
        label="finish",
        help="manager.free(req): the request's blocks go back, in reverse order",
    )
    caching = W.ToggleButtons(
        options=["on", "off"],
        value="on" if enable_caching else "off",
        description="prefix caching",
        style={"button_width": "42px"},
    )
    steps = [(op, dict(args)) for op, args in opening]
    for op, args in steps:  # the operations' own argument names
        if op == "decode":
            args["running"] = args.pop("request")
        elif op == "finish":
            args["finishing"] = args.pop("request")
    return Instrument(
        build,
        [submit, decode, finish],
        lambda sc, step: draw_vllm(sc.books("", **(step.marks if step else {}))),
        vllm_books,
        settings={"prefix_caching": caching},
        opening=steps,
        title="vLLM's block pool: your own prompts",
    )
