"""Moved to ``memlab.course.compare``: chapter 06's side-by-side driver runs both engines' books,
so it sits with the course, above them."""

raise ImportError(
    "memlab.capstone.compare moved to memlab.course.compare: "
    "from memlab.course import compare (the same names)"
)
