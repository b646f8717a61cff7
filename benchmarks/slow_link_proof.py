"""Does any allocation let a sweep case route over fast links alone? A proof by enumeration.

For a case of ``scheduler_sweep`` with few nodes, every allocation of the nodes to the stage
sizes is tried (stage 0 as a set, the other stages in order): the linear relaxation of the
routing under the TC1 caps with slow links forbidden (``slow_links.min_cost_routing`` with
``fast_only``). When it is infeasible for every allocation, every plan sends some microbatch
over a slow link, once each way (activation and gradient), so no plan is faster than the
cheapest slow link both ways: a floor the set-free floors cannot see.

Beyond ``MAX_ALLOCATIONS`` allocations (or with ``--by-data-nodes``) each set of data nodes is
tried instead: one mixed-integer programme (HiGHS) chooses the stages of the other nodes (0/1)
and routes the microbatches over fast links alone (fractional flows along the graph of the
stage orders, ``order_graph``) under that set's TC1 caps. Infeasible for every set, it is the
same proof; feasible, the integer routing on its allocation is checked and printed.

    python3 benchmarks/slow_link_proof.py --case 30
    python3 benchmarks/slow_link_proof.py --case 4002 --by-data-nodes
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
from scheduler_sweep import case

from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.planner.routing.candidates import stage_orders
from skippipe.planner.routing.every_allocation import allocation_count, allocations
from skippipe.planner.routing.fast_allocation import fast_stages
from skippipe.planner.routing.slow_links import min_cost_routing, slow_link_cutoff, slow_link_mask

MAX_ALLOCATIONS = 200_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", type=int, default=30)
    ap.add_argument("--by-data-nodes", action="store_true", help="one programme per data-node set")
    args = ap.parse_args()
    kind, cluster, workload = case(args.case)
    problem = build_problem(cluster, workload)
    sizes = list(problem.stage_sizes)
    n = problem.n
    cutoff, slow = slow_link_cutoff(problem.transfer_s), slow_link_mask(problem.transfer_s)
    if cutoff is None or slow is None:
        raise SystemExit(f"case {args.case}: no slow links")
    count = allocation_count(sizes)
    seqs = stage_orders(problem, [[]] * len(sizes))
    print(f"case {args.case} ({kind}, N={n}, S={len(sizes)}, L={workload.path_length}, sizes {sizes}): "
          f"{count} allocations, slow links above {cutoff:.2f} s")
    t0 = time.process_time()
    tried = 0
    if args.by_data_nodes or count > MAX_ALLOCATIONS:
        for data in itertools.combinations(range(n), sizes[0]):
            tried += 1
            found = fast_stages(problem, data, seqs, ~slow)
            if not found.infeasible and found.stages is None:
                raise SystemExit(f"data nodes {data}: the programme hit its node limit; no proof")
            stages = found.stages
            if stages is not None:
                routing = min_cost_routing(problem, stages, seqs, slow, integral=True, fast_only=True)
                print(f"allocation {stages} routes over fast links alone ({tried} data-node sets tried, "
                      f"{time.process_time() - t0:.1f} s CPU; integer routing: {routing is not None})")
                return
        what = f"{tried} data-node sets"
    else:
        for stages in allocations(sizes, n):
            tried += 1
            if min_cost_routing(problem, stages, seqs, slow, integral=False, fast_only=True) is not None:
                print(f"allocation {stages} routes over fast links alone ({tried} tried)")
                return
        what = f"{tried} allocations"
    t = np.asarray(problem.transfer_s, dtype=float)
    floor = float((t + t.T)[slow].min())
    plan = make_plan("skippipe", problem, seed=0)
    print(f"no allocation of the {what} routes over fast links alone ({time.process_time() - t0:.1f} s CPU): "
          f"every plan crosses a slow link both ways, makespan >= {floor:.2f} s; "
          f"skippipe {plan.predicted_makespan_s:.2f} s = {plan.predicted_makespan_s / floor:.3f} x that")


if __name__ == "__main__":
    main()
