"""The instruments without a browser: driven through their Python API, their books compared with
the library's objects driven directly; a refused or raising call leaves every object as it was;
the call shown is the call made (pasted into Python it returns the same slots); the pictures are
SVG whose every cell says what it is, with every text escaped."""

import copy
import re
import xml.etree.ElementTree as ET

import pytest
import torch

from memlab.course.viz import sglang_books
from memlab.course.viz.instrument import (
    Instrument,
    Operation,
    ints,
    names,
    spell,
    spell_value,
)
from memlab.course.viz.sglang_books import (
    EXTEND_BATCHES,
    extend_instrument,
    extend_scene,
)
from memlab.course.viz.widgets import Stepper
from memlab.sglang.allocation import alloc_for_extend
from memlab.sglang.req_to_token import Req

SVG = "{http://www.w3.org/2000/svg}"


# -- helpers ------------------------------------------------------------------------------------


def state(sc):
    """Everything a call could change in a Scene's real objects, as plain values."""
    al, rp = sc.allocator, sc.req_pool
    return dict(
        free_pages=al.free_pages.tolist(),
        staged_pages=al.get_all_free_pages()[len(al.free_pages) :].tolist(),
        table=rp.req_to_token.tolist(),
        generations=rp.req_generation.tolist(),
        free_rows=list(rp.free_slots),
        row_free=bytes(rp._row_free),
        reqs={
            r: (q.kv.req_pool_idx, q.kv.kv_allocated_len) for r, q in sc.reqs.items()
        },
    )


def direct(page_size, batches):
    """The library driven directly: chapter 04's books, then ``batches`` (dicts of new tokens)."""
    sc = extend_scene(page_size)
    outs = [sc.extend_batch(b) for b in (*EXTEND_BATCHES, *batches)]
    return sc, outs


def cells(svg: str) -> dict:
    """gid -> tooltip of every cell of an instrument's SVG (parsed as XML: it must be
    well-formed)."""
    root = ET.fromstring(svg)
    found = {}
    for g in root.iter(f"{SVG}g"):
        if g.get("data-gid"):
            t = g.find(f"{SVG}title")
            found[g.get("data-gid")] = "" if t is None else t.text
    return found


def batch_args(sc, batch):
    """prefix_lens and seq_lens of ``batch`` ({rid: new tokens}) on scene ``sc``."""
    pre = [sc.reqs[r].kv.kv_allocated_len if r in sc.reqs else 0 for r in batch]
    return dict(
        requests=list(batch),
        prefix_lens=pre,
        seq_lens=[p + n for p, n in zip(pre, batch.values())],
    )


@pytest.fixture
def inst():
    return extend_instrument()


# -- chapter 04: the opening state ---------------------------------------------------------------


def test_opens_on_page_size_4_at_the_storys_last_state(inst):
    assert inst.setting_values == {"page_size": 4}
    story = sglang_books.paged_extend(page_size=4)
    assert state(inst.world) == state(story)
    assert (
        "the story&#x27;s last step" in inst.call_box.value
        or "the story's last step" in inst.call_box.value
    )
    assert "allocator.alloc_extend(" in inst.call_box.value
    # the fields hold a batch that fits and continues A from what it holds
    assert (
        inst.fields["requests"].widget.value,
        inst.fields["prefix_lens"].widget.value,
    ) == ("A, D", "11, 0")


def test_chapter_04_stepper_opens_on_page_size_4():
    stories = {f"page_size {ps}": [object()] for ps in (1, 2, 4, 8)}
    s = Stepper(stories, lambda _: "<i>x</i>", story="page_size 4")
    assert s.story.value == "page_size 4"
    # the default stays the first
    assert Stepper(stories, lambda _: "<i>x</i>").story.value == "page_size 1"


# -- chapter 04: operations against the library driven directly --------------------------------


@pytest.mark.parametrize(
    "page_size, batches",
    [
        (4, [{"A": 3, "D": 6}]),
        (
            4,
            [{"D": 5}, {"D": 2, "B": 1}],
        ),  # a request continues inside its old page (5 -> 7)
        (2, [{"A": 1, "B": 4, "D": 3}]),
        (1, [{"D": 9}, {"A": 2, "D": 1}]),
    ],
)
def test_alloc_extend_books_are_the_librarys(page_size, batches):
    inst = extend_instrument(page_size=page_size)
    sc, outs = direct(page_size, batches)
    for batch, out in zip(batches, outs[len(EXTEND_BATCHES) :]):
        step = inst.do("alloc_extend", **batch_args(inst.world, batch))
        assert step.ok, step.error
        assert step.result == spell_value(out), (
            "the slots shown are not the ones the library hands out"
        )
    assert state(inst.world) == state(sc)
    books = inst.books()
    al = sc.allocator
    assert (
        books["free_pages"] == al.free_pages.tolist()
        and books["available_size()"] == al.available_size()
    )
    for rid, req in sc.reqs.items():
        row = sc.req_pool.req_to_token[
            req.kv.req_pool_idx, : req.kv.kv_allocated_len
        ].tolist()
        assert books[f"request {rid}"]["tokens"] == req.kv.kv_allocated_len
        assert books[f"request {rid}"]["pages"] == list(
            dict.fromkeys(s // page_size for s in row)
        )


def test_the_call_shown_is_the_call_made(inst):
    """The chapter's recipe: undo the call, paste it under a copy of the allocator: same slots."""
    step = inst.do(
        "alloc_extend", requests=["A", "D"], prefix_lens=[11, 0], seq_lens=[14, 6]
    )
    comment, *lines = step.call.splitlines()
    assert comment.startswith(
        "# alloc_for_extend(req_to_token_pool, allocator, reqs=[A, D], extend_lens=[3, 6])"
    )
    assert lines[:3] == [
        "allocator.alloc_extend(",
        "    prefix_lens=tensor([11, 0]),",
        "    prefix_lens_cpu=tensor([11, 0]),",
    ]
    inst.undo()
    allocator = copy.deepcopy(inst.world.allocator)
    # the comment line is harmless
    pasted = eval(step.call, {"tensor": torch.tensor, "allocator": allocator})
    assert spell_value(pasted) == step.result
    assert (
        allocator.free_pages.tolist() == []
        and inst.world.allocator.free_pages.tolist() == [10, 11, 12]
    )


def test_release_gives_the_pages_back_like_the_library(inst):
    sc, _ = direct(4, [])
    sc.finish("B")
    step = inst.do("release", request="B")
    assert step.ok and step.call.splitlines()[1:4] == [
        "# called allocator.free_segment(",
        "#       free_index=tensor([12, 13, 14, 15, 20, 21, 22, 23, 24, 25, 26, 27]),",
        "#       start_pos=0,",
    ]
    assert state(inst.world) == state(sc)
    assert inst.fields["request"].widget.options == ("A", "C") or list(
        inst.fields["request"].widget.options
    ) == ["A", "C"]


# -- bad input: the library's message, nothing changed -----------------------------------------


def library_error(batch_reqs, extend_lens):
    """What alloc_for_extend itself raises on the opening state (or None if it does not)."""
    sc, _ = direct(4, [])
    reqs = [sc.reqs.get(r) or Req(r) for r in batch_reqs]
    try:
        alloc_for_extend(sc.req_pool, sc.allocator, reqs, extend_lens)
    except ValueError as exc:
        return f"ValueError: {exc}", sc
    return None, sc


@pytest.mark.parametrize(
    "args, extend",
    [
        (
            dict(requests=["A", "D"], prefix_lens=[11, 0], seq_lens=[14, -2]),
            [3, -2],
        ),  # a negative length
        (
            dict(requests=["A"], prefix_lens=[11], seq_lens=[5]),
            [-6],
        ),  # a prefix longer than its sequence
    ],
)
def test_bad_lengths_show_the_librarys_message_and_change_nothing(inst, args, extend):
    want, _ = library_error(args["requests"], extend)
    assert want is not None
    before = state(inst.world)
    step = inst.do("alloc_extend", **args)
    assert not step.ok and step.error == want
    assert state(inst.world) == before
    assert (
        "nothing changed" in inst.call_box.value
        and "shorter than its prefix" in inst.call_box.value
    )


def test_a_raising_call_that_changed_the_books_is_replayed_away(inst, monkeypatch):
    """A library call that takes pages and then raises (memlab's own refuse before they change
    anything, so this one is injected, once): the instrument replays its steps and its objects
    are as before. The buggy variant trusts the library and keeps what the call took."""
    from memlab.sglang.allocator.paged import PagedTokenToKVPoolAllocator

    real, armed = PagedTokenToKVPoolAllocator.alloc_extend, [True]

    def takes_then_raises(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if armed[0]:
            armed[0] = False
            raise ValueError("injected: raised after taking pages")
        return out

    monkeypatch.setattr(PagedTokenToKVPoolAllocator, "alloc_extend", takes_then_raises)
    before = state(inst.world)
    step = inst.do("alloc_extend", requests=["A"], prefix_lens=[11], seq_lens=[14])
    assert (
        not step.ok and step.error == "ValueError: injected: raised after taking pages"
    ), step.error
    assert state(inst.world) == before
    # the buggy variant: trust the library
    monkeypatch.setattr(Instrument, "_rebuild", lambda self: None)
    armed[0] = True
    inst.do("alloc_extend", requests=["A"], prefix_lens=[11], seq_lens=[14])
    assert state(inst.world) != before


def test_a_batch_the_pool_cannot_hold_is_refused_with_nothing_taken(inst):
    before = state(inst.world)
    step = inst.do(
        "alloc_extend", requests=["A", "D"], prefix_lens=[11, 0], seq_lens=[24, 24]
    )
    sc, outs = direct(4, [{"A": 13, "D": 24}])
    assert outs[-1] is None  # the library refuses it too
    assert (
        not step.ok
        and step.result == "None"
        and step.call.startswith("alloc_for_extend(")
    )
    assert "needs 9 new pages" in step.error and "3 free" in step.error, step.error
    assert state(inst.world) == before == state(sc)


def test_rows_short_and_wrong_prefixes_are_refused(inst):
    before = state(inst.world)
    step = inst.do(
        "alloc_extend", requests=["D", "E"], prefix_lens=[0, 0], seq_lens=[1, 1]
    )
    assert (
        not step.ok
        and "need a row each" in step.error
        and "1 row(s) are free" in step.error
    )
    step = inst.do("alloc_extend", requests=["A"], prefix_lens=[5], seq_lens=[9])
    assert not step.ok and "A holds 11" in step.error
    inst.fields["seq_lens"].widget.value = "14, six"
    step = inst.press("alloc_extend")
    assert not step.ok and "'six' is not a whole number" in step.error
    assert state(inst.world) == before


# -- undo, reset, settings, story --------------------------------------------------------------


def test_undo_reset_and_another_page_size_replay_on_fresh_objects(inst):
    one, _ = direct(4, [{"A": 3}])
    inst.do("alloc_extend", requests=["A"], prefix_lens=[11], seq_lens=[14])
    inst.do("release", request="B")
    assert inst.undo() and state(inst.world) == state(one)
    assert inst.undo() and not inst.undo()  # never past the opening
    inst.do("alloc_extend", requests=["A"], prefix_lens=[11], seq_lens=[14])
    dropped = inst.set(page_size=2)
    assert dropped == [] and state(inst.world) == state(direct(2, [{"A": 3}])[0])
    inst.do("alloc_extend", requests=["D"], prefix_lens=[0], seq_lens=[8])
    # 6 pages of 8: the story fills them; A 11 -> 14 stays in its page, D does not fit
    dropped = inst.set(page_size=8)
    assert [(s.op, s.args["requests"]) for s in dropped] == [("alloc_extend", ["D"])]
    assert state(inst.world) == state(direct(8, [{"A": 3}])[0])
    assert "dropped" in inst.call_box.value
    inst.reset(empty=True)
    assert state(inst.world) == state(extend_scene(8)) and inst.books()[
        "free_pages"
    ] == list(range(1, 7))


def test_story_replays_the_learners_own_steps(inst):
    inst.do("alloc_extend", requests=["A", "D"], prefix_lens=[11, 0], seq_lens=[14, 6])
    inst.do("release", request="C")
    stepper = inst.story()
    assert len(stepper.states) == 3 and inst.story_box.children[-1] is stepper
    assert stepper.view.value.startswith("<svg")
    stepper.slider.value = 2
    assert "C finishes" in stepper.caption.value and stepper.view.value == inst.picture
    inst.undo()  # the story told steps that are gone now
    assert list(inst.story_box.children) == []


def test_following_fields_fill_each_requests_prefix(inst):
    inst.fields["requests"].widget.value = "C, B, Z"
    assert inst.fields["prefix_lens"].widget.value == "11, 12, 0"
    inst.fields["seq_lens"].widget.value = "12, 13, 1"
    step = inst.press("alloc_extend")
    assert step.ok and step.args == dict(
        requests=["C", "B", "Z"], prefix_lens=[11, 12, 0], seq_lens=[12, 13, 1]
    )
    # ready to continue them
    assert inst.fields["prefix_lens"].widget.value == "12, 13, 1"


# -- the three implementations -----------------------------------------------------------------


@pytest.mark.kernel
def test_three_way_runs_kernel_and_references_on_the_batch(inst, monkeypatch):
    step = inst.do(
        "alloc_extend", requests=["A", "D"], prefix_lens=[11, 0], seq_lens=[14, 6]
    )
    assert "all three agree" in step.details and "memlab-prefix-sums" in step.details
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", step.details)
    assert cells[cells.index("D") : cells.index("D") + 9] == [
        "D",
        "0 -&gt; 6",
        "-1",
        "6",
        "3",
        "2",
        "1",
        "[11, 12]",
        "0 / 4 / 2",
    ]
    inst.undo()
    from memlab.sglang.allocator import reference

    real = reference.alloc_extend_torch

    # a broken reference: the instrument must name the first difference
    def off_by_one(*a, **k):
        out = real(*a, **k).clone()
        out[2] += 1
        return out

    monkeypatch.setattr(reference, "alloc_extend_torch", off_by_one)
    step = inst.do(
        "alloc_extend", requests=["A", "D"], prefix_lens=[11, 0], seq_lens=[14, 6]
    )
    assert (
        "do not agree" in step.details
        and "first difference at output 2" in step.details
    )


# -- the pictures ------------------------------------------------------------------------------


def test_every_cell_says_what_it_is(inst):
    inst.do("alloc_extend", requests=["A", "D"], prefix_lens=[11, 0], seq_lens=[14, 6])
    tips = cells(inst.picture)
    books = inst.world.books()
    assert {g for g in tips if g.startswith("slot:")} == {
        f"slot:{s}" for s in range(books.num_slots)
    }
    assert (
        tips["slot:19"]
        == "slot 19 = page 4 × 4 + offset 3 · A, position 11 · new: part 1: the rest of its old "
        "page"
    )
    assert tips["slot:44"].endswith("D, position 0 · new: part 2: whole new pages")
    assert tips["slot:48"].endswith("D, position 4 · new: part 3: a new partial page")
    assert tips["slot:50"].endswith(
        "D's page, not written yet (its next token lands here)"
    )
    assert tips["row:1:4"].startswith(
        "row 1 · D (generation 1, 6 tokens) · position 4 -> slot 48"
    )
    inst.do("release", request="C")
    tips = cells(inst.picture)
    assert tips["free:0"] == "free_pages[0] = page 7 (slots 28-31) · taken next"
    assert (
        tips["slot:28"]
        == "slot 28 = page 7 × 4 + offset 0 · free: free_pages[0] · given back by the last call"
    )


def test_text_is_escaped_never_markup(inst):
    step = inst.do("alloc_extend", requests=["<s>"], prefix_lens=[0], seq_lens=[2])
    assert step.ok
    svg = inst.picture
    assert "<s>" not in svg and "&lt;s&gt;" in svg
    assert "<s>" not in inst.call_box.value + inst.books_box.value + inst.details.value
    ET.fromstring(svg)  # still well-formed
    # the tooltip reads the token
    assert cells(svg)["row:1:0"].startswith("row 1 · <s> (generation 1")


def test_spell_writes_python_a_cell_can_run():
    assert (
        spell("f", torch.tensor([1, 2]), x=[3, "a"], y=(1,))
        == "f(tensor([1, 2]), x=[3, 'a'], y=(1,))"
    )
    long = spell("g", a=list(range(30)), b=1)
    assert long.splitlines()[0] == "g(" and eval(long, {"g": lambda a, b: (a, b)}) == (
        list(range(30)),
        1,
    )
    assert (
        ints("6, 3 0") == [6, 3, 0]
        and ints("-1") == [-1]
        and names("A, B C") == ["A", "B", "C"]
    )


def test_a_generic_instrument_refuses_and_replays():
    """The framework alone, on a list: a raising step is refused and shown; undo replays the
    history on a fresh world, so a change made behind the instrument's back is gone too."""

    def push(world, step, x):
        step.call = f"world.append({x!r})"
        world.append(x)

    def pop(world, step):
        step.call = "world.pop()"
        step.result = repr(world.pop())

    inst = Instrument(
        lambda: [],
        [Operation("push", push), Operation("pop", pop)],
        draw=lambda w, s: f"<svg>{len(w)}</svg>",
        books=lambda w: {"items": list(w)},
    )
    step = inst.do("pop")
    assert (
        not step.ok
        and step.error == "IndexError: pop from empty list"
        and inst.history == []
    )
    assert "pop from empty list" in inst.call_box.value
    inst.do("push", x=1)
    inst.do("push", x=2)
    inst.world.append(99)  # behind the instrument's back
    assert (
        inst.undo()
        and inst.books() == {"items": [1]}
        and inst.picture == "<svg>1</svg>"
    )
    assert inst.do("pop").result == "1" and inst.books() == {"items": []}


def test_recording_sees_the_call_and_puts_the_method_back():
    from memlab.course.viz.instrument import recording
    from memlab.sglang.allocator import PagedTokenToKVPoolAllocator

    al = PagedTokenToKVPoolAllocator(16, 4)
    with recording(al, "alloc") as calls:
        got = al.alloc(8)
    assert calls == [{"args": {"need_size": 8}, "result": got}]
    assert "alloc" not in vars(al) and al.alloc(4).tolist() == [12, 13, 14, 15]


def test_released_pages_are_marked_as_given_back_not_handed_out():
    """After release_kv_cache the freed slots carry a dashed edge and the legend says what it means
    (a solid edge is 'handed out by the last call')."""
    from memlab.course.viz import sglang_books as sb

    inst = sb.extend_instrument(page_size=4)
    assert "handed out by the last call" in inst.picture  # the opening batch
    inst.do("release", request="A")
    pic = inst.picture
    assert (
        "given back by the last call" in pic
        and "handed out by the last call" not in pic
    )
    freed = re.findall(
        r'data-gid="slot:(\d+)">(?:<title>[^<]*</title>)?<rect[^>]*dasharray', pic
    )
    # A held pages 1, 2, 4
    assert freed and {int(s) // 4 for s in freed} == {1, 2, 4}, freed


def test_a_prefix_the_learner_typed_is_kept_and_named_in_the_refusal():
    from memlab.course.viz import sglang_books as sb

    inst = sb.extend_instrument(page_size=4)
    f = inst.fields
    f["requests"].widget.value = "A"
    assert f["prefix_lens"].widget.value == "11"  # filled in: what A holds
    f["prefix_lens"].widget.value = "5"
    f["requests"].widget.value = "B"  # another request: the typed value stays
    assert f["prefix_lens"].widget.value == "5"
    f["seq_lens"].widget.value = "20"
    step = inst.press("alloc_extend")
    assert "you gave B a prefix of 5, but B holds 12 tokens" in step.error, step.error
    big = inst.do(
        "alloc_extend", requests=["B", "D"], prefix_lens=[12, 0], seq_lens=[24, 24]
    )
    assert big.error.endswith("so nothing was taken"), big.error
