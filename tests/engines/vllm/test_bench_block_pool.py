"""bench/bench_block_pool.py runs on a small pool and prints its ratios against vLLM 0.33's own
BlockPool (a benchmark, not a timed test: the figures are not judged here, only that the two
pools handed out the same blocks and that the last line says the ratios)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from memlab_tests.tools.engines.vllm_loader import load

ROOT = Path(__file__).resolve().parents[3]


def test_the_bench_runs_and_prints_both_ratios():
    load()  # the wheel first: without it this skips (CI: fails) like the other engine tests
    r = subprocess.run(
        [sys.executable, "bench/bench_block_pool.py", "--smoke", "--ops"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert any(
        line.startswith("same blocks handed out by every pool") for line in lines
    )
    ops = [line.split(":")[0].split() for line in lines if "| all " in line]
    assert ops == [[n, p] for n in ("memlab", "vLLM") for p in ("fill", "steady")], (
        lines
    )
    assert re.fullmatch(
        r"block pool vs vLLM 0\.33: fill \d+\.\d\dx, steady \d+\.\d\dx", lines[-1]
    ), lines[-1]


def test_the_bench_refuses_to_time_pools_that_disagree(monkeypatch):
    """Bug zoo: a memlab queue that hands its head blocks out in reverse order must stop the
    bench before anything is timed."""
    import runpy

    import pytest

    from memlab.vllm.block_pool import FreeKVCacheBlockQueue

    bench = runpy.run_path(
        str(ROOT / "bench" / "bench_block_pool.py"), run_name="bench"
    )
    real = FreeKVCacheBlockQueue.popleft_n
    monkeypatch.setattr(
        FreeKVCacheBlockQueue, "popleft_n", lambda self, n: real(self, n)[::-1]
    )
    with pytest.raises(AssertionError, match="handed out other blocks than vLLM"):
        bench["check_same"](load(), 4_000, 200)
