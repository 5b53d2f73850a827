"""Graded: chapter 12, a sub-pool's books in virtual pages (exercises/ch12_virtual_pages.py).

Hand cases first (each says what it teaches), then seeded random streams against memlab's own
unified allocator (memlab.sglang.unified): translations after every step, the capacity of both
ends of a pair, and every eager compaction, at page sizes 1 to 6, with ids freed in random order.
A failing random case names its seed, its step and its inputs.
"""

import pytest
import torch

from memlab.course.grading.checks import (
    CheckFailed,
    call_keeping_inputs,
    expect_equal,
    expect_tensor,
    plural,
)
from memlab.course.grading.loader import load
from memlab.sglang.unified import (
    MHASubPoolSpec,
    MultiEndedAllocator,
    UnifiedKVPool,
    translate_token_ids,
)
from memlab_tests.exercises.exercise_refs import i64

PAGE_SIZES = (1, 2, 3, 4, 5, 6)


def points(n, requires=None):
    """Worth n points; with ``requires``, only once that (core) test passes."""
    return pytest.mark.points(n, exercise="ch12.virtual_pages", requires=requires)


def ex():
    return load("ch12_virtual_pages")


def translate(loc, v2p, ps):
    """The learner's translate, which may change neither input."""
    return call_keeping_inputs(ex().translate, "translate", loc, v2p, ps)


def compact(grow, wm, freed, v2p, p2v):
    """The learner's compact_after_free, which may change v2p and p2v but not freed_pages."""
    return call_keeping_inputs(
        ex().compact_after_free,
        "compact_after_free",
        grow,
        wm,
        freed,
        v2p,
        p2v,
        mutable=("argument 4", "argument 5"),
    )


# -- translate ---------------------------------------------------------------------------------


@points(2)
def test_translate_by_hand(rng):
    # page 0: the sink; virtual page 1 -> 5, 2 unbound, 3 -> 2; the last: -1
    v2p = i64(0, 5, -1, 2, -1)
    got = translate(i64(2, 3, 6, 7), v2p, 2)
    expect_tensor(got, "translate's result", torch.int64, 4)
    expect_equal(
        got,
        i64(10, 11, 4, 5),
        "virtual ids 2, 3 (page 1 -> physical page 5) and 6, 7 (page 3 -> 2), "
        "page size 2: v2p[t // 2] * 2 + t % 2",
    )
    expect_equal(
        translate(i64(5, 4, 3), v2p, 2),
        i64(0, 0, 11),
        "virtual ids 5, 4 sit in page 2, which is "
        "unbound (-1): they go to 0, the sink, not to -2 + offset",
    )
    expect_equal(
        translate(i64(-1, -2, 10, 11, 8), v2p, 2),
        i64(0, 0, 0, 0, 0),
        "negative ids, ids past the table "
        "(page 5 of a 5-entry table) and the table's last entry (-1): all to the sink 0",
    )
    expect_equal(
        translate(i64(1, 3, 0), v2p, 1),
        i64(5, 2, 0),
        "page size 1: a virtual page is a token",
    )
    expect_equal(
        translate(torch.tensor([3, 2], dtype=torch.int32), v2p, 2),
        i64(11, 10),
        "int32 ids in: int64 physical ids out (v2p is int64)",
    )
    expect_equal(translate(i64(), v2p, 3), i64(), "no ids: an empty int64 tensor")
    expect_equal(
        translate(i64(7, 5, 9), i64(0, 2, 1, -1), 3),
        i64(4, 8, 0),
        "page size 3, v2p [0, 2, 1, -1]: id 7 is page 2, offset 1 (-> 1 * 3 + 1), id 5 "
        "page 1, offset 2 (-> 2 * 3 + 2), id 9 page 3 (-1)",
    )
    for _ in range(3):
        ps, n = rng.choice(PAGE_SIZES), rng.randint(3, 40)
        pages = rng.sample(range(1, 10_000), n - 1)
        v2p = i64(0, *[p if rng.random() < 0.7 else -1 for p in pages], -1)
        loc = i64(
            *[rng.randint(-2 * ps, (n + 2) * ps) for _ in range(rng.randint(1, 30))]
        )
        check_translation(loc, v2p, ps, f"page size {ps}, v2p = {v2p.tolist()}")


def check_translation(loc, v2p, ps, what):
    got = translate(loc, v2p, ps)
    want = translate_token_ids(loc, v2p, ps)
    try:
        expect_equal(got, want, what)
    except CheckFailed:  # shrink to the first id that differs
        g, w = as_ints(got), want.tolist()
        i = next((i for i in range(min(len(g), len(w))) if g[i] != w[i]), None)
        if i is None:
            raise
        raise CheckFailed(
            f"{what}: virtual id {int(loc[i])} translates to {g[i]}, expected {w[i]} "
            f"(page size {ps}, v2p = {v2p.tolist()})"
        ) from None


def as_ints(t):
    return t.tolist() if isinstance(t, torch.Tensor) else list(t)


def random_tables(d):
    """Random page tables, bound and unbound between translations, and ids in and out of range."""
    from memlab.course.grading.fuzz import tensor_code

    ps, n = d.pick(PAGE_SIZES), d.int(2, 24)
    v2p = torch.full((n + 1,), -1, dtype=torch.int64)
    v2p[0] = 0
    d.given(page_size=ps)
    for _step in d.count(1, 3):
        for v, p in zip(range(1, n), d.sample(range(1, 3 * n), n - 1)):
            v2p[v] = p if d.chance(0.7) else -1
        dtype = d.pick([torch.int64, torch.int32])
        loc = torch.tensor(
            [d.int(-2 * ps, (n + 3) * ps) for _ in d.count(0, 30, 0.9)], dtype=dtype
        )
        d.step(
            f"translate({loc.tolist()}, v2p={v2p.tolist()}, page_size={ps}) with {dtype}"
        )
        d.code(
            f"print(ex.translate({tensor_code(loc.tolist(), str(dtype).split('.')[-1])}, "
            f"{tensor_code(v2p.tolist())}, {ps}))"
        )
        got = d.call("translate", ex().translate, loc, v2p, ps)
        d.returns("translate", got, translate_token_ids(loc, v2p, ps))


@points(1)
def test_translate_random_tables():
    from memlab.course.grading.fuzz import check

    check(random_tables, trials=60, name="ch12_virtual_pages")


# -- available_tokens --------------------------------------------------------------------------


@points(2)
def test_available_tokens_by_hand(rng):
    f = ex().available_tokens
    # A 2048-byte buffer; the up side's pages are 32 bytes, it uses pages 2..5; the
    # neighbour starts at 1792.
    expect_equal(
        f("up", 6, 64, 2, 32, 1, 1792),
        50,
        "up: pages 2..5 in use (frontier at 6 x 32 = 192), the "
        "neighbour at byte 1792: (1792 - 192) // 32 = 50 pages of gap, 58 page numbers left",
    )
    expect_equal(
        f("down", 12, 16, 1, 128, 2, 512),
        18,
        "down: pages 13..15 in use (frontier at 13 x 128 = 1664), "
        "the neighbour ends at byte 512: (1664 - 512) // 128 = 9 pages of 2 tokens",
    )
    expect_equal(
        f("up", 6, 64, 2, 32, 1, 2048 + 4096),
        58,
        "up, the gap larger than its page numbers: 64 - 2 - 4 "
        "= 58 pages it has never used bound it",
    )
    expect_equal(
        f("down", 12, 16, 1, 128, 2, 0),
        24,
        "down with nothing below: 13 x 128 bytes of gap, but only "
        "12 of its page numbers (1..12) left: 12 pages of 2 tokens",
    )
    expect_equal(
        f("up", 6, 64, 2, 32, 3, 192 + 95),
        6,
        "up, 95 bytes of gap, pages of 32 bytes (3 tokens): 2 whole pages, 6 tokens",
    )
    expect_equal(
        f("down", 12, 16, 1, 128, 2, 1700),
        0,
        "down, the neighbour's frontier (1700) above its own "
        "(1664): the frontiers crossed, no gap",
    )
    expect_equal(
        f("up", 6, 64, 2, 32, 1, 100), 0, "up, the neighbour below its frontier: no gap"
    )
    expect_equal(
        f("up", 6, 64, 2, 1, 1, 6),
        0,
        "up, entries of 1 byte, the neighbour right at the frontier "
        "(byte 6): a gap of 0 bytes holds no page",
    )
    expect_equal(
        f("down", 15, 16, 1, 128, 4, 1000),
        32,
        "down with nothing in use (watermark num_pages - 1 = "
        "15): (16 x 128 - 1000) // 128 = 8 pages of 4 tokens",
    )
    for _ in range(4):
        grow = rng.choice(("up", "down"))
        num_pages, low = rng.randint(8, 200), rng.randint(1, 2)
        entry, ps = rng.randint(1, 4096), rng.randint(1, 8)
        used = rng.randint(0, num_pages - low - 1)
        never = num_pages - low - used  # page numbers it has never used
        pages = rng.choice((rng.randint(0, never), never + rng.randint(1, 50)))
        # whole pages, and a part of one
        gap = pages * entry + rng.randint(0, entry - 1)
        if grow == "up":
            wm = low + used
            frontier = wm * entry + gap
        else:
            wm = num_pages - 1 - used
            frontier = (wm + 1) * entry - gap
        expect_equal(
            f(grow, wm, num_pages, low, entry, ps, frontier),
            min(pages, never) * ps,
            f"{grow}, {plural(used, 'page')} in use (watermark {wm}) of page numbers "
            f"{low}..{num_pages - 1}, entries of {plural(entry, 'byte')}, a gap of "
            f"{plural(gap, 'byte')}: "
            f"{plural(pages, 'whole page')} of gap, {plural(never, 'page number')} never "
            "used; in tokens of "
            f"pages of {ps}",
        )


# -- compact_after_free ------------------------------------------------------------------------


def tables(n_virtual, n_pages, bound, names=None):
    """v2p and p2v with the virtual pages of ``bound`` (virtual page: physical page) bound;
    ``names`` renames virtual page v to ``names[v]`` (a compaction never depends on them)."""
    names = names or {}
    v2p = torch.full((n_virtual + 1,), -1, dtype=torch.int64)
    p2v = torch.full((n_pages + 1,), -1, dtype=torch.int64)
    v2p[0] = p2v[0] = 0
    for v, p in bound.items():
        v2p[names.get(v, v)], p2v[p] = p, names.get(v, v)
    return v2p, p2v


def renamed(rng, n_virtual):
    """Random names for the virtual pages 1..n_virtual - 1 (the last entry stays -1): a
    compaction moves physical pages and never depends on which virtual pages they hold."""
    pages = range(1, n_virtual)
    return dict(zip(pages, rng.sample(pages, len(pages))))


def rename_v2p(v2p, names):
    out = list(v2p)
    for v, w in names.items():
        out[w] = v2p[v]
    return out


def rename_p2v(p2v, names):
    return [names.get(v, v) for v in p2v]


@points(1)
def test_compact_down_moves_the_bottom_pages_up(rng):
    # A grow-down sub-pool of 8 pages uses 3..7 (watermark 2) for virtual pages 1..5; 4
    # and 5 are freed.
    names = renamed(rng, 9)
    v2p, p2v = tables(9, 8, {1: 3, 2: 4, 3: 5, 4: 6, 5: 7}, names)
    v2p[names[4]] = v2p[names[5]] = -1  # the caller unbinds first
    out = compact("down", 2, [6, 7], v2p, p2v)
    expect_equal(
        out,
        (4, [3, 4], [6, 7]),
        "down, pages 6 and 7 freed: the watermark moves up by 2 to 4, the band (2, 4] = "
        "pages 3, 4 is given up, their pages move into 6 and 7 (return a tuple: an int "
        "and two lists)",
    )
    expect_equal(
        v2p,
        i64(*rename_v2p([0, 6, 7, 5, -1, -1, -1, -1, -1, -1], names)),
        f"v2p after the moves: virtual page {names[1]} -> 6, {names[2]} -> 7",
    )
    expect_equal(
        p2v,
        i64(*rename_p2v([0, -1, -1, -1, -1, 3, 1, 2, -1], names)),
        f"p2v after the moves: pages 6, 7 hold virtual pages {names[1]}, {names[2]}; "
        "the band (3, 4) is unused",
    )


@points(1)
def test_compact_up_with_holes_inside_and_at_the_frontier(rng):
    names = renamed(rng, 9)
    # up: pages 2..9 in use, watermark 10
    v2p, p2v = tables(9, 12, {v: v + 1 for v in range(1, 9)}, names)
    v2p[names[4]] = v2p[names[1]] = v2p[names[8]] = -1
    freed = [5, 2, 9]  # out of order, one at the frontier
    out = compact("up", 10, freed, v2p, p2v)
    expect_equal(
        out,
        (7, [7, 8], [2, 5]),
        "up, pages 5, 2 and 9 freed: the watermark drops by 3 to 7; of the band [7, 10) "
        "page 9 was freed, pages 7 and 8 move into the holes below, lowest first: 2, "
        "then 5",
    )
    expect_equal(
        v2p.tolist(),
        rename_v2p([0, -1, 3, 4, -1, 6, 2, 5, -1, -1], names),
        f"v2p: virtual page {names[6]} now on page 2, {names[7]} on page 5",
    )
    expect_equal(
        p2v.tolist(),
        rename_p2v([0, -1, 6, 2, 3, 7, 5, -1, -1, -1, -1, -1, -1], names),
        "p2v: pages 7, 8, 9 unused",
    )
    expect_equal(freed, [5, 2, 9], "compact_after_free must not reorder freed_pages")


@points(1, requires="test_compact_down_moves_the_bottom_pages_up")
def test_compact_at_the_frontier_moves_nothing(rng):
    names = renamed(rng, 9)
    v2p, p2v = tables(9, 10, {1: 2, 2: 3, 3: 4}, names)
    v2p[names[3]] = v2p[names[2]] = -1
    expect_equal(
        compact("up", 5, [4, 3], v2p, p2v),
        (3, [], []),
        "up, the two top pages freed: nothing moves, the watermark drops to 3",
    )
    expect_equal(
        p2v.tolist(),
        rename_p2v([0, -1, 1, -1, -1, -1, -1, -1, -1, -1, -1], names),
        "p2v: the band [3, 5) unused",
    )
    v2p, p2v = tables(9, 10, {1: 2}, names)
    expect_equal(
        compact("down", 4, [], v2p, p2v), (4, [], []), "nothing freed: nothing changes"
    )
    expect_equal(
        p2v.tolist(),
        rename_p2v([0, -1, 1, -1, -1, -1, -1, -1, -1, -1, -1], names),
        "nothing freed: p2v as it was",
    )


# -- random streams against memlab's own allocators ---------------------------------------------


class Recording:
    def __init__(self):
        self.moves = []

    def move_physical_pages(self, tgt, src, page_size):
        self.moves.append((src.tolist(), tgt.tolist()))


def end_pair(d, ps):
    def spec(name, grow):
        return MHASubPoolSpec(
            name=name,
            layer_num=1,
            head_num=1,
            head_dim=d.pick([8, 16, 24]),
            store_dtype=torch.float16,
            grow_direction=grow,
        )

    pool = UnifiedKVPool(
        total_bytes=d.int(24, 60) * 64 * ps,
        sub_pool_specs=[spec("full", "down"), spec("swa", "up")],
        page_size=ps,
    )

    def mk(name):
        return MultiEndedAllocator(
            kvcache=Recording(),
            unified_buffer=pool,
            sub_pool_name=name,
            is_id_owner=True,
            page_size=ps,
        )

    down, up = mk("full"), mk("swa")
    down.bind_peer(up), up.bind_peer(down)
    return down, up


def frontier_of(peer, grow):
    """The neighbour's frontier facing this side, in bytes."""
    return peer._byte_low_frontier() if grow == "up" else peer._byte_high_frontier()


def stream(d):
    """(side, its peer, the tokens about to be freed or None) for every step of a random stream of
    allocations and frees on both ends of a pair, ids freed in random order."""
    ps = d.pick(PAGE_SIZES)
    pair, live = end_pair(d, ps), [[], []]
    d.given(page_size=ps, total_bytes=pair[0].unified_buffer.total_bytes)
    total = pair[0].unified_buffer.total_bytes
    d.code(f"# a pair of end sub-pools over one {total}-byte buffer at page size {ps}")
    for _ in d.count(1, 40, 0.95):
        i = d.int(0, 1)
        a, peer = pair[i], pair[1 - i]
        side = "down" if i == 0 else "up"
        if not live[i] or d.chance(0.55):
            n = d.int(1, 5) * ps
            got = a.alloc(n)
            d.step(
                f"the {side} side allocates {plural(n, 'token')}"
                + ("" if got is not None else " (refused: full)")
            )
            if got is not None:
                live[i].append(got.tolist())
            yield a, peer, None
        else:
            ids = live[i].pop(d.int(0, len(live[i]) - 1))
            d.step(f"the {side} side frees {plural(len(ids), 'token')}")
            yield a, peer, d.shuffled(ids)


def available_case(d):
    f = ex().available_tokens
    for a, peer, _ in stream(d):
        for side, other in ((a, peer), (peer, a)):
            args = (
                side.grow_direction,
                side.watermark_physical,
                side.num_pages,
                side.min_page_index,
                side.entry_bytes_per_page,
                side.page_size,
                frontier_of(other, side.grow_direction),
            )
            d.code(f"print(ex.available_tokens{args})")
            d.returns(
                f"available_tokens{args}",
                d.call("available_tokens", f, *args),
                side.available_size(),
            )


@points(1)
def test_available_tokens_random_streams():
    from memlab.course.grading.fuzz import check

    check(available_case, trials=12, name="ch12_virtual_pages")


def compact_case(d):
    for a, _peer, freeing in stream(d):
        if freeing is None:
            continue
        ps = a.page_size
        pages = sorted({t // ps for t in freeing})
        freed = a.virtual_to_physical[pages].tolist()
        order = d.shuffled(freed)  # the freed pages in any order
        v2p, p2v = a.virtual_to_physical.clone(), a.physical_to_virtual.clone()
        v2p[pages] = -1
        wm, kv = a.watermark_physical, a._kvcache
        kv.moves.clear()
        what = f"compact_after_free({a.grow_direction!r}, {wm}, {order}, v2p, p2v)"
        given = list(order)
        got = d.call(
            "compact_after_free",
            ex().compact_after_free,
            a.grow_direction,
            wm,
            order,
            v2p,
            p2v,
            keep=False,
        )
        d.same(
            "freed_pages after your compact_after_free (it may not change them)",
            order,
            given,
        )
        a.free(i64(*freeing))
        src, dst = kv.moves[0] if kv.moves else ([], [])
        d.returns(what, got, (a.watermark_physical, src, dst))
        d.books(what, "v2p", v2p, a.virtual_to_physical)
        d.books(what, "p2v", p2v, a.physical_to_virtual)


@points(1)
def test_compact_random_streams():
    from memlab.course.grading.fuzz import check

    check(compact_case, trials=12, name="ch12_virtual_pages")
