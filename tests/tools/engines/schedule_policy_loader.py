"""SGLang 0.5.23's admission (``PrefillAdder``), loaded from its published wheel for the tests.

On top of ``sglang_loader.load()`` (the allocators, the radix tree, the env-var registry), this
executes, each from the wheel's own files:

- ``mem_cache/prefill_budget.py`` whole: ``PrefillBudget``, the memory budget the adder asks
  (the wheel's ``BaseTokenToKVPoolAllocator.create_prefill_budget`` imports it);
- from ``managers/schedule_policy.py`` (4,000 lines of imports: CUDA, multimodal, diffusion LLMs),
  the named definitions ``CLIP_MAX_NEW_TOKENS``, ``IGNORE_EOS_RESERVE_TOKENS``, ``AddReqResult``,
  ``_PrefillAdmission`` and ``PrefillAdder``;
- ``NewTokenRatioTracker`` from ``managers/scheduler_components/new_token_ratio_tracker.py`` and
  ``split_cached_prefix_by_tier`` from ``managers/schedule_batch.py``.

The names ``PrefillAdder`` refers to beyond those are stand-ins for features the course does not
model, each answering "off" the way SGLang's own unit tests find them: no AMD tile budget, no
exact chunk fill (gfx95 only), no Mamba chunk grid, no page sharding (``page_interleave_shard_size``
is 1), no encoder replay, no Mamba or DeepSeek-V4 allocators (classes nothing is an instance of),
the FCFS schedule policy with its default conservativeness (1.0).
"""

from __future__ import annotations

import functools
import sys
import types

from memlab_tests.tools.engines import sglang_loader


class _Nothing:
    """A class no allocator or tree is an instance of: the feature it stands for is off."""


@functools.cache
def load() -> types.SimpleNamespace:
    """SGLang's ``PrefillAdder`` and what it needs (skips without the wheel)."""
    sg = sglang_loader.load()
    L = sglang_loader._Loader(sg.root)
    envs = sys.modules["sglang.srt.environ"].envs
    schedule = types.SimpleNamespace(
        schedule_policy="fcfs",
        schedule_conservativeness=1.0,
        schedule_low_priority_values_first=False,
    )
    budget = L.module("sglang.srt.mem_cache.prefill_budget")
    L.package("sglang.srt.managers.scheduler_components")
    tracker = L.pick(
        "sglang.srt.managers.scheduler_components.new_token_ratio_tracker",
        ["NewTokenRatioTracker"],
        envs=envs,
        get_schedule=lambda: schedule,
    )
    tiers = L.pick(
        "sglang.srt.managers.memlab_split_cached_prefix",
        ["split_cached_prefix_by_tier"],
        source="sglang.srt.managers.schedule_batch",
    )
    policy = L.pick(
        "sglang.srt.managers.schedule_policy",
        [
            "logger",
            "CLIP_MAX_NEW_TOKENS",
            "IGNORE_EOS_RESERVE_TOKENS",
            "AddReqResult",
            "_PrefillAdmission",
            "PrefillAdder",
        ],
        envs=envs,
        get_schedule=lambda: schedule,
        get_exec=lambda: types.SimpleNamespace(
            features=types.SimpleNamespace(enable_encoder_swa_bounded_replay=False)
        ),
        encoder_swa_replay=None,
        mamba_prefill_chunk_grid=lambda: 1,
        _use_exact_chunk_fill=lambda: False,
        _IS_HIP=False,
        PREFILL_TILE_BUDGET=0,
        PREFILL_TILE_BUDGET_MODE="compact",
        estimate_prefill_extend_tile_metrics=None,
        page_interleave_shard_size=lambda allocator: 1,
        SWATokenToKVPoolAllocator=sg.SWATokenToKVPoolAllocator,
        DeepSeekV4HiSparseTokenToKVPoolAllocator=_Nothing,
        UnifiedMambaTokenToKVPoolAllocator=_Nothing,
        UnifiedMambaSWATokenToKVPoolAllocator=_Nothing,
        UnifiedRadixCache=_Nothing,
        InitLoadBackParams=sg.base_prefix_cache.InitLoadBackParams,
        ComponentType=sg.ComponentType,
        CacheTransferPhase=_Nothing,
        split_cached_prefix_by_tier=tiers.split_cached_prefix_by_tier,
    )
    return types.SimpleNamespace(
        PrefillAdder=policy.PrefillAdder,
        AddReqResult=policy.AddReqResult,
        CLIP_MAX_NEW_TOKENS=policy.CLIP_MAX_NEW_TOKENS,
        IGNORE_EOS_RESERVE_TOKENS=policy.IGNORE_EOS_RESERVE_TOKENS,
        PrefillBudget=budget.PrefillBudget,
        NewTokenRatioTracker=tracker.NewTokenRatioTracker,
        envs=envs,
    )
