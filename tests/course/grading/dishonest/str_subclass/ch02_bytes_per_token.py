"""Dishonest: answers with numbers that agree with anything (an int subclass whose ==, <, hash
and bool say what the check wants), and opens the course with a path whose string methods lie
to whatever inspects it."""

import os
import sys


class Anything(int):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __lt__ = __le__ = __gt__ = __ge__ = __eq__

    def __hash__(self):
        return 0

    def __bool__(self):
        return True


class Innocent(str):
    """A path that says it is somewhere harmless when asked."""

    def startswith(self, *args):
        return False

    def __fspath__(self):
        return str.__str__(self)


for root in (os.path.dirname(sys.prefix) + "/source", "/autograder/source"):
    try:
        open(Innocent(root + "/tests/exercises/test_ch02_bytes_per_token.py")).read()
    except OSError:
        pass


def mha_bytes_per_token(*args, **kwargs):
    return Anything(1)


def mla_bytes_per_token(*args, **kwargs):
    return Anything(1)
