"""memlab.capstone.schedule_compare: cache-aware scheduling (SGLang 0.5.23's ``SchedulePolicy``,
``lpm``) in the engine, and the claims bench/bench_schedule.py prints: LPM reorders, FCFS does
not, and the outputs do not change."""

from pathlib import Path

import pytest

from memlab.capstone.engine import Engine, TinyConfig, TinyLlama
from memlab.capstone.schedule_compare import measure

MODEL = TinyLlama(TinyConfig())
ROOT = Path(__file__).resolve().parents[2]


def engine(policy, **kw):
    kw = (
        dict(
            page_size=1,
            num_tokens=512,
            max_running=1,
            max_context=256,
            chunk_size=256,
            attention="torch",
            prefix_cache="radix",
            ignore_eos=True,
            schedule_policy=policy,
            debug_mode=True,
        )
        | kw
    )
    return Engine(MODEL, **kw)


def served_order(policy, **kw):
    e = engine(policy, **kw)
    shared = list(range(1, 41))
    e.generate([shared + [50, 51]], 1)  # the tree now holds `shared`
    others = [[60 + i] * 40 for i in range(3)]  # nothing cached
    reqs = [e.add_request(p, 1) for p in others[:2] + [shared + [52, 53]] + others[2:]]
    while e.step():
        pass
    return [reqs.index(r) for r in e.finished[1:]], e


def test_lpm_serves_the_longest_cached_prefix_first():
    assert served_order("fcfs")[0] == [0, 1, 2, 3]
    order, e = served_order("lpm")
    # the cached one first; the rest (no match) stay in arrival order
    assert order == [2, 0, 1, 3]
    assert e.stats["cached_tokens"] >= 40


def test_lpm_without_a_prefix_cache_is_fcfs():
    assert engine("lpm", prefix_cache=None).schedule_policy == "fcfs"
    with pytest.raises(ValueError, match="schedule_policy must be one of"):
        engine("sjf")


def test_lpm_defers_a_request_that_an_earlier_waiting_one_will_compute():
    e = engine("lpm", max_running=2)  # room for two in the first round
    base = list(range(1, 41))
    reqs = [e.add_request(base + [90 + i], 1) for i in range(2)] + [
        e.add_request([70] * 10, 1)
    ]
    while e.step():
        pass
    # the second shares 40 tokens with the first: it waits a round, then finds them cached
    assert [reqs.index(r) for r in e.finished] == [0, 2, 1]
    assert e.stats["cached_tokens"] == 40


@pytest.mark.slow
def test_the_bench_claims_hold_on_a_cut_of_the_trace():
    r = measure(requests=32)
    f, lpm = r["fcfs"], r["lpm"]
    assert f["outputs"] == lpm["outputs"]
    assert f["order"] == sorted(f["order"]) and lpm["order"] != f["order"]
    assert lpm["cached"] >= f["cached"] and lpm["computed"] <= f["computed"]
    assert lpm["displacement"] > f["displacement"] == 0


def test_chapter_12_families_lpm_keeps_each_system_prompt_while_its_family_is_served():
    """Chapter 12's example: 4 system prompts of 64 tokens, 16 requests interleaved, a pool with
    room for two prefixes. FCFS evicts each prompt before its family returns; LPM serves a family
    while its prompt is cached. The chapter's text quotes these figures."""
    import random

    rng = random.Random(0)
    system_prompts = [[rng.randrange(1, 128) for _ in range(64)] for _ in range(4)]
    prompts = [
        system_prompts[i % 4] + [rng.randrange(1, 128) for _ in range(8)]
        for i in range(16)
    ]
    got = {}
    for policy in ("fcfs", "lpm"):
        e = engine(
            policy, num_tokens=160, max_running=2, max_context=128, chunk_size=64
        )
        reqs = [e.add_request(p, 4) for p in prompts]
        while e.step():
            pass
        got[policy] = (
            e.stats["cached_tokens"],
            e.stats["prefill_tokens"],
            [r.rid for r in e.finished],
            [r.output for r in reqs],
        )
    assert got["fcfs"][:3] == (0, 1152, list(range(16)))
    assert got["lpm"][:3] == (
        769,
        383,
        [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15],
    )
    assert got["fcfs"][3] == got["lpm"][3]
    text = (ROOT / "chapters" / "py" / "12_unified_pool.py").read_text()
    assert "0 of 1,152 prompt tokens" in text and "finds 769 and prefills 383" in text


@pytest.mark.slow
def test_chapter_12_quotes_the_bench_as_measured():
    """The table of chapter 12 is what ``python bench/bench_schedule.py`` prints (96 requests)."""
    r = measure()
    f, lpm = r["fcfs"], r["lpm"]
    text = (ROOT / "chapters" / "py" / "12_unified_pool.py").read_text()
    rows = {
        "prefix hit rate": (
            f"{f['hit_rate']:.1%}".replace("%", " %"),
            f"{lpm['hit_rate']:.1%}".replace("%", " %"),
        ),
        "cached prompt tokens": (f"{f['cached']:,}", f"{lpm['cached']:,}"),
        "tokens computed (prefill + decode)": (
            f"{f['computed']:,}",
            f"{lpm['computed']:,}",
        ),
        "mean displacement in the finishing order": (
            f"{f['displacement']:.1f}",
            f"{lpm['displacement']:.1f} places",
        ),
    }
    for label, (a, b) in rows.items():
        assert f"# | {label} | {a} | {b} |" in text, (label, a, b)
    assert (
        f["outputs"] == lpm["outputs"] and "| outputs | the same | the same |" in text
    )
    assert (
        f"{f['computed'] - lpm['computed']:,}" == "18"
        and "Eighteen fewer tokens computed" in text
    )
