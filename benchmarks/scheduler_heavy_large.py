"""Heavy workloads on 800-1,000 nodes: long paths (L = S-2..S) and 6-8 microbatches per data
node, where one iteration has the most operations and the joint allocation's groups have the
longest chains. Checks the planning-time target (60 s at 1,000 nodes) beside the plan.

Each cluster is drawn from its number alone (one site, sites or one site per node; compute
0.5-2 x or even; memory 1-4, 1-2, 1 or even; S = 4..9, max_jump 4), so the table is the same on
every machine but for the seconds. Printed per cluster: ``skippipe``'s makespan, the naive plan's,
the floor over every allocation and the ratio, the planning wall-clock and CPU seconds (the
planning workers' included) against the target, and the candidate that won.

    python3 benchmarks/scheduler_heavy_large.py [--first 0] [--count 10] [--light]
"""

from __future__ import annotations

import argparse
import math
import random
import time

from skippipe.cluster_gen import random_global_cluster, single_site_cluster
from skippipe.errors import UserError
from skippipe.planfile import plan_violations
from skippipe.planner import methods
from skippipe.planner.floors import free_allocation_floor
from skippipe.planner.problem import Problem, build_problem
from skippipe.planner.routing.budget import planning_target_s
from skippipe.planner.routing.pool import cpu_seconds
from skippipe.sim import simulate
from skippipe.workload import Workload


def drawn(number: int, light: bool = False) -> tuple[Problem, str]:
    """The cluster and workload of ``number``, and a line that says what they are; ``light``:
    120-1,000 nodes, any L and 1-8 microbatches instead (another draw)."""
    r = random.Random((9000 if light else 19000) + number)
    n = r.randint(120, 1000) if light else r.randint(800, 1000)
    kind = r.choice(["single site", "sites", "one per node"])
    speed = r.choice([(0.5, 2.0), (0.5, 2.0), None])
    memory = r.choice([None, (1, 4), (1, 2), (1, 1)])
    stages = r.randint(4, 9)
    least = math.ceil((stages - 1) / 4) + 1  # the shortest path that reaches the last stage with max_jump 4
    length = r.randint(least if light else max(least, stages - 2), stages)
    m = r.randint(1, 8) if light else r.randint(6, 8)
    if kind == "single site":
        cluster = single_site_cluster(n, seed=number, speed=speed, memory=memory)
    else:
        cluster = random_global_cluster(n, number, sites=r.randint(2, 60) if kind == "sites" else None, speed=speed,
                                        memory=memory, broken=r.choice([0.0, 0.05, 0.2]))
    workload = Workload(num_stages=stages, path_length=length, microbatches_per_data_node=m, n_layers=3 * stages,
                        max_jump=4)
    spread = "even" if speed is None else f"{speed[0]}-{speed[1]}"
    mem = "even" if memory is None else f"{memory[0]}-{memory[1]}"
    return build_problem(cluster, workload), f"{kind:12s} {n:5d} {spread:>7s} {mem:>5s} {stages:2d} {length:2d} {m:2d}"


def naive_makespan(problem: Problem) -> float:
    try:
        return simulate(methods.make_plan("naive", problem, seed=0), record=False, bound=False).makespan_s
    except UserError:
        return math.nan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--first", type=int, default=0, help="the first cluster's number")
    ap.add_argument("--count", type=int, default=10, help="clusters planned")
    ap.add_argument("--light", action="store_true", help="the lighter draw: 120-1,000 nodes, any L, 1-8 microbatches")
    args = ap.parse_args()
    print(f"{'#':>3s} {'kind':12s} {'N':>5s} {'speed':>7s} {'mem':>5s} {'S':>2s} {'L':>2s} {'m':>2s} {'skippipe':>9s} "
          f"{'naive':>9s} {'floor':>8s} {'ratio':>6s} {'wall s':>6s} {'cpu s':>6s} {'target':>6s}  candidate")
    late = 0
    for number in range(args.first, args.first + args.count):
        problem, line = drawn(number, args.light)
        cpu, wall = cpu_seconds(), time.perf_counter()
        plan = methods.make_plan("skippipe", problem, seed=0)
        wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
        assert not plan_violations(plan), f"cluster {number}: skippipe's plan breaks a rule"
        ours = simulate(plan, record=False, bound=False).makespan_s
        floor = free_allocation_floor(problem).value
        target = planning_target_s(problem.n)
        late += wall > target
        print(f"{number:3d} {line} {ours:9.2f} {naive_makespan(problem):9.2f} {floor:8.2f} {ours / floor:6.3f} "
              f"{wall:6.1f} {cpu:6.1f} {target:6.1f}  {plan.meta.get('candidate')}", flush=True)
    print(f"{args.count} clusters: planned past the target on {late}")


if __name__ == "__main__":
    main()
