"""``python -m memlab.grade``: the autograder's command (``from memlab.grade import
main`` in a notebook). The grader itself is the package memlab.course.grading; this
module is only its entry point, kept under the name learners type."""

import sys

from memlab.course.grading.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    # Not dumpable: no process of this user opens /proc/<this>/fd (the event log's pipe).
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    sys.exit(main())
