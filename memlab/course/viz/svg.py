"""The books' one renderer: inline SVG whose cells say what they are when hovered.

Every picture of the books (the Steppers' frames, the instruments, and the static PNGs under
chapters/img, rasterised from the same SVG by ``render_static``) is drawn here, cell by cell. A
cell carries its full description twice: a ``<title>`` (the browser's own tooltip) and a hidden
line that CSS shows in the picture's read-out strip while the pointer is over the cell (it also
shows in a screenshot, and works in Colab, JupyterLab and Notebook alike: no script, only CSS).
Every string that enters the SVG is escaped (a token ``<s>`` stays text). A cell carries
``data-gid`` (``slot:13``, ``row:2:5``, ``free:0``) so tests can find it and read its colour.
A still picture (``html(still=True)``, for a PNG) leaves out the read-out strip and the tips.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from memlab.course.viz.style import text_color

CELL = 22  # a cell's side in pixels
FONT = "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace"

# Class names carry the memlab- prefix: a <style> inside inline SVG applies to the whole page.
CSS = f"""
.memlab-svg {{ font-family: {FONT}; }}
.memlab-svg .memlab-cell:hover > rect.memlab-box {{ stroke: #000; stroke-width: 2.5; }}
.memlab-svg .memlab-tip {{ visibility: hidden; }}
.memlab-svg .memlab-cell:hover > .memlab-tip {{ visibility: visible; }}
"""

# alloc_extend's three parts, drawn over the owner's colour: hatched, plain, dotted.
DEFS = """<defs>
<pattern id="memlab-part1" patternUnits="userSpaceOnUse" width="6" height="6"
 patternTransform="rotate(45)">
<rect width="2.2" height="6" fill="#000" fill-opacity="0.38"/></pattern>
<pattern id="memlab-part3" patternUnits="userSpaceOnUse" width="6" height="6">
<circle cx="3" cy="3" r="1.3" fill="#000" fill-opacity="0.45"/></pattern>
</defs>"""
PART_FILL = {1: "url(#memlab-part1)", 2: None, 3: "url(#memlab-part3)"}


def esc(value) -> str:
    """Text as it must appear inside HTML or SVG: ``<s>`` stays the four characters."""
    return html.escape(str(value), quote=True)


@dataclass(frozen=True)
class Swatch:
    """One legend entry: a small cell drawn like the cells it explains, and its words."""

    label: str
    fill: str = "#ffffff"
    pattern: str | None = None  # an SVG paint over the fill, e.g. PART_FILL[1]
    stroke: str = "#999"
    stroke_width: float = 1.0
    opacity: float = 1.0
    dash: str | None = None  # an SVG stroke-dasharray, e.g. "4 2"


class Canvas:
    """An SVG built cell by cell, sized to what was drawn; ``html()`` closes it with a read-out
    strip."""

    def __init__(self, readout: str = "hover a cell to read what it is"):
        self.parts: list = []  # SVG text, and ints: where cell i's hidden read-out line goes
        self.tips: list[str] = []
        self.width = self.height = 0.0
        self.readout = readout

    def _grow(self, x: float, y: float) -> None:
        self.width, self.height = max(self.width, x), max(self.height, y)

    def text(
        self,
        x,
        y,
        s,
        size: float = 11,
        anchor: str = "start",
        color: str = "#333",
        weight: str = "normal",
        title: str | None = None,
    ) -> None:
        """A line of text with its baseline at ``y``."""
        t = f"<title>{esc(title)}</title>" if title else ""
        self.parts.append(
            f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{color}" font-weight="{weight}">{t}{esc(s)}</text>'
        )
        width = 0.62 * size * len(str(s))
        self._grow(
            x
            + (width if anchor == "start" else width / 2 if anchor == "middle" else 0),
            y + 4,
        )

    def caption(
        self, x, y, caption: str, note: str = "", width: float = 640, size: float = 12
    ) -> float:
        """A picture's caption, then its note, wrapped to ``width`` pixels (nothing when both
        are empty); returns the y below."""
        import textwrap

        chars = max(40, int(width / (0.62 * size)))
        lines = [
            line
            for part in (caption, note)
            for para in part.splitlines()
            for line in textwrap.wrap(para, chars)
        ]
        for i, line in enumerate(lines):
            self.text(x, y + size + 2 + i * (size + 4), line, size=size, color="#222")
        return y + len(lines) * (size + 4) + (8 if lines else 0)

    def cell(
        self,
        x,
        y,
        fill,
        label="",
        tip: str = "",
        gid: str | None = None,
        w: float = CELL,
        h: float = CELL,
        stroke: str = "#ffffff",
        stroke_width: float = 1.0,
        opacity: float = 1.0,
        pattern: str | None = None,
        size: float = 10,
        dash: str | None = None,
    ) -> None:
        """A box with its top-left corner at (x, y), its label centred, its description in
        ``tip``; ``dash`` draws its edge dashed (an SVG stroke-dasharray)."""
        data = f' data-gid="{esc(gid)}"' if gid else ""
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        box = f'x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}"'
        body = [
            f'<rect class="memlab-box" {box} fill="{fill}" fill-opacity="{opacity}" '
            f'stroke="{stroke}" stroke-width="{stroke_width}"{dashed}/>'
        ]
        if pattern:
            body.append(f'<rect {box} fill="{pattern}" pointer-events="none"/>')
        if label != "":
            ink = text_color(fill) if opacity > 0.5 else "black"
            halo = "#000" if ink == "white" else "#fff"
            body.append(
                f'<text x="{x + w / 2:.1f}" y="{y + h / 2 + size * 0.36:.1f}" '
                f'font-size="{size}" text-anchor="middle" fill="{ink}" stroke="{halo}" '
                f'stroke-width="{2.4 if pattern else 0}" stroke-opacity="0.7" '
                f'paint-order="stroke" pointer-events="none">{esc(label)}</text>'
            )
        title = f"<title>{esc(tip)}</title>" if tip else ""
        self.parts += [
            f'<g class="memlab-cell"{data}>{title}{"".join(body)}',
            len(self.tips),
            "</g>",
        ]
        self.tips.append(tip)
        self._grow(x + w, y + h)

    def legend(self, x, y, swatches, gap: float = 18) -> float:
        """Swatches in a row from (x, y), wrapping at the canvas's width so far; returns the y
        below."""
        right = max(self.width, 480)
        cx, cy = x, y
        for s in swatches:
            width = 16 + 6 + 6.6 * len(s.label)
            if cx > x and cx + width > right:
                cx, cy = x, cy + 22
            dashed = f' stroke-dasharray="{s.dash}"' if s.dash else ""
            box = f'x="{cx:.1f}" y="{cy:.1f}" width="16" height="16"'
            body = (
                f'<rect {box} fill="{s.fill}" fill-opacity="{s.opacity}" '
                f'stroke="{s.stroke}" stroke-width="{s.stroke_width}"{dashed}/>'
            )
            if s.pattern:
                body += f'<rect {box} fill="{s.pattern}"/>'
            self.text(cx + 22, cy + 12.5, s.label, size=11)
            # the swatch and its words in one group: a test reads a legend entry whole
            words = self.parts.pop()
            self.parts.append(f'<g class="memlab-swatch">{body}{words}</g>')
            cx += width + gap
        return cy + 22

    def html(self, still: bool = False) -> str:
        """The SVG, with a read-out strip under the drawing where a hovered cell's words appear;
        ``still``: the drawing alone, for a picture that cannot be hovered (a PNG)."""
        import textwrap

        pad, line_h = 6, 15
        width = max(self.width, 420) + pad
        if still:
            body = "".join(p for p in self.parts if isinstance(p, str))
            height = self.height + pad
            return (
                f'<svg class="memlab-svg" xmlns="http://www.w3.org/2000/svg" '
                f'width="{width:.0f}" height="{height:.0f}" '
                f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="{FONT}">'
                f'<rect width="100%" height="100%" fill="#fff"/>{DEFS}{body}</svg>'
            )
        # 11.5 px monospace: about 7 px a character
        chars = max(40, int((width - 12) / 7.0))
        lines = {i: textwrap.wrap(t, chars) for i, t in enumerate(self.tips) if t}
        rows = max([1, *map(len, lines.values())])
        y, strip_h = self.height + 8, rows * line_h + 8

        def block(texts, fill, ink):
            spans = "".join(
                f'<tspan x="6" y="{y + 15 + k * line_h:.1f}">{esc(t)}</tspan>'
                for k, t in enumerate(texts)
            )
            return (
                f'<rect x="0" y="{y:.1f}" width="{width:.1f}" height="{strip_h}" '
                f'fill="{fill}"/><text font-size="11.5" fill="{ink}">{spans}</text>'
            )

        def tip(i):
            if i not in lines:
                return ""
            shown = block(lines[i], "#fff8d6", "#000")
            return f'<g class="memlab-tip" pointer-events="none">{shown}</g>'

        strip = block([self.readout], "#f6f6f6", "#777")
        body = "".join(p if isinstance(p, str) else tip(p) for p in self.parts)
        height = y + strip_h + pad
        return (
            f'<svg class="memlab-svg" xmlns="http://www.w3.org/2000/svg" '
            f'width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" style="max-width:100%;height:auto">'
            f"<style>{CSS}</style>{DEFS}{strip}{body}</svg>"
        )
