"""Small deep clusters with half their links broken: how long ``skippipe`` plans, and what.

Cluster i draws, from seed 7000 + i: 11 to 14 nodes, one site each, half of the links broken
(they only trickle, about 313 s a hop), compute 0.5-2x, 1-3 slots per node, S = 9 stages,
L = 5..8, one or two swaps, 2 to 6 microbatches per data node. Their routing programmes around
the slow links (``routing.slow_links``) have many stage orders (up to 185), so planning time
is the flow programme's. Printed per cluster: the flow programme's arcs and rows on the
planner's first allocation, skippipe's makespan, wall-clock and CPU seconds of planning, and
its candidate.

    python3 benchmarks/scheduler_slow_links.py [--first 0] [--count 12]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from skippipe.cluster_gen import random_global_cluster
from skippipe.errors import UserError
from skippipe.planner.allocation import allocate
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import Problem, build_problem
from skippipe.planner.routing.candidates import stage_orders
from skippipe.planner.routing.pool import cpu_seconds
from skippipe.planner.routing.slow_links import programme_size
from skippipe.workload import Workload, least_max_jump


def case(i: int) -> Problem:
    rng = np.random.default_rng(7000 + i)
    n, length, swaps = int(rng.integers(11, 15)), int(rng.integers(5, 9)), int(rng.integers(1, 3))
    cluster = random_global_cluster(n, seed=7000 + i, speed=(0.5, 2.0), memory=(1, 3), broken=0.5)
    workload = Workload(num_stages=9, path_length=length, microbatches_per_data_node=int(rng.integers(2, 7)),
                        n_layers=27, max_jump=max(4, least_max_jump(9, length)), max_swaps=swaps)
    return build_problem(cluster, workload)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, default=12)
    args = ap.parse_args()
    print(f"{'case':>4} {'N':>3} {'L':>2} {'swaps':>5} {'orders':>6} {'arcs':>5} {'rows':>5} {'skippipe':>9} "
          f"{'wall s':>6} {'cpu s':>6}  candidate")
    for i in range(args.first, args.first + args.count):
        try:
            problem = case(i)
            stages = allocate(problem, seed=0)
            seqs = stage_orders(problem, stages)
            arcs, rows = programme_size(stages, seqs)
            start, cpu = time.perf_counter(), cpu_seconds()
            plan = make_plan("skippipe", problem, seed=0)
        except UserError as err:
            print(f"{i:>4} refused: {err}")
            continue
        w = problem.workload
        print(f"{i:>4} {problem.n:>3} {w.path_length:>2} {w.max_swaps:>5} {len(seqs):>6} {arcs:>5} {rows:>5} "
              f"{plan.predicted_makespan_s:>9.2f} {time.perf_counter() - start:>6.1f} {cpu_seconds() - cpu:>6.1f}  "
              f"{plan.meta.get('candidate')}", flush=True)


if __name__ == "__main__":
    main()
