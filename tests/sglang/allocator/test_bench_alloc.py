"""bench/bench_alloc.py runs and prints its ratios on a small size (a benchmark, not a timed test:
nothing here asserts a speed), and it refuses to time implementations that disagree."""

import re

import pytest

from memlab_tests.tools.loading import load_file


@pytest.fixture(scope="module")
def bench():
    return load_file("bench/bench_alloc.py")


def test_the_bench_runs_and_prints_the_ratio_against_sglang(bench, capsys):
    assert bench.main(["--smoke", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "outputs identical" in out and "debug on / debug off" in out
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(
        r"torch alloc_extend vs SGLang's alloc_extend_naive \(bs 16, page 16\): "
        r"\d+\.\d\dx",
        last,
    ), last


def test_the_bench_refuses_to_time_a_wrong_reference(bench, monkeypatch):
    right = bench.ref.alloc_extend_torch
    # every slot, in the wrong order
    monkeypatch.setattr(bench.ref, "alloc_extend_torch", lambda *a: right(*a).flip(0))
    naive, _ = bench.sglang_naive()
    with pytest.raises(AssertionError, match="disagrees"):
        bench.extend_row(4, 16, False, naive, rounds=1, min_time=0.001)
