"""The SGLang-books instruments (chapters 01, 03, 04, 05, 12) in a real browser (the harness:
tests/tools/browser.py; one JupyterLab and one Chromium for the session).

Each chapter is opened in its own tab and run down to its instrument; then an operation typed
and clicked, a bad input refused with the library's message, undo, a cell hovered. After each,
the picture and the books shown are checked, the books against the live objects read in the
kernel. Chapter 04 is driven further: its kernel comparison, a typed prefix that is kept, the
story replay, and the pages ``release_kv_cache`` gives back. Screenshots go to
artifacts/browser/.
"""

import pytest

from memlab_tests.tools.browser import (
    Inst,
    close_notebook,
    kernel_eval,
    no_error_output,
    open_instrument,
    shot,
)

CHAPTERS = {
    "01": "01_request_table.ipynb",
    "03": "03_token_allocator.ipynb",
    "05": "05_decode_and_free.ipynb",
    "12": "12_unified_pool.ipynb",
}

# What each chapter's instrument is driven with: (fields to type, the operation, words its call
# shows), the bad input and the library's words, and a cell to hover.
PLANS = {
    "01": dict(
        good=({"requests": "F, G", "tokens": "2, 3"}, "alloc", "-> [4, 5]"),
        bad=(
            {"requests": "X, X", "tokens": "1, 1"},
            "alloc",
            "appears twice in one alloc",
        ),
        hover="row:5:0",
    ),
    "03": dict(
        good=({"request": "F", "n": "3"}, "alloc", "allocator.alloc(need_size=3)"),
        bad=({"n": "-1"}, "alloc", "ValueError: need_size must be an int >= 0, got -1"),
        hover="slot:8",
    ),
    "05": dict(
        good=({"requests": "A, B, C"}, "decode", "allocator.alloc_decode("),
        bad=(
            {"start_pos": "1", "count": "2"},
            "segment",
            "free_segment needs a page-aligned start",
        ),
        hover="slot:36",
    ),
    "12": dict(
        good=({}, "free", "release_kv_cache(req_to_token_pool, allocator, B)"),
        bad=(
            {"request": "D", "tokens": "-1"},
            "extend",
            "seq_len -1 is shorter than its prefix 0",
        ),
        hover="v2p:full:8",
    ),
}


@pytest.mark.parametrize("nn", list(CHAPTERS))
def test_instrument_in_a_real_browser(lab, browser, nn):
    plan = PLANS[nn]
    page = open_instrument(browser, lab, CHAPTERS[nn], "inst = ")
    try:
        inst = Inst(page, 0, "inst")
        assert "the story's last step" in inst.call()
        opening_svg, opening_books = inst.view(), inst.shown()
        assert opening_books == inst.real()
        inst.shot(f"{nn}_instrument_open.png")

        # an operation typed and clicked: the call it made, the books of the real objects
        fields, op, words = plan["good"]
        for label, value in fields.items():
            inst.type(label, value)
        inst.click(op)
        inst.wait_call(words)
        after_svg = inst.wait_view_changed(opening_svg)
        shown = inst.shown()
        assert shown == inst.real() and shown != opening_books
        inst.shot(f"{nn}_instrument_after_op.png")

        # a bad input: the library's own message, nothing changed
        fields, op, words = plan["bad"]
        for label, value in fields.items():
            inst.type(label, value)
        inst.click(op)
        inst.wait_error(words)
        assert inst.shown() == shown == inst.real()
        assert inst.view() == after_svg
        assert "nothing changed" in inst.call()
        inst.shot(f"{nn}_instrument_refused.png")

        # undo: the opening picture and books again
        inst.loc.locator("button", has_text="undo").click()
        inst.wait_call("the story's last step")
        inst.wait_view_changed(after_svg)
        assert inst.view() == opening_svg and inst.shown() == opening_books

        # hover: the cell's tooltip, and the read-out strip shows it
        gid = plan["hover"]
        title = inst.hover(gid)
        want = kernel_eval(
            page,
            "import html, json, re; print(json.dumps(html.unescape(re.search("
            f"r'data-gid=\"{gid}\"><title>([^<]*)</title>', inst.picture).group(1))))",
        )
        assert title == want and title, (title, want)
        inst.shot(f"{nn}_instrument_hover.png")
        if nn == "12":
            free_swa_lists_its_moves_and_decode_drops_the_freed(inst)
        no_error_output(page, CHAPTERS[nn])
    finally:
        close_notebook(page)


def free_swa_lists_its_moves_and_decode_drops_the_freed(inst) -> None:
    """Chapter 12: free B; the decode field no longer names it; free_swa reports its page moves."""
    inst.pick("free", 0, "B")
    inst.click("free")
    inst.wait_call("release_kv_cache(req_to_token_pool, allocator, B)")
    assert "B" not in inst.row("decode").locator("input").input_value().split(", ")
    inst.pick("window", 0, "C")
    inst.type_row("window", "2")
    inst.click("window")
    inst.wait_call("allocator.free_swa(")
    call = inst.call()
    assert "swa page" in call and "->" in call, call
    assert "pages in use" in " ".join(inst.shown())
    inst.shot("12_instrument_after_free_swa.png")


# -- chapter 04, further -----------------------------------------------------------------------

REAL_04 = "viz.sglang_books.extend_books"


def test_chapter_04_instrument_in_a_real_browser(lab, browser):
    page = open_instrument(browser, lab, "04_alloc_extend.ipynb", "extend_instrument(")
    try:
        inst = Inst(page, 0, "inst", REAL_04)
        assert "the story's last step" in inst.call()
        active = inst.loc.locator(
            ".widget-toggle-button.mod-active, .widget-toggle-buttons button.mod-active"
        )
        assert active.first.text_content().strip() == "4", "opens on page size 4"
        opening_svg, opening_books = inst.svg(), inst.shown()
        assert (
            opening_books == inst.real()
            and opening_books["free_pages"] == "[10, 11, 12]"
        )
        inst.shot("04_instrument_open.png")

        # prefix_lens follows the requests typed, and keeps a value the learner typed
        inst.type("requests", "A")
        page.wait_for_function(
            "() => [...document.querySelectorAll('.memlab-instrument input')]"
            ".some(i => i.value === '11')"
        )
        inst.type("prefix_lens", "5")
        inst.type("requests", "A, D")
        assert inst.field("prefix_lens").input_value() == "5", (
            "the typed prefix was reset"
        )
        inst.type("seq_lens", "14, 6")
        inst.click("alloc_extend")
        error = inst.wait_error("prefix_lens")
        assert "2 requests, 1 prefix_lens" in error, error
        inst.type("prefix_lens", "5, 0")
        inst.click("alloc_extend")
        error = inst.wait_error("you gave A a prefix of 5, but A holds 11 tokens")
        inst.shot("04_instrument_typed_prefix_refused.png")

        # an operation: the learner's batch, the call it made, the books of the real allocator
        inst.type("prefix_lens", "11, 0")
        inst.click("alloc_extend")
        inst.wait_call("extend_lens=[3, 6]")
        after_svg = inst.wait_view_changed(opening_svg)
        call = inst.loc.locator(".memlab-call pre").text_content()
        assert "allocator.alloc_extend(\n    prefix_lens=tensor([11, 0])," in call
        assert "-> tensor([19, 40, 41, 44" in call
        assert "all three agree" in inst.loc.locator(".memlab-three-way").text_content()
        shown = inst.shown()
        assert shown == inst.real() and shown["free_pages"] == "[]"
        assert shown != opening_books and 'data-gid="slot:44"' in after_svg
        inst.shot("04_instrument_after_alloc_extend.png")

        # a batch the pool cannot hold: the whole refusal, nothing changed
        inst.type("requests", "B")
        inst.type("prefix_lens", "12")
        inst.type("seq_lens", "24")
        inst.click("alloc_extend")
        error = inst.wait_error("refused")
        assert error.endswith("so nothing was taken"), error
        assert inst.shown() == shown == inst.real() and inst.svg() == after_svg
        inst.shot("04_instrument_refused.png")

        # replay as a story: the state before the learner's steps, then the batch
        inst.loc.locator("button", has_text="replay as a story").click()
        story = page.locator(".memlab-instrument .memlab-story")
        story.wait_for()
        assert "step 0 of 1" in story.text_content()
        story.locator("button", has_text="next").click()
        page.wait_for_function(
            "() => document.querySelector('.memlab-instrument .memlab-story')"
            ".textContent.includes('step 1 of 1')"
        )
        assert (
            "alloc_extend: A 11->14 (parts 1/0/2), D 0->6 (parts 0/4/2)"
            in story.text_content()
        )
        shot(story, "04_instrument_story.png")

        # release_kv_cache: the freed pages carry a dashed edge and their own legend entry
        inst.pick("release", 0, "C")
        inst.click("release")
        inst.wait_call("release_kv_cache(req_to_token_pool, allocator, C)")
        freed = inst.wait_view_changed(after_svg)
        assert "given back by the last call" in freed
        assert "handed out by the last call" not in freed
        assert 'stroke-dasharray="4 2"' in freed
        assert inst.shown() == inst.real()
        inst.shot("04_instrument_after_release.png")

        # undo: back to the books after the batch
        inst.loc.locator("button", has_text="undo").click()
        inst.wait_call("extend_lens=[3, 6]")
        inst.wait_view_changed(freed)
        assert inst.shown() == shown == inst.real()

        title = inst.hover("slot:38")
        assert title.startswith("slot 38 = page 9 × 4 + offset 2 · C, position 10"), (
            title
        )
        inst.shot("04_instrument_hover.png")
        no_error_output(page, "04_alloc_extend.ipynb", allowed=("NotImplementedError",))
    finally:
        close_notebook(page)
