"""The engines suite: every test here carries the ``engines`` marker, and the run ends with a
tally of what was compared (a test reports it with the ``tally`` fixture)."""

import pytest

HERE = __file__.rpartition("/")[0]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(item.path).startswith(HERE):
            item.add_marker(pytest.mark.engines)


@pytest.fixture
def tally(record_property):
    """``tally(what, streams, steps)``: add to the end-of-run table of what matched the engine."""

    def add(what: str, streams: int, steps: int) -> None:
        record_property("engines_tally", (what, streams, steps))

    return add


def pytest_terminal_summary(terminalreporter):
    rows = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if (
                getattr(rep, "when", None) != "call"
                or getattr(rep, "outcome", None) != "passed"
            ):
                continue
            for name, value in getattr(rep, "user_properties", ()):
                if name == "engines_tally":
                    what, streams, steps = value
                    s, n = rows.get(what, (0, 0))
                    rows[what] = (s + streams, n + steps)
    if rows:
        terminalreporter.section("memlab and the engines, stream by stream")
        width = max(len(w) for w in rows)
        terminalreporter.write_line(
            f"{'compared':<{width}}  {'streams':>8}  {'steps':>8}  all identical"
        )
        for what in sorted(rows):
            s, n = rows[what]
            terminalreporter.write_line(f"{what:<{width}}  {s:>8}  {n:>8}  yes")
