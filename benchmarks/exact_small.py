"""The true optimum of small clusters, over every allocation: how far are ``skippipe`` and the floor
from it? (needs ``pip install ortools``)

The suite's 1.10 target is measured against ``free_allocation_floor``, a floor. Where a row
misses it, is the plan slow or the floor low? On clusters small enough, this answers it: every
allocation of the stage sizes is given to the CP-SAT model of ``scheduler_exact.py`` (paths,
processing orders, activation slots, TC1 caps, the path rules; workloads without swaps, which the
model leaves out) twice over:

- durations rounded **down** to 10 ms: the model's optimum is at most the real one, so its
  proven bound, least over the allocations, is a lower bound on every plan (``optimum >=``);
- its schedules, as plans (paths and processing orders), simulated by ``skippipe.sim``: the best
  is a real plan (``optimum <=``).

Allocations are taken least floor first (``allocation_data_node_floor``) and skipped once that
floor reaches the best plan found. An allocation whose model is not solved to optimality within
``--seconds`` gives its proven bound only, and the row says so (``exact`` no).

Printed per cluster: kind, N, S, L, m, the floor over every allocation, ``skippipe``'s plan, the
optimum's bounds (one figure where they meet), optimum / floor at least and ``skippipe`` /
optimum at most (both against the optimum's proven lower bound).

    python3 benchmarks/exact_small.py [--first 0] [--count 8] [--seconds 20] [--nodes 6 7] [--microbatches 2 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scheduler_exact import TICKS_PER_S, ExactModel, cp_model
from tqdm import tqdm

from skippipe.cluster import Cluster
from skippipe.cluster_gen import random_global_cluster, single_site_cluster
from skippipe.fileio import atomic_write_text
from skippipe.planfile import Microbatch, plan_violations
from skippipe.planner.floors import allocation_data_node_floor, free_allocation_floor
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import Problem, build_problem
from skippipe.planner.routing.every_allocation import allocations
from skippipe.sim import simulate
from skippipe.workload import Workload

UNEVEN = {"speed": (0.5, 2.0), "memory": (1, 4)}


@dataclass
class SmallCase:
    kind: str
    cluster: Cluster
    workload: Workload


def small_cases(
    first: int, count: int, nodes: tuple[int, int] = (6, 7), microbatches: tuple[int, int] = (2, 3)
) -> list[SmallCase]:
    """Small clusters of the suite's kinds: one site or random sites on the globe (some links
    broken), compute 0.5-2x and memory 1-4, or memory alone; ``nodes`` nodes (drawn from
    the range), S = 4, L = 3, ``microbatches`` per data node (drawn), no swaps. Deterministic
    for each case number."""
    cases = []
    for k in range(first, first + count):
        rng = np.random.default_rng(1000 + k)
        n = int(rng.integers(nodes[0], nodes[1] + 1))
        m = int(rng.integers(microbatches[0], microbatches[1] + 1))
        kind = ("single site, uneven", "global uneven", "global uneven, broken links", "single site, memory 1-4")[k % 4]
        if kind == "single site, uneven":
            cluster = single_site_cluster(n, k, **UNEVEN)
        elif kind == "global uneven":
            cluster = random_global_cluster(n, k, **UNEVEN)
        elif kind == "global uneven, broken links":
            cluster = random_global_cluster(n, k, broken=0.15, **UNEVEN)
        else:
            cluster = single_site_cluster(n, k, memory=UNEVEN["memory"])
        workload = Workload(num_stages=4, path_length=3, microbatches_per_data_node=m, max_swaps=0)
        cases.append(SmallCase(kind, cluster, workload))
    return cases


def serial_horizon_s(problem: Problem) -> float:
    """A makespan every allocation reaches: the microbatches one at a time, each through the
    slowest nodes and links (so the model's horizon cuts off no optimum)."""
    w, cm = problem.workload, problem.cost_model
    f = np.asarray(problem.forward_s, dtype=float)
    per_op = f.max() * (1 + cm.backward_factor + cm.loss_factor) + 3 * max(cm.op_gap_s, cm.inject_gap_s)
    trip = (w.path_length + 1) * per_op + 2 * (w.path_length + 1) * float(np.max(problem.transfer_s))
    return trip * len(problem.stage_sizes) * w.microbatches_per_data_node * problem.stage_sizes[0] + 1.0


def solve(problem: Problem, stages: list[list[int]], seconds: float, horizon_s: float,
          round_down: bool) -> tuple[float, float, bool]:
    """(the model's proven bound in seconds, the simulated makespan of its best schedule as a
    plan (inf: none), whether it proved its optimum) on one allocation (inf, inf, True where it
    has no plan at all)."""
    w = problem.workload
    mbs = [Microbatch(id=i * w.microbatches_per_data_node + j, data_node=d, path=[])
           for i, d in enumerate(stages[0]) for j in range(w.microbatches_per_data_node)]
    skeleton = problem.make_plan(stages, mbs, "skeleton", 0)
    exact = ExactModel(problem, skeleton, horizon_s=horizon_s, round_down=round_down)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 1
    status = solver.Solve(exact.model)
    if status == cp_model.INFEASIBLE:  # e.g. the TC1 caps leave the slow stages too many visits
        return math.inf, math.inf, True
    bound = solver.BestObjectiveBound() / TICKS_PER_S
    if status != cp_model.OPTIMAL and status != cp_model.FEASIBLE:
        return bound, math.inf, False
    plan = exact.to_plan(solver)
    res = simulate(plan, record=False, bound=False)
    if plan_violations(plan) or not res.finished:
        raise SystemExit(f"exact_small: the model's schedule on {stages} is not a valid plan: {plan_violations(plan)}")
    return bound, float(res.makespan_s), status == cp_model.OPTIMAL


def run_case(case: SmallCase, seconds: float) -> dict:
    problem = build_problem(case.cluster, case.workload)
    floor = free_allocation_floor(problem).value
    start = time.perf_counter()
    ours = float(make_plan("skippipe", problem, seed=0).predicted_makespan_s)
    plan_s = time.perf_counter() - start
    horizon = serial_horizon_s(problem)
    allocs = sorted(((allocation_data_node_floor(problem, st), st) for st in allocations(list(problem.stage_sizes), problem.n)),
                    key=lambda item: item[0])  # each allocation's data-node floor, least first
    best_plan, least_bound, exact, solved = ours, math.inf, True, 0
    for cheap, stages in allocs:
        if cheap >= best_plan:
            least_bound = min(least_bound, cheap)
            continue
        bound, _, proved = solve(problem, stages, seconds, horizon, round_down=True)
        least_bound = min(least_bound, max(bound, cheap))
        exact = exact and proved
        if bound < best_plan:
            _, made, _ = solve(problem, stages, seconds, horizon, round_down=False)
            best_plan = min(best_plan, made)
        solved += 1
    least_bound = min(least_bound, best_plan)
    return {"kind": case.kind, "N": problem.n, "S": problem.workload.num_stages, "L": problem.workload.path_length,
            "m": problem.workload.microbatches_per_data_node, "sizes": list(problem.stage_sizes),
            "floor": round(floor, 3), "skippipe": round(ours, 3), "skippipe_plan_s": round(plan_s, 2),
            "optimum_at_least": round(least_bound, 3), "optimum_at_most": round(best_plan, 3), "exact": exact,
            "allocations": len(allocs), "solved": solved,
            "optimum_over_floor_at_least": round(least_bound / floor, 3),
            "skippipe_over_optimum_at_most": round(ours / least_bound, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0, help="CP-SAT limit per allocation (1 worker)")
    ap.add_argument("--nodes", type=int, nargs=2, default=(6, 7), metavar=("LEAST", "MOST"))
    ap.add_argument("--microbatches", type=int, nargs=2, default=(2, 3), metavar=("LEAST", "MOST"), help="per data node")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = []
    head = (f"{'case':>4s} {'cluster':28s} {'N':>2s} {'m':>2s} {'floor':>7s} {'skippipe':>8s} {'optimum':>15s} "
            f"{'opt/floor>=':>11s} {'skip/opt<=':>10s} exact")
    lines = []
    cases = small_cases(args.first, args.count, tuple(args.nodes), tuple(args.microbatches))
    for k, case in zip(range(args.first, args.first + args.count), tqdm(cases, desc="clusters")):
        row = run_case(case, args.seconds)
        row["case"] = k
        rows.append(row)
        lo, hi = row["optimum_at_least"], row["optimum_at_most"]
        span = f"{lo:.2f}" if hi - lo < 0.005 else f"{lo:.2f}-{hi:.2f}"
        lines.append(f"{k:4d} {row['kind']:28s} {row['N']:2d} {row['m']:2d} {row['floor']:7.2f} {row['skippipe']:8.2f} "
                     f"{span:>15s} {row['optimum_over_floor_at_least']:11.3f} {row['skippipe_over_optimum_at_most']:10.3f} "
                     f"{'yes' if row['exact'] else 'no'}")
        tqdm.write(lines[-1])
    print(head)
    print("\n".join(lines))
    out_of_reach = [r for r in rows if r["optimum_over_floor_at_least"] > 1.10]
    within = [r for r in rows if r["skippipe_over_optimum_at_most"] <= 1.10]
    print(f"the optimum above 1.10 x the floor (no plan within the target): {len(out_of_reach)} of {len(rows)}; "
          f"skippipe within 1.10 x the optimum: {len(within)} of {len(rows)}; "
          f"skippipe / optimum at most: median {np.median([r['skippipe_over_optimum_at_most'] for r in rows]):.3f}, "
          f"largest {max(r['skippipe_over_optimum_at_most'] for r in rows):.3f}")
    if args.json:
        atomic_write_text(args.json, json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
