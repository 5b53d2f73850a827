"""Each capstone benchmark runs on a small size and prints its side-by-side ratio.

Benchmarks are benchmarks: nothing here times anything or asserts a speed; each test runs the
script as a user would (``python bench/<name>.py``, small arguments) and checks that it ends
with its ratio, on outputs that agree where the script compares them.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RATIO = r"(\d+\.\d\d|inf)x"


def run(script: str, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()


def test_bench_engine_prints_the_trace_ratio():
    out = run(
        "bench_engine.py",
        *("--requests", "6", "--batch", "3", "--repeat", "1"),
        *("--equal-requests", "2", "--equal-new", "3"),
    )
    assert re.fullmatch(
        rf"engine vs transformers batched on the trace: {RATIO}", out[-1]
    )
    assert any(re.search(rf"equal lengths: {RATIO} \(", line) for line in out)
    assert any("6 of 6 outputs identical on all three" in line for line in out)
    assert any("2 of 2 outputs identical" in line for line in out)
    assert any("with the model stubbed out" in line for line in out)


def test_bench_schedule_prints_lpm_against_fcfs():
    out = run("bench_schedule.py", "--requests", "12")
    assert re.fullmatch(rf"LPM vs FCFS prefix hit rate: {RATIO}", out[-1])
    assert "same output for every request: True" in out


def test_bench_prefix_cache_prints_replay_ratios():
    out = run(
        "bench_prefix_cache.py",
        *("--conversations", "8", "--turns", "2", "--sizes", "2048", "4096"),
        *("--host", "8192"),
    )
    ratios = [line for line in out if re.search(rf"ms/request +{RATIO}$", line)]
    assert len(ratios) == 3 and ratios[0].endswith("1.00x")


def test_bench_sim_prints_replay_against_reference():
    out = run("bench_sim.py", "--n", "100", "--fig2", "300")
    ratios = [
        line for line in out if re.search(r"ratio +\d+\.\dx, same books: True", line)
    ]
    assert len(ratios) == 3
