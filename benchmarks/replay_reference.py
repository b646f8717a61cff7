"""Replay the SkipPipe reference instances in our simulator, beside the reference's own figures.

For each instance (``shipped``: forward 0.44 s; ``current``: forward 1.76 s) and method, our
simulated seconds per iteration, the reference simulator's figure, their ratio, the plan's lower
bound and the memory floor of the reference allocation; then a *fair* full pipeline (correct
bottleneck matching, 30 microbatches, from ``skippipe.planner.baselines.full_plan``) beside the
reference's own; the rules the replayed plans break under our TC1 caps; and the simulator's
speed. Everything is measured in this run.

    python3 benchmarks/replay_reference.py [--gantt DIR] [--write-plans DIR] [--no-speed]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

from skippipe.bounds import DataNodeLoad, lower_bound, memory_floor
from skippipe.planfile import Constraints, Costs, Microbatch, Plan, save_plan
from skippipe.reference import (
    INSTANCES,
    INVALID_FIGURES,
    METHOD_TITLES,
    METHODS,
    reference_figure,
    reference_plan,
    reference_problem,
    reference_stages,
    rule_breaks,
)
from skippipe.sim import simulate


def floor_of(instance: str) -> float:
    plan, shape = reference_plan(instance, "ca"), reference_problem(instance).workload
    return memory_floor(DataNodeLoad.of(reference_stages(instance), plan.costs, plan.memory, shape))


def fair_full(instance: str, seed: int = 0) -> Plan | None:
    try:
        from skippipe.planner.baselines import full_plan
    except ImportError:
        return None
    problem = reference_problem(instance)
    return full_plan(problem, reference_stages(instance), seed)


def fmt(x: float | None, nd: int = 2) -> str:
    if x is None:
        return "-"
    return f"{x:.{nd}f}" if math.isfinite(x) else "inf"


def replay_table(args: argparse.Namespace) -> list[str]:
    notes: list[str] = []
    head = (
        f"{'instance':<9} {'method':<32} {'mbs':>4} {'ours s':>8} {'reference s':>12} {'ratio':>6} "
        f"{'bound s':>8} {'ours/bound':>10}"
    )
    print(head)
    print("-" * len(head))
    for instance in INSTANCES:
        floor = floor_of(instance)
        rows = [(m, reference_plan(instance, m)) for m in METHODS]
        fair = fair_full(instance)
        if fair is not None:
            rows.insert(2, ("fair-full", fair))
        for method, plan in rows:
            res = simulate(plan)
            ref = reference_figure(instance, method) if method in METHODS else None
            title = METHOD_TITLES.get(method, "fair full pipeline vs ref. full")
            ratio = res.makespan_s / ref if ref else None
            if method == "fair-full":
                ref = reference_figure(instance, "full")
                ratio = res.makespan_s / ref if ref else None
            star = ""
            if (instance, method) in INVALID_FIGURES:
                star = " *"
                notes.append(
                    f"* {instance} {method}: the reference figure {ref:.2f} s is not valid "
                    f"({INVALID_FIGURES[(instance, method)]}); "
                    f"our last finish among the microbatches it did finish: "
                    f"{max(res.finish_s[i] for i in res.finish_s if i not in _lost(instance, method)):.2f} s"
                )
            print(
                f"{instance:<9} {title:<32} {len(plan.microbatches):>4} {fmt(res.makespan_s):>8} {fmt(ref):>12} "
                f"{fmt(ratio, 3):>6}{star} {fmt(res.lower_bound_s):>8} {fmt(res.makespan_s / res.lower_bound_s, 3):>10}"
            )
            if args.gantt:
                from skippipe.viz import gantt

                out = Path(args.gantt) / f"gantt-{instance}-{method}.png"
                gantt(res.ops, out, stages=plan.stages, title=f"{instance} instance: {title}",
                      makespan_s=res.makespan_s if res.finished else None, lower_bound_s=res.lower_bound_s)
            if args.write_plans:
                save_plan(plan, Path(args.write_plans) / f"{instance}-{method}.json")
        print(f"{instance:<9} {'memory floor, reference allocation':<32} {'':>4} {fmt(floor):>8}")
        print()
    return notes


# Microbatches the reference simulator never finished: on the current instance's random plan the
# second microbatch (d = 1) of agents 12 and 13 (data node 19) waits for its partner with a free
# memory slot, and the reference's loop never looks at it again (README, "Replaying the reference").
LOST_AGENTS = {("current", "random"): (12, 13)}


def _lost(instance: str, method: str) -> set[int]:
    """Our ids of the microbatches the reference lost: with three agents per data node each
    agent has one copy, so agent a's microbatches are ids 2a (d = 0) and 2a + 1 (d = 1)."""
    return {2 * a + 1 for a in LOST_AGENTS.get((instance, method), ())}


def print_rule_breaks() -> None:
    print("rules the replayed plans break under our TC1 caps (path rules CC1-CC3 all hold):")
    for instance in INSTANCES:
        problem = reference_problem(instance)
        for method in METHODS:
            plan = reference_plan(instance, method)
            breaks = rule_breaks(plan, problem)
            if method.startswith("full"):
                used = sorted({mb.data_node for mb in plan.microbatches})
                print(f"  {instance} {method}: {len(plan.microbatches)} microbatches from data nodes {used} only "
                      f"(each data node and chain node handles {len(plan.microbatches) // len(used)})")
            elif breaks:
                print(f"  {instance} {method}: " + "; ".join(breaks))
            else:
                print(f"  {instance} {method}: none")
    print()


def synthetic_plan(n: int = 1000, mbs_per_data_node: int = 6, seed: int = 0) -> Plan:
    """A random valid plan: n nodes, 6 stages (stage 0 a quarter of the nodes), L = 4."""
    rng = np.random.default_rng(seed)
    S, L = 6, 4
    d = n // 4
    sizes = [d] + [(n - d) // (S - 1) + (1 if i < (n - d) % (S - 1) else 0) for i in range(S - 1)]
    order = [int(x) for x in rng.permutation(n)]
    stages, i = [], 0
    for s in sizes:
        stages.append(order[i : i + s])
        i += s
    T = rng.uniform(0.4, 3.0, (n, n))
    T = (T + T.T) / 2
    np.fill_diagonal(T, 0.0)
    costs = Costs(transfer_s=T, forward_s=np.full(n, 1.76))
    mbs = []
    for dn in stages[0]:
        for _ in range(mbs_per_data_node):
            seq = sorted(int(x) for x in rng.choice(np.arange(1, S), L - 1, replace=False))
            mbs.append(Microbatch(len(mbs), dn, [int(rng.choice(stages[s])) for s in seq]))
    layers = [[s] for s in range(S)]
    return Plan(stages=stages, layers=layers, memory=[3] * n, constraints=Constraints(L, 1, 4, None),
                costs=costs, microbatches=mbs, method="synthetic")


def best_ms(fn, repeat: int, number: int) -> float:
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t) / number)
    return best * 1e3


def print_speed() -> None:
    print("simulator speed (best of 5 runs):")
    plan = reference_plan("current", "ca")
    lower_bound(plan)
    for kw in ({"record": False, "bound": False}, {"record": False}, {"record": True}):
        ms = best_ms(lambda kw=kw: simulate(plan, **kw), 5, 100)
        flags = ", ".join(f"{k}={v}" for k, v in kw.items())
        print(f"  20 nodes, 30 microbatches, {flags}: {ms:.3f} ms per simulation")
    big = synthetic_plan()
    t = time.perf_counter()
    floor = lower_bound(big)
    first = (time.perf_counter() - t) * 1e3
    ms = best_ms(lambda: simulate(big, record=False, bound=False), 3, 1)
    res = simulate(big, record=False)
    print(f"  1000 nodes, {len(big.microbatches)} microbatches, record=False bound=False: {ms:.1f} ms per simulation "
          f"(makespan {res.makespan_s:.2f} s, finished {res.finished})")
    print(f"  1000 nodes: lower bound {floor:.2f} s computed in {first:.0f} ms (cached afterwards)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gantt", metavar="DIR", help="write a Gantt chart PNG per replayed plan into DIR")
    parser.add_argument("--write-plans", metavar="DIR", help="write the replayed plans as plan files into DIR")
    parser.add_argument("--no-speed", action="store_true", help="skip the speed measurement")
    args = parser.parse_args(argv)
    notes = replay_table(args)
    for line in notes:
        print(line)
    if fair_full("shipped") is None:
        print("(fair full pipeline: skippipe.planner.baselines.full_plan is not available yet)")
    print()
    print_rule_breaks()
    if not args.no_speed:
        print_speed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
