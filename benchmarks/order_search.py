"""Processing-order searches on fixed paths: the random moves against the critical path's.

For suite clusters (``skippipe.cluster_gen.suite``, seed 0) this plans ``skippipe``, keeps its
paths, and searches the processing orders of the component that finishes last from first come,
first served, with the same number of simulations: the random moves of ``RouteSearch`` alone
(an operation a few places earlier or later, from two starts, iterated with kicks; the planner
now runs the critical path's first) and the moves on the critical path alone
(``planner.routing.critical_orders``). Prints the makespan of each and their ratio, from
one run.

    python3 benchmarks/order_search.py [--kind "single site, uneven"] [--largest 40] [--sims 3000]
"""

from __future__ import annotations

import argparse
import math
import time

from skippipe.cluster_gen import suite
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.planner.routing.candidates import stage_orders
from skippipe.planner.routing.critical_orders import critical_orders
from skippipe.planner.routing.evaluate import Evaluator
from skippipe.planner.routing.search import RouteSearch, SearchLimits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", default="", help="suite cluster kinds starting with this (default: every kind)")
    ap.add_argument("--largest", type=int, default=40, help="leave out clusters with more nodes")
    ap.add_argument("--sims", type=int, default=3000, help="simulations of each search")
    args = ap.parse_args()
    print(f"{'kind':28s} {'N':>4s} {'ops':>5s} {'fcfs':>8s} {'random':>8s} {'critical':>8s} {'ratio':>6s} "
          f"{'rnd s':>6s} {'crit s':>6s}")
    for case in suite(0, args.largest):
        if not case.kind.startswith(args.kind):
            continue
        problem = build_problem(case.cluster, case.workload())
        plan = make_plan("skippipe", problem, seed=0)
        routes = [(m.data_node, tuple(m.path)) for m in plan.microbatches]
        ev = Evaluator(problem, plan.stages)
        fcfs = ev.score(routes)
        comp = next(ids for ids in ev.components(routes) if any(routes[i][0] == fcfs.latest[0] for i in ids))
        if not math.isfinite(fcfs.makespan):
            print(f"{case.kind:28s} {problem.n:4d}: its paths deadlock first come, first served (no start)")
            continue
        found = []
        for method in ("random", "critical"):
            search = RouteSearch(ev, plan.stages, problem.load_caps(plan.stages), stage_orders(problem, plan.stages),
                                 0, SearchLimits(budget=args.sims))
            start = time.perf_counter()
            if method == "random":
                _, score = search.improve_orders(routes, comp, {}, critical=False)
            else:
                served = ev.realized_orders(routes, comp)
                _, score = critical_orders(search, routes, comp, served, search.component_score(routes, comp, {}),
                                           args.sims - 1)
            found.append((score.makespan, time.perf_counter() - start))
        (rnd, rnd_s), (crit, crit_s) = found
        ops = sum(2 * len(routes[i][1]) + 3 for i in comp)
        print(f"{case.kind:28s} {problem.n:4d} {ops:5d} {fcfs.makespan:8.2f} {rnd:8.2f} {crit:8.2f} {crit / rnd:6.3f} "
              f"{rnd_s:6.1f} {crit_s:6.1f}", flush=True)


if __name__ == "__main__":
    main()
