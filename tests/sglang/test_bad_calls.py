"""Generated bad calls at the SGLang side and the common layer (issue 32), debug mode on and off.

``tests/tools/bad_calls.py`` generates the calls from each entry point's good call (every argument
replaced by wrong kinds and values) and adds misuse in time; its script prints the counts of all
of them. Here every scenario runs, and for each entry point Hypothesis draws generated calls, in
both modes:

- no raw Python or torch error, no state changed before a refusal, in either mode;
- nothing accepted that leaves the books broken with debug mode on;
- with debug mode off, only the misuse SGLang itself leaves to its caller, each kind listed in
  ``TRUSTED`` with the docstring that says so.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from memlab_tests.tools import bad_calls

bad_calls.build_entries()
CALLS = bad_calls.calls()
BY_ENTRY: dict[str, list] = {}
for _c in CALLS:
    if _c.prepare is None:
        BY_ENTRY.setdefault(_c.entry.name, []).append(_c)
SCENARIOS = [c for c in CALLS if c.prepare is not None]

# (entry point, call) patterns that may leave the books broken with debug mode off, and why: the
# engine trusts its caller there for speed, debug mode refuses them, the docstring says so.
DOUBLE_FREE = (
    "a double free (SGLang asserts it in debug mode only; the frees' docstrings say so)"
)
TRUSTED = {
    (
        r"Allocator.*\.free(_segment|_page_ids)?$",
        r"a free slot|held twice|one longer|repeated",
    ): (DOUBLE_FREE),
    (
        r"Allocator.* \(order\)$",
        r"freed twice|free after clear|another allocator",
    ): DOUBLE_FREE,
    (r"HybridReqToTokenPool \(order\)$", r"freed twice"): DOUBLE_FREE,
    (r"release_kv_cache.* \(order\)$", r"a lock released twice"): (
        "RadixCache.dec_lock_ref: a lock released twice (debug mode refuses it)"
    ),
    (
        r"^alloc_for_extend",
        r"prefix_indices: (free slots|slots the tree does not hold)",
    ): (
        "alloc_for_extend: a cache hit's slots are the tree's; debug mode checks they are held"
    ),
    (r"RadixCache\.insert$", r"value: (slots of a free page|repeated)"): (
        "RadixCache.insert: the request's slots; debug mode checks them (held, whole pages)"
    ),
}


def trusted(c) -> str | None:
    for (entry, label), why in TRUSTED.items():
        if re.search(entry, c.entry.name) and re.search(label, c.label):
            return why
    return None


def judge(c) -> list[str]:
    """What is wrong with one call, in both modes (nothing: an empty list)."""
    bad = []
    for mode in bad_calls.MODES:
        cls, what = bad_calls.classify_safe(c, mode == "debug on")
        if cls in ("raw", "changed") or (
            cls == "corrupt" and (mode == "debug on" or not trusted(c))
        ):
            bad.append(f"{cls} with {mode}: {c.entry.name} [{c.label}]: {what}")
    return bad


@pytest.mark.parametrize("call", SCENARIOS, ids=lambda c: f"{c.entry.name}: {c.label}")
def test_misuse_in_time_is_refused_or_trusted_as_sglang_does(call):
    assert judge(call) == []


@pytest.mark.parametrize("entry", sorted(BY_ENTRY))
@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
def test_generated_bad_calls_are_refused_or_trusted_as_sglang_does(entry, data):
    call = data.draw(st.sampled_from(BY_ENTRY[entry]), label="call")
    assert judge(call) == []


def test_every_trusted_kind_is_still_one():
    """A listed kind that debug mode no longer needs to catch (memlab refuses it in both modes
    now) leaves the list: each pattern still matches a call that is corrupt with debug off."""
    for (entry, label), why in TRUSTED.items():
        matching = [c for c in CALLS if trusted(c) == why and re.search(label, c.label)]
        matching = [c for c in matching if re.search(entry, c.entry.name)]
        assert matching, f"no generated call matches {entry!r} [{label!r}]"
        assert any(
            bad_calls.classify_safe(c, False)[0] == "corrupt" for c in matching[:6]
        ), f"{entry!r} [{label!r}] is refused with debug off now: drop it from TRUSTED"


def test_the_classes_can_fail():
    """Each class is told apart: a raw error, a change before an error, a silent acceptance, a
    broken book, memlab's own refusal."""

    def entry(call, books=None):
        return bad_calls.Entry(
            "x", lambda debug: SimpleNamespace(n=[0]), call, lambda env: {}, books
        )

    def grow_then_refuse(env):
        env.n.append(1)
        bad_calls.wrong_values(1)  # memlab's frames are not these
        raise ValueError("x")

    def broken(env):
        raise AssertionError("books")

    def memlab_refusal(env):
        from memlab.common import _checks

        _checks.integer("n", None)

    cases = {
        "raw": entry(lambda env: None.x),
        "changed": entry(grow_then_refuse),
        "silent": entry(lambda env: None),
        "corrupt": entry(lambda env: None, books=broken),
        "clean": entry(memlab_refusal),
    }
    for want, e in cases.items():
        got = bad_calls.classify(bad_calls.Call(e, "x", e.call), True)[0]
        assert got == want, (want, got)


def test_the_generator_makes_every_kind_of_wrong_value():
    import torch

    kinds = {label for label, _ in bad_calls.wrong_values(torch.tensor([1, 2]))}
    assert {"meta device", "2-D", "0-d", "one shorter", "ids past the end"} <= kinds
    assert {"None inside", "float inside", "huge id"} <= {
        label for label, _ in bad_calls.wrong_values([1, 2, 3], "tokens")
    }
