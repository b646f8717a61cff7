"""Scheduler target 1: the SkipPipe reference instances, our plans beside the reference's.

For each reference instance with the reference allocation kept (``shipped``, ``current``) and for
the current-code network with our own allocation, plan with ``skippipe-no-tc2`` and ``skippipe``
and simulate them in one simulator beside the replayed reference plans. Printed per row: the
makespan, whether every microbatch finished and TC1 holds, the planning time, and the ratios
to the memory floor of the allocation (``skippipe.bounds``), to the sharper data-node floor
(``skippipe.planner.floors``: no plan on that allocation can beat it) and to the
reference's SkipPipe. For our own allocation it also prints the load-aware floor over every
allocation (``planner.floors.free_allocation_floor``). Every number is measured in this run.

    python3 benchmarks/scheduler_reference.py [--seed 0] [--time-limit S] [--write-plans DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from skippipe.bounds import DataNodeLoad, memory_floor
from skippipe.cluster import load_cluster
from skippipe.planfile import Plan, plan_violations, save_plan
from skippipe.planner.floors import allocation_data_node_floor, free_allocation_floor
from skippipe.planner.problem import Problem, build_problem
from skippipe.planner.routing.schedule import plan_no_tc2, plan_skippipe
from skippipe.reference import reference_figure, reference_plan, reference_problem, reference_stages
from skippipe.sim import simulate

TARGETS = {  # (instance, allocation) -> (what the ratio is taken against, the target)
    ("shipped", "reference"): ("floor", 1.03),
    ("current", "reference"): ("floor", 1.10),
    ("current", "own"): ("ref", 0.70),
}


def floor_of(problem: Problem, stages: list[list[int]]) -> float:
    return memory_floor(DataNodeLoad.of(stages, problem.costs(), [int(x) for x in problem.memory], problem.workload))


def own_problem(instance: str) -> Problem:
    """The instance's network and workload with no allocation fixed (ours to choose)."""
    ref = reference_problem(instance)
    return build_problem(load_cluster(f"gcp20-{instance}-free"), ref.workload)


def row(label: str, plan: Plan, problem: Problem, planning_s: float | None, ref_s: float) -> dict:
    res = simulate(plan, record=False)
    floor = floor_of(problem, plan.stages)
    dn_floor = allocation_data_node_floor(problem, plan.stages)
    ok = res.finished and not plan_violations(plan)
    return {
        "label": label, "makespan": res.makespan_s, "ok": ok, "time": planning_s, "floor": floor,
        "dn_floor": dn_floor, "ref": ref_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=None, help="seconds per skippipe plan (default: its budget)")
    ap.add_argument("--write-plans", type=Path, default=None, help="save our plans as JSON files here")
    args = ap.parse_args(argv)

    head = (f"{'instance':<8} {'allocation':<10} {'method':<22} {'makespan s':>10} {'valid':>5} {'plan s':>7} "
            f"{'floor s':>8} {'/floor':>7} {'dn-floor s':>10} {'/dn-floor':>9} {'/ref SkipPipe':>13}")
    print(head)
    print("-" * len(head))
    summary = []
    for instance, alloc in (("shipped", "reference"), ("current", "reference"), ("current", "own")):
        problem = reference_problem(instance) if alloc == "reference" else own_problem(instance)
        ref_s = float(reference_figure(instance, "ca"))
        rows = []
        if alloc == "reference":
            for method in ("nonca", "ca"):
                rplan = reference_plan(instance, method)
                rows.append(row(f"reference {method} (replay)", rplan, reference_problem(instance), None, ref_s))
        t = time.perf_counter()
        base = plan_no_tc2(problem, seed=args.seed)
        rows.append(row("skippipe-no-tc2", base, problem, time.perf_counter() - t, ref_s))
        t = time.perf_counter()
        ours = plan_skippipe(problem, seed=args.seed, time_limit_s=args.time_limit)
        rows.append(row("skippipe", ours, problem, time.perf_counter() - t, ref_s))
        if args.write_plans:
            args.write_plans.mkdir(parents=True, exist_ok=True)
            save_plan(base, args.write_plans / f"{instance}-{alloc}-no-tc2.json")
            save_plan(ours, args.write_plans / f"{instance}-{alloc}-skippipe.json")
        for r in rows:
            plan_s = "-" if r["time"] is None else f"{r['time']:.2f}"
            print(f"{instance:<8} {alloc:<10} {r['label']:<22} {r['makespan']:>10.2f} {('yes' if r['ok'] else 'NO'):>5} "
                  f"{plan_s:>7} {r['floor']:>8.2f} {r['makespan'] / r['floor']:>7.3f} {r['dn_floor']:>10.2f} "
                  f"{r['makespan'] / r['dn_floor']:>9.3f} {r['makespan'] / r['ref']:>13.3f}")
        kind, target = TARGETS[(instance, alloc)]
        got = rows[-1]
        value = got["makespan"] / (got["floor"] if kind == "floor" else got["ref"])
        against = "the memory floor of the allocation" if kind == "floor" else f"reference SkipPipe {ref_s:.2f} s"
        # the best any plan can do: the data-node floor of the allocation, or over every allocation
        if alloc == "own":
            t = time.perf_counter()
            free = free_allocation_floor(problem)
            best_possible = free.value
            print(f"load-aware floor over every allocation: {free.value:.2f} s (data nodes {list(free.data_nodes)}, "
                  f"{'every data-node set tried' if free.exhaustive else 'set-free'}, {time.perf_counter() - t:.2f} s)")
        else:
            best_possible = got["dn_floor"]
        limit = target * (got["floor"] if kind == "floor" else got["ref"])
        status = "met" if value <= target + 1e-12 else (
            f"NOT met, proven infeasible: no plan beats {best_possible:.2f} s > {limit:.2f} s"
            if best_possible > limit + 1e-9 else "NOT met")
        summary.append(
            f"{instance} instance, {alloc} allocation: skippipe {got['makespan']:.2f} s = {value:.3f} x {against} "
            f"(target <= {target:.2f}: {status}); "
            f"{got['makespan'] / got['dn_floor']:.3f} x the data-node floor {got['dn_floor']:.2f} s; "
            + (f"{got['makespan'] / best_possible:.3f} x the floor over every allocation; " if alloc == "own" else "")
            + f"{got['makespan'] / ref_s:.3f} x reference SkipPipe"
        )
        print()
    for line in summary:
        print(line)
    print("(reference SkipPipe figures from the reference's simulator: shipped "
          f"{reference_figure('shipped', 'ca'):.2f} s, current {reference_figure('current', 'ca'):.2f} s; "
          "reference allocations: " + "; ".join(f"{i} {reference_stages(i)}" for i in ("shipped", "current")) + ")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
