"""Clusters of 120 to 600 nodes, between the suite's 100- and 1,000-node rows: ``skippipe`` with
its default deterministic budget against one search over the whole cluster.

Above 200 nodes ``skippipe`` plans a cluster of sites in locality groups alone (where it has
sites and the groups' estimated planning fits the time target, ``routing.site_groups``); from
48 to 200 nodes it plans whole and in groups and keeps the quicker. The ``whole`` column is the
search over the whole cluster with the same safety net (what ``skippipe`` did above 200 nodes
before; ``same`` where ``skippipe`` planned whole). Printed per cluster: the makespans, the
planning wall-clock seconds and CPU seconds (the planning workers' included), the floor over
every allocation and the ratios to it.

    python3 benchmarks/scheduler_midsize.py [--only 3 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from skippipe.cluster import Cluster
from skippipe.cluster_gen import gcp_regions_cluster, random_global_cluster, single_site_cluster
from skippipe.planfile import plan_violations
from skippipe.planner import methods
from skippipe.planner.floors import free_allocation_floor
from skippipe.planner.problem import build_problem
from skippipe.planner.routing.pool import cpu_seconds
from skippipe.planner.routing.schedule import plan_skippipe
from skippipe.sim import simulate
from skippipe.workload import Workload

UNEVEN = {"speed": (0.5, 2.0), "memory": (1, 4)}
CLUSTERS: list[tuple[str, Callable[[], Cluster], int, int]] = [
    ("one per node, uneven", lambda: random_global_cluster(120, 13, broken=0.1, **UNEVEN), 8, 6),
    ("gcp 12 regions", lambda: gcp_regions_cluster(150), 4, 3),
    ("single site, uneven", lambda: single_site_cluster(160, 12, **UNEVEN), 6, 4),
    ("20 sites, uneven", lambda: random_global_cluster(200, 11, sites=20, broken=0.05, **UNEVEN), 9, 5),
    ("one per node, uneven", lambda: random_global_cluster(201, 18, **UNEVEN), 9, 8),
    ("25 sites, one slot", lambda: random_global_cluster(250, 15, sites=25, speed=(0.5, 2.0), memory=(1, 1)), 6, 4),
    ("30 sites, uneven", lambda: random_global_cluster(300, 14, sites=30, broken=0.05, **UNEVEN), 7, 4),
    ("single site, uneven", lambda: single_site_cluster(400, 17, **UNEVEN), 9, 9),
    ("gcp 12 regions", lambda: gcp_regions_cluster(500), 9, 5),
    ("40 sites, uneven", lambda: random_global_cluster(600, 16, sites=40, broken=0.05, **UNEVEN), 5, 3),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", type=int, nargs="*", help="row numbers (from 0)")
    args = ap.parse_args()
    print(f"{'#':>2s} {'kind':22s} {'N':>4s} {'S':>2s} {'L':>2s} {'skippipe':>9s} {'wall s':>6s} {'cpu s':>6s} "
          f"{'whole':>9s} {'cpu s':>6s} "
          f"{'floor':>7s} {'ratio':>6s} {'whole':>6s}  candidate")
    for i, (kind, make, stages, length) in enumerate(CLUSTERS):
        if args.only and i not in args.only:
            continue
        problem = build_problem(make(), Workload(num_stages=stages, path_length=length))
        t0, wall = cpu_seconds(), time.perf_counter()
        plan = methods.make_plan("skippipe", problem, seed=0)
        cpu, wall = cpu_seconds() - t0, time.perf_counter() - wall
        assert not plan_violations(plan), f"row {i}: skippipe's plan breaks a rule"
        ours = simulate(plan, record=False, bound=False).makespan_s
        candidate = str(plan.meta.get("candidate"))
        floor = free_allocation_floor(problem).value
        if candidate == "groups of sites" and "whole_makespan_s" not in plan.meta and problem.n > 200:
            t0 = cpu_seconds()
            whole = plan_skippipe(problem, seed=0, fallbacks=lambda st, p=problem: methods._fallbacks(p, st, seed=0))
            whole_cpu = cpu_seconds() - t0
            whole_s = simulate(whole, record=False, bound=False).makespan_s
            cells = f"{whole_s:9.2f} {whole_cpu:6.1f}"
            whole_ratio = f"{whole_s / floor:6.3f}"
        elif "whole_makespan_s" in plan.meta:  # 48-200 nodes: both planned, the groups won
            whole_s = float(plan.meta["whole_makespan_s"])
            cells, whole_ratio = f"{whole_s:9.2f} {'-':>6s}", f"{whole_s / floor:6.3f}"
        else:
            cells, whole_ratio = f"{'same':>9s} {'':>6s}", f"{'':>6s}"
        print(f"{i:2d} {kind:22s} {problem.n:4d} {stages:2d} {length:2d} {ours:9.2f} {wall:6.1f} {cpu:6.1f} {cells} {floor:7.2f} "
              f"{ours / floor:6.3f} {whole_ratio}  {candidate}", flush=True)


if __name__ == "__main__":
    main()
