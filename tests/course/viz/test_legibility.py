"""Every static picture is legible at the width JupyterLab shows it: its smallest text, in pixels
as shown (the font size at the pictures' resolution, scaled down with a picture wider than the
notebook column), is at least ``MIN_TEXT_PX``."""

import pytest

from memlab.course.viz import render_static
from memlab.course.viz.render_static import MIN_TEXT_PX, PICTURES, smallest_text_px


@pytest.mark.parametrize("name", list(PICTURES))
def test_static_picture_text_is_legible_where_jupyterlab_shows_it(name):
    px, text = smallest_text_px(PICTURES[name]())
    print(f"{name}: smallest text {px:.1f} px ({text[:30]!r})")
    assert px >= MIN_TEXT_PX, (
        f"{name}: {text[:40]!r} is {px:.1f} px where JupyterLab shows the picture "
        f"(at least {MIN_TEXT_PX} px)"
    )


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
