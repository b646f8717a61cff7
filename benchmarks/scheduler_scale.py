"""Scheduler target 2: planning time and plan quality at 20, 100 and 1,000 nodes.

For each size, a ``gcp-2025/geo-distributed/N`` cluster (nodes round robin over its locations)
with the reference workload (6 stages, L = 4, 6 microbatches per data node, memory 3), no
allocation fixed. ``skippipe-no-tc2`` and ``skippipe`` (with a time limit below the target) are
planned and simulated; printed: wall-clock planning time, makespan, the simulator's lower bound
(``skippipe.bounds.lower_bound``) and the sharper data-node floor of the chosen allocation, the
ratios, whether the plan is valid and every microbatch finishes, and skippipe vs no-tc2.
Targets: 20 nodes <= 10 s, 100 nodes <= 30 s, 1,000 nodes <= 60 s of planning, valid, no worse
than no-tc2. The machine is shared, so times are noisy.

    python3 benchmarks/scheduler_scale.py [--sizes 20 100 1000] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import time

from skippipe.cluster import load_cluster
from skippipe.planfile import plan_violations
from skippipe.planner.floors import allocation_data_node_floor
from skippipe.planner.problem import build_problem
from skippipe.planner.routing.schedule import plan_no_tc2, plan_skippipe
from skippipe.sim import simulate
from skippipe.workload import Workload

TARGET_S = {20: 10.0, 100: 30.0, 1000: 60.0}


def time_limit_for(n: int) -> float:
    """Search budget: the target minus room for allocation, the static routing and the checks."""
    target = TARGET_S.get(n, 60.0)
    return max(1.0, 0.75 * target - 0.004 * n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 100, 1000])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"machine: {os.cpu_count()} cores (shared with other work; timings are noisy)")
    head = (f"{'nodes':>5} {'method':<16} {'plan s':>7} {'target s':>8} {'makespan s':>10} {'bound s':>8} "
            f"{'/bound':>7} {'dn-floor s':>10} {'/dn-floor':>9} {'valid':>5} {'vs no-tc2':>9}")
    print(head)
    print("-" * len(head))
    lines = []
    for n in args.sizes:
        problem = build_problem(load_cluster(f"gcp-2025/geo-distributed/{n}"), Workload())
        t = time.perf_counter()
        base = plan_no_tc2(problem, seed=args.seed)
        t_base = time.perf_counter() - t
        t = time.perf_counter()
        ours = plan_skippipe(problem, seed=args.seed, time_limit_s=time_limit_for(n), budget=10**9)
        t_ours = time.perf_counter() - t
        base_s = simulate(base, record=False).makespan_s
        for name, plan, took in (("skippipe-no-tc2", base, t_base), ("skippipe", ours, t_ours)):
            res = simulate(plan, record=False)
            floor = allocation_data_node_floor(problem, plan.stages)
            valid = res.finished and not plan_violations(plan)
            print(f"{n:>5} {name:<16} {took:>7.2f} {TARGET_S.get(n, 60.0):>8.0f} {res.makespan_s:>10.2f} "
                  f"{res.lower_bound_s:>8.2f} {res.makespan_s / res.lower_bound_s:>7.3f} {floor:>10.2f} "
                  f"{res.makespan_s / floor:>9.3f} {('yes' if valid else 'NO'):>5} {res.makespan_s / base_s:>9.3f}")
        res = simulate(ours, record=False)
        ok = t_ours <= TARGET_S.get(n, 60.0) and res.makespan_s <= base_s + 1e-9 and not plan_violations(ours)
        lines.append(
            f"{n} nodes: skippipe planned in {t_ours:.1f} s (target <= {TARGET_S.get(n, 60.0):.0f} s), "
            f"{res.makespan_s:.2f} s per iteration = {res.makespan_s / res.lower_bound_s:.3f} x the lower bound, "
            f"{res.makespan_s / base_s:.3f} x no-tc2 ({'met' if ok else 'NOT met'})"
        )
    print()
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
