"""memlab.course.viz without a browser: drawings show the right owners, colours and labels for a
given state (the books' SVG read cell by cell, the charts' matplotlib artists by gid); widgets
re-render through their observers; scenes replay the real library."""

import xml.etree.ElementTree as ET
from typing import NamedTuple

import pytest
import torch

from memlab.course.viz import hybrid_books, sglang_books, vllm_books
from memlab.course.viz.sglang_books import Scene, draw_books, read_books
from memlab.course.viz.style import (
    FREE,
    HIGHLIGHT,
    PADDING,
    STAGED,
    owner_color,
    same_color,
    text_color,
)
from memlab.course.viz.svg import PART_FILL
from memlab.course.viz.widgets import Explorer, Stepper
from memlab.sglang.allocator import TokenToKVPoolAllocator
from memlab.sglang.req_to_token import ReqToTokenPool

# -- helpers ------------------------------------------------------------------------------------


def by_gid(fig, prefix):
    """A chart's artists whose gid starts with ``prefix``, by gid (the charts tag every bar)."""
    found = {}
    for a in fig.findobj(
        lambda a: isinstance(a.get_gid(), str) and a.get_gid().startswith(prefix)
    ):
        found[a.get_gid()] = a
    return found


SVG = "{http://www.w3.org/2000/svg}"


class Cell(NamedTuple):
    """One cell of a books picture, as the SVG draws it."""

    fill: str
    opacity: float
    stroke: str
    stroke_width: float
    dash: str | None
    pattern: str | None  # the paint drawn over the fill (a part's hatching)
    label: str
    tip: str


def cells_of(svg: str, prefix: str) -> dict[str, Cell]:
    """The cells whose gid starts with ``prefix``, by gid (the SVG parsed: it must be
    well-formed)."""
    found = {}
    for g in ET.fromstring(svg).iter(f"{SVG}g"):
        gid = g.get("data-gid") or ""
        if not gid.startswith(prefix):
            continue
        box, *over = g.findall(f"{SVG}rect")
        text, title = g.find(f"{SVG}text"), g.find(f"{SVG}title")
        found[gid] = Cell(
            box.get("fill"),
            float(box.get("fill-opacity")),
            box.get("stroke"),
            float(box.get("stroke-width")),
            box.get("stroke-dasharray"),
            over[0].get("fill") if over else None,
            "" if text is None else text.text,
            "" if title is None else title.text,
        )
    return found


def texts_of(svg: str) -> list[str]:
    """Every line of text the SVG draws (not the tooltips)."""
    root = ET.fromstring(svg)
    return [t.text for t in root.iter(f"{SVG}text") if t.text] + [
        t.text for t in root.iter(f"{SVG}tspan") if t.text
    ]


def is_new(cell: Cell) -> bool:
    return same_color(cell.stroke, HIGHLIGHT) and cell.stroke_width > 1


@pytest.fixture(scope="module")
def orientation():
    return sglang_books.orientation()


def expected_slot_fill(books, s):
    """What draw_slot_grid must paint slot ``s``, derived from the books independently."""
    page = s // books.page_size
    if page == 0:
        return PADDING, 1.0
    if page in books.staged_pages:
        return STAGED, 1.0
    if page in books.free_pages:
        return FREE, 1.0
    owner = {x: r.owner for r in books.rows if r.owner for x in r.slots}
    if s in owner:
        return owner_color(owner[s]), 1.0
    page_owner = {
        x // books.page_size: r.owner for r in books.rows if r.owner for x in r.slots
    }
    return owner_color(page_owner[page]), 0.3  # the unfilled tail of a held page


def check_slot_grid(svg, books, prefix="slot"):
    cells = cells_of(svg, f"{prefix}:")
    assert len(cells) == books.num_slots, (
        f"{len(cells)} slot cells for {books.num_slots} slots"
    )
    for s in range(books.num_slots):
        cell = cells[f"{prefix}:{s}"]
        fill, alpha = expected_slot_fill(books, s)
        assert same_color(cell.fill, fill), (
            f"slot {s}: drawn {cell.fill}, expected {fill}"
        )
        assert cell.opacity == pytest.approx(alpha), (
            f"slot {s}: alpha {cell.opacity}, expected {alpha}"
        )
        assert cell.label == str(s)
        new = is_new(cell)
        assert new == (s in books.new_slots), (
            f"slot {s}: highlighted={new}, new this step={s in books.new_slots}"
        )


# -- colours ------------------------------------------------------------------------------------


def test_owner_colours_are_stable_and_distinct():
    assert owner_color("A") == owner_color("A") and owner_color("A") != owner_color("B")
    assert len({owner_color(c) for c in "ABCDEFGHIJ"}) == 10
    # hashed names: stable across calls
    assert owner_color("req-17") == owner_color("req-17")
    assert owner_color(None) == FREE
    assert text_color(PADDING) == "white" and text_color(FREE) == "black"


# -- state --------------------------------------------------------------------------------------


def test_read_books_reads_the_real_tables(orientation):
    sc = orientation
    books = sc.frames[-1]
    for rid, req in sc.reqs.items():
        row = books.rows[req.kv.req_pool_idx]
        assert row.owner == rid
        assert (
            list(row.slots)
            == sc.req_pool.req_to_token[
                req.kv.req_pool_idx, : req.kv.kv_allocated_len
            ].tolist()
        )
        assert row.generation == int(sc.req_pool.req_generation[req.kv.req_pool_idx])
    assert books.rows[0].owner is None and books.free_rows == tuple(
        sc.req_pool.free_slots
    )
    assert books.free_pages == tuple(sc.allocator.free_pages.tolist())
    assert [b.name for b in books.buffers] == [
        "k_buffer[0]",
        "v_buffer[0]",
        "k_buffer[1]",
        "v_buffer[1]",
    ]
    assert books.buffers[0].row_bytes == sc.kvcache.k_buffer[0][0].nbytes


def test_books_are_frozen_snapshots(orientation):
    first = orientation.frames[0]
    assert (
        first.slot_owner == {}
        and len(first.free_pages) == orientation.allocator.num_pages
    )
    # later frames did not change the first one
    assert orientation.frames[-1].slot_owner


# -- drawings -----------------------------------------------------------------------------------


def test_slot_grid_shows_owners_padding_tails_and_new_slots(orientation):
    for books in (orientation.frames[1], orientation.frames[4], orientation.frames[-1]):
        check_slot_grid(draw_books(books, ("slots",)), books)


def test_slot_grid_check_catches_a_grid_that_ignores_page_tails(
    orientation, monkeypatch
):
    # Buggy variant: paint the whole page of an owner, hiding how much of its last page is unused.
    books = orientation.frames[1]
    import memlab.course.viz.sglang_books as d

    real = d._slot_cell

    def solid(*args):
        return {**real(*args), "opacity": 1.0}

    monkeypatch.setattr(d, "_slot_cell", solid)
    with pytest.raises(AssertionError, match="alpha"):
        check_slot_grid(draw_books(books, ("slots",)), books)


def test_request_table_cells_hold_the_slots(orientation):
    books = orientation.frames[-1]
    svg = draw_books(books, ("table",))
    cells = cells_of(svg, "row:")
    for r in books.rows:
        for pos in range(books.row_width):
            cell = cells[f"row:{r.row}:{pos}"]
            if r.row == 0:
                assert same_color(cell.fill, PADDING)
            elif r.owner and pos < len(r.slots):
                assert same_color(cell.fill, owner_color(r.owner))
                assert cell.label == str(r.slots[pos])
            else:
                assert same_color(cell.fill, FREE)
    assert "D · gen 2" in texts_of(svg), "D's row was B's: its generation must read 2"


def test_released_slots_are_pale_in_the_table_and_free_in_the_grid():
    sc = sglang_books.paged_free("free_segment")
    books = sc.frames[1]
    released = books.released_slots
    assert released == frozenset(sc.slots("C")[:8])
    svg = draw_books(books, ("table", "slots"))
    row = sc.reqs["C"].kv.req_pool_idx
    cells = cells_of(svg, f"row:{row}:")
    assert all(cells[f"row:{row}:{p}"].opacity == pytest.approx(0.3) for p in range(8))
    assert cells[f"row:{row}:8"].opacity == pytest.approx(1.0)
    check_slot_grid(svg, books)


def test_free_list_strip_in_order_with_staged_after():
    sc = sglang_books.token_allocator(need_sort=True)
    books = sc.frames[5]  # A and B freed: staged
    assert books.staged_pages
    cells = cells_of(draw_books(books, ("free",)), "free:")
    order = [
        (int(c.label), "staged" if same_color(c.fill, STAGED) else "free")
        for _, c in sorted(cells.items(), key=lambda kv: int(kv[0].split(":")[1]))
    ]
    assert order == [(p, "free") for p in books.free_pages] + [
        (p, "staged") for p in books.staged_pages
    ]
    assert all(
        same_color(c.fill, STAGED) or same_color(c.fill, FREE) for c in cells.values()
    )


def test_buffers_colour_each_slot_row_by_owner_and_trace_bytes(orientation):
    books = orientation.frames[-1]
    slot = orientation.slots("D")[0]
    svg = draw_books(books, ("buffers",), slot=slot)
    cells = cells_of(svg, "buf:")
    assert len(cells) == len(books.buffers) * books.num_slots
    owner = books.slot_owner
    for b in books.buffers:
        for s in range(books.num_slots):
            want = PADDING if s < books.page_size else owner_color(owner.get(s))
            cell = cells[f"buf:{b.name}:{s}"]
            assert same_color(cell.fill, want)
            assert is_new(cell) == (s == slot), f"{b.name}[{s}]: the traced slot"
    row_bytes = books.buffers[0].row_bytes
    assert f"[{slot * row_bytes}, {(slot + 1) * row_bytes})" in " ".join(texts_of(svg))


def test_part_hatching_follows_extend_parts():
    sc = sglang_books.paged_extend(page_size=4)
    books = sc.frames[2]
    cells = cells_of(draw_books(books, ("slots",)), "slot:")
    assert books.part_of
    for s, part in books.part_of.items():
        assert cells[f"slot:{s}"].pattern == PART_FILL[part], f"slot {s} is part {part}"


def test_free_rows_strip_in_list_order(orientation):
    books = sglang_books.request_table().frames[4]
    svg = draw_books(books, ("table", "rows"))
    cells = cells_of(svg, "freerow:")
    assert [cells[f"freerow:{i}"].label for i in range(len(cells))] == [
        str(r) for r in books.free_rows
    ]
    assert cells[f"freerow:{len(cells) - 1}"].tip.endswith("the tail: taken next")


def test_a_still_picture_has_no_readout_and_no_tips(orientation):
    books = orientation.frames[-1]
    live, still = draw_books(books), draw_books(books, still=True)
    assert "memlab-tip" in live and "hover a cell" in live
    assert "memlab-tip" not in still and "hover a cell" not in still
    assert cells_of(still, "slot:") == cells_of(live, "slot:")  # the same drawing


def test_extend_parts_agree_with_the_page_count():
    from memlab.sglang.allocator.reference import num_new_pages

    for ps in (1, 2, 4, 16):
        for pre in range(0, 20):
            for seq in range(pre, pre + 20):
                parts = sglang_books.extend_parts(pre, seq, ps)
                assert len(parts) == seq - pre and parts == sorted(parts)
                pages = (parts.count(2) // ps) + (parts.count(3) > 0)
                assert pages == num_new_pages(pre, seq, ps), (ps, pre, seq)


def test_draw_books_rejects_unknown_panels(orientation):
    with pytest.raises(ValueError, match="unknown panel 'pages'"):
        draw_books(orientation.frames[0], ("table", "pages"))


def test_kv_bytes_picture_highlights_the_model_and_uses_memlab_numbers():
    from memlab.common.models import MODELS
    from memlab.course.viz.draw_models import draw_kv_bytes, kv_text
    from memlab.course.viz.style import PALETTE

    fig = draw_kv_bytes("DeepSeek-V3", dtype_bytes=1, tp_size=2)
    bars = by_gid(fig, "model:")
    assert set(bars) == {f"model:{n}" for n in MODELS}
    for name, m in MODELS.items():
        bar = bars[f"model:{name}"]
        assert bar.get_width() == pytest.approx(m.kv_bytes_per_token(None, 1, 2) / 1024)
        assert same_color(bar.get_facecolor(), PALETTE[0]) == (name == "DeepSeek-V3")
    assert set(by_gid(fig, "seg:")) == {"seg:V = view of the latent", "seg:rope part"}
    assert set(by_gid(draw_kv_bytes("Llama-3.1-8B"), "seg:")) == {"seg:K", "seg:V"}
    dsa = by_gid(draw_kv_bytes("DeepSeek-V3.2"), "seg:")
    assert set(dsa) == {
        "seg:V = view of the latent",
        "seg:rope part",
        "seg:indexer key",
    }
    assert f"{MODELS['Llama-3.1-8B'].kv_bytes_per_token():,} B per token" in kv_text(
        "Llama-3.1-8B"
    )


# -- widgets ------------------------------------------------------------------------------------


class S:
    def __init__(self, caption):
        self.caption = caption


def test_stepper_rerenders_through_its_observer():
    calls = []

    def draw(state):
        calls.append(state.caption)
        return f"<p>{state.caption}</p>"

    w = Stepper([S("a"), S("b"), S("c")], draw)
    assert w.view.value == "<p>a</p>" and "step 0 of 2" in w.caption.value
    w.slider.value = 2
    assert (
        w.view.value == "<p>c</p>"
        and "step 2 of 2" in w.caption.value
        and w.state.caption == "c"
    )
    w.prev.click()
    assert w.slider.value == 1 and w.view.value == "<p>b</p>"
    w.next.click()
    w.next.click()  # clamps at the last step
    assert w.slider.value == 2
    w.slider.value = 0
    assert calls == ["a", "c", "b"], "each step is drawn once, then cached"


def test_stepper_check_catches_a_widget_without_observer():
    class Frozen(Stepper):
        def _on_value(self, change):  # buggy variant: forgets to re-render
            pass

    w = Frozen([S("a"), S("b")], lambda s: s.caption)
    w.slider.value = 1
    assert w.view.value == "a", (
        "the frozen widget shows a stale picture; the check above would fail"
    )


def test_stepper_stories_switch_states_and_bounds():
    w = Stepper(
        {"long": [S("1"), S("2"), S("3")], "short": [S("x")]}, lambda s: s.caption
    )
    w.slider.value = 2
    w.story.value = "short"
    assert w.slider.max == 0 and w.slider.value == 0 and w.view.value == "x"
    w.story.value = "long"
    assert w.slider.max == 2 and w.view.value == "1"
    with pytest.raises(ValueError):
        Stepper([], str)
    with pytest.raises(ValueError):
        Stepper({"empty": []}, str)


def test_stepper_on_a_real_scene_draws_the_svg(orientation):
    w = Stepper(orientation.frames[:2], lambda b: draw_books(b, ("slots",)))
    first = w.view.value
    assert first.startswith('<svg class="memlab-svg"') and "slot:4" in first
    w.slider.value = 1
    assert w.view.value != first and "A arrives" in w.caption.value


def test_explorer_rerenders_on_every_control():
    import ipywidgets as W

    seen = []

    def draw(n, kind):
        seen.append((n, kind))
        return f"{kind}:{n}"

    e = Explorer(
        dict(n=W.IntSlider(value=1, min=0, max=9), kind=W.Dropdown(options=["a", "b"])),
        draw,
        text=lambda n, kind: f"n={n}",
    )
    assert e.view.value == "a:1" and e.summary.value == "n=1" and e.renders == 1
    e.controls["n"].value = 5
    e.controls["kind"].value = "b"
    assert e.view.value == "b:5" and e.summary.value == "n=5" and e.renders == 3
    assert e.controls["n"].description == "n", (
        "a control without a description gets its name"
    )


# -- scenes drive the real library ----------------------------------------------------------------


def test_orientation_story(orientation):
    f = orientation.frames
    assert len(f) == 7
    b_row = f[2].rows  # B arrived in frame 2
    b = next(r for r in b_row if r.owner == "B")
    d = next(r for r in f[-1].rows if r.owner == "D")
    assert d.row == b.row and d.generation == b.generation + 1, (
        "D reuses B's row with a new generation"
    )
    assert {s // 4 for s in d.slots} == {s // 4 for s in b.slots}, "and B's page (LIFO)"


# The stories take the page size as a parameter: their captions must say what happened at that size.
@pytest.mark.parametrize("ps", [1, 2, 4, 8])
def test_story_captions_follow_the_page_size(ps):
    import ast
    import re

    first = sglang_books.orientation(page_size=ps).frames[0].caption
    assert (
        f"page 0 and {'slot 0' if ps == 1 else f'slots 0-{ps - 1}'} are padding"
        in first
    ), first
    seg = sglang_books.paged_free("free_segment", page_size=ps).frames
    every = {
        1: "every slot",
        2: "every 2nd slot",
        4: "every 4th slot",
        8: "every 8th slot",
    }[ps]
    assert every in seg[1].caption, seg[1].caption
    said_refused = "is refused" in seg[2].caption
    assert said_refused == ("Error" in seg[2].note) == (ps > 1), (
        seg[2].caption,
        seg[2].note,
    )
    if said_refused:  # the run it names starts mid-page
        start = int(re.search(r"positions (\d+)\.\.", seg[2].caption).group(1))
        assert start % ps
    group = next(
        f.caption
        for f in sglang_books.paged_free("free group", page_size=ps).frames
        if "two pieces" in f.caption
    )
    a, b = (
        ast.literal_eval(x)
        for x in re.search(r"\((\[.*?\]) and (\[.*?\])\)", group).groups()
    )
    both = {s // ps for s in a} & {s // ps for s in b}
    assert (
        f"page {min(both)} is under both" if both else "no page is under both"
    ) in group, group
    for f in sglang_books.decode_steps(page_size=ps).frames:
        assert "% 1 ==" not in f.caption, f.caption


@pytest.mark.parametrize("bs", [2, 3, 4, 5])
def test_prefix_cache_caption_counts_the_blocks_it_names(bs):
    # after A's 2 decodes
    books = vllm_books.prefix_cache(True, num_blocks=16, block_size=bs).frames[2]
    hashed = [b for b in books.req_blocks["A"] if b in books.hashes]
    if 12 // bs > 10 // bs:
        assert f"its block number {len(hashed)} fills up" in books.caption, (
            books.caption
        )
    else:
        assert "no block of A's fills up" in books.caption, books.caption


def test_scene_refusal_changes_nothing():
    sc = Scene(ReqToTokenPool(2, 8), TokenToKVPoolAllocator(8))
    sc.extend_batch({"A": 4})
    before = sc.books()
    assert sc.extend_batch({"B": 2, "C": 1}) is None  # one row for two requests
    assert sc.extend_batch({"B": 5}) is None  # slots short: its new row goes back
    after = sc.books()
    assert (
        after.rows == before.rows
        and after.free_rows == before.free_rows
        and after.free_pages == before.free_pages
    )


@pytest.mark.parametrize("story", ["free", "free_segment", "free group", "double free"])
def test_paged_free_stories_keep_the_books(story):
    sc = sglang_books.paged_free(story)
    sc.allocator.check_books()  # debug mode: free + held == capacity, nothing free twice
    notes = [f.note for f in sc.frames if f.note]
    if story in ("free_segment", "double free", "free group"):
        assert notes and all("Error" in n for n in notes)
    with pytest.raises(ValueError):
        sglang_books.paged_free("nonsense")


def test_decode_steps_open_pages_when_seq_len_mod_ps_is_one():
    sc = sglang_books.decode_steps(page_size=4)
    for prev, cur in zip(sc.frames, sc.frames[1:]):
        for r in cur.rows:
            if r.owner is None:
                continue
            n = len(r.slots)
            opened = (n - 1) % 4 == 0
            assert (r.slots[-1] % 4 == 0) == opened
            old = next(x for x in prev.rows if x.owner == r.owner)
            assert (r.owner in cur.caption.split(";")[1]) == opened or not opened
            assert r.slots[:-1] == old.slots


def test_render_static_writes_one_picture(tmp_path):
    from memlab.course.viz.render_static import PICTURES, render

    (path,) = render(["01_request_table"], out=tmp_path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="unknown picture"):
        render(["nope"], out=tmp_path)
    assert all(name[:2].isdigit() for name in PICTURES)


def test_books_from_a_kvcache_free_allocator_have_no_buffers():
    from memlab.sglang.allocator import PagedTokenToKVPoolAllocator

    b = read_books("x", ReqToTokenPool(2, 4), PagedTokenToKVPoolAllocator(8, 2))
    assert b.buffers == () and b.num_slots == 10 and b.free_pages == (1, 2, 3, 4)
    torch.testing.assert_close(torch.tensor(b.free_rows), torch.tensor([1, 2]))


# -- vLLM, hybrid, sizing, attention and engine pictures ------------------------------------------


def test_vllm_pictures_follow_the_block_pool():
    from memlab.course.viz.vllm_books import CACHED, EVICTED, draw_vllm

    sc = vllm_books.prefix_cache(True)
    hit_frame = next(f for f in sc.frames if f.hit)
    assert hit_frame.hit == {1, 2}, "B's first two blocks come from A's cached prefix"
    svg = draw_vllm(hit_frame)
    blocks = cells_of(svg, "block:")
    for b in range(hit_frame.num_blocks):
        cell = blocks[f"block:{b}"]
        if b == hit_frame.null_block:
            want = "#bbbbbb"
        elif hit_frame.ref_cnt[b] > 0:
            want = owner_color(hit_frame.owner(b))
        elif b in hit_frame.hashes:
            want = CACHED
        else:
            want = FREE
        assert same_color(cell.fill, want), f"block {b}"
        assert (cell.pattern == PART_FILL[1]) == (b in hit_frame.hit)
        assert is_new(cell) == (b in hit_frame.new | hit_frame.hit)
    assert blocks["block:1"].tip.startswith("block 1 · ref_cnt 1 · hash h1 = ")
    queue = cells_of(svg, "queue:")
    order = [
        int(g.split(":")[2]) for g in sorted(queue, key=lambda g: int(g.split(":")[1]))
    ]
    assert tuple(order) == hit_frame.queue
    head = queue[f"queue:0:{hit_frame.queue[0]}"].tip
    assert "free queue #0 (head: reused first; prev fake head" in head
    evict = next(f for f in sc.frames if f.evicted)
    cell = cells_of(draw_vllm(evict), "block:")[f"block:{min(evict.evicted)}"]
    assert same_color(cell.stroke, EVICTED)


def test_vllm_frames_read_the_real_pool():
    sc = vllm_books.prefix_cache(True)
    pool = sc.manager.block_pool
    last = sc.frames[-1]
    assert last.queue == tuple(
        b.block_id for b in pool.free_block_queue.get_all_free_blocks()
    )
    assert last.ref_cnt == tuple(b.ref_cnt for b in pool.blocks)
    pool.check_invariants()
    # A finished: its hashed blocks at the tail, last block first
    freed_frame = sc.frames[3]
    assert freed_frame.queue[-3:] == (3, 2, 1)
    off = vllm_books.prefix_cache(False)
    assert not any(f.hit for f in off.frames) and not off.frames[-1].hashes


def test_swa_picture_pairs_two_ledgers():
    from memlab.course.viz.hybrid_books import draw_swa

    sc = hybrid_books.sliding_window()
    frame = sc.frames[5]  # after decode step 2: out-of-window pages released
    mapping = sc.allocator.full_to_swa_index_mapping
    assert all(int(mapping[f]) == s for f, s in sc.frames[-1].pairs)
    held_swa = {s for _, s in frame.pairs}
    assert set(frame.swa.slot_owner) == held_swa
    svg = draw_swa(frame)
    check_slot_grid(svg, frame.full)  # the full ledger
    swa = cells_of(svg, "swaslot:")  # the SWA ledger, its own slot numbers
    assert len(swa) == frame.swa.num_slots
    for f, s in frame.pairs:
        assert same_color(
            swa[f"swaslot:{s}"].fill, owner_color(frame.full.slot_owner[f])
        )
    # the map: each position's full slot over its SWA slot, a dot where it was released
    full, below = cells_of(svg, "full:"), cells_of(svg, "swa:")
    pairs = dict(frame.pairs)
    for r in frame.full.rows:
        if r.owner is None:
            continue
        for pos, f in enumerate(r.slots):
            top, bottom = full[f"full:{r.owner}:{pos}"], below[f"swa:{r.owner}:{pos}"]
            assert top.label == str(f) and same_color(top.fill, owner_color(r.owner))
            if f in pairs:
                assert bottom.label == str(pairs[f])
            else:
                assert bottom.label == "·" and same_color(bottom.fill, FREE)
    assert any(c.label == "·" for c in below.values()), "the window released some"
    sc.allocator.check_books()
    released = [
        c for c in (f.caption for f in sc.frames) if "released" in c and "[]" not in c
    ]
    assert released, "some SWA slots leave the window during the story"


def test_mamba_picture_marks_state_and_ping_pong_slots():
    from memlab.course.viz.hybrid_books import draw_mamba

    frames = hybrid_books.mamba_slots(extra_buffer=True, overlap=True)
    snaps = [f for f in frames if "snapshots" in f.caption]
    nexts = [next(r[4] for r in f.rows if r[1] == "A") for f in snaps]
    assert nexts == [1, 0, 1], "the next tracking slot alternates: ping-pong"
    f = snaps[0]
    roles = f.slot_roles()
    a = next(r for r in f.rows if r[1] == "A")
    assert roles[a[2]] == ("A", "state") and roles[a[3][1]] == ("A", "track 1*")
    svg = draw_mamba(f)
    cells = cells_of(svg, "mslot:")
    assert same_color(cells[f"mslot:{a[2]}"].fill, owner_color("A"))
    assert same_color(cells["mslot:0"].fill, PADDING)
    assert "t1*" in texts_of(svg), "the * marks the next snapshot's slot"
    assert is_new(cells[f"mslot:{a[3][0]}"]), "the slot this snapshot wrote"
    free = cells_of(svg, "mfree:")
    assert [free[f"mfree:{i}"].label for i in range(len(free))] == [
        str(x) for x in f.free_slots
    ]
    assert all(
        len(r[3]) == 0 for r in hybrid_books.mamba_slots(extra_buffer=False)[-1].rows
    )


def test_sizing_picture_uses_memlab_sizing():
    from memlab.common.models import MODELS
    from memlab.course.viz.draw_sizing import draw_sizing, serving_config, sizing_text
    from memlab.sglang.sizing import GiB, report

    kw = dict(model="Llama-3.1-8B", gpu="A100 / H100 80GB", page_size=16)
    cfg = serving_config(**kw)
    r = report(
        MODELS["Llama-3.1-8B"], cfg.gpu, 8192, cfg.schedule, cfg.spec, cfg.parallel
    )
    bars = by_gid(draw_sizing(seq_len=8192, **kw), "mem:")
    assert bars["mem:weights"].get_width() == pytest.approx(r.sizes.weight_bytes / GiB)
    assert bars["mem:full_attention"].get_width() == pytest.approx(
        r.sizes.bytes_by_kind["full_attention"] / GiB
    )
    assert f"{r.requests:,} requests" in sizing_text(seq_len=8192, **kw)
    assert "does not fit" in sizing_text(model="DeepSeek-V3", gpu="T4 (16 GB)")


def test_attention_frames_walk_a_request_page_by_page():
    from memlab.course.viz.draw_attention import (
        attention_frames,
        draw_attention,
        fill_kv,
    )

    sc = sglang_books.orientation(dtype=torch.float32, head_dim=16)
    sc.extend_batch({"A": 6, "D": 3})
    fill_kv(sc)
    q = torch.randn(len(sc.reqs), 4, 16, generator=torch.Generator().manual_seed(1))
    stories = attention_frames(sc, q)
    a = stories["request A"]
    assert [f.positions for f in a] == [
        tuple(range(i, min(i + 4, 12))) for i in range(0, 12, 4)
    ]
    assert [sorted(f.books.new_slots) for f in a] == [
        sc.slots("A")[i : i + 4] for i in range(0, 12, 4)
    ]
    assert sum(a[0].weights) == pytest.approx(1.0)
    svg = draw_attention(a[1])
    bars = cells_of(svg, "weight:")
    assert same_color(bars["weight:5"].fill, owner_color("A"))  # read now
    assert same_color(bars["weight:0"].fill, PADDING)  # read before
    assert same_color(bars["weight:9"].fill, "#dddddd")  # read later
    slots = cells_of(svg, "slot:")
    assert {s for s, c in ((int(g[5:]), c) for g, c in slots.items()) if is_new(c)} == (
        a[1].books.new_slots
    ), "the slots read in this step have a black edge"


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_engine_frames_follow_a_real_engine(prefix_cache):
    from memlab.capstone.engine import Engine, TinyLlama
    from memlab.course.viz.draw_engine import draw_engine, engine_frames

    g = torch.Generator().manual_seed(0)
    system = torch.randint(0, 128, (8,), generator=g).tolist()
    prompts = [system + [i] for i in range(5)]
    engine = Engine(
        TinyLlama(),
        page_size=4,
        num_tokens=64,
        max_running=3,
        max_context=32,
        chunk_size=16,
        attention="torch",
        prefix_cache=prefix_cache,
    )
    frames = engine_frames(engine, prompts, max_new_tokens=4)
    assert frames[-1].history[-1][:2] == (0, 0), "everybody finished"
    assert (
        frames[-1].cached == frozenset(engine.tree_cache.device_pages()) != frozenset()
    )
    for f in frames:
        running, waiting, owned, cached, free = f.history[-1]
        assert owned + cached + free == engine.allocator.num_pages
        assert len(f.cached) == cached and not f.cached & set(f.page_owner)
        assert set(f.shared) <= f.cached
    assert any(f.shared for f in frames), "the shared prefix is mapped from the cache"
    shared = next(f for f in frames if f.shared)
    cells = by_gid(draw_engine(shared), "page:")
    assert len(cells) == shared.num_pages + 1
    p = next(iter(shared.shared))
    assert cells[f"page:{p}"].get_hatch() == "///"


# -- chapter 12: the unified pool ---------------------------------------------------------------


def test_unified_story_reads_the_real_books_and_marks_moves():
    from memlab.course.viz.unified_books import draw_unified, unified_story

    sc = unified_story(page_size=2)
    al = sc.allocator
    frames = sc.frames
    assert (
        frames[0].joint_available == frames[0].gap_bytes // 256 * 2
        and not frames[0].rows
    )
    first = frames[1]  # A's 7 tokens: 4 virtual pages, bound on both sides
    assert (
        first.new_pages == frozenset({1, 2, 3, 4})
        and len(first.full.bound) == len(first.swa.bound) == 4
    )
    assert first.gap_bytes == frames[0].gap_bytes - 4 * 256
    # A's window moved on: its first SWA pages went, its full pages stayed
    released = frames[4]
    assert len(released.swa.bound) == len(released.full.bound) - 2 and {
        m[0] for m in released.moves
    } == {"swa"}
    # A finished: B's full pages moved up into A's; B's virtual ids did not change
    done = frames[5]
    moved = [m for m in done.moves if m[0] == "full"]
    assert moved and dict(done.rows)["B"] == dict(frames[4].rows)["B"]
    svg = draw_unified(done)
    cells, v2p = cells_of(svg, "byte:full:"), cells_of(svg, "v2p:full:")
    for _, v, _, p in moved:
        assert is_new(cells[f"byte:full:{p}"]) and is_new(v2p[f"v2p:full:{v}"])
    assert same_color(cells[f"byte:full:{moved[0][3]}"].fill, owner_color("B"))
    assert "byte:gap" in cells_of(svg, "byte:gap")
    assert "byte:floor" in cells_of(svg, "byte:floor")
    refused = frames[6]
    assert (
        "refused" in refused.caption
        and refused.joint_available < refused.full.available
    )
    assert frames[-1].gap_bytes < 256  # C took every page pair that fit
    al.check_books()


# -- labels never cut, legends drawn, captions escaped (issue 18, section 5) -------------------


def node_label_words(svg, books):
    """Each node's drawn label, its lines joined: it must hold the node's tokens in full."""
    labels = {
        g.get("data-label"): [t.text for t in g.iter(f"{SVG}text")]
        for g in ET.fromstring(svg).iter(f"{SVG}g")
        if g.get("data-label")
    }
    for n in books.nodes:
        words = " ".join(
            books.words[t] if t < len(books.words) else str(t) for t in n.key
        )
        tokens = " ".join(
            line
            for line in labels[f"node:{n.id}"]
            if not line.startswith(("dev ", "host ", "lock_ref ")) and "|" not in line
        )
        assert tokens == words, (
            f"node {n.id}: drawn {tokens!r}, its tokens are {words!r}"
        )


@pytest.mark.parametrize("page_size", [1, 2])
def test_radix_node_labels_show_every_token(page_size):
    from memlab.course.viz.radix_books import draw_radix, story

    for books in story(page_size=page_size):
        node_label_words(draw_radix(books), books)


def test_radix_label_check_catches_a_cut_label(monkeypatch):
    from memlab.course.viz import radix_books

    real = radix_books._label

    def cut(books, n, chars=24):  # the old label: cut at 22 characters with a "~"
        words, *rest = real(books, n, chars=1000)
        return [words[:21] + "~" if len(words) > 22 else words, *rest]

    monkeypatch.setattr(radix_books, "_label", cut)
    frames = radix_books.story()
    with pytest.raises(AssertionError, match="drawn"):
        for books in frames:
            node_label_words(radix_books.draw_radix(books), books)


def legend_of(svg: str) -> list[tuple]:
    """(pattern over the swatch, words) of every legend entry, in order."""
    out = []
    for g in ET.fromstring(svg).iter(f"{SVG}g"):
        if g.get("class") == "memlab-swatch":
            _, *over = g.findall(f"{SVG}rect")
            out.append(
                (over[0].get("fill") if over else None, g.find(f"{SVG}text").text)
            )
    return out


def test_legends_are_drawn_swatches_not_text():
    from memlab.course.viz.radix_books import draw_radix, story

    svg = draw_books(
        sglang_books.paged_extend(page_size=4).frames[2], ("table", "slots", "free")
    )
    assert not any("///" in t or "... part" in t for t in texts_of(svg)), (
        "a legend written as text"
    )
    assert legend_of(svg)[:3] == [
        (PART_FILL[1], "part 1: the rest of its old page"),
        (None, "part 2: whole new pages"),
        (PART_FILL[3], "part 3: a new partial page"),
    ]
    svg = draw_radix(story()[3])  # B running: its own pages dotted in the pools
    assert (PART_FILL[3], "a request's own") in legend_of(svg)
    assert not any(t.startswith("xx:") for t in texts_of(svg))


def test_stepper_captions_are_text_not_markup():
    class S:
        caption = "B shares 7 tokens with A ('<s> You are brief . What is')"

    s = Stepper([S()], lambda _: "<i>x</i>")
    assert "&lt;s&gt; You are brief" in s.caption.value and "<s>" not in s.caption.value
