"""Generated clusters beyond the suite: does every method plan, obey the rules, and is
``skippipe`` never worse than the others?

Case i draws, from seed 5000 + i: S = 2..9 stages, L = 2..S, a ``max_jump`` from the least
that reaches the last stage (``workload.least_max_jump``) to 5, 8 to 120 nodes (every fourth
case) or 8 to 44, one site per node / 2-7 sites / a single site in turn, memory 1 or 1..4, even
or 0.5-2x compute, 0 / 20 / 50 % of the links between sites broken (they only trickle), 1-8
microbatches per data node and 0-2 swaps. Each method plans with its defaults; the plan is
validated and simulated. Printed per case: the makespans, skippipe's planning CPU seconds, the
floor over every allocation and skippipe's ratio to it; "refused" is a one-line ``UserError``
and WORSE marks a case where skippipe is slower than another method's plan.

    python3 benchmarks/scheduler_sweep.py [--first 0] [--count 36]
"""

from __future__ import annotations

import argparse

import numpy as np

from skippipe.cluster import Cluster
from skippipe.cluster_gen import random_global_cluster, single_site_cluster
from skippipe.errors import UserError
from skippipe.planfile import plan_violations
from skippipe.planner.floors import free_allocation_floor
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import Problem, build_problem
from skippipe.planner.routing.pool import cpu_seconds
from skippipe.sim import simulate
from skippipe.workload import Workload, least_max_jump

METHODS = ("skippipe", "skippipe-no-tc2", "random", "naive")


def case(i: int) -> tuple[str, Cluster, Workload]:
    rng = np.random.default_rng(5000 + i)
    S = int(rng.integers(2, 10))
    L = int(rng.integers(2, S + 1))
    J = int(rng.integers(least_max_jump(S, L), max(least_max_jump(S, L), 5) + 1))
    n = int(rng.integers(max(S + 1, 8), 121 if i % 4 == 0 else 45))
    kind = ("one site per node", "sites", "single site")[i % 3]
    memory = (1, 1) if rng.random() < 0.25 else (1, int(rng.integers(1, 5)))
    speed = (0.5, 2.0) if rng.random() < 0.7 else None
    if kind == "single site":
        cluster = single_site_cluster(n, seed=i, speed=speed, memory=memory)
    else:
        sites = int(rng.integers(2, 8)) if kind == "sites" else None
        cluster = random_global_cluster(n, seed=i, sites=sites, speed=speed, memory=memory,
                                        broken=float(rng.choice([0.0, 0.2, 0.5])))
    workload = Workload(num_stages=S, path_length=L, microbatches_per_data_node=int(rng.integers(1, 9)), n_layers=3 * S,
                        max_jump=J, max_swaps=int(rng.integers(0, 3)))
    return kind, cluster, workload


def run(problem: Problem, method: str) -> tuple[float, float, bool] | str:
    """(simulated makespan, planning CPU seconds, valid) or the refusal's first words."""
    t0 = cpu_seconds()
    try:
        plan = make_plan(method, problem, seed=0)
    except UserError as exc:
        return "refused: " + str(exc)[:60]
    cpu = cpu_seconds() - t0
    return simulate(plan, record=False, bound=False).makespan_s, cpu, not plan_violations(plan)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, default=36)
    args = ap.parse_args()
    print(f"{'case':>4s} {'kind':18s} {'N':>4s} {'S':>2s} {'L':>2s} {'J':>2s} {'m':>2s} {'mem':>5s} "
          + " ".join(f"{m:>16s}" for m in METHODS) + f" {'cpu':>5s} {'floor':>8s} {'ratio':>7s}")
    worse = refused = 0
    for i in range(args.first, args.first + args.count):
        kind, cluster, workload = case(i)
        problem = build_problem(cluster, workload)
        made = {m: run(problem, m) for m in METHODS}
        ours = made["skippipe"]
        floor = free_allocation_floor(problem).value
        cells = [f"{r[0]:16.2f}" if not isinstance(r, str) else f"{'refused':>16s}" for r in made.values()]
        if isinstance(ours, str):
            refused += 1
            tail = f"{'-':>5s} {floor:8.2f} {'-':>7s}  {ours}"
        else:
            assert ours[2], f"case {i}: skippipe's plan breaks a rule"
            slower = [m for m, r in made.items() if not isinstance(r, str) and r[0] < ours[0] - 1e-6]
            worse += bool(slower)
            tail = f"{ours[1]:5.1f} {floor:8.2f} {ours[0] / floor:7.3f}" + (f"  WORSE than {slower}" if slower else "")
        mem = f"{int(problem.memory.min())}-{int(problem.memory.max())}"
        print(f"{i:4d} {kind:18s} {problem.n:4d} {workload.num_stages:2d} {workload.path_length:2d} {workload.max_jump:2d} "
              f"{workload.microbatches_per_data_node:2d} {mem:>5s} " + " ".join(cells) + " " + tail, flush=True)
    print(f"{args.count} cases: skippipe refused {refused}, slower than another method on {worse}")


if __name__ == "__main__":
    main()
