"""Chapters 00, 01 and 03 say what their pictures and cells show (the cells assert the rest
when the chapters run in tests/test_notebooks.py)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def twin(name: str) -> str:
    return next((ROOT / "chapters" / "py").glob(f"{name}_*.py")).read_text()


def test_chapter_03_picture_shows_the_yellow_staging_area():
    from memlab.course.viz.render_static import token_allocator_books

    books = token_allocator_books()
    assert books.staged_pages and set(books.staged_pages) == {1, 2, 3, 4, 5, 6, 7}, books.staged_pages
    text = twin("03")
    assert "staging area (yellow)" in text and "The picture is the second story just before D arrives" in text


def test_chapter_03_points_at_debug_mode_where_a_double_free_first_matters():
    text = twin("03")
    fifo = text.index("## FIFO reuse")
    assert fifo < text.index("### A double free, and `debug_mode`") < text.index("## Staged frees")
    assert "debug_mode=True" in text and "SGLANG_DEBUG_MEMORY_POOL" in text


def test_chapter_01_generation_demo_reuses_one_row():
    text = twin("01")
    assert "assert again == row and now == seen[1] + 1" in text
