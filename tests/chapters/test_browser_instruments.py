"""The instruments in a real browser: JupyterLab on a free local port, chapter 04 opened in
headless Chromium and run down to its instrument; then a batch typed and ``alloc_extend``
clicked, a bad batch refused with the library's message, undo, a slot hovered. After each, the
picture and the books shown are checked, the books against the live objects read in the kernel.
Screenshots go to artifacts/browser/ (git-ignored).

Every wait is for a condition (the kernel idle, a widget drawn, a text changed), never a
fixed time: the test runs on a busy 2-core machine. Needs Debian's ``chromium`` and
Playwright's Python package (no browser download); skips with a message naming what is
missing. It starts its own JupyterLab in its own folder
(tests/chapters/test_browser.py's may run at the same time on another pytest-xdist
worker).
"""

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
CHAPTER = "04_alloc_extend.ipynb"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
WAIT = 120_000  # ms: the longest any one condition may take on a loaded machine
INST = ".memlab-instrument"


def find_chromium():
    for name in (
        os.environ.get("MEMLAB_CHROMIUM"),
        "/usr/bin/chromium",
        "chromium",
        "chromium-browser",
    ):
        if name and (shutil.which(name) or Path(name).is_file()):
            return shutil.which(name) or name
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_server(url: str, proc, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(
                0.3
            )  # polling a server that is starting: the one place a pause is the wait
    raise TimeoutError(f"JupyterLab did not answer {url} within {timeout:.0f} s")


@contextlib.contextmanager
def serve_lab(folder: str, chapters):
    """One JupyterLab over copies of ``chapters`` (and their pictures) in artifacts/browser/``folder``;
    yields the Chromium to drive and ``url(chapter, workspace)``. Skips without a browser or lab."""
    chromium = find_chromium()
    if chromium is None:
        pytest.skip(
            "no Chromium here: apt-get install -y chromium (or set MEMLAB_CHROMIUM)"
        )
    pytest.importorskip(
        "playwright.sync_api",
        reason="no Playwright: pip install playwright (no browser download needed)",
    )
    pytest.importorskip("jupyterlab", reason="no JupyterLab: pip install jupyterlab")
    work = ARTIFACTS / folder
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for name in chapters:
        shutil.copy(ROOT / "chapters" / name, work / name)
    shutil.copytree(ROOT / "chapters" / "img", work / "img")
    state = Path(tempfile.mkdtemp(prefix="memlab-lab-"))
    port, token = free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        MEMLAB_FAST="1",
        JUPYTER_CONFIG_DIR=str(state / "config"),
        JUPYTERLAB_WORKSPACES_DIR=str(state / "workspaces"),
        JUPYTERLAB_SETTINGS_DIR=str(state / "settings"),
    )
    env.pop(
        "TRITON_INTERPRET", None
    )  # the kernel picks its own mode, as a learner's would
    log = open(state / "lab.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={work}",
            "--LabApp.expose_app_in_browser=True",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--ServerApp.port_retries=0",
            *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
        ],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        try:
            wait_for_server(f"http://127.0.0.1:{port}/api/status?token={token}", proc)
        except (RuntimeError, TimeoutError) as exc:
            log.flush()
            raise RuntimeError(
                f"{exc}; its log ends:\n{(state / 'lab.log').read_text()[-3000:]}"
            ) from None
        yield dict(
            url=lambda chapter, ws: (
                f"http://127.0.0.1:{port}/lab/workspaces/{ws}/tree/{chapter}?token={token}"
            ),
            chromium=chromium,
            state=state,
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def lab():
    with serve_lab("lab-instruments", [CHAPTER]) as served:
        yield dict(served, url=served["url"](CHAPTER, "instruments"))


# -- talking to the page and its kernel -----------------------------------------------------------


def wait_idle(page) -> None:
    """The notebook's kernel has nothing left to run."""
    page.wait_for_function(
        """() => { const s = window.jupyterapp.shell.currentWidget.sessionContext.session;
        return s && s.kernel && s.kernel.status === 'idle'; }""",
        timeout=WAIT,
    )


def kernel_eval(page, code: str):
    """Run ``code`` in the notebook's kernel (not in a cell) and return what it prints, as JSON."""
    out = page.evaluate(
        """async (code) => {
        const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
        let text = '';
        const f = k.requestExecute({code, silent: false, store_history: false});
        f.onIOPub = m => { if (m.header.msg_type === 'stream') text += m.content.text;
                           if (m.header.msg_type === 'error') text += 'ERROR ' + m.content.evalue; };
        await f.done;
        return text; }""",
        code,
    )
    assert not out.startswith("ERROR"), out
    return json.loads(out)


def svg_of(page) -> str:
    return page.locator(f"{INST} svg.memlab-svg").first.evaluate("e => e.outerHTML")


def wait_text(page, selector: str, words: str) -> None:
    page.wait_for_function(
        "([s, w]) => { const e = document.querySelector(s); return e && e.textContent.includes(w); }",
        arg=[selector, words],
        timeout=WAIT,
    )


def wait_changed(page, old_svg: str) -> str:
    page.wait_for_function(
        "([s, old]) => { const e = document.querySelector(s); return e && e.outerHTML !== old; }",
        arg=[f"{INST} svg.memlab-svg", old_svg],
        timeout=WAIT,
    )
    return svg_of(page)


def type_into(inst, label: str, value: str) -> None:
    """Fill an ipywidgets Text (found by its description) and commit it (Enter: continuous_update is off)."""
    box = inst.locator(
        ".widget-text", has=inst.page.locator("label", has_text=label)
    ).locator("input")
    box.fill(value)
    box.press("Enter")


def books_shown(page) -> dict:
    """The books as the widget shows them: name -> value."""
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll(
        '.memlab-instrument .memlab-books .memlab-book')].map(
        b => [b.querySelector('.memlab-book-key').textContent, b.querySelector('.memlab-book-value').textContent]))""")


REAL_BOOKS = (
    "import json; from memlab.course.viz.instrument import books_value; "
    "print(json.dumps({k: books_value(v) for k, v in viz.sglang_books.extend_books(inst.world).items()}))"
)


# -- the test ---------------------------------------------------------------------------------------------


def test_chapter_04_instrument_in_a_real_browser(lab):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(lab["state"] / "chromium"),
            executable_path=lab["chromium"],
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1300, "height": 1700},
        )
        try:
            page = ctx.new_page()
            page.goto(lab["url"], wait_until="domcontentloaded", timeout=WAIT)
            page.wait_for_function(
                "window.jupyterapp && window.jupyterapp.shell.currentWidget"
                " && window.jupyterapp.shell.currentWidget.sessionContext",
                timeout=WAIT,
            )
            page.evaluate("""async () => { const p = window.jupyterapp.shell.currentWidget;
                await p.context.ready; await p.sessionContext.ready; }""")
            page.add_style_tag(
                content=".Toastify { display: none !important; }"
            )  # the "news?" toast: off the pictures
            drive_the_instrument(page)
        finally:
            ctx.close()


def drive_the_instrument(page):
    cell = page.evaluate("""() => {
        const nb = window.jupyterapp.shell.currentWidget.content;
        const i = nb.widgets.findIndex(c => c.model.sharedModel.getSource().includes("extend_instrument("));
        if (i >= 0) nb.activeCellIndex = i + 1;
        return i; }""")
    assert cell > 0, "chapter 04 has no cell that makes its instrument"
    page.evaluate(
        "window.jupyterapp.commands.execute('notebook:run-all-above')"
    )  # setup .. instrument
    inst = page.locator(INST)
    inst.wait_for(timeout=WAIT)
    page.locator(f"{INST} svg.memlab-svg").first.wait_for(timeout=WAIT)
    wait_idle(page)
    inst.scroll_into_view_if_needed()
    assert "the story's last step" in inst.locator(".memlab-call").text_content()
    assert (
        page.locator(
            f"{INST} .widget-toggle-button.mod-active, {INST} .widget-toggle-buttons button.mod-active"
        )
        .first.text_content()
        .strip()
        == "4"
    ), "the instrument opens on page size 4"
    opening_svg = svg_of(page)
    opening_books = books_shown(page)
    assert opening_books == kernel_eval(page, REAL_BOOKS)
    assert opening_books["free_pages"] == "[10, 11, 12]"
    inst.screenshot(path=str(ARTIFACTS / "04_instrument_open.png"))

    # an operation: the learner's batch, the call it made, the books of the real allocator
    type_into(inst, "requests", "A, D")
    type_into(inst, "seq_lens", "14, 6")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.memlab-instrument input')]"
        ".some(i => i.value === '11, 0')",
        timeout=WAIT,
    )  # prefix_lens followed
    inst.locator("button", has_text="alloc_extend").click()
    wait_text(page, f"{INST} .memlab-call", "extend_lens=[3, 6]")
    after_svg = wait_changed(page, opening_svg)
    wait_idle(page)
    call = inst.locator(".memlab-call pre").text_content()
    assert (
        "allocator.alloc_extend(\n    prefix_lens=tensor([11, 0])," in call
        and "-> tensor([19, 40, 41, 44" in call
    )
    assert "all three agree" in inst.locator(".memlab-three-way").text_content()
    shown = books_shown(page)
    assert shown == kernel_eval(page, REAL_BOOKS) and shown["free_pages"] == "[]"
    assert shown != opening_books and 'data-gid="slot:44"' in after_svg
    inst.screenshot(path=str(ARTIFACTS / "04_instrument_after_alloc_extend.png"))

    # a bad batch: the library's own message, nothing changed
    type_into(inst, "seq_lens", "15, -2")
    inst.locator("button", has_text="alloc_extend").click()
    wait_text(page, f"{INST} .memlab-error", "shorter than its prefix")
    wait_idle(page)
    error = inst.locator(".memlab-error").text_content()
    assert (
        error
        == "ValueError: request 1: seq_len -2 is shorter than its prefix 6 (extend_lens[1] = -8)"
    ), error
    assert books_shown(page) == shown == kernel_eval(page, REAL_BOOKS)
    assert svg_of(page) == after_svg
    inst.screenshot(path=str(ARTIFACTS / "04_instrument_refused.png"))

    # replay as a story: a stepper over the learner's steps (the state before them, then the batch)
    inst.locator("button", has_text="replay as a story").click()
    story = page.locator(f"{INST} .memlab-story")
    story.wait_for(timeout=WAIT)
    wait_idle(page)
    assert "step 0 of 1" in story.text_content()
    story.locator("button", has_text="next").click()
    wait_text(page, f"{INST} .memlab-story", "step 1 of 1")
    assert (
        "alloc_extend: A 11->14 (parts 1/0/2), D 0->6 (parts 0/4/2)"
        in story.text_content()
    )
    story.screenshot(path=str(ARTIFACTS / "04_instrument_story.png"))

    # undo: back to the opening books and picture (the story of the undone step is gone)
    inst.locator("button", has_text="undo").click()
    wait_text(page, f"{INST} .memlab-call", "the story's last step")
    wait_changed(page, after_svg)
    wait_idle(page)
    assert svg_of(page) == opening_svg
    assert books_shown(page) == opening_books == kernel_eval(page, REAL_BOOKS)
    assert page.locator(f"{INST} .memlab-story").count() == 0

    # hover a slot: its tooltip says what it is, and the read-out strip shows it
    slot = inst.locator('g.memlab-cell[data-gid="slot:38"]')
    slot.scroll_into_view_if_needed()
    slot.locator(
        "rect.memlab-box"
    ).hover()  # the cell itself (its group also holds the hidden read-out line)
    title = slot.locator("title").text_content()
    assert (
        title
        == "slot 38 = page 9 × 4 + offset 2 · C, position 10 · new: part 3: a new partial page"
    ), title
    page.wait_for_function(
        """() => { const t = document.querySelector(
        '.memlab-instrument g.memlab-cell[data-gid="slot:38"] > .memlab-tip');
        return t && getComputedStyle(t).visibility === 'visible'; }""",
        timeout=WAIT,
    )
    inst.screenshot(path=str(ARTIFACTS / "04_instrument_hover.png"))

    errors = page.locator(
        ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
    )
    texts = [errors.nth(i).text_content() or "" for i in range(errors.count())]
    bad = [t for t in texts if "Error" in t or "Traceback" in t]
    assert not bad, f"error output in chapter 04: {bad[0][:500]}"
    for name in ("open", "after_alloc_extend", "refused", "story", "hover"):
        assert (ARTIFACTS / f"04_instrument_{name}.png").stat().st_size > 10_000
