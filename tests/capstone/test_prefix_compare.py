"""memlab.capstone.prefix_compare, the replay behind chapter 11's table: the stream is what its
docstring says, a cache that never evicts hits exactly the longest earlier prefix (worked out here
in plain Python, per cache kind), and the over-eviction count matches a case done by hand."""

import pytest

from memlab.capstone.prefix_compare import (
    Turn,
    compare,
    replay_radix,
    replay_vllm,
    shared_prefix_conversations,
)


def lcp(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def expected_hits(stream, unit: int) -> int:
    """Hits with unlimited room: each request reuses the longest prefix of its prompt (not its
    last token) that an earlier request computed, in whole units of ``unit`` tokens."""
    done, hits = [], 0
    for t in stream:
        best = max((lcp(t.prompt[: len(t.prompt) - 1], d) for d in done), default=0)
        hits += best - best % unit
        # the last answer token is sampled, never computed
        done.append(t.prompt + t.answer[:-1])
    return hits


@pytest.fixture(scope="module")
def stream():
    return shared_prefix_conversations(
        8,
        3,
        num_system_prompts=2,
        system_len=40,
        user_len=(3, 20),
        answer_len=(3, 20),
        vocab=50,
        seed=1,
    )


def test_stream_shape(stream):
    assert len(stream) == 24 and stream == shared_prefix_conversations(
        8,
        3,
        num_system_prompts=2,
        system_len=40,
        user_len=(3, 20),
        answer_len=(3, 20),
        vocab=50,
        seed=1,
    )
    by_conv = {}
    for t in stream:
        by_conv.setdefault(t.rid.split("-")[0], []).append(t)
    assert len(by_conv) == 8 and all(len(ts) == 3 for ts in by_conv.values())
    for ts in by_conv.values():
        assert [t.rid.split("-")[1] for t in ts] == ["t0", "t1", "t2"]
        for prev, nxt in zip(ts, ts[1:]):
            assert (
                nxt.prompt[: len(prev.prompt) + len(prev.answer)]
                == prev.prompt + prev.answer
            )
            assert 3 <= len(nxt.prompt) - len(prev.prompt) - len(prev.answer) <= 20


@pytest.mark.parametrize("kind, unit", [("radix", 1), ("radix", 4), ("vllm", 4)])
def test_a_cache_that_never_evicts_hits_the_longest_earlier_prefix(stream, kind, unit):
    big = 1 << 14
    stats = (
        replay_radix(stream, big, unit)
        if kind == "radix"
        else replay_vllm(stream, big, unit)
    )
    assert stats.prompt_tokens == sum(len(t.prompt) for t in stream)
    assert stats.evicted_tokens == 0
    assert stats.hit_tokens == expected_hits(stream, unit) > 0


def test_small_caches_evict_and_hit_less(stream):
    big, small = replay_radix(stream, 1 << 14, 1), replay_radix(stream, 160, 1)
    assert small.evicted_tokens > 0 and small.hit_tokens < big.hit_tokens
    assert 0 < small.evict_requested <= small.evicted_tokens
    assert replay_vllm(stream, 160, 4).evict_requested is None


def test_over_eviction_by_hand():
    # 16 slots, pages of 1. "a" computes 10 tokens and leaves them cached as one leaf; "b" shares
    # nothing and needs 10 slots with 6 free: evict is asked for 4 and frees the whole leaf, 10.
    a = Turn("a", list(range(1, 9)), [100, 101, 102])  # 8 + 3 - 1 = 10 computed tokens
    b = Turn("b", list(range(20, 28)), [200, 201, 202])
    stats = replay_radix([a, b], 16, 1)
    assert (stats.evict_requested, stats.evicted_tokens) == (4, 10)
    assert stats.over_eviction == pytest.approx(6 / 10)


def test_table_reports_over_eviction_for_device_only_radix_rows(stream):
    table = compare(stream, (160, 1 << 14), page_size=4, host_tokens=256).table()
    lines = [line for line in table.splitlines() if "beyond the ask" in line]
    assert [line.split(":")[0] for line in lines] == ["radix, page 4", "radix, page 1"]
    # the big cache evicts nothing: no share to report
    assert lines[0].split()[-1] == "-"
