"""memlab.sim: how much of a KV pool each allocation policy wastes, replayed on request streams.

Notebook entry points (chapter 10)::

    from memlab import sim
    wl = sim.sharegpt_like(20_000)                 # or sim.load_azure("conv"), sim.load_azure("code")
    results = sim.compare_policies(wl, pool_size=15_728)
    print(sim.breakdown_table(results)); sim.plot_breakdown(results)
    sim.plot_sweep(sim.block_size_sweep(wl))

The four shares (used, reserved, internal, free) are defined in ``memlab.sim.replay``.
"""

from memlab.sim.policies import FirstFit, MaxContext, Oracle, Paged, Policy, Pow2, Reservation, make_policy
from memlab.sim.replay import (DEFAULT_POOL_SIZE, SHARES, SimResult, block_size_sweep, breakdown_table,
                               compare_policies, simulate)
from memlab.sim.reference import simulate_reference
from memlab.sim.workload import Workload, load_azure, sharegpt_like

_PLOTS = ("plot_breakdown", "plot_sweep", "plot_timeline")


def __getattr__(name):
    # The plots pull in matplotlib and memlab.viz (seconds): load them only when one is asked for.
    if name in _PLOTS:
        from memlab.sim import plots

        return getattr(plots, name)
    raise AttributeError(f"module 'memlab.sim' has no attribute {name!r}")

__all__ = [
    "Workload", "sharegpt_like", "load_azure", "Policy", "Reservation", "MaxContext", "Pow2", "Oracle",
    "Paged", "make_policy", "FirstFit", "simulate", "simulate_reference", "SimResult", "SHARES",
    "DEFAULT_POOL_SIZE", "compare_policies", "block_size_sweep", "breakdown_table", "plot_breakdown",
    "plot_sweep", "plot_timeline",
]
