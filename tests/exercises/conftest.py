"""Graded tests: they reach learner code only through memlab.course.grading.loader.load (the seam).

Which folder they grade: MEMLAB_EXERCISES ('exercises', 'solutions' or a path) when set, as the
grader (python -m memlab.grade) always sets it. In the plain test suite it is unset and these
tests grade solutions/, so the suite checks that every solution earns its points; a learner
grades their own work with ``./course grade`` (or sets MEMLAB_EXERCISES=exercises).

Randomness: every graded test draws it from the run's seed (memlab.course.grading.fuzz):
MEMLAB_GRADE_SEED when set (the grader draws one per run and prints it), else one drawn for
this session and printed in the header, so any failure can be run again. The ``rng`` fixture is
a test's own stream; ``fuzz.check`` runs a property on random cases. MEMLAB_GRADE_PROFILE=
gradescope adds more and larger cases.

Gating: ``@pytest.mark.points(1, exercise=..., requires="test_core")`` earns its points only
when the exercise's core test passes (an edge case passed by code that does nothing earns
nothing). In one session, a gated test that passes while its core test has failed here fails
and says why; the grader's report applies the same rule to tests run in other sessions.
"""

import pytest

from memlab.course.grading import fuzz, loader, plugin
from memlab.course.grading.checks import CheckFailed

loader.set_default("solutions")

_outcomes: dict[str, str] = {}  # node id -> passed / failed / skipped, in this session


def pytest_configure(config):
    plugin.register_markers(config)


@pytest.fixture
def rng(request):
    """This test's own random stream, from the run's seed."""
    module = request.node.path.stem
    return fuzz.rng(f"{module}::{request.node.name}")


def requires(item) -> tuple[str, ...]:
    """The tests (of the same file) whose passing a test's points are gated on."""
    mark = item.get_closest_marker("points")
    need = (mark.kwargs.get("requires") if mark is not None else None) or ()
    return (need,) if isinstance(need, str) else tuple(need)


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("GPU-only check: needs a CUDA device")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A gated test runs as any other (its own failure, "not written yet" included, is the one
    to read); passed while its core test failed here, it fails and says why."""
    result = yield
    for name in requires(item):
        outcome = _outcomes.get(f"{item.nodeid.rsplit('::', 1)[0]}::{name}")
        if outcome not in (None, "passed"):
            raise CheckFailed(
                f"not counted yet: this edge case earns its points once {name} (the "
                f"exercise's core behaviour) passes, and it {outcome}: fix that first"
            )
    return result


def pytest_runtest_logreport(report):
    # a test's first failing phase
    if _outcomes.get(report.nodeid, "passed") == "passed":
        _outcomes[report.nodeid] = report.outcome
