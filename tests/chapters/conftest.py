"""The browser tests' shared fixtures: one JupyterLab and one Chromium for the whole session
(``tests/tools/browser.py`` is the harness)."""

import pytest

from memlab_tests.tools import browser as harness


@pytest.fixture(scope="session")
def lab():
    yield from harness.serve_lab()


@pytest.fixture(scope="session")
def browser(lab):
    yield from harness.launch_browser(lab)
