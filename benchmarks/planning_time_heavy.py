"""Planning time of ``skippipe`` on heavy workloads at 32-40 nodes: the 10 s target's hardest corner.

The suite's rows run 6 microbatches per data node; the planning-time target (10 s up to 40
nodes, default deterministic budget, no ``--time-limit``) also holds for the user whose
iteration is long. Each case is drawn from its number: 32-40 nodes, random places on the globe
(one site per node, 2 or 5 sites; some with 30 % of the links between sites broken), compute
0.5-2x or 0.05-3x, memory 3 or 1-4 or 1 slot per node, S = 6..9, L = 4..S, 17 microbatches per
data node, ``max_swaps`` 0-2, the jump rule at least what L and S need. ``skippipe`` plans each
with its defaults; printed first, the machine's speed (``reference_s``: seconds of a fixed
piece of pure Python), then per case: the draw, wall-clock and CPU seconds (this process and its
planning workers), the makespan and the candidate kept; then how many took longer than
``--target`` seconds of wall clock. Nothing else should run on the machine meanwhile.

    python3 benchmarks/planning_time_heavy.py [--first 0] [--count 30] [--microbatches 17] [--target 10]
"""

from __future__ import annotations

import argparse
import heapq
import random
import time

from skippipe.cluster_gen import random_global_cluster
from skippipe.errors import UserError
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import Problem, build_problem
from skippipe.planner.routing.pool import cpu_seconds
from skippipe.workload import Workload, least_max_jump


def heavy_case(k: int, microbatches: int = 17) -> tuple[str, Problem]:
    """Case ``k``: a description and its problem (see the module text)."""
    rng = random.Random(k)
    n, S = rng.randint(32, 40), rng.randint(6, 9)
    L = rng.randint(4, S)
    sites = rng.choice([None, 2, 5])
    speed = rng.choice([(0.5, 2.0), (0.05, 3.0)])
    memory = rng.choice([None, (1, 4), (1, 1)])
    broken = rng.choice([0.0, 0.3])
    swaps = rng.choice([0, 1, 2])
    cluster = random_global_cluster(n, seed=k, sites=sites, speed=speed, memory=memory, broken=broken)
    workload = Workload(num_stages=S, path_length=L, microbatches_per_data_node=microbatches, memory=3,
                        max_swaps=swaps, max_jump=max(2, least_max_jump(S, L)))
    text = (f"N={n} S={S} L={L} m={microbatches} sites={sites or n} speed={speed} "
            f"slots={memory or 3} broken={broken} swaps={swaps}")
    return text, build_problem(cluster, workload)


REFERENCE_ITEMS = 300_000


def reference_s(runs: int = 3) -> float:
    """The least of ``runs`` timings of a fixed piece of pure Python, the simulator's kind of
    work (``REFERENCE_ITEMS`` heap pushes and pops), which no change to the project moves: how
    fast the machine is today, since the same planning code's wall clock moved by up to 40 %
    from one day to the next."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        rng, heap = random.Random(0), []
        for i in range(REFERENCE_ITEMS):
            heapq.heappush(heap, (rng.random(), i))
        while heap:
            heapq.heappop(heap)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, default=30)
    ap.add_argument("--microbatches", type=int, default=17, help="per data node")
    ap.add_argument("--target", type=float, default=10.0, help="planning-time target in seconds of wall clock")
    args = ap.parse_args(argv)
    print(f"reference: {reference_s():.3f} s for {REFERENCE_ITEMS:,} heap pushes and pops (the machine's speed: "
          "compare runs of different days by it)", flush=True)
    walls: list[float] = []
    for k in range(args.first, args.first + args.count):
        text, problem = heavy_case(k, args.microbatches)
        start, cpu = time.perf_counter(), cpu_seconds()
        try:
            plan = make_plan("skippipe", problem, seed=0)
            result = f"{float(plan.predicted_makespan_s):.2f} s ({plan.meta.get('candidate')})"
        except UserError as err:
            result = f"refused ({err})"
        wall = time.perf_counter() - start
        walls.append(wall)
        print(f"case {k:3d} [{text}] planned in {wall:5.2f} s wall, {cpu_seconds() - cpu:5.2f} s CPU: {result}",
              flush=True)
    over = [w for w in walls if w > args.target]
    print(f"{len(over)} of {len(walls)} cases above {args.target:g} s of wall clock"
          + (f" ({', '.join(f'{w:.2f}' for w in sorted(over))} s)" if over else "")
          + f"; the most {max(walls, default=0.0):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
