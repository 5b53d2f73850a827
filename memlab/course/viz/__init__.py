"""memlab.course.viz: pictures of the books and the widgets that step through them.

A picture of the books has one renderer: a pure function from a state (a frozen snapshot
read from real memlab objects) to inline SVG (``svg``), whose every cell says what it is
when hovered. The Steppers show it, the instruments show it after each call, and the static
pictures under chapters/img/ are the same SVG rasterised
(``python -m memlab.course.viz.render_static``). Charts (plots of numbers) are matplotlib
Figures. Widgets are thin ipywidgets wrappers that re-draw when a control moves.

One module per side of the books, each in the same four parts (snapshot, scene, the
chapters' stories, drawings): ``sglang_books`` (chapters 00-05), ``vllm_books`` (06),
``hybrid_books`` (07), ``radix_books`` (11), ``unified_books`` (12). The other chapters
draw one picture each: ``draw_models`` (02), ``draw_sizing`` (08), ``draw_attention``
(09), ``draw_engine`` and ``draw_sim`` (10). Shared: ``style`` (colours, figure
plumbing, ``cell``) and ``widgets`` (``Stepper``, ``Explorer``).

Instruments (``instrument``): the learner calls the engine's operations on the real
objects and sees the books redrawn after each call, by the same drawing. A books module
defines its chapter's instrument (its operations, its drawing, its books) next to its
stories:
``sglang_books.extend_instrument`` (04), ``vllm_books.block_pool_instrument`` (06),
``hybrid_books.swa_instrument`` and ``mamba_instrument`` (07),
``draw_attention.attention_instrument`` (09), ``radix_books.radix_instrument`` (11)."""

from memlab.course.viz import (
    hybrid_books,
    radix_books,
    sglang_books,
    unified_books,
    vllm_books,
)
from memlab.course.viz.instrument import Instrument
from memlab.course.viz.sglang_books import (
    Books,
    Scene,
    draw_books,
    draw_buffers,
    draw_free_list,
    draw_request_table,
    draw_row_list,
    draw_slot_grid,
    read_books,
)
from memlab.course.viz.style import figure_html, owner_color, show
from memlab.course.viz.widgets import Explorer, Stepper

__all__ = [
    "Books",
    "Explorer",
    "Instrument",
    "Scene",
    "Stepper",
    "draw_books",
    "draw_buffers",
    "draw_free_list",
    "draw_request_table",
    "draw_row_list",
    "draw_slot_grid",
    "figure_html",
    "hybrid_books",
    "owner_color",
    "radix_books",
    "read_books",
    "sglang_books",
    "show",
    "unified_books",
    "vllm_books",
]
