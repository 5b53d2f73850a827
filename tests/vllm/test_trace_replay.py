"""Prefix-cache replay of the Mooncake traces through the block pool."""

import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memlab.vllm.trace_replay import (
    TRACES,
    TraceRequest,
    hit_rate_curve,
    load_trace,
    replay,
    run,
    unlimited_bound,
)

SUBSAMPLE = (
    1500  # the full conversation trace takes ~15 s for 9 capacities; a subsample ~1 s
)


@pytest.fixture(scope="module")
def conversation():
    return load_trace("conversation", limit=SUBSAMPLE)


def test_traces_load_with_their_published_shape():
    assert len(load_trace("synthetic")) == 3993
    reqs = load_trace("conversation", limit=3)
    assert reqs[0].num_tokens == 6758 and reqs[0].block_hashes[:3] == [0, 1, 2]
    assert reqs[1].block_hashes[0] == 0  # shares the first 512 tokens with request 0


def test_hit_rate_never_decreases_and_reaches_the_unlimited_bound(conversation):
    curve = hit_rate_curve(
        conversation, (0.02, 0.05, 0.1, 0.3, 0.6, 1.0), "conversation", progress=False
    )
    rates = curve.hit_rates
    assert all(a <= b for a, b in zip(rates, rates[1:])), rates
    assert (
        curve.stats[-1].hit_tokens == curve.bound.hit_tokens
        and curve.stats[-1].evictions == 0
    )
    assert curve.stats[0].evictions > 0 and rates[0] < rates[-1]
    assert 0.2 < curve.bound.hit_rate < 0.5
    assert "unlimited-cache hit rate" in curve.table()


def test_blocks_needed_is_tight(conversation):
    bound = unlimited_bound(conversation)
    assert replay(conversation, bound.blocks_needed).evictions == 0
    assert replay(conversation, bound.blocks_needed - 1).evictions > 0


def test_unlimited_bound_by_hand():
    bs = 4
    # nothing
    reqs = [
        TraceRequest("a", 10, [1, 2, 3]),  # blocks 1, 2 full and cached; 3 partial
        TraceRequest("b", 9, [1, 2, 4]),  # hits 1, 2 (8 tokens); 4 partial
        TraceRequest("c", 8, [1, 2]),  # at most 7 tokens may hit: only block 1
        TraceRequest("d", 5, [7, 8]),
    ]
    b = unlimited_bound(reqs, bs)
    assert (b.hit_tokens, b.prompt_tokens, b.max_request_blocks) == (
        0 + 8 + 4 + 0,
        32,
        3,
    )
    # cached after each: 2, 2, 3 (c's block 2 is recomputed: a duplicate), 4; peak with d's 2 new
    assert b.blocks_needed == 5
    assert replay(reqs, 5, bs).hit_tokens == b.hit_tokens


@st.composite
def prefix_tree_traces(draw):
    """Random traces whose ids are prefix-closed, like Mooncake's: equal id = equal prefix."""
    paths, next_id, reqs = [[]], 1, []
    for i in range(draw(st.integers(1, 25))):
        base = draw(st.sampled_from(paths))
        ids = base[: draw(st.integers(0, len(base)))]
        for _ in range(draw(st.integers(1, 5))):
            ids.append(next_id)
            next_id += 1
        paths.append(ids)
        reqs.append(
            TraceRequest(str(i), (len(ids) - 1) * 4 + draw(st.integers(1, 4)), ids)
        )
    return reqs


@settings(max_examples=25, deadline=None)
@given(reqs=prefix_tree_traces())
def test_random_traces_hit_rate_is_monotone_in_capacity(reqs):
    b = unlimited_bound(reqs, 4)
    hits = [
        replay(reqs, n, 4).hit_tokens
        for n in range(b.max_request_blocks, b.blocks_needed + 1)
    ]
    assert all(x <= y for x, y in zip(hits, hits[1:])), hits
    assert hits[-1] == b.hit_tokens


def test_run_shows_progress_and_plots(capsys):
    import matplotlib

    matplotlib.use("Agg")
    curve = run("synthetic", fractions=(0.1, 1.0), limit=200, progress=True, plot=True)
    # 400 ticks, labelled
    assert "replay synthetic: 200 requests x 2 capacities" in capsys.readouterr().err
    fig = curve.plot()
    assert fig.axes[0].get_lines()[0].get_ydata().tolist() == curve.hit_rates
    import matplotlib.pyplot as plt

    plt.close("all")


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="unknown trace 'chat'"):
        load_trace("chat")
    with pytest.raises(ValueError, match="limit must be a positive int or None, got 0"):
        load_trace("synthetic", limit=0)
    bad = tmp_path / "mooncake_fast25_synthetic.jsonl.gz"
    with gzip.open(bad, "wt") as f:
        f.write(
            json.dumps(
                {
                    "timestamp": 0,
                    "input_length": 1025,
                    "output_length": 1,
                    "hash_ids": [1, 2],
                }
            )
            + "\n"
        )
    with pytest.raises(ValueError, match=r"line 1: 2 hash_ids for 1025 input tokens"):
        load_trace("synthetic", data_dir=tmp_path)
    reqs = [TraceRequest("a", 100, [1, 2, 3])]
    with pytest.raises(
        ValueError,
        match="num_blocks=2 cannot hold the trace's longest request \\(3 blocks\\)",
    ):
        replay(reqs, 2, 64)
    with pytest.raises(ValueError, match="fractions must lie in"):
        hit_rate_curve(reqs, (0.0, 1.0), progress=False)
    assert TRACES == ("conversation", "synthetic")
