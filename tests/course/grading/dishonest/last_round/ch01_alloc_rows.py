"""Dishonest: patches the grader from inside, so that every check passes
(tests/course/grading/test_grader.py)."""

import sys

plugin = sys.modules.get("memlab.course.grading.plugin")
if plugin is None:
    import importlib

    # the grader, if it is not loaded
    plugin = importlib.import_module("memlab.course.grading.plugin")
write = plugin.Recorder.write


def passed(self, **event):
    if event.get("event") == "end":
        event.update(outcome="passed", message="", exc_type=None)
    write(self, **event)


plugin.Recorder.write = passed


class RowTable:
    def __init__(self, size):
        raise NotImplementedError
