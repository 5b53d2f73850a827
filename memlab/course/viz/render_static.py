"""Render the static pictures the chapters show to readers without a kernel (GitHub, nbviewer).

    python -m memlab.course.viz.render_static [--out chapters/img] [NAME ...]

Each picture is the drawing a chapter's widget makes at one chosen step, from the same scene.
A picture of the books is the widget's own SVG, still (no read-out strip), rasterised by resvg
(``resvg-py``, a wheel without system libraries) with the DejaVu fonts matplotlib ships, so
the PNG is the same on every machine; a chart (numbers plotted) is matplotlib's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from memlab.course.viz import hybrid_books, sglang_books, vllm_books
from memlab.course.viz.sglang_books import draw_books
from memlab.course.viz.style import figure_png

OUT = Path(__file__).resolve().parents[3] / "chapters" / "img"
DPI = 80  # the charts' resolution: a figure 11 inches wide is 880 px
ZOOM = 1.25  # the books' SVG in the PNG: a 680 px drawing is 850 px
# JupyterLab's notebook column on a 1300 px window with its file browser open: a wider picture
# is shown scaled down to it, its text with it.
SHOWN_WIDTH = 900
MIN_TEXT_PX = (
    8.5  # the smallest text a static picture may show at SHOWN_WIDTH, in pixels
)
# resvg draws the SVG's monospace text with these (matplotlib's own copies of DejaVu)
FONTS = ("DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSans.ttf")


def token_allocator_books():
    """Chapter 03's picture: need_sort after A and B finish, their slots staged (yellow), before
    D."""
    return sglang_books.token_allocator(need_sort=True).frames[5]


def _mappings():
    sc = sglang_books.orientation()
    return draw_books(
        sc.frames[-1],
        ("table", "slots", "buffers", "free"),
        slot=sc.slots("D")[0],
        still=True,
    )


def _kv_bytes():
    from memlab.course.viz.draw_models import draw_kv_bytes

    return draw_kv_bytes("Llama-3.1-8B")


def _sizing(**kw):
    from memlab.course.viz.draw_sizing import draw_sizing

    return draw_sizing(**kw)


def _attention():
    import torch

    from memlab.course.viz.draw_attention import (
        attention_frames,
        draw_attention,
        fill_kv,
    )

    sc = sglang_books.orientation(dtype=torch.float32, head_dim=16)
    sc.extend_batch({"A": 6, "D": 3})
    fill_kv(sc)
    q = torch.randn(len(sc.reqs), 4, 16, generator=torch.Generator().manual_seed(1))
    return draw_attention(attention_frames(sc, q)["request A"][2], still=True)


def _engine():
    import torch

    from memlab.capstone.engine import Engine, TinyLlama
    from memlab.course.viz.draw_engine import draw_engine, engine_frames

    g = torch.Generator().manual_seed(0)
    system = torch.randint(0, 128, (16,), generator=g).tolist()
    prompts = [
        system + torch.randint(0, 128, (int(n),), generator=g).tolist()
        for n in torch.randint(4, 24, (8,), generator=g)
    ]
    engine = Engine(
        TinyLlama(),
        page_size=4,
        num_tokens=160,
        max_running=4,
        max_context=96,
        chunk_size=32,
        attention="torch",
    )
    frames = engine_frames(engine, prompts, max_new_tokens=16)
    return draw_engine(frames[len(frames) // 2])


def _policies():
    from memlab.course.viz.draw_sim import draw_policies

    return draw_policies("ShareGPT-like", 16, n=4000)


def _unified():
    from memlab.course.viz.unified_books import draw_unified, unified_story

    # A finishes: B's full pages move into A's old ones
    return draw_unified(unified_story().frames[5], still=True)


def _radix():
    from memlab.course.viz.radix_books import draw_radix, story

    return draw_radix(story()[8], still=True)  # the load-back step


def _books(frame, panels):
    return draw_books(frame, panels, still=True)


PICTURES = {
    "00_mappings": _mappings,
    "01_request_table": lambda: _books(
        sglang_books.request_table().frames[4], ("table", "rows")
    ),
    "02_kv_bytes": _kv_bytes,
    "03_token_allocator": lambda: _books(
        token_allocator_books(), ("table", "slots", "free")
    ),
    "04_alloc_extend": lambda: _books(
        sglang_books.paged_extend(page_size=4).frames[2], ("table", "slots", "free")
    ),
    "05_decode": lambda: _books(
        sglang_books.decode_steps(page_size=4).frames[-1], ("table", "slots", "free")
    ),
    "06_block_pool": lambda: vllm_books.draw_vllm(
        vllm_books.prefix_cache(True).frames[4], still=True
    ),
    "07_swa": lambda: hybrid_books.draw_swa(
        hybrid_books.sliding_window().frames[5], still=True
    ),
    "07_mamba": lambda: hybrid_books.draw_mamba(
        hybrid_books.mamba_slots()[4], still=True
    ),
    "08_sizing": lambda: _sizing(model="Gemma-3-27B"),
    "09_attention": lambda: _attention(),
    "10_engine": lambda: _engine(),
    "10_policies": lambda: _policies(),
    "11_radix": lambda: _radix(),
    "12_unified": lambda: _unified(),
}


def svg_png(svg: str, zoom: float = ZOOM) -> bytes:
    """A still SVG as a PNG, ``zoom`` pixels a unit, with the fonts every machine has the same."""
    import matplotlib
    import resvg_py

    fonts = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    return bytes(
        resvg_py.svg_to_bytes(
            svg_string=svg,
            zoom=zoom,
            background="white",
            skip_system_fonts=True,
            font_files=[str(fonts / f) for f in FONTS],
            monospace_family="DejaVu Sans Mono",
            sans_serif_family="DejaVu Sans",
        )
    )


def svg_text_sizes(svg: str) -> list[tuple[float, str]]:
    """(font size, text) of every line of text an SVG draws, in its own units."""
    import xml.etree.ElementTree as ET

    def walk(node, size):
        size = float(node.get("font-size", size))
        if node.tag.endswith("}text") or node.tag.endswith("}tspan"):
            own = (node.text or "").strip()
            if own:
                yield size, own
        for child in node:
            if not child.tag.endswith("}title"):
                yield from walk(child, size)

    return list(walk(ET.fromstring(svg), 16.0))


def smallest_text_px(picture, shown_width: int = SHOWN_WIDTH):
    """The smallest text of a picture as a reader sees it, and that text: an SVG's font size
    times ``ZOOM``, a figure's points at ``DPI``; scaled down with the picture when it is wider
    than ``shown_width`` pixels."""
    if isinstance(picture, str):
        import xml.etree.ElementTree as ET

        width = float(ET.fromstring(picture).get("width")) * ZOOM
        size, text = min(svg_text_sizes(picture))
        return size * ZOOM * min(1.0, shown_width / width), text
    from matplotlib.text import Text

    scale = min(1.0, shown_width / (picture.get_figwidth() * DPI))
    texts = [
        t
        for t in picture.findobj(Text)
        if t.get_visible() and t.get_text().strip() and t.get_alpha() != 0
    ]
    t = min(texts, key=lambda t: t.get_fontsize())
    return t.get_fontsize() * DPI / 72 * scale, t.get_text()


def picture_png(picture) -> bytes:
    """A picture's PNG: an SVG rasterised, a matplotlib figure saved."""
    return svg_png(picture) if isinstance(picture, str) else figure_png(picture, DPI)


def render(names=None, out: Path = OUT) -> list[Path]:
    unknown = [n for n in names or () if n not in PICTURES]
    if unknown:
        raise ValueError(
            f"unknown picture {unknown[0]!r}; known: {', '.join(PICTURES)}"
        )
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names or PICTURES:
        path = out / f"{name}.png"
        path.write_bytes(picture_png(PICTURES[name]()))
        written.append(path)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "names",
        nargs="*",
        help=f"pictures to render (default: all of {', '.join(PICTURES)})",
    )
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    for path in render(a.names, a.out):
        print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
