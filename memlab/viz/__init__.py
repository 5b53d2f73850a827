"""memlab.viz: pictures of the books and the widgets that step through them.

Drawings are pure functions from a state (a frozen snapshot read from real memlab objects) to a
matplotlib Figure; widgets are thin ipywidgets wrappers that re-draw when a control moves. The
same drawings make the static pictures under chapters/img/ (``python -m memlab.viz.render_static``).
"""

from memlab.viz import scenes
from memlab.viz.draw import draw_books, draw_buffers, draw_free_list, draw_request_table, draw_row_list, draw_slot_grid
from memlab.viz.notebook import fast, start
from memlab.viz.scene import Scene
from memlab.viz.state import Books, read_books
from memlab.viz.style import figure_html, owner_color, show
from memlab.viz.widgets import Explorer, Stepper

__all__ = ["Books", "Explorer", "Scene", "Stepper", "draw_books", "draw_buffers", "draw_free_list",
           "draw_request_table", "draw_row_list", "draw_slot_grid", "fast", "figure_html", "owner_color",
           "read_books", "scenes", "show", "start"]
