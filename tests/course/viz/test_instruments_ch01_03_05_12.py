"""The instruments of chapters 01, 03, 05 and 12 without a browser: each opens on its story's last
state, is driven through its Python API, and its books are compared with the library's objects
driven directly; a refused or raising call shows the library's message and leaves every object as
it was; undo and reset replay on fresh objects; every cell of the picture says what it is."""

import xml.etree.ElementTree as ET

import pytest
import torch

from memlab.course.viz import sglang_books, token_books, unified_books
from memlab.course.viz.instrument import spell_value
from memlab.sglang.allocation import alloc_for_decode, alloc_for_extend
from memlab.sglang.req_to_token import Req

SVG = "{http://www.w3.org/2000/svg}"


def state(sc):
    """Everything a call could change in a Scene's real objects, as plain values."""
    al, rp = sc.allocator, sc.req_pool
    out = dict(
        table=rp.req_to_token.tolist(),
        generations=rp.req_generation.tolist(),
        free_rows=list(rp.free_slots),
        reqs={
            r: (q.kv.req_pool_idx, q.kv.kv_allocated_len) for r, q in sc.reqs.items()
        },
    )
    if hasattr(al, "full_attn_allocator"):
        for side in (al.full_attn_allocator, al.swa_attn_allocator):
            out[side.sub_pool_name] = (
                side.virtual_to_physical.tolist(),
                side.used_page_range(),
                side.free_pages.tolist(),
            )
    else:
        out.update(
            free_pages=al.free_pages.tolist(),
            staged=token_books.staged_pages(al),
            group=None
            if al.free_group is None
            else [t.tolist() for t in al.free_group],
        )
    return out


def cells(svg: str) -> dict:
    root = ET.fromstring(svg)
    return {
        g.get("data-gid"): (
            g.find(f"{SVG}title").text if g.find(f"{SVG}title") is not None else ""
        )
        for g in root.iter(f"{SVG}g")
        if g.get("data-gid")
    }


# -- chapter 01: the request table -------------------------------------------------------------


def test_01_opens_on_the_storys_last_state():
    inst = token_books.request_instrument()
    story = sglang_books.request_table(rows=5, width=8)
    assert state(inst.world) == state(story)
    assert (
        inst.books()["req_generation"]
        == story.req_pool.req_generation.tolist()
        == [0, 0, 1, 1, 1, 2]
    )
    assert (
        "the story&#x27;s last step" in inst.call_box.value
        or "the story's last step" in inst.call_box.value
    )


def test_01_rows_chunks_and_frees_match_the_library():
    inst = token_books.request_instrument()
    sc = sglang_books.request_table(rows=5, width=8)
    s = inst.do("alloc", requests=["F", "G"], tokens=[2, 3])
    out = sc.extend_batch({"F": 2, "G": 3})
    assert s.ok and s.call == "req_to_token_pool.alloc([F, G])" and s.result == "[4, 5]"
    s = inst.do("continue", request="F", chunk=2)
    sc.extend_batch({"F": 2})
    assert s.ok and s.result == "[4]" and "keeps row 4" in s.caption
    s = inst.do("free", free_request="G")
    sc.finish("G")
    assert s.ok and "req_to_token_pool.free(G)" in s.call
    assert state(inst.world) == state(sc)
    assert inst.books()["free_slots"] == list(sc.req_pool.free_slots) == [1, 2, 3, 5]
    tips = cells(inst.picture)
    assert (
        tips["freerow:3"]
        == "free_slots[3] = row 5 (generation 3) · the tail: taken next"
    )
    assert out is not None


@pytest.mark.parametrize(
    "args, words",
    [
        (
            dict(requests=["X", "X"], tokens=[1, 1]),
            "appears twice in one alloc",
        ),  # the library's own check
        (
            dict(requests=["F"], tokens=[-1]),
            "seq_len -1 is shorter than its prefix 0",
        ),  # refused before a row is taken
    ],
)
def test_01_bad_input_shows_the_librarys_message_and_changes_nothing(args, words):
    inst = token_books.request_instrument()
    before = state(inst.world)
    reqs = [Req("X")] * 2 if args["requests"] == ["X", "X"] else [Req("F")]
    sc = sglang_books.request_table(rows=5, width=8)
    with pytest.raises(ValueError) as exc:
        alloc_for_extend(sc.req_pool, sc.allocator, reqs, args["tokens"])
    step = inst.do("alloc", **args)
    assert (
        not step.ok and step.error == f"ValueError: {exc.value}" and words in step.error
    )
    assert state(inst.world) == before and "nothing changed" in inst.call_box.value


def test_01_more_rows_than_free_is_refused_all_or_nothing_and_undo_replays():
    inst = token_books.request_instrument()
    for r in "FGHIJ":
        assert inst.do("alloc", requests=[r], tokens=[1]).ok
    before = state(inst.world)
    step = inst.do("alloc", requests=["K"], tokens=[1])
    assert not step.ok and step.result == "None" and "0 row(s) are free" in step.error
    assert state(inst.world) == before
    assert inst.undo() and inst.books()["free_slots"] == [1]
    inst.reset()
    assert state(inst.world) == state(sglang_books.request_table(rows=5, width=8))


# -- chapter 03: the token allocator -----------------------------------------------------------


def test_03_opens_on_the_storys_last_state_and_need_sort_replays():
    inst = token_books.token_instrument(need_sort=True)
    for sort in (True, False):
        inst.set(need_sort=sort)
        story = sglang_books.token_allocator(need_sort=sort)
        got, want = state(inst.world), state(story)
        assert {k: got[k] for k in want if k != "group"} == {
            k: want[k] for k in want if k != "group"
        }


def test_03_alloc_free_merge_match_the_library_and_the_contiguity():
    inst = token_books.token_instrument(need_sort=True)
    sc = sglang_books.token_allocator(need_sort=True)
    s = inst.do("free", free_request="C")
    sc.finish("C")
    assert (
        s.ok
        and "staged" in s.result
        and inst.books()["staged (need_sort)"] == list(range(8, 14))
    )
    s = inst.do("alloc", request="F", n=3)
    out = sc.extend_batch({"F": 3})
    assert (
        s.ok
        and s.call == "allocator.alloc(need_size=3)"
        and s.result == spell_value(out) == "tensor([7, 14, 15])"
    )
    s = inst.do("merge")
    sc.allocator.merge_and_sort_free()
    assert s.ok and state(inst.world) == state(sc)
    books = inst.books()
    assert (
        books["free_pages"] == [8, 9, 10, 11, 12, 13, 16]
        and books["free_pages runs"] == "2 runs: 8-13 16"
    )
    assert books["staged (need_sort)"] == []


def test_03_fifo_frees_join_the_tail():
    inst = token_books.token_instrument(need_sort=False)
    s = inst.do("free", free_request="C")
    assert s.ok and "TAIL" in s.result
    assert (
        inst.books()["free_pages"][-6:] == [8, 9, 10, 11, 12, 13]
        and inst.books()["staged (need_sort)"] == []
    )


def test_03_bad_n_and_too_many_change_nothing():
    inst = token_books.token_instrument()
    before = state(inst.world)
    s = inst.do("alloc", request="F", n=-1)
    with pytest.raises(ValueError) as exc:
        sglang_books.token_allocator(need_sort=True).allocator.alloc(-1)
    assert not s.ok and s.error == f"ValueError: {exc.value}"
    s = inst.do("alloc", request="F", n=5)
    assert not s.ok and s.result == "None" and "available_size() = 4" in s.error
    assert state(inst.world) == before


# -- chapter 05: decode and free ---------------------------------------------------------------


def decode_story():
    return sglang_books.decode_steps(page_size=4)


def test_05_opens_on_the_decode_storys_last_state():
    inst = token_books.paged_free_instrument()
    got, want = state(inst.world), state(decode_story())
    assert got == want and inst.books()["debug_mode"] is True
    assert [inst.books()[f"request {r}"]["tokens"] for r in "ABC"] == [9, 10, 12]


def test_05_decode_group_and_segment_match_the_library():
    inst = token_books.paged_free_instrument()
    sc = decode_story()
    s = inst.do("decode", requests=["A", "B"])
    out = alloc_for_decode(sc.req_pool, sc.allocator, [sc.reqs["A"], sc.reqs["B"]])
    assert s.ok and s.result == spell_value(out) and "allocator.alloc_decode(" in s.call
    assert inst.do("group_begin").ok and "open" in inst.books()["free group"]
    assert inst.do("free", request="A").ok
    sc.allocator.free_group_begin()
    sc.finish("A")
    assert state(inst.world) == state(sc)  # queued in the group, not yet on free_pages
    assert inst.do("group_end").ok
    sc.allocator.free_group_end()
    c = sc.slots("C")
    s = inst.do("segment", seg_request="C", start_pos=0, count=8)
    sc.allocator.free_segment(torch.tensor(c[:8]), start_pos=0)
    assert s.ok and s.call == f"allocator.free_segment(tensor({c[:8]}), start_pos=0)"
    assert state(inst.world) == state(sc)
    assert inst.books()["free_pages"] == sc.allocator.free_pages.tolist()


def test_05_library_refusals_show_its_message_and_change_nothing():
    inst = token_books.paged_free_instrument()
    before = state(inst.world)
    s = inst.do("segment", seg_request="C", start_pos=9, count=2)
    assert (
        not s.ok
        and "page-aligned start" in s.error
        and s.error.startswith("ValueError: ")
    )
    assert inst.do("group_begin").ok
    s = inst.do("group_begin")
    assert (
        not s.ok
        and s.error
        == "RuntimeError: free groups do not nest: free_group_begin called inside an open group"
    )
    inst.undo()
    assert state(inst.world) == before


def test_05_a_double_free_raises_the_engines_error_in_debug_mode():
    inst = token_books.paged_free_instrument()
    assert inst.do("free", request="A").ok
    before = state(inst.world)
    sc = token_books.paged_scene(4)  # the library driven directly, debug mode on
    sc.extend_batch({"A": 3, "B": 4, "C": 6})
    for _ in range(6):
        sc.decode(["A", "B", "C"])
    slots = sc.finish("A")
    with pytest.raises(ValueError) as exc:
        sc.allocator.free(torch.tensor(slots))
    s = inst.do("double_free", stale="A")
    assert (
        not s.ok and s.error == f"ValueError: {exc.value}" and "double free" in s.error
    )
    assert s.call == f"allocator.free(tensor({slots}))"
    assert state(inst.world) == before


def test_05_page_size_replays_the_steps():
    inst = token_books.paged_free_instrument()
    inst.do("free", request="B")
    assert inst.set(page_size=2) == []
    sc = sglang_books.decode_steps(page_size=2)
    sc.finish("B")
    assert state(inst.world) == state(sc)


# -- chapter 12: the unified pool --------------------------------------------------------------


def test_12_opens_on_the_storys_last_state():
    inst = unified_books.unified_instrument()
    assert state(inst.world) == state(
        unified_books.unified_story(page_size=2, window=4)
    )
    assert inst.books()["available_size()"] == 0 and inst.books()["gap bytes"] == 128


def test_12_free_extend_decode_window_match_the_library():
    inst = unified_books.unified_instrument()
    sc = unified_books.unified_story(page_size=2, window=4)
    s = inst.do("free", free_request="B")
    sc.finish("B")
    assert s.ok and "full page 13 -> 21 (virtual page 8)" in s.result
    s = inst.do("extend", request="D", tokens=3)
    out = sc.extend_batch({"D": 3})
    assert s.ok and s.result == spell_value(out) and "allocator.alloc_extend(" in s.call
    s = inst.do("decode", requests=["C", "D"])
    out = sc.decode(["C", "D"])
    assert s.ok and s.result == spell_value(out)
    s = inst.do("window", win_request="C", window=2)
    gone = sc.release_window("C", 2)
    assert s.ok and s.call == f"allocator.free_swa(tensor({gone}))"
    assert state(inst.world) == state(sc)
    al = sc.allocator
    books = inst.books()
    assert (
        books["available_size()"] == al.available_size()
        and books["gap bytes"] == al.full_attn_allocator._current_gap_bytes()
    )
    v2p = al.swa_attn_allocator.virtual_to_physical.tolist()
    assert books["request C"]["swa"] == [
        v2p[v] for v in books["request C"]["virtual_pages"]
    ]


def test_12_refusals_and_undo():
    inst = unified_books.unified_instrument()
    before = state(inst.world)
    s = inst.do("extend", request="D", tokens=3)
    assert not s.ok and s.result == "None" and "available_size() = 0" in s.error
    s = inst.do("extend", request="D", tokens=-1)
    assert (
        not s.ok
        and s.error
        == "ValueError: request 0: seq_len -1 is shorter than its prefix 0 (extend_lens[0] = -1)"
    )
    assert state(inst.world) == before
    inst.do("free", free_request="B")
    assert inst.undo() and state(inst.world) == before


# -- the pictures: every cell says what it is, text escaped ------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        token_books.request_instrument,
        token_books.token_instrument,
        token_books.paged_free_instrument,
        unified_books.unified_instrument,
    ],
)
def test_every_cell_has_a_tooltip_and_no_button_is_cut(make):
    inst = make()
    assert all(b.layout.width == "auto" for b in inst.buttons.values())
    tips = cells(inst.picture)
    assert tips and all(tips.values()), [g for g, t in tips.items() if not t][:5]


def test_tooltips_say_what_a_cell_is():
    inst = token_books.token_instrument()
    inst.do("free", free_request="C")
    tips = cells(inst.picture)
    assert tips["slot:8"] == "slot 8 · freed, staged (not yet on the free list)"
    inst = unified_books.unified_instrument()
    tips = cells(inst.picture)
    assert (
        tips["v2p:full:8"]
        == "full v2p[8] = 13: virtual page 8 of C (virtual ids 16-17) lives in full page 13"
    )
    assert tips["byte:gap"].startswith("the gap: bytes ")
    inst = token_books.request_instrument()
    assert inst.do("alloc", requests=["<s>"], tokens=[2]).ok
    svg = inst.picture
    assert "<s>" not in svg and cells(svg)["row:5:0"].startswith(
        "row 5 · <s> (generation 3"
    )


def test_replay_as_a_story_tells_the_learners_steps():
    inst = unified_books.unified_instrument()
    inst.do("free", free_request="B")
    inst.do("extend", request="D", tokens=3)
    stepper = inst.story()
    assert len(stepper.states) == 3 and stepper.view.value.startswith("<svg")
    stepper.slider.value = 2
    assert "D +3" in stepper.caption.value and stepper.view.value == inst.picture
