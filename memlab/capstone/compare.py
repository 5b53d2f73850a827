"""Moved to ``memlab.course.compare`` (chapter 06's side-by-side driver runs both engines' books,
so it sits with the course above them). This alias stays until the chapters and saved notebooks
that import it from here have moved."""

import warnings

from memlab.course.compare import *  # noqa: F403

warnings.warn(
    "memlab.capstone.compare moved to memlab.course.compare",
    DeprecationWarning,
    stacklevel=2,
)
