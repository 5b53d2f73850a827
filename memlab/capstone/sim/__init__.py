"""memlab.capstone.sim: how much of a KV pool each allocation policy wastes, replayed on request
streams.

Notebook entry points (chapter 10)::

    from memlab.capstone import sim
    wl = sim.sharegpt_like(20_000)    # or sim.load_azure("conv"), sim.load_azure("code")
    results = sim.compare_policies(wl, pool_size=15_728)  # placement="buddy" (default)
                                                          # or "first_fit"
    print(sim.breakdown_table(results))
    sweep = sim.block_size_sweep(wl)
    buddy, first_fit = sim.figure2(), sim.figure2("first_fit")   # the vLLM paper's Figure 2
    print(sim.figure2_table(buddy, first_fit))

Their pictures are memlab.course.viz.draw_sim's (``plot_breakdown(results)``, ``plot_sweep(sweep)``,
``plot_figure2(buddy, first_fit)``): memlab.capstone.sim computes, memlab.course.viz draws.

The five shares (used, reserved, internal, rounding, free) are defined in
``memlab.capstone.sim.replay``; the placements (buddy, first fit, any slots) in
``memlab.capstone.sim.policies``; the paper's setup in ``memlab.capstone.sim.figure2``.
"""

from memlab.capstone.sim.figure2 import (
    FIG2_POOL_SIZE,
    FIG2_REQUESTS,
    PAPER_FIG2,
    PAPER_FIG13_BATCH,
    figure2,
    figure2_table,
    paper_categories,
    tokens_per_request,
)
from memlab.capstone.sim.policies import (
    PLACEMENTS,
    AnySlots,
    Buddy,
    FirstFit,
    MaxContext,
    Oracle,
    Paged,
    Policy,
    Pow2,
    Reservation,
    make_policy,
)
from memlab.capstone.sim.reference import simulate_reference
from memlab.capstone.sim.replay import (
    DEFAULT_POOL_SIZE,
    SHARES,
    SimResult,
    bin_timeline,
    block_size_sweep,
    breakdown_table,
    compare_policies,
    simulate,
)
from memlab.capstone.sim.workload import (
    WORKLOADS,
    Workload,
    load_azure,
    load_azure_arrivals,
    load_workload,
    sharegpt_like,
)

__all__ = [
    "Workload",
    "WORKLOADS",
    "sharegpt_like",
    "load_azure",
    "load_azure_arrivals",
    "load_workload",
    "Policy",
    "Reservation",
    "MaxContext",
    "Pow2",
    "Oracle",
    "Paged",
    "make_policy",
    "PLACEMENTS",
    "Buddy",
    "FirstFit",
    "AnySlots",
    "simulate",
    "simulate_reference",
    "SimResult",
    "SHARES",
    "DEFAULT_POOL_SIZE",
    "compare_policies",
    "block_size_sweep",
    "breakdown_table",
    "bin_timeline",
    "figure2",
    "figure2_table",
    "paper_categories",
    "tokens_per_request",
    "FIG2_POOL_SIZE",
    "FIG2_REQUESTS",
    "PAPER_FIG2",
    "PAPER_FIG13_BATCH",
]
