"""Thin ipywidgets wrappers around the pure drawings.

Only core widgets present in ipywidgets 7.7 (Colab) and 8.x are used: IntSlider, Play, Button,
Dropdown, HTML, HBox, VBox, and ``jslink``. A drawing (the books' inline SVG, or a chart's
figure as an inline PNG) goes inside an ``HTML`` widget, which renders the same way in both
versions, in JupyterLab, Notebook and Colab.
"""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as W

from memlab.course.viz.style import figure_html
from memlab.course.viz.svg import esc


def as_html(drawing) -> str:
    return drawing if isinstance(drawing, str) else figure_html(drawing)


class Stepper(W.VBox):
    """Step through precomputed states (each with a ``caption``, plain text): play, previous,
    slider, next.

    ``states`` is a list, or a dict of named lists (stories) with a dropdown to pick one; ``story``
    names the one it opens on (default: the first).
    ``draw(state)`` returns an HTML string (the books' SVG) or a matplotlib Figure (a chart);
    pictures are cached per step, so playing back and forth redraws nothing.
    """

    def __init__(
        self,
        states,
        draw: Callable,
        interval_ms: int = 1500,
        start: int = 0,
        story: str | None = None,
    ):
        self.stories = dict(states) if isinstance(states, dict) else {"": list(states)}
        if not self.stories or not all(self.stories.values()):
            raise ValueError("a Stepper needs at least one state in every story")
        self.draw = draw
        self._cache: dict[tuple, str] = {}
        # wide enough for the longest story's name: a cut label hides what the story is
        longest = max(len(str(name)) for name in self.stories)
        self.story = W.Dropdown(
            options=list(self.stories),
            description="story",
            value=list(self.stories)[0] if story is None else story,
            layout=W.Layout(width=f"{max(300, min(760, 90 + 8 * longest))}px"),
        )
        self.states = list(self.stories[self.story.value])
        self.slider = W.IntSlider(
            value=0,
            min=0,
            max=len(self.states) - 1,
            description="step",
            continuous_update=False,
        )
        self.play = W.Play(
            value=0,
            min=0,
            max=len(self.states) - 1,
            interval=interval_ms,
            description="play",
        )
        W.jslink((self.play, "value"), (self.slider, "value"))
        self.prev = W.Button(description="previous", icon="step-backward")
        self.next = W.Button(description="next", icon="step-forward")
        self.prev.on_click(lambda _: self._move(-1))
        self.next.on_click(lambda _: self._move(+1))
        self.caption = W.HTML()
        self.view = W.HTML()
        self.slider.observe(self._on_value, names="value")
        self.story.observe(self._on_story, names="value")
        head = [self.story] if len(self.stories) > 1 else []
        super().__init__(
            [
                *head,
                W.HBox([self.play, self.prev, self.slider, self.next]),
                self.caption,
                self.view,
            ]
        )
        self.add_class("memlab-stepper")
        self._render(0)
        if start:
            self.slider.value = start

    @property
    def state(self):
        return self.states[self.slider.value]

    def _move(self, delta: int) -> None:
        self.slider.value = min(max(self.slider.value + delta, 0), len(self.states) - 1)

    def _on_value(self, change) -> None:
        self._render(change["new"])

    def _on_story(self, change) -> None:
        self.states = list(self.stories[change["new"]])
        last = len(self.states) - 1
        if self.slider.value > last:
            self.slider.value = 0  # re-renders through the observer
        self.slider.max = self.play.max = last
        self._render(self.slider.value)

    def _render(self, i: int) -> None:
        key = (self.story.value, i)
        if key not in self._cache:
            self._cache[key] = as_html(self.draw(self.states[i]))
        # a token like <s> is text, not markup
        caption = esc(getattr(self.states[i], "caption", ""))
        self.caption.value = f"<b>step {i} of {len(self.states) - 1}</b>: {caption}"
        self.view.value = self._cache[key]


class Explorer(W.VBox):
    """Controls (sliders, dropdowns ...) feeding one drawing: ``draw(**values)`` -> Figure or HTML.

    ``text(**values)``, when given, fills an HTML line under the controls (derived numbers).
    """

    def __init__(
        self,
        controls: dict,
        draw: Callable,
        text: Callable | None = None,
        columns: int = 3,
    ):
        self.controls, self.draw, self.text = dict(controls), draw, text
        for name, c in self.controls.items():
            if not getattr(c, "description", ""):
                c.description = name
            c.observe(self._on_change, names="value")
        items = list(self.controls.values())
        rows = [W.HBox(items[i : i + columns]) for i in range(0, len(items), columns)]
        self.summary = W.HTML()
        self.view = W.HTML()
        super().__init__([*rows, self.summary, self.view])
        self.add_class("memlab-explorer")
        self.renders = 0
        self._render()

    @property
    def values(self) -> dict:
        return {k: c.value for k, c in self.controls.items()}

    def _on_change(self, change) -> None:
        self._render()

    def _render(self) -> None:
        v = self.values
        if self.text is not None:
            self.summary.value = self.text(**v)
        self.view.value = as_html(self.draw(**v))
        self.renders += 1
