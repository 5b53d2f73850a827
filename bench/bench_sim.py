"""The workload simulator on real-sized streams, and its speed against the per-iteration reference.

  python bench/bench_sim.py                  every policy on ShareGPT-like 20k, Azure conv,
                                             Azure code
  python bench/bench_sim.py --sweep          plus paged block sizes 1..256 on ShareGPT-like
  python bench/bench_sim.py --plots DIR      and save the figures as PNG files in DIR
  python bench/bench_sim.py --n 2000         fewer requests per stream
  python bench/bench_sim.py --fig2 1000      fewer requests in the Figure 2 replays

Prints the vLLM paper's Figure 2 beside memlab's (buddy allocator and first fit), each stream's
breakdown (% of the pool, averaged over iterations) with its wall time, reservations placed by
the buddy allocator and by first fit, and the event-skipping replay timed side by side with the
one-iteration-at-a-time reference on the same small stream (they produce the same books; the
ratio is the point).
"""

import argparse
import os
import time

from memlab.capstone import sim


def replay_table(wl, pool, policies):
    t0 = time.perf_counter()
    results, refused = [], []
    for p in policies:
        try:
            results.append(sim.simulate(wl, pool, p))
        # a buddy block larger than the pool's largest power-of-two block
        except ValueError as e:
            refused.append(f"{p.name}: {e}")
    print(
        f"\n{wl.describe()}; pool {pool:,} slots; {time.perf_counter() - t0:.1f} s for "
        f"{len(results)} replays"
    )
    print(sim.breakdown_table(results))
    print(
        "wall s: "
        + ", ".join(f"{r.policy} {r.wall_seconds:.1f}" for r in results)
        + " | recomputed tokens: "
        + ", ".join(
            f"{r.policy} {r.recomputed_tokens:,}" for r in results if r.preemptions
        )
    )
    for line in refused:
        print("cannot run:", line)
    return results


def figure2(n: int = sim.FIG2_REQUESTS):
    t0 = time.perf_counter()
    buddy, first_fit = (
        sim.figure2(n=n, progress=True),
        sim.figure2("first_fit", n=n, progress=True),
    )
    print(
        f"\nvLLM paper, Fig. 2 beside memlab ({n:,} ShareGPT-like requests, "
        f"{sim.FIG2_POOL_SIZE:,} slots); {time.perf_counter() - t0:.1f} s for 8 replays"
    )
    print(sim.figure2_table(buddy, first_fit))
    # the stream's tail fitted to the Max bar (not the default: see memlab.capstone.sim.figure2)
    fitted = sim.figure2(n=n, sigma=0.8, progress=True)
    print(
        "\nthe same, buddy allocator, lengths with sigma 0.8 (the tail the Max bar implies): "
        "token states "
        + ", ".join(f"{r.policy} {sim.paper_categories(r)[0]:.1f}" for r in fitted)
    )
    return buddy, first_fit


def speed_vs_reference(pool):
    wl = sim.sharegpt_like(400, seed=5)
    print(f"\nfast replay vs per-iteration reference, {wl.describe()}, pool {pool:,}:")
    for policy in (sim.Oracle("buddy"), sim.Oracle("first_fit"), sim.Paged(16)):
        t0 = time.perf_counter()
        fast = sim.simulate(wl, pool, policy, progress=False)
        t1 = time.perf_counter()
        slow = sim.simulate_reference(wl, pool, policy)
        t2 = time.perf_counter()
        same = (
            fast.slot_iterations == slow.slot_iterations
            and fast.iterations == slow.iterations
        )
        print(
            f"  {fast.policy:>18}: replay {1e3 * (t1 - t0):8.1f} ms, "
            f"reference {1e3 * (t2 - t1):8.1f} ms, "
            f"ratio {(t2 - t1) / (t1 - t0):6.1f}x, same books: {same}"
        )


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--n", type=int, default=20_000, help="requests per stream (default 20,000)"
    )
    ap.add_argument("--pool", type=int, default=sim.DEFAULT_POOL_SIZE)
    ap.add_argument(
        "--fig2",
        type=int,
        default=sim.FIG2_REQUESTS,
        help=f"requests of the Figure 2 replays (default {sim.FIG2_REQUESTS:,}, the paper's)",
    )
    ap.add_argument(
        "--sweep", action="store_true", help="paged block sizes 1..256 on ShareGPT-like"
    )
    ap.add_argument("--plots", metavar="DIR", help="save figures as PNG files in DIR")
    args = ap.parse_args()

    t0 = time.perf_counter()
    fig2 = figure2(args.fig2)
    policies = [
        cls(placement)
        for placement in ("buddy", "first_fit")
        for cls in (sim.MaxContext, sim.Pow2, sim.Oracle)
    ]
    policies += [sim.Paged(16), sim.Paged(16, watermark=0.01)]
    streams = [
        sim.sharegpt_like(args.n),
        sim.load_azure("conv", n=args.n),
        sim.load_azure("code", n=args.n),
    ]
    all_results = [replay_table(wl, args.pool, policies) for wl in streams]
    sweep = sim.block_size_sweep(streams[0], args.pool) if args.sweep else None
    if sweep:
        print(f"\nblock-size sweep, {streams[0].name}:")
        print(sim.breakdown_table(sweep))
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")
    speed_vs_reference(args.pool)
    if args.plots:
        # matplotlib only when figures are asked for
        from memlab.course.viz import draw_sim

        os.makedirs(args.plots, exist_ok=True)
        draw_sim.plot_figure2(*fig2).savefig(
            os.path.join(args.plots, "figure2.png"), dpi=120
        )
        for wl, results in zip(streams, all_results):
            stem = wl.name.lower().replace(" ", "_").replace("(", "").replace(")", "")
            draw_sim.plot_breakdown(results).savefig(
                os.path.join(args.plots, f"breakdown_{stem}.png"), dpi=120
            )
            paged = next(r for r in results if r.policy == "paged B=16")
            draw_sim.plot_timeline(paged).savefig(
                os.path.join(args.plots, f"timeline_{stem}.png"), dpi=120
            )
        if sweep:
            draw_sim.plot_sweep(sweep).savefig(
                os.path.join(args.plots, "sweep_sharegpt.png"), dpi=120
            )
        print(f"figures in {args.plots}")


if __name__ == "__main__":
    main()
