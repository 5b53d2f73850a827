"""A real browser: JupyterLab on a free local port, chapters opened in headless Chromium, run,
their widgets drawn, controls moved, the pictures and captions changed, screenshots saved.

Chapter 01 runs whole (its exercise cell may raise NotImplementedError, nothing else may raise);
chapter 11 runs down to its radix-tree widget only (the rest of it runs headless in
tests/test_notebooks.py), which keeps this test short.

Needs Debian's ``chromium`` (apt) and Playwright's Python package (pip; no browser download:
it drives the system Chromium). Skips with a message naming what is missing.
The notebook runs from a copy under artifacts/browser/ (git-ignored), so the chapter in git never
gets outputs; the copy still finds the repository by walking up to pyproject.toml.
"""

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

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts" / "browser"
CHAPTER = "01_request_table.ipynb"  # a Stepper widget, no kernel launch: quick in the interpreter
RADIX = "11_radix_and_hicache.ipynb"  # the radix tree's Stepper: two stories, twelve steps each
# Playwright adds --headless and a fresh --user-data-dir (the profile folder it is given).
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]


def find_chromium():
    for name in (os.environ.get("MEMLAB_CHROMIUM"), "/usr/bin/chromium", "chromium", "chromium-browser"):
        if name and (shutil.which(name) or Path(name).is_file()):
            return shutil.which(name) or name
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_server(url: str, proc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"JupyterLab did not answer {url} within {timeout:.0f} s")


@pytest.fixture(scope="module")
def lab():
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no Chromium here: apt-get install -y chromium (or set MEMLAB_CHROMIUM)")
    pytest.importorskip("playwright.sync_api",
                        reason="no Playwright: pip install playwright (no browser download needed)")
    pytest.importorskip("jupyterlab", reason="no JupyterLab: pip install jupyterlab")
    work = ARTIFACTS / "lab"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for name in (CHAPTER, RADIX):
        shutil.copy(ROOT / "chapters" / name, work / name)
    shutil.copytree(ROOT / "chapters" / "img", work / "img")  # the static pictures it links to
    state = Path(tempfile.mkdtemp(prefix="memlab-lab-"))
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, MEMLAB_FAST="1", JUPYTER_CONFIG_DIR=str(state / "config"),
               JUPYTERLAB_WORKSPACES_DIR=str(state / "workspaces"), JUPYTERLAB_SETTINGS_DIR=str(state / "settings"))
    env.pop("TRITON_INTERPRET", None)  # the kernel picks its own mode, as a learner's would
    log = open(state / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}", "--LabApp.expose_app_in_browser=True",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--ServerApp.port_retries=0", *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            wait_for_server(f"http://127.0.0.1:{port}/api/status?token={token}", proc)
        except (RuntimeError, TimeoutError) as exc:
            log.flush()
            raise RuntimeError(f"{exc}; its log ends:\n{(state / 'lab.log').read_text()[-3000:]}") from None
        # A workspace per chapter, so opening one does not restore (and re-run) the other.
        yield dict(url=lambda name: f"http://127.0.0.1:{port}/lab/workspaces/{name[:2]}/tree/{name}?token={token}",
                   chromium=chromium, state=state)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(state, ignore_errors=True)


def open_notebook(ctx, lab, name):
    """A page with notebook ``name`` open, its kernel started; returns the page."""
    page = ctx.new_page()
    page.goto(lab["url"](name), wait_until="domcontentloaded", timeout=60_000)
    page.wait_for_function("window.jupyterapp && window.jupyterapp.shell.currentWidget"
                           " && window.jupyterapp.shell.currentWidget.sessionContext", timeout=60_000)
    cells = page.evaluate("""async () => {
        const panel = window.jupyterapp.shell.currentWidget;
        await panel.context.ready;
        await panel.sessionContext.ready;
        return panel.content.widgets.length; }""")
    assert cells > 5, f"{name} opened with {cells} cells"
    news = page.get_by_role("button", name="No")  # JupyterLab's "get notified about news?" toast
    if news.count():
        news.first.click()
    return page


def error_outputs(page, allowed=("NotImplementedError",)):
    """Tracebacks in the notebook's outputs, except the allowed ones (an exercise stub's)."""
    page.wait_for_timeout(500)
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    texts = [errors.nth(i).text_content() or "" for i in range(errors.count())]
    return [t for t in texts if ("Error" in t or "Traceback" in t) and not any(a in t for a in allowed)]


def wait_for_new_picture(page, old):
    page.wait_for_function(
        "([sel, old]) => { const i = document.querySelector(sel); return i && i.src !== old; }",
        arg=[".memlab-stepper img.memlab-view", old], timeout=30_000)
    return page.locator(".memlab-stepper img.memlab-view").get_attribute("src")


def test_widgets_draw_and_react_in_a_real_browser(lab):
    """One JupyterLab and one Chromium for both chapters (two tests could land on two pytest-xdist
    workers, each starting its own)."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(str(lab["state"] / "chromium"), executable_path=lab["chromium"],
                                                    headless=True, args=CHROMIUM_FLAGS,
                                                    viewport={"width": 1400, "height": 1000})
        try:
            request_table_widget(ctx, lab)
            radix_widget(ctx, lab)
        finally:
            ctx.close()


def request_table_widget(ctx, lab):
    """Chapter 01 whole: the Stepper draws, next changes the step and the picture."""
    page = open_notebook(ctx, lab, CHAPTER)
    try:
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        stepper = page.locator(".memlab-stepper")
        stepper.wait_for(timeout=90_000)
        stepper.scroll_into_view_if_needed()
        view = stepper.locator("img.memlab-view")
        view.wait_for(timeout=30_000)
        first = view.get_attribute("src")
        caption = stepper.locator(".widget-html").first
        assert first.startswith("data:image/png;base64,") and len(first) > 5000, "the widget drew no picture"
        assert "step 0 of" in stepper.text_content()

        stepper.locator("button", has_text="next").click()
        wait_for_new_picture(page, first)
        assert "step 1 of" in stepper.text_content(), caption.text_content()
        stepper.scroll_into_view_if_needed()
        stepper.screenshot(path=str(ARTIFACTS / "01_request_table_widget.png"))
        page.screenshot(path=str(ARTIFACTS / "01_request_table_lab.png"))

        # The cells above the first exercise stub raised nothing (the stub itself may raise
        # NotImplementedError: that is its job until the learner fills it in).
        bad = error_outputs(page)
        assert not bad, f"error output in the notebook: {bad[0][:500]}"
    finally:
        page.close()
    assert (ARTIFACTS / "01_request_table_widget.png").stat().st_size > 10_000


def radix_widget(ctx, lab):
    """Chapter 11 down to its widget: step through the radix tree's story (arrive, finish, the
    split) and back, switch to pages of 2; each move changes the caption and the picture."""
    page = open_notebook(ctx, lab, RADIX)
    try:
        widget_cell = page.evaluate("""() => {
            const nb = window.jupyterapp.shell.currentWidget.content;
            const i = nb.widgets.findIndex(c => c.model.sharedModel.getSource().includes("viz.Stepper("));
            if (i >= 0) nb.activeCellIndex = i + 1;
            return i; }""")
        assert widget_cell > 0, "chapter 11 has no cell that makes the Stepper"
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-above')")  # setup .. widget

        stepper = page.locator(".memlab-stepper")
        stepper.wait_for(timeout=120_000)
        stepper.scroll_into_view_if_needed()
        view = stepper.locator("img.memlab-view")
        view.wait_for(timeout=30_000)
        caption = stepper.locator(".widget-html").first
        picture = view.get_attribute("src")
        assert picture.startswith("data:image/png;base64,") and len(picture) > 5000, "the radix widget drew no picture"
        assert stepper.locator("select").input_value() == "page size 1", "the first story has pages of 1 token"
        text = caption.text_content()
        assert "step 0 of 11" in text and "empty tree" in text, text

        expected = {1: "A arrives", 2: "A finishes", 3: "SPLITS"}
        for step, words in expected.items():
            stepper.locator("button", has_text="next").click()
            picture = wait_for_new_picture(page, picture)
            text = caption.text_content()
            assert f"step {step} of 11" in text and words in text, f"after {step} clicks on next: {text}"
        stepper.screenshot(path=str(ARTIFACTS / "11_radix_widget.png"))

        stepper.locator("button", has_text="previous").click()
        picture = wait_for_new_picture(page, picture)
        text = caption.text_content()
        assert "step 2 of 11" in text and "A finishes" in text, f"previous goes back one step: {text}"

        stepper.locator("select").select_option("page size 2")  # same step of the paged story
        picture = wait_for_new_picture(page, picture)
        text = caption.text_content()
        assert "step 2 of 11" in text and "A finishes" in text, f"the paged story keeps the step: {text}"
        stepper.locator("button", has_text="next").click()
        wait_for_new_picture(page, picture)
        assert "step 3 of 11" in caption.text_content() and "SPLITS" in caption.text_content()
        stepper.screenshot(path=str(ARTIFACTS / "11_radix_widget_pages_of_2.png"))

        bad = error_outputs(page, allowed=())
        assert not bad, f"error output in chapter 11: {bad[0][:500]}"
    finally:
        page.close()
    assert (ARTIFACTS / "11_radix_widget.png").stat().st_size > 10_000
