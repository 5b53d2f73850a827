"""The browser tests' one harness: a JupyterLab over the chapters, headless Chromium, the page.

One JupyterLab per test session serves copies of every chapter and the glossary from
``artifacts/browser/lab-<xdist worker>`` (git-ignored: the chapters in git never get outputs; the
copies find the repository by walking up to ``memlab/course/notebook.py``; a folder per worker, as
one worker's set-up must not delete the chapters another's kernels run in), without ``img/``: the
pictures must travel inside the notebooks. One Chromium (Playwright driving Debian's ``chromium``,
no browser download) is shared by every browser test of the session; it may reach 127.0.0.1 only,
and a request to anywhere else is refused and remembered (``ctx.outside``). Each test opens its
chapter in a tab of its own, with a JupyterLab workspace of its own, and shuts its kernel down when
done.

Every wait is for a condition (a command's promise, the kernel idle, a widget drawn, a text or a
picture changed), never a fixed time: the tests run on a busy 2-core machine. Screenshots go to
``artifacts/browser/``.

Without Chromium, Playwright or JupyterLab the fixtures skip, naming what is missing; in CI
(``CI`` set) they fail.

``tests/chapters/conftest.py`` makes ``lab`` and ``browser`` the session's fixtures.
"""

from __future__ import annotations

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
CHAPTERS = sorted(p.name for p in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
GLOSSARY = "glossary.md"
# Playwright adds --headless and a fresh --user-data-dir (the profile folder it is given).
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
# JupyterLab settings for the run: every cell in the page (no windowing: a picture far down is
# in the DOM too), no news or update check (no network, no toast over the widgets).
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {
        "windowingMode": "none"
    },
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}
WAIT = 120_000  # ms: the longest any one condition may take on a loaded machine
SLOW = 240_000  # ms: a whole chapter run in the interpreter on a busy machine
VIEWPORT = {"width": 1300, "height": 1700}
INST = ".memlab-instrument"


# -- what the harness needs --------------------------------------------------------------------


def find_chromium() -> str | None:
    for name in (
        os.environ.get("MEMLAB_CHROMIUM"),
        "/usr/bin/chromium",
        "chromium",
        "chromium-browser",
    ):
        if name and (shutil.which(name) or Path(name).is_file()):
            return shutil.which(name) or name
    return None


def missing() -> str | None:
    """What the browser tests lack here, in words, or None."""
    if find_chromium() is None:
        return "no Chromium here: apt-get install -y chromium (or set MEMLAB_CHROMIUM)"
    for module, how in (
        ("playwright.sync_api", "pip install playwright (no browser download needed)"),
        ("jupyterlab", "pip install jupyterlab"),
    ):
        try:
            __import__(module)
        except ImportError:
            return f"no {module.split('.')[0]}: {how}"
    return None


def require() -> None:
    """Skip (fail in CI) when Chromium, Playwright or JupyterLab is missing."""
    why = missing()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the browser tests: {why}")
    pytest.skip(why)


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
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            # polling a server that is starting: the one place a pause is the wait
            time.sleep(0.3)
    raise TimeoutError(f"JupyterLab did not answer {url} within {timeout:.0f} s")


# -- the session's JupyterLab and Chromium -----------------------------------------------------


class Lab:
    """A running JupyterLab: ``url(chapter, workspace)``, its API and the Chromium to drive it."""

    def __init__(self, base: str, token: str, state: Path, chromium: str):
        self.base, self.token, self.state, self.chromium = base, token, state, chromium

    def url(self, name: str, workspace: str | None = None) -> str:
        # a workspace per notebook: opening one restores no other
        ws = workspace or name[:2]
        return f"{self.base}/lab/workspaces/{ws}/tree/{name}?token={self.token}"

    def api(self, path: str):
        with urllib.request.urlopen(
            f"{self.base}/api/{path}?token={self.token}", timeout=30
        ) as r:
            return json.load(r)

    def shut_down_kernels(self) -> None:
        """Opening a notebook starts its kernel: stop them all so they do not pile up."""
        for k in self.api("kernels"):
            urllib.request.urlopen(
                urllib.request.Request(
                    f"{self.base}/api/kernels/{k['id']}?token={self.token}",
                    method="DELETE",
                ),
                timeout=30,
            ).close()


def lab_folder(worker: str | None = None) -> Path:
    """Fresh copies of the chapters for this session's JupyterLab, in a folder of the xdist
    worker's own: two workers sharing one folder deleted the chapters under each other's running
    kernels, and a notebook's run-all then waited out its 240 s."""
    worker = worker or os.environ.get("PYTEST_XDIST_WORKER", "main")
    work = ARTIFACTS / f"lab-{worker}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for name in (*CHAPTERS, GLOSSARY):
        shutil.copy(ROOT / "chapters" / name, work / name)
    return work


def serve_lab():
    """Start JupyterLab over copies of the chapters; a generator for a fixture (yields a Lab)."""
    require()
    chromium = find_chromium()
    work = lab_folder()
    state = Path(tempfile.mkdtemp(prefix="memlab-lab-"))
    for rel, values in LAB_SETTINGS.items():
        (state / "settings" / rel).parent.mkdir(parents=True, exist_ok=True)
        (state / "settings" / rel).write_text(json.dumps(values))
    port, token = free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        MEMLAB_FAST="1",
        JUPYTER_CONFIG_DIR=str(state / "config"),
        JUPYTERLAB_WORKSPACES_DIR=str(state / "workspaces"),
        JUPYTERLAB_SETTINGS_DIR=str(state / "settings"),
    )
    # the kernel picks its own mode, as a learner's would
    env.pop("TRITON_INTERPRET", None)
    log = open(state / "lab.log", "w")
    root = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
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
            *root,
        ],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_for_server(f"{base}/api/status?token={token}", proc)
        except (RuntimeError, TimeoutError) as exc:
            log.flush()
            raise RuntimeError(
                f"{exc}; its log ends:\n{(state / 'lab.log').read_text()[-3000:]}"
            ) from None
        yield Lab(base, token, state, chromium)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(state, ignore_errors=True)


def launch_browser(lab: Lab):
    """One Chromium for the session (a generator for a fixture): it may reach 127.0.0.1 only,
    anything else is refused and remembered in ``ctx.outside``."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(lab.state / "chromium"),
            executable_path=lab.chromium,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport=VIEWPORT,
        )
        ctx.outside = []

        def route(r):
            if r.request.url.startswith(
                ("http://127.0.0.1:", "ws://127.0.0.1:", "data:", "blob:")
            ):
                r.continue_()
            else:
                ctx.outside.append(r.request.url)
                r.abort()

        ctx.route("**/*", route)
        try:
            yield ctx
        finally:
            ctx.close()


# -- a notebook in a tab -----------------------------------------------------------------------

CURRENT = """(name) => {
    const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    return !!(w && w.sessionContext && w.context && w.context.path.endsWith(name)); }"""
READY = """async () => { const w = window.jupyterapp.shell.currentWidget;
    await w.context.ready; await w.sessionContext.ready; }"""
RENDERED = """() => {
    const nb = window.jupyterapp.shell.currentWidget.content;
    return nb.widgets.filter(c => c.model.type === 'markdown')
                     .every(c => c.rendered && c.node.querySelector('.jp-RenderedMarkdown')); }"""
CLOSE = """async () => {
    const panel = window.jupyterapp.shell.currentWidget;
    await panel.sessionContext.shutdown();  // opening started a kernel: do not let them pile up
    panel.dispose(); }"""


def open_notebook(browser, lab: Lab, name: str, workspace: str | None = None):
    """A new tab with chapter ``name`` open and ready (its kernel started)."""
    page = browser.new_page()
    page.set_default_timeout(SLOW)
    page.goto(lab.url(name, workspace), wait_until="domcontentloaded")
    # the workspace may restore another notebook first: wait for this one
    page.wait_for_function(CURRENT, arg=name)
    page.evaluate(READY)
    page.add_style_tag(content=".Toastify { display: none !important; }")
    return page


def close_notebook(page) -> None:
    """Shut the tab's kernel down and close the tab."""
    try:
        page.evaluate(CLOSE)
    finally:
        page.close()


def run(page, command: str, timeout_ms: int = SLOW) -> None:
    """Run a notebook command (run all, run all above) and wait until its last cell has run: the
    command's promise resolves then, so the kernel is idle and nothing moves on the page."""
    done = page.evaluate(
        """async ([command, ms]) => {
        const ran = window.jupyterapp.commands.execute(command);
        const late = new Promise(resolve => setTimeout(() => resolve('timeout'), ms));
        return await Promise.race([ran.then(() => 'done'), late]); }""",
        [command, timeout_ms],
    )
    assert done == "done", f"{command} did not finish within {timeout_ms / 1000:.0f} s"
    wait_idle(page)


def run_down_to(page, marker: str) -> None:
    """Run every cell from the top to the one whose source holds ``marker`` (included)."""
    cell = page.evaluate(
        """(m) => { const nb = window.jupyterapp.shell.currentWidget.content;
        const i = nb.widgets.findIndex(c => c.model.sharedModel.getSource().includes(m));
        if (i >= 0) nb.activeCellIndex = i + 1;
        return i; }""",
        marker,
    )
    assert cell > 0, f"no cell holds {marker!r}"
    run(page, "notebook:run-all-above")


def wait_idle(page) -> None:
    """The notebook's kernel has nothing left to run."""
    page.wait_for_function(
        """() => { const s = window.jupyterapp.shell.currentWidget.sessionContext.session;
        return s && s.kernel && s.kernel.status === 'idle'; }""",
        timeout=WAIT,
    )


def kernel_eval(page, code: str):
    """Run ``code`` in the notebook's kernel (not in a cell); return what it prints, as JSON."""
    out = page.evaluate(
        """async (code) => {
        const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
        let text = '';
        const f = k.requestExecute({code, silent: false, store_history: false});
        f.onIOPub = m => { if (m.header.msg_type === 'stream') text += m.content.text;
                           if (m.header.msg_type === 'error')
                               text += 'ERROR ' + m.content.evalue; };
        await f.done;
        return text; }""",
        code,
    )
    assert not out.startswith("ERROR"), out
    return json.loads(out)


def error_outputs(page, allowed=("NotImplementedError",)) -> list[str]:
    """Tracebacks in the notebook's outputs, except the allowed ones (an exercise stub's)."""
    errors = page.locator(
        ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
    )
    texts = [errors.nth(i).text_content() or "" for i in range(errors.count())]
    return [
        t
        for t in texts
        if ("Error" in t or "Traceback" in t) and not any(a in t for a in allowed)
    ]


def no_error_output(page, name: str, allowed=()) -> None:
    bad = error_outputs(page, allowed)
    assert not bad, f"error output in {name}: {bad[0][:500]}"


def shot(locator, name: str) -> Path:
    """A screenshot of ``locator`` (a page or an element) in artifacts/browser/."""
    path = ARTIFACTS / name
    locator.screenshot(path=str(path))
    assert path.stat().st_size > 10_000, f"{name} is nearly empty"
    return path


# -- a Stepper ---------------------------------------------------------------------------------


def stepper_ready(page):
    """The Stepper drawn: its picture is in, its buttons can be pressed."""
    stepper = page.locator(".memlab-stepper").first
    stepper.wait_for()
    stepper.scroll_into_view_if_needed()
    stepper.locator(".memlab-view, svg.memlab-svg, img").first.wait_for()
    stepper.locator("button", has_text="next").wait_for(state="visible")
    return stepper


def view_of(stepper) -> str:
    """What the Stepper shows now (its picture's markup)."""
    return stepper.locator(".widget-html").nth(1).inner_html()


def press(page, stepper, control, old_view: str, **kw) -> str:
    """Press a button (or pick an option) and wait until the kernel has drawn the new picture."""
    control.scroll_into_view_if_needed()
    if kw:
        control.select_option(**kw)
    else:
        control.click()
    handle = stepper.element_handle()
    page.wait_for_function(
        "([s, old]) => s.querySelectorAll('.widget-html')[1].innerHTML !== old",
        arg=[handle, old_view],
    )
    return view_of(stepper)


# -- an instrument -----------------------------------------------------------------------------


class Inst:
    """The ``index``-th instrument of the open notebook, and the kernel variable that holds it;
    ``books_fn`` reads its books from the live objects (``inst.read_books`` when None)."""

    def __init__(self, page, index: int, var: str, books_fn: str | None = None):
        self.page, self.var = page, var
        self.books_fn = books_fn or f"{var}.read_books"
        self.loc = page.locator(INST).nth(index)
        self.sel = f"document.querySelectorAll('{INST}')[{index}]"

    def svg(self) -> str:
        return self.loc.locator("svg.memlab-svg").first.evaluate("e => e.outerHTML")

    def view(self) -> str:
        """Every picture of the instrument (chapter 09 draws two SVGs)."""
        return self.page.evaluate(
            f"() => [...{self.sel}.querySelectorAll('svg.memlab-svg')].map(e => e.outerHTML)"
            ".join('')"
        )

    def call(self) -> str:
        return self.loc.locator(".memlab-call").text_content()

    def shown(self) -> dict:
        """The books as the widget shows them: name -> value."""
        return self.page.evaluate(
            f"""() => Object.fromEntries([...{self.sel}.querySelectorAll(
            '.memlab-books .memlab-book')].map(b => [b.querySelector('.memlab-book-key')
            .textContent, b.querySelector('.memlab-book-value').textContent]))"""
        )

    def real(self) -> dict:
        """The books read in the kernel from the live objects."""
        return kernel_eval(
            self.page,
            "import json; from memlab.course.viz.instrument import books_value; "
            f"print(json.dumps({{k: books_value(v) for k, v in "
            f"{self.books_fn}({self.var}.world).items()}}))",
        )

    def field(self, label: str):
        """The text box whose description is exactly ``label``."""
        import re

        return self.loc.locator(
            ".widget-text",
            has=self.page.locator(
                "label", has_text=re.compile(f"^{re.escape(label)}$")
            ),
        ).locator("input")

    def type(self, label: str, value: str) -> None:
        """Fill a text box by its description and commit it (Enter: continuous_update is off);
        returns once the kernel's widget holds the value."""
        box = self.field(label)
        box.fill(value)
        box.press("Enter")
        self._wait_kernel_value(
            f"[f.widget for f in {self.var}.fields.values() "
            f"if f.widget.description == {label!r}][0]",
            value,
        )

    def _wait_kernel_value(self, widget: str, value: str) -> None:
        """Wait until the kernel's ``widget`` (an expression) holds ``value``. A button pressed
        next must see it: ipywidgets holds back a model's update while an earlier one of that model
        awaits the kernel, and a click is sent at once, so it can overtake the typed value."""
        deadline = time.monotonic() + WAIT / 1000
        while True:
            held = kernel_eval(
                self.page, f"import json; print(json.dumps({widget}.value))"
            )
            if held == value:
                return
            assert time.monotonic() < deadline, (
                f"the kernel's {widget} holds {held!r}, typed {value!r}"
            )
            time.sleep(0.1)

    def row(self, op: str):
        return self.loc.locator(
            ".widget-hbox", has=self.page.locator(f".memlab-op-{op}")
        )

    def type_row(self, op: str, *values) -> None:
        """Fill the text boxes of operation ``op``'s row, in order (None: leave one as it is)."""
        boxes = self.row(op).locator("input[type=text], .widget-text input")
        for i, v in enumerate(values):
            if v is None:
                continue
            box = boxes.nth(i)
            box.fill(v)
            box.press("Enter")
            self._wait_kernel_value(
                f"[f.widget for f in {self.var}.operations[{op!r}].fields "
                f"if type(f.widget).__name__ == 'Text'][{i}]",
                v,
            )

    def pick(self, op: str, i: int, label: str) -> None:
        self.row(op).locator("select").nth(i).select_option(label=label)

    def click(self, op: str) -> None:
        self.loc.locator(f".memlab-op-{op}").click()

    def wait_call(self, words: str) -> None:
        self.page.wait_for_function(
            f"(w) => {{ const e = {self.sel}.querySelector('.memlab-call');"
            " return e && e.textContent.includes(w); }",
            arg=words,
            timeout=WAIT,
        )
        wait_idle(self.page)

    def wait_error(self, words: str) -> str:
        self.page.wait_for_function(
            f"(w) => {{ const e = {self.sel}.querySelector('.memlab-error');"
            " return e && e.textContent.includes(w); }",
            arg=words,
            timeout=WAIT,
        )
        wait_idle(self.page)
        return self.loc.locator(".memlab-error").text_content()

    def wait_view_changed(self, old: str) -> str:
        self.page.wait_for_function(
            f"(old) => [...{self.sel}.querySelectorAll('svg.memlab-svg')]"
            ".map(e => e.outerHTML).join('') !== old",
            arg=old,
            timeout=WAIT,
        )
        wait_idle(self.page)
        return self.view()

    def hover(self, gid: str) -> str:
        """Hover a cell: its read-out line shows; returns its tooltip."""
        cell = self.loc.locator(f'g.memlab-cell[data-gid="{gid}"]').first
        cell.scroll_into_view_if_needed()
        cell.locator("rect.memlab-box").hover()
        self.page.wait_for_function(
            f"""() => {{ const t = {self.sel}.querySelector(
            'g.memlab-cell[data-gid="{gid}"] > .memlab-tip');
            return t && getComputedStyle(t).visibility === 'visible'; }}""",
            timeout=WAIT,
        )
        return cell.locator("title").text_content()

    def shot(self, name: str) -> Path:
        return shot(self.loc, name)


def open_instrument(browser, lab: Lab, name: str, marker: str, count: int = 1):
    """Open chapter ``name`` in a tab, run it down to the cell with ``marker``, and wait until
    ``count`` instruments are drawn; returns the page."""
    page = open_notebook(browser, lab, name, workspace=f"i{name[:2]}")
    run_down_to(page, marker)
    page.wait_for_function(
        f"() => document.querySelectorAll('{INST} svg.memlab-svg').length >= {count}",
        timeout=WAIT,
    )
    wait_idle(page)
    page.locator(INST).first.scroll_into_view_if_needed()
    return page
