"""Every static picture is legible at the width JupyterLab shows it: its smallest text, in pixels
as shown, is at least ``MIN_TEXT_PX``. A picture of the books is SVG rasterised at ``ZOOM``: its
smallest font size times the zoom, scaled down with a PNG wider than the notebook column; a
chart's is its font size at the charts' resolution, scaled the same way."""

import struct

import pytest

from memlab.course.viz import render_static
from memlab.course.viz.render_static import (
    MIN_TEXT_PX,
    PICTURES,
    ZOOM,
    picture_png,
    smallest_text_px,
)
from memlab.course.viz.svg import Canvas


def png_width(png: bytes) -> int:
    return struct.unpack(">I", png[16:20])[0]


@pytest.mark.parametrize("name", list(PICTURES))
def test_static_picture_text_is_legible_where_jupyterlab_shows_it(name):
    picture = PICTURES[name]()
    px, text = smallest_text_px(picture)
    print(f"{name}: smallest text {px:.1f} px ({text[:30]!r})")
    assert px >= MIN_TEXT_PX, (
        f"{name}: {text[:40]!r} is {px:.1f} px where JupyterLab shows the picture "
        f"(at least {MIN_TEXT_PX} px)"
    )
    # the measure is the PNG's: drawn at the zoom it assumes
    if isinstance(picture, str):
        import xml.etree.ElementTree as ET

        width = float(ET.fromstring(picture).get("width"))
        assert abs(png_width(picture_png(picture)) - width * ZOOM) <= 1


def test_the_check_catches_small_text_and_a_squeezed_picture():
    from memlab.course.viz.style import new_figure

    fig, ax = new_figure(6, 3)
    ax.text(0.5, 0.5, "slot 13", fontsize=6)
    ax.set_title("big enough", fontsize=12)
    px, text = smallest_text_px(fig)
    assert text == "slot 13" and px < MIN_TEXT_PX
    fig, ax = new_figure(30, 3)  # 2,400 px drawn, shown at 900: everything shrinks
    ax.text(0.5, 0.5, "slot 13", fontsize=10)
    assert smallest_text_px(fig)[0] < MIN_TEXT_PX
    assert render_static.SHOWN_WIDTH < 30 * render_static.DPI


def test_the_check_catches_small_svg_text_and_a_wide_svg():
    c = Canvas()
    c.text(4, 20, "big enough", size=12)
    c.cell(4, 30, "#4e79a7", "13", size=6)  # a cell's label counts too
    px, text = smallest_text_px(c.html(still=True))
    assert text == "13" and px == pytest.approx(6 * ZOOM) and px < MIN_TEXT_PX
    c = Canvas()  # 2,400 px drawn, shown at 900: everything shrinks
    c.text(4, 20, "slot 13", size=10)
    c.cell(2380, 30, "#4e79a7")
    assert smallest_text_px(c.html(still=True))[0] < MIN_TEXT_PX
    assert render_static.SHOWN_WIDTH < 2400 * ZOOM
