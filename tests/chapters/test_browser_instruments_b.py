"""Chapters 06, 07, 09 and 11's instruments in a real browser (the harness:
tests/tools/browser.py; one JupyterLab and one Chromium for the session). Each chapter is opened
in its own tab and run down to its instrument; then an operation typed or picked and clicked, a
bad input refused with the library's message (books and picture unchanged), undo, a cell
hovered. After each, the picture is checked and the books shown are compared with the books read
from the live objects in the kernel. Screenshots go to artifacts/browser/.
"""

from memlab_tests.tools.browser import (
    WAIT,
    Inst,
    close_notebook,
    no_error_output,
    open_instrument,
)

CHAPTERS = (
    "06_vllm_block_pool.ipynb",
    "07_hybrid_models.ipynb",
    "09_attention_through_pages.ipynb",
    "11_radix_and_hicache.ipynb",
)


def hover(inst: Inst, gid: str) -> str:
    return inst.hover(gid)


# -- the chapters ------------------------------------------------------------------------------


def test_chapter_06_block_pool_instrument(browser, lab):
    page = open_instrument(browser, lab, CHAPTERS[0], "block_pool_instrument(")
    inst = Inst(page, 0, "inst", "viz.vllm_books.vllm_books")
    inst.loc.scroll_into_view_if_needed()
    assert "the story's last step" in inst.loc.locator(".memlab-call").text_content()
    opening, books = inst.view(), inst.shown()
    assert books == inst.real() and books["free queue (head -> tail)"] == "[4, 2, 1]"
    inst.shot("06_instrument_open.png")

    inst.type_row("submit", "E", "0 1 2 3 4 5 6 7 60 61")
    inst.click("submit")
    inst.wait_call("blocks [1, 2], 8 tokens")
    after = inst.wait_view_changed(opening)
    shown = inst.shown()
    assert shown == inst.real() and shown["request E"].startswith("blocks [1, 2, 4]")
    assert (
        "manager.allocate_slots(req, 2, 8, hits)"
        in inst.loc.locator(".memlab-call pre").text_content()
    )
    inst.shot("06_instrument_after_submit.png")

    inst.pick("finish", 0, "C")
    inst.click("finish")
    inst.wait_call("manager.free(req)  # req = the Request 'C'")
    after = inst.wait_view_changed(after)
    freed = inst.shown()
    # reversed: the tail of C first
    assert (
        freed == inst.real()
        and freed["free queue (head -> tail)"] == "[10, 9, 8, 7, 6, 5]"
    )

    inst.type_row("submit", "F", "-1 2")
    inst.click("submit")
    error = inst.wait_error("must hold ints >= 0")
    assert (
        error
        == "ValueError: request 'F': prompt_token_ids (token ids) must hold ints >= 0, got -1"
    ), error
    assert inst.shown() == freed == inst.real() and inst.view() == after
    inst.shot("06_instrument_refused.png")

    inst.loc.locator("button", has_text="undo").click()
    inst.wait_call("blocks [1, 2], 8 tokens")
    inst.wait_view_changed(after)
    assert inst.shown() == shown == inst.real()
    tip = hover(inst, "block:1")  # back after E's submit: A's first block, hit by E
    assert (
        tip.startswith("block 1 · ref_cnt 1 · hash h1 = ")
        and "E's block 0 (tokens 0-3)" in tip
    ), tip
    inst.shot("06_instrument_hover.png")
    no_error_output(page, CHAPTERS[0])
    close_notebook(page)


def test_chapter_07_window_and_mamba_instruments(browser, lab):
    page = open_instrument(browser, lab, CHAPTERS[1], "mamba_instrument(", count=2)
    swa = Inst(page, 0, "swa", "viz.hybrid_books.swa_books")
    swa.loc.scroll_into_view_if_needed()
    opening, books = swa.view(), swa.shown()
    assert books == swa.real() and "swa_evicted_len 4" in books["request A"]
    swa.shot("07_instrument_open.png")

    swa.type_row("extend", "C", "3")
    swa.click("extend")
    swa.wait_call("extend_lens=[3]")
    after = swa.wait_view_changed(opening)
    shown = swa.shown()
    assert shown == swa.real() and "request C" in shown
    assert (
        "allocator.release_out_of_window(req_to_token, "
        in swa.loc.locator(".memlab-call pre").text_content()
    )
    swa.shot("07_instrument_after_extend.png")

    swa.type_row("extend", "E", "-2")
    swa.click("extend")
    error = swa.wait_error("shorter than its prefix")
    assert (
        error
        == "ValueError: request 0: seq_len -2 is shorter than its prefix 0 (extend_lens[0] = -2)"
    ), error
    assert swa.shown() == shown == swa.real() and swa.view() == after
    swa.shot("07_instrument_refused.png")

    swa.loc.locator("button", has_text="undo").click()
    swa.wait_call("the story's last step")
    swa.wait_view_changed(after)
    assert swa.view() == opening and swa.shown() == books == swa.real()
    tip = hover(swa, "swa:A:0")
    assert tip.startswith(
        "A, position 0 · full slot 2 (page 1) · SWA slot none: released"
    ), tip
    swa.shot("07_instrument_hover.png")

    # the window: 2 tokens, the story's steps replayed under it
    swa.loc.locator(".widget-toggle-button", has_text="2").first.click()
    swa.wait_view_changed(opening)
    assert "swa_evicted_len 6" in swa.shown()["request A"] and swa.shown() == swa.real()

    mamba = Inst(page, 1, "mamba", "viz.hybrid_books.mamba_books")
    mamba.loc.scroll_into_view_if_needed()
    m_open = mamba.view()
    assert mamba.shown() == mamba.real()
    mamba.pick("track", 0, "C")
    mamba.type_row("track", "64")
    mamba.click("track")
    mamba.wait_call("track_state([3], [64])")
    mamba.wait_view_changed(m_open)
    assert (
        mamba.shown() == mamba.real()
        and "last_track_seqlen 64" in mamba.shown()["request C"]
    )
    mamba.shot("07_mamba_instrument_after_track.png")
    no_error_output(page, CHAPTERS[1])
    close_notebook(page)


def test_chapter_09_attention_instrument(browser, lab):
    page = open_instrument(browser, lab, CHAPTERS[2], "attention_instrument(")
    inst = Inst(page, 0, "inst", "viz.draw_attention.attn_books")
    inst.loc.scroll_into_view_if_needed()
    page.wait_for_function(
        "() => document.querySelector('.memlab-instrument .memlab-attn-compare')",
        timeout=WAIT,
    )
    assert (
        "paged and dense agree"
        in inst.loc.locator(".memlab-attn-compare").text_content()
    )
    opening, books = inst.view(), inst.shown()
    assert books == inst.real()
    inst.shot("09_instrument_open.png")

    inst.pick("read", 0, "D")
    inst.pick("read", 1, "1")
    inst.pick("read", 2, "3")
    inst.click("read")
    inst.wait_call("# request D is batch entry 2; KV head 1")
    after = inst.wait_view_changed(opening)
    assert (
        "paged and dense agree"
        in inst.loc.locator(".memlab-attn-compare").text_content()
    )
    assert "reads pages [3, 8]" in inst.loc.locator(".memlab-call pre").text_content()
    assert inst.shown() == books == inst.real()  # reading changes no book
    inst.shot("09_instrument_after_read.png")

    inst.type_row("extend", "B", "-1")
    inst.click("extend")
    error = inst.wait_error("shorter than its prefix")
    assert (
        error
        == "ValueError: request 0: seq_len -1 is shorter than its prefix 0 (extend_lens[0] = -1)"
    ), error
    assert inst.view() == after and inst.shown() == books == inst.real()
    inst.shot("09_instrument_refused.png")

    inst.pick("finish", 0, "C")
    inst.click("finish")
    inst.wait_call("release_kv_row(req_to_token_pool, allocator, C)")
    freed = inst.wait_view_changed(after)
    assert inst.shown() == inst.real() and "request C" not in inst.shown()
    inst.loc.locator("button", has_text="undo").click()
    inst.wait_view_changed(freed)
    assert inst.shown() == books == inst.real()
    tip = hover(inst, "weight:0")
    assert tip.startswith("D position 0 · slot 12 = page 3 × 4 + offset 0 · weight "), (
        tip
    )
    inst.shot("09_instrument_hover.png")
    no_error_output(page, CHAPTERS[2])
    close_notebook(page)


def test_chapter_11_radix_instrument(browser, lab):
    page = open_instrument(browser, lab, CHAPTERS[3], "radix_instrument(")
    inst = Inst(page, 0, "inst", "viz.radix_books.radix_books_of")
    inst.loc.scroll_into_view_if_needed()
    assert "the story's last step" in inst.loc.locator(".memlab-call").text_content()
    opening, books = inst.view(), inst.shown()
    assert books == inst.real() and books["device available_size()"] == "24"
    inst.shot("11_instrument_open.png")

    inst.type_row("load_back", "<s> You are brief . What is KV ?")
    inst.click("load_back")
    inst.wait_call("tree.load_back(m.last_host_node)")
    after = inst.wait_view_changed(opening)
    shown = inst.shown()
    assert shown == inst.real() and shown["device available_size()"] == "15"
    inst.shot("11_instrument_after_load_back.png")

    inst.pick("unlock", 0, "1")
    inst.click("unlock")
    error = inst.wait_error("which nobody locks")
    assert error.startswith("ValueError: dec_lock_ref on TreeNode(id=1"), error
    assert inst.shown() == shown == inst.real() and inst.view() == after
    inst.shot("11_instrument_refused.png")

    inst.type_row(
        "arrive",
        "E",
        "<s> You are brief . What is KV ? and a very long question that wraps",
    )
    inst.click("arrive")
    inst.wait_call("req = driver.admit(")
    long = inst.wait_view_changed(after)
    assert inst.shown() == inst.real()
    for word in ("question", "that", "wraps"):
        assert f">{word}" in long or f" {word}" in long, (
            f"{word!r} was cut from the node labels"
        )
    inst.shot("11_instrument_after_arrive.png")

    inst.loc.locator("button", has_text="undo").click()
    inst.wait_view_changed(long)
    assert inst.shown() == shown == inst.real()
    tip = hover(inst, "node:1")
    assert tip.startswith("node 1 · key 'KV ?' (2 tokens: ids [7, 9])"), tip
    inst.shot("11_instrument_hover.png")
    no_error_output(page, CHAPTERS[3])
    close_notebook(page)
