"""Generated clusters of 400-1,000 nodes in 15-60 sites with uneven compute: ``skippipe`` (groups
of sites where their estimated planning fits the time target) against one search over the
whole cluster with the same safety net.

Each cluster is drawn from its number alone (nodes, sites, compute spread 0.5-2 x or 0.2-3 x,
memory 1-4, 1-2 or even, 0-10 % broken links, S = 5..9, L = 3..S-1), so the table is the same
on every machine but for the seconds. Printed per cluster: both makespans and their ratio,
the planning wall-clock and CPU seconds of each (the planning workers' included) and the
planning-time target.

    python3 benchmarks/scheduler_large_sites.py [--first 0] [--count 10]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from skippipe.cluster_gen import random_global_cluster
from skippipe.planfile import Plan, plan_violations
from skippipe.planner import methods
from skippipe.planner.problem import Problem, build_problem
from skippipe.planner.routing.budget import planning_target_s
from skippipe.planner.routing.pool import cpu_seconds
from skippipe.planner.routing.schedule import plan_skippipe
from skippipe.sim import simulate
from skippipe.workload import Workload


def drawn(number: int) -> tuple[Problem, str]:
    """The cluster and workload of ``number``, and a line that says what they are."""
    r = random.Random(number)
    n, sites = r.randint(400, 1000), r.randint(15, 60)
    speed, memory = r.choice([(0.5, 2.0), (0.2, 3.0)]), r.choice([None, (1, 4), (1, 2)])
    cluster = random_global_cluster(n, number, sites=sites, speed=speed, memory=memory, broken=r.choice([0.0, 0.05, 0.1]))
    stages = r.randint(5, 9)
    length = r.randint(3, stages - 1)
    mem = "even" if memory is None else f"{memory[0]}-{memory[1]}"
    return (build_problem(cluster, Workload(num_stages=stages, path_length=length)),
            f"{n:5d} {sites:5d} {speed[0]}-{speed[1]:<4} {mem:>5s} {stages:2d} {length:2d}")


def timed(make: Callable[[], Plan]) -> tuple[Plan, float, float]:
    """A plan, and the wall-clock and CPU seconds it took."""
    cpu, wall = cpu_seconds(), time.perf_counter()
    plan = make()
    return plan, time.perf_counter() - wall, cpu_seconds() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--first", type=int, default=0, help="the first cluster's number")
    ap.add_argument("--count", type=int, default=10, help="clusters planned")
    args = ap.parse_args()
    print(f"{'#':>3s} {'N':>5s} {'sites':>5s} {'speed':8s} {'mem':>5s} {'S':>2s} {'L':>2s} {'skippipe':>9s} {'wall s':>6s} "
          f"{'cpu s':>6s} {'whole':>9s} {'wall s':>6s} {'cpu s':>6s} {'target':>6s} {'ratio':>6s}  candidate")
    for number in range(args.first, args.first + args.count):
        problem, line = drawn(number)
        plan, wall, cpu = timed(lambda p=problem: methods.make_plan("skippipe", p, seed=0))
        assert not plan_violations(plan), f"cluster {number}: skippipe's plan breaks a rule"
        whole, whole_wall, whole_cpu = timed(lambda p=problem: plan_skippipe(
            p, seed=0, fallbacks=lambda st: methods._fallbacks(p, st, seed=0)))
        ours, theirs = (simulate(x, record=False, bound=False).makespan_s for x in (plan, whole))
        print(f"{number:3d} {line} {ours:9.2f} {wall:6.1f} {cpu:6.1f} {theirs:9.2f} {whole_wall:6.1f} {whole_cpu:6.1f} "
              f"{planning_target_s(problem.n):6.1f} {ours / theirs:6.3f}  {plan.meta.get('candidate')}", flush=True)


if __name__ == "__main__":
    main()
