"""Instruments: the learner calls the engine's own operations on the real memlab objects.

A ``Stepper`` replays a story someone wrote; an ``Instrument`` answers the learner's question
("what does the kernel hand out for MY batch?"). It holds a *world*, the real objects a chapter
draws (a ``Scene``, an allocator, a tree), made by ``build(**settings)``, and the *history* of the
operations applied to it. An operation runs on the live world; when it raises or is refused, the
world is rebuilt by replaying the history, so a failed call can never leave the picture's objects
changed, whatever the library promises about its own refusals. Undo drops the last step and
replays; reset goes back to the opening steps (the chapter's story) or to the empty world; a
setting (the page size) rebuilds and replays everything under the new value; "replay as a
story" turns the learner's own steps into a ``Stepper``.

A chapter defines an instrument with
- ``build(**settings) -> world``: fresh real objects;
- ``operations``: ``Operation(name, run, fields)``; ``run(world, step, **args)`` calls the library,
  writes the call it made into ``step.call`` (the engine's spelling, see ``spell``) and what came
  back into ``step.result``, and ``step.refuse(why)`` when the library said no (a ``None``);
  ``step.marks`` carries what the drawing highlights; ``step.details`` is extra HTML, computed
  only when ``step.replay`` is false (a replay redoes the state, not the comparisons);
  ``fields`` are the controls whose values, parsed, become ``args``;
- ``draw(world, step) -> str``: the picture (inline SVG, memlab.course.viz.svg) after ``step``;
- ``books(world) -> dict``: the numbers listed under the picture, read from the real objects;
- ``opening``: the (operation, args) pairs that make the first state.

Python: ``do(name, **args)``, ``press(name)`` (what the button does: read and parse the fields),
``undo()``, ``reset(empty=False)``, ``set(**settings)``, ``books()``, ``story()``; ``world``,
``history``, ``last``. Only core widgets of ipywidgets 7.7 and 8 are used: Text, Dropdown,
ToggleButtons, Button, HTML, HBox, VBox.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import ipywidgets as W
import torch

from memlab.course.viz.svg import esc
from memlab.course.viz.widgets import Stepper

# -- spelling a call ------------------------------------------------------------------------------


def spell_value(v) -> str:
    """A value as Python source a learner can paste: ``tensor([6, 3, 0])``, ``[1, 2]``, ``'A'``."""
    if isinstance(v, torch.Tensor):
        return f"tensor({v.tolist()})" if v.dim() else f"tensor({v.item()})"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(spell_value(x) for x in v)
        return (
            f"[{inner}]"
            if isinstance(v, list)
            else f"({inner}{',' if len(v) == 1 else ''})"
        )
    return repr(v)


def spell(name: str, *args, width: int = 96, **kwargs) -> str:
    """``name(arg, key=value, ...)`` with every value spelled by ``spell_value``; longer than
    ``width``, one argument a line (still one Python expression to paste)."""
    parts = [a if isinstance(a, Verbatim) else spell_value(a) for a in args]
    parts += [
        f"{k}={v if isinstance(v, Verbatim) else spell_value(v)}"
        for k, v in kwargs.items()
    ]
    line = f"{name}({', '.join(parts)})"
    if len(line) <= width:
        return line
    return f"{name}(\n" + "".join(f"    {p},\n" for p in parts) + ")"


class Verbatim(str):
    """An argument spelled as it is: the name of an object, e.g. ``Verbatim("allocator")``."""


@contextlib.contextmanager
def recording(obj, method: str):
    """Record every call of ``obj.method`` (its arguments by name, tensors copied before the call,
    and what it returned) while the block runs: the call an instrument shows is the call made."""
    real = getattr(obj, method)
    sig = inspect.signature(real)
    calls: list[dict] = []

    def spy(*args, **kwargs):
        seen = {
            k: (v.clone() if isinstance(v, torch.Tensor) else v)
            for k, v in sig.bind(*args, **kwargs).arguments.items()
        }
        call = {"args": seen, "result": None}
        calls.append(call)
        call["result"] = real(*args, **kwargs)
        return call["result"]

    # an attribute of the instance itself (else the class's method)
    own = method in vars(obj)
    setattr(obj, method, spy)
    try:
        yield calls
    finally:
        if own:
            setattr(obj, method, real)
        else:
            delattr(obj, method)


# -- parsing what the learner typed ------------------------------------------------------------


class InputError(ValueError):
    """The learner's text could not be read (the library is not called)."""


def ints(text) -> list[int]:
    """``"6, 3, 0"`` (commas or spaces) -> ``[6, 3, 0]``; negative numbers pass (the library judges
    them)."""
    if isinstance(text, (list, tuple)):
        return [int(x) for x in text]
    out = []
    for word in str(text).replace(",", " ").split():
        try:
            out.append(int(word))
        except ValueError:
            raise InputError(f"{word!r} is not a whole number") from None
    return out


def names(text) -> list[str]:
    """``"A, B, C"`` -> ``["A", "B", "C"]``."""
    if isinstance(text, (list, tuple)):
        return [str(x) for x in text]
    return [w for w in str(text).replace(",", " ").split()]


def integer(text) -> int:
    got = ints(text)
    if len(got) != 1:
        raise InputError(f"{text!r} is not one whole number")
    return got[0]


@dataclass
class Field:
    """A control whose value, parsed, becomes the argument ``name`` of an operation.

    ``options(world)``, when given, refreshes a Dropdown's choices after every step (e.g. the
    requests that hold a row); ``follow = (other, fn)`` sets this field to ``fn(world, value of
    other)`` whenever the other field changes (e.g. each named request's prefix length)."""

    name: str
    widget: W.Widget
    parse: Callable = str
    options: Callable | None = None
    follow: tuple | None = None
    # refresh(world, value) -> the value to show after each step (e.g. drop a freed request)
    refresh: Callable | None = None


@dataclass
class Operation:
    name: str
    run: Callable  # run(world, step, **args)
    fields: list = field(default_factory=list)
    label: str = ""  # the button's text (default: the name)
    help: str = ""  # the button's tooltip


# -- one step ----------------------------------------------------------------------------------


@dataclass
class Step:
    """One operation as the instrument ran it: its arguments, the call it made, what came back."""

    op: str
    args: dict
    replay: bool = False  # True while rebuilding: the state only, no comparisons
    call: str = ""  # the engine's spelling of what was called
    result: str = ""  # what it returned, spelled
    ok: bool = True
    error: str = ""  # the library's message (or why it said no)
    marks: dict = field(default_factory=dict)  # what the drawing highlights
    details: str = ""  # extra HTML under the call
    caption: str = ""  # one line for the story

    def refuse(self, why: str) -> None:
        self.ok, self.error = False, why


# -- the instrument ----------------------------------------------------------------------------


class Instrument(W.VBox):
    """The controls, the call box, the picture, the books and the story area over one world
    (see the module's docstring for what a chapter gives it)."""

    def __init__(
        self,
        build: Callable,
        operations: list,
        draw: Callable,
        books: Callable,
        settings: dict | None = None,
        opening=(),
        title: str = "",
        max_steps: int = 200,
    ):
        self.build, self.draw_world, self.read_books = build, draw, books
        self.operations = {op.name: op for op in operations}
        # name -> control (its value is passed to build)
        self.settings = dict(settings or {})
        self.opening = [(name, dict(args)) for name, args in opening]
        self.max_steps = max_steps
        self.use_opening = True
        self.history: list[Step] = []  # the learner's steps, after the opening ones
        self.opening_steps: list[Step] = []
        self.last: Step | None = None  # the step the widget shows (maybe a refused one)
        self.world = None
        self._busy = False

        # -- the controls
        self.fields: dict[str, Field] = {}
        rows = []
        if self.settings:
            for _name, c in self.settings.items():
                c.observe(self._on_setting, names="value")
            rows.append(W.HBox(list(self.settings.values())))
        self.buttons = {}
        for op in operations:
            for f in op.fields:
                self.fields.setdefault(f.name, f)
            b = W.Button(
                description=op.label or op.name,
                tooltip=op.help or op.name,
                button_style="primary",
            )
            b.on_click(lambda _, name=op.name: self.press(name))
            self.buttons[op.name] = b
            b.add_class(f"memlab-op-{op.name}")
            rows.append(W.HBox([f.widget for f in op.fields] + [b]))
        for f in self.fields.values():
            if f.follow:
                self.fields[f.follow[0]].widget.observe(
                    lambda ch, f=f: self._follow(f), names="value"
                )
        self.undo_button = W.Button(
            description="undo", icon="undo", tooltip="drop the last step"
        )
        self.reset_button = W.Button(
            description="reset", icon="refresh", tooltip="back to the opening state"
        )
        self.empty_button = W.Button(
            description="start empty", tooltip="no step at all: the empty books"
        )
        self.story_button = W.Button(
            description="replay as a story",
            icon="play",
            tooltip="your steps, one by one, in a stepper",
        )
        self.undo_button.on_click(lambda _: self.undo())
        self.reset_button.on_click(lambda _: self.reset())
        self.empty_button.on_click(lambda _: self.reset(empty=True))
        self.story_button.on_click(lambda _: self.story())
        history_row = [self.undo_button, self.reset_button] + (
            [self.empty_button] if self.opening else []
        )
        rows.append(W.HBox(history_row + [self.story_button]))
        self.call_box = W.HTML()
        self.details = W.HTML()
        self.view = W.HTML()
        self.books_box = W.HTML()
        self.story_box = W.VBox()
        head = [W.HTML(f"<b>{esc(title)}</b>")] if title else []
        super().__init__(
            [
                *head,
                *rows,
                self.call_box,
                self.details,
                self.view,
                self.books_box,
                self.story_box,
            ]
        )
        self.add_class("memlab-instrument")
        self._rebuild()
        self._show(self.last)

    # -- the Python API ------------------------------------------------------------------------
    @property
    def setting_values(self) -> dict:
        return {k: c.value for k, c in self.settings.items()}

    @property
    def picture(self) -> str:
        return self.view.value

    def books(self) -> dict:
        """The numbers the widget lists, read from the live objects now."""
        return self.read_books(self.world)

    def do(self, name: str, **args) -> Step:
        """Run operation ``name`` with ``args`` on the live world; show and return the step."""
        step = Step(name, dict(args))
        try:
            if len(self.history) >= self.max_steps:
                step.refuse(
                    f"{self.max_steps} steps is this instrument's limit: undo or reset"
                )
            else:
                self._run(step)
        except InputError as exc:
            step.refuse(f"input: {exc}")
        except Exception as exc:  # the library's own error, shown as it is
            step.refuse(f"{type(exc).__name__}: {exc}")
        if step.ok:
            self.history.append(step)
            self.last = step
            self.story_box.children = []  # a story of the steps before this one would be stale
        else:
            self._rebuild()  # whatever the failed call touched, the objects are the history's again
        self._show(step)
        return step

    def press(self, name: str) -> Step:
        """What the button does: read the operation's fields, parse them, ``do`` it."""
        op = self.operations[name]
        try:
            args = {f.name: f.parse(f.widget.value) for f in op.fields}
        except InputError as exc:
            step = Step(name, {f.name: f.widget.value for f in op.fields})
            step.refuse(f"input: {exc}")
            self._show(step)
            return step
        return self.do(name, **args)

    def undo(self) -> bool:
        """Drop the last step (never an opening one); False when there is none."""
        if not self.history:
            self._show(self.last, note="nothing to undo")
            return False
        self.history.pop()
        self.story_box.children = []
        self._rebuild()
        self._show(self.last)
        return True

    def reset(self, empty: bool = False) -> None:
        """Back to the opening state (or, ``empty``, to the books before any step)."""
        self.use_opening = not empty
        self.history = []
        self.story_box.children = []
        self._rebuild()
        self._show(self.last)

    def set(self, **settings) -> list[Step]:
        """Change settings (e.g. ``page_size=8``): rebuild and replay every step under them.
        Returns the steps dropped because the library refuses them now (the history stops there)."""
        self._busy = True
        try:
            for k, v in settings.items():
                self.settings[k].value = v
        finally:
            self._busy = False
        return self._resettle()

    def story(self) -> Stepper:
        """The learner's own steps as a story: the state before them, then one frame per step."""
        world = self._fresh(keep=False)
        frames = [
            _Frame(
                "the state before your steps" if self.history else "no steps yet",
                self.draw_world(
                    world, self.opening_steps[-1] if self.opening_steps else None
                ),
            )
        ]
        for s in self.history:
            again = Step(s.op, dict(s.args), replay=True)
            self._apply(world, again)
            line = s.call + (f" -> {s.result}" if s.result else "")
            frames.append(
                _Frame(s.caption or line, self.draw_world(world, again), code=line)
            )
        stepper = Stepper(frames, lambda f: f.svg, start=0)
        stepper.add_class("memlab-story")
        self.story_box.children = [W.HTML("<b>your steps as a story</b>"), stepper]
        return stepper

    # -- the machinery -------------------------------------------------------------------------
    def _fresh(self, keep: bool = True):
        """A new world with the opening steps applied (when in use); ``keep``: remember those steps
        as the ones the widget reports."""
        world = self.build(**self.setting_values)
        steps = []
        if self.use_opening:
            for name, args in self.opening:
                s = Step(name, dict(args), replay=True)
                self._apply(world, s)
                steps.append(s)
        if keep:
            self.opening_steps = steps
        return world

    def _apply(self, world, step: Step) -> None:
        """Replay a step that succeeded before: it must succeed again (same settings, same
        library)."""
        self.operations[step.op].run(world, step, **step.args)
        if not step.ok:
            raise RuntimeError(f"replaying {step.op}{step.args} failed: {step.error}")

    def _run(self, step: Step) -> None:
        self.operations[step.op].run(self.world, step, **step.args)

    def _rebuild(self) -> None:
        self.world = self._fresh()
        for s in self.history:
            again = Step(s.op, dict(s.args), replay=True)
            self._apply(self.world, again)
        self.last = (
            self.history[-1]
            if self.history
            else (self.opening_steps[-1] if self.opening_steps else None)
        )

    def _resettle(self) -> list[Step]:
        """After a setting changed: replay what still goes through, drop the rest."""
        old, self.history = self.history, []
        self.story_box.children = []
        self.world = self._fresh()
        dropped = []
        for i, s in enumerate(old):
            again = Step(s.op, dict(s.args), replay=True)
            try:
                self._run(again)
            except Exception as exc:
                again.refuse(f"{type(exc).__name__}: {exc}")
            if not again.ok:
                dropped = old[i:]
                self.world = None
                break
            self.history.append(again)
        if dropped:
            self._rebuild()
        self.last = (
            self.history[-1]
            if self.history
            else (self.opening_steps[-1] if self.opening_steps else None)
        )
        note = ""
        if dropped:
            note = (
                f"under {self._settings_text()} step {len(self.history) + 1} ({dropped[0].op}) is "
                f"refused: {len(dropped)} step(s) from there were dropped"
            )
        self._show(self.last, note=note)
        return dropped

    def _settings_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.setting_values.items())

    def _on_setting(self, change) -> None:
        if not self._busy:
            self._resettle()

    def _follow(self, f: Field, force: bool = False) -> None:
        """Fill ``f`` from the field it follows, unless the learner typed a value of their own
        there (it differs from what the instrument last wrote): that value is theirs until a step
        uses it (``force``, after a step went through)."""
        written = getattr(self, "_followed", {})
        self._followed = written
        if not force and f.name in written and f.widget.value != written[f.name]:
            return
        src = self.fields[f.follow[0]]
        try:
            f.widget.value = f.follow[1](self.world, src.parse(src.widget.value))
        except (InputError, KeyError, ValueError):
            return  # the learner is still typing; the call will say what is wrong
        written[f.name] = f.widget.value

    def _show(self, step: Step | None, note: str = "") -> None:
        """Redraw everything from the live world; ``step`` is the one the call box reports."""
        for f in self.fields.values():
            if f.options is not None:
                opts = list(f.options(self.world))
                keep = (
                    f.widget.value
                    if f.widget.value in opts
                    else (opts[0] if opts else None)
                )
                f.widget.options = opts
                f.widget.value = keep
        for f in self.fields.values():
            if f.refresh is not None:
                f.widget.value = f.refresh(self.world, f.widget.value)
        if step is not None and step.ok and step is self.last:
            # e.g. the prefix lengths the next batch continues from
            for f in self.fields.values():
                if f.follow:
                    self._follow(f, force=True)
        self.call_box.value = call_html(
            step, note, opening=any(step is s for s in self.opening_steps)
        )
        self.details.value = step.details if step is not None and step.ok else ""
        shown = step if step is not None and step.ok else self.last
        self.view.value = self.draw_world(self.world, shown)
        self.books_box.value = books_html(self.books())
        self.undo_button.disabled = not self.history


@dataclass
class _Frame:
    caption: str  # plain text: the Stepper escapes it
    svg: str
    code: str = ""


BOX = "font-size:12.5px;line-height:1.45"  # ipywidgets' HTML gives its content a 28 px line height


def call_html(step: Step | None, note: str = "", opening: bool = False) -> str:
    """The call box: the call in a copyable block, what came back, or the library's message."""
    if step is None:
        body = (
            f'<div class="memlab-call" style="{BOX}">no step yet: type your values and press an '
            "operation</div>"
        )
    else:
        who = (
            "the story's last step"
            if opening
            else ("you ran" if step.ok else "refused")
        )
        code = esc(
            step.call
            or f"{step.op}({', '.join(f'{k}={v!r}' for k, v in step.args.items())})"
        )
        result = f"\n-> {esc(step.result)}" if step.result else ""
        colour = "#2e7d32" if step.ok else "#c62828"
        err = (
            '<div class="memlab-error" '
            'style="color:#c62828;font-weight:bold;white-space:pre-wrap">'
            f"{esc(step.error)}</div>"
            if step.error
            else ""
        )
        keep = (
            ""
            if step.ok
            else '<div style="color:#555">nothing changed: the books are as before this call</div>'
        )
        body = (
            f'<div class="memlab-call" style="{BOX};border-left:4px solid {colour};'
            f'padding:2px 8px"><span style="color:#555">{who}:</span>'
            '<pre style="margin:2px 0;white-space:pre-wrap;word-break:normal;'
            f'overflow-wrap:anywhere;line-height:1.35">{code}{result}</pre>{err}{keep}</div>'
        )
    if note:
        body += (
            f'<div class="memlab-note" style="{BOX};color:#8a6d00">{esc(note)}</div>'
        )
    return body


def books_value(v) -> str:
    """A value of the books as the widget writes it: a dict as ``key value · key value``."""
    if isinstance(v, dict):
        return " · ".join(f"{k} {books_value(x)}" for k, x in v.items())
    return str(v)


def books_html(books: dict) -> str:
    """The books, one line each: the name, then the value read from the objects (escaped)."""
    lines = "".join(
        '<div class="memlab-book"><span class="memlab-book-key" style="display:inline-block;'
        f'min-width:140px;margin-right:1ch;color:#555">{esc(k)}</span>'
        '<code class="memlab-book-value">'
        f"{esc(books_value(v))}</code></div>"
        for k, v in books.items()
    )
    return (
        f'<div class="memlab-books" style="{BOX}"><div style="color:#555"><b>the books now</b> '
        f"(read from the objects)</div>{lines}</div>"
    )


def table_html(head, rows, cls: str = "") -> str:
    """A compact table (every cell escaped), for an operation's details."""
    td = "padding:0 12px 0 0;text-align:left;white-space:nowrap"
    th = "".join(f'<th style="{td}">{esc(h)}</th>' for h in head)
    body = "".join(
        "<tr>" + "".join(f'<td style="{td}">{esc(v)}</td>' for v in r) + "</tr>"
        for r in rows
    )
    return (
        f'<table class="{cls}" style="{BOX};border-collapse:collapse">'
        f"<tr>{th}</tr>{body}</table>"
    )
