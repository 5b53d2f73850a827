"""The instruments of chapters 01, 03, 05 and 12 in a real browser (the machinery is
tests/chapters/test_browser_instruments.py's, imported): one JupyterLab serves the four
chapters; each is opened in headless Chromium and run down to its instrument; then an
operation typed and clicked, a bad input refused with the library's message, undo, a
cell hovered. After each, the picture and the books shown are checked, the books against
the live objects read in the kernel.
Screenshots go to artifacts/browser/ (git-ignored). Every wait is for a condition."""

import re

import pytest

from memlab_tests.chapters.test_browser_instruments import (
    ARTIFACTS,
    CHROMIUM_FLAGS,
    INST,
    WAIT,
    books_shown,
    kernel_eval,
    serve_lab,
    svg_of,
    wait_changed,
    wait_idle,
    wait_text,
)

CHAPTERS = {
    "01": "01_request_table.ipynb",
    "03": "03_token_allocator.ipynb",
    "05": "05_decode_and_free.ipynb",
    "12": "12_unified_pool.ipynb",
}
REAL_BOOKS = (
    "import json; from memlab.course.viz.instrument import books_value; "
    "print(json.dumps({k: books_value(v) for k, v in inst.read_books(inst.world).items()}))"
)


@pytest.fixture(scope="module")
def lab():
    with serve_lab("lab-instruments-a", CHAPTERS.values()) as served:
        yield served


def type_into(inst, label: str, value: str) -> None:
    """Fill the Text whose description is exactly ``label`` and commit it (Enter)."""
    box = inst.locator(
        ".widget-text",
        has=inst.page.locator("label", has_text=re.compile(f"^{re.escape(label)}$")),
    )
    box = box.locator("input")
    box.fill(value)
    box.press("Enter")


def open_chapter(ctx, lab, nn: str):
    page = ctx.new_page()
    page.goto(
        lab["url"](CHAPTERS[nn], f"a{nn}"), wait_until="domcontentloaded", timeout=WAIT
    )
    page.wait_for_function(
        "window.jupyterapp && window.jupyterapp.shell.currentWidget"
        " && window.jupyterapp.shell.currentWidget.sessionContext",
        timeout=WAIT,
    )
    page.evaluate("""async () => { const p = window.jupyterapp.shell.currentWidget;
        await p.context.ready; await p.sessionContext.ready; }""")
    page.add_style_tag(content=".Toastify { display: none !important; }")
    cell = page.evaluate("""() => {
        const nb = window.jupyterapp.shell.currentWidget.content;
        const i = nb.widgets.findIndex(c => /^inst = /m.test(c.model.sharedModel.getSource()));
        if (i >= 0) nb.activeCellIndex = i + 1;
        return i; }""")
    assert cell > 0, f"chapter {nn} has no cell that makes its instrument"
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-above')")
    inst = page.locator(INST)
    inst.wait_for(timeout=WAIT)
    page.locator(f"{INST} svg.memlab-svg").first.wait_for(timeout=WAIT)
    wait_idle(page)
    inst.scroll_into_view_if_needed()
    return page, inst


def click(page, inst, op: str, words: str, where: str = ".memlab-call") -> None:
    inst.locator(f".memlab-op-{op}").click()
    wait_text(page, f"{INST} {where}", words)
    wait_idle(page)


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
def test_instrument_in_a_real_browser(lab, nn):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    plan = PLANS[nn]
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            f"{lab['state']}/chromium-{nn}",
            executable_path=lab["chromium"],
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1300, "height": 1700},
        )
        try:
            page, inst = open_chapter(ctx, lab, nn)
            assert (
                "the story's last step" in inst.locator(".memlab-call").text_content()
            )
            opening_svg, opening_books = svg_of(page), books_shown(page)
            assert opening_books == kernel_eval(page, REAL_BOOKS)
            inst.screenshot(path=str(ARTIFACTS / f"{nn}_instrument_open.png"))

            # an operation typed and clicked: the call it made, the books of the real objects
            fields, op, words = plan["good"]
            for label, value in fields.items():
                type_into(inst, label, value)
            click(page, inst, op, words)
            after_svg = wait_changed(page, opening_svg)
            shown = books_shown(page)
            assert shown == kernel_eval(page, REAL_BOOKS) and shown != opening_books
            inst.screenshot(path=str(ARTIFACTS / f"{nn}_instrument_after_op.png"))

            # a bad input: the library's own message, nothing changed
            fields, op, words = plan["bad"]
            for label, value in fields.items():
                type_into(inst, label, value)
            click(page, inst, op, words, ".memlab-error")
            assert books_shown(page) == shown == kernel_eval(page, REAL_BOOKS)
            assert svg_of(page) == after_svg
            assert "nothing changed" in inst.locator(".memlab-call").text_content()
            inst.screenshot(path=str(ARTIFACTS / f"{nn}_instrument_refused.png"))

            # undo: the opening picture and books again
            inst.locator("button", has_text="undo").click()
            wait_text(page, f"{INST} .memlab-call", "the story's last step")
            wait_changed(page, after_svg)
            wait_idle(page)
            assert svg_of(page) == opening_svg and books_shown(page) == opening_books

            # hover: the cell's tooltip, and the read-out strip shows it
            gid = plan["hover"]
            cell = inst.locator(f'g.memlab-cell[data-gid="{gid}"]')
            cell.scroll_into_view_if_needed()
            cell.locator("rect.memlab-box").hover()
            title = cell.locator("title").text_content()
            want = kernel_eval(
                page,
                "import html, json, re; print(json.dumps(html.unescape(re.search("
                f"r'data-gid=\"{gid}\"><title>([^<]*)</title>', inst.picture).group(1))))",
            )
            assert title == want and title, (title, want)
            page.wait_for_function(
                """(gid) => { const t = document.querySelector(
                `.memlab-instrument g.memlab-cell[data-gid="${gid}"] > .memlab-tip`);
                return t && getComputedStyle(t).visibility === 'visible'; }""",
                arg=gid,
                timeout=WAIT,
            )
            inst.screenshot(path=str(ARTIFACTS / f"{nn}_instrument_hover.png"))

            errors = page.locator(
                ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
            )
            texts = [errors.nth(i).text_content() or "" for i in range(errors.count())]
            bad = [t for t in texts if "Error" in t or "Traceback" in t]
            assert not bad, f"error output in chapter {nn}: {bad[0][:500]}"
        finally:
            ctx.close()
    for name in ("open", "after_op", "refused", "hover"):
        assert (ARTIFACTS / f"{nn}_instrument_{name}.png").stat().st_size > 10_000
