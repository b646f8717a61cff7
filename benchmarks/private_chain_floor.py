"""How fast can a plan be in which no two data nodes share a visited node? An exact floor.

Where the stage-0 size D and the path length L fill the cluster exactly (N = D x L: every
suite cluster up to 40 nodes but global random; those with at most ``MAX_GROUPS`` groups are
computed: gcp one per region, single site and the six presets), a plan whose data nodes each keep
L-1 nodes to themselves (private chains, what `skippipe` plans on those clusters) splits the N
nodes into D groups of one data node and L-1 others. Every microbatch of data node d then
visits all L-1 nodes of its group, in some order, so its time out (hops out, forwards, the hop
back) is at least the least over the orders, and so is its time back; d finishes no sooner
than its own schedule solved with those lags (``set_floor.solved_floor``, and never below
``closed_floor`` of its quickest round trip). The TC1 caps are left out (a weaker floor, still
a floor).

The least, over every split of the nodes into such groups, of the slowest group's floor is
therefore a floor on every private-chain plan. It is found exactly: every group's floor is
computed (N x C(N-1, L-1) groups, each over its (L-1)! orders), then the least threshold at
which the groups below it cover every node exactly once (a depth-first exact cover, the node
with the fewest groups left first), by bisection over the groups' values.

Printed per cluster: `skippipe`'s plan, the data-node floor of its own allocation, this
private-chain floor, and the floor over every allocation (``free_allocation_floor``). Where the
plan sits at the private-chain floor, a quicker plan must share visited nodes between data
nodes.

    python3 benchmarks/private_chain_floor.py [--kind "gcp-2025 geo-distributed"]
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import numpy as np

from skippipe.cluster_gen import suite
from skippipe.planner.floors import allocation_data_node_floor, free_allocation_floor
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import Problem, build_problem
from skippipe.planner.relaxed_floors import round_trip_terms
from skippipe.planner.set_floor import closed_floor, solved_floor

Group = tuple[int, tuple[int, ...]]  # (data node, its other nodes)
MAX_GROUPS = 25_000  # clusters with more groups are left out (the 20-node presets have 19,380: about 5 s)


def group_floors(problem: Problem) -> dict[Group, float]:
    """The floor of every group of one data node and L-1 other nodes (see the module text)."""
    t = np.asarray(problem.transfer_s, dtype=float)
    f = np.asarray(problem.forward_s, dtype=float)
    b = f * problem.cost_model.backward_factor
    edge, visit, own, gaps = round_trip_terms(problem)
    hops = problem.workload.path_length - 1
    floors: dict[Group, float] = {}
    for d in range(problem.n):
        for others in itertools.combinations([x for x in range(problem.n) if x != d], hops):
            out = back = trip = math.inf
            for order in itertools.permutations(others):
                cycle = [d, *order, d]
                pairs = list(zip(cycle, cycle[1:]))
                out = min(out, sum(t[a, c] for a, c in pairs) + f[list(order)].sum())
                back = min(back, sum(t[c, a] for a, c in pairs) + b[list(order)].sum())
                trip = min(trip, sum(edge[a, c] for a, c in pairs) + visit[list(order)].sum())
            floors[d, others] = max(solved_floor(problem, d, out, back),
                                    closed_floor(problem, d, float(own[d] + max(trip, gaps))))
    return floors


def cover(n: int, groups: list[Group], count: int) -> list[Group] | None:
    """``count`` of ``groups`` that hold every node exactly once, or None (tried in the order given)."""
    by_node: dict[int, list[tuple[int, Group]]] = {x: [] for x in range(n)}
    for g in groups:
        mask = sum(1 << x for x in (g[0], *g[1]))
        for x in (g[0], *g[1]):
            by_node[x].append((mask, g))
    full, chosen = (1 << n) - 1, []

    def walk(covered: int) -> bool:
        if covered == full:
            return len(chosen) == count
        if len(chosen) >= count:
            return False
        fewest: list[tuple[int, Group]] | None = None
        for x in range(n):
            if not covered >> x & 1:
                left = [mg for mg in by_node[x] if not mg[0] & covered]
                if fewest is None or len(left) < len(fewest):
                    fewest = left
                if not left:
                    return False
        for mask, g in fewest or []:
            chosen.append(g)
            if walk(covered | mask):
                return True
            chosen.pop()
        return False

    return list(chosen) if walk(0) else None


def private_chain_floor(problem: Problem) -> tuple[float, list[Group]]:
    """The least slowest-group floor over every split into private chains, and that split."""
    floors = group_floors(problem)
    values = sorted(set(floors.values()))
    count = int(problem.stage_sizes[0])

    def split(threshold: float) -> list[Group] | None:
        return cover(problem.n, sorted((g for g, v in floors.items() if v <= threshold), key=floors.__getitem__), count)

    lo, hi = 0, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if split(values[mid]) is not None:
            hi = mid
        else:
            lo = mid + 1
    best = split(values[lo])
    assert best is not None  # the largest threshold admits every group
    return values[lo], best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", help="only the suite cluster of this kind (default: every one it applies to)")
    args = ap.parse_args()
    print(f"{'kind':28s} {'N':>3s} {'skippipe':>9s} {'own floor':>9s} {'private':>9s} {'floor':>9s} {'s':>5s}")
    for case in suite(0, largest=40):
        problem = build_problem(case.cluster, case.workload())
        n, hops = problem.n, problem.workload.path_length - 1
        if (args.kind and case.kind != args.kind) or problem.stage_sizes[0] * (hops + 1) != n:
            continue
        if n * math.comb(n - 1, hops) > MAX_GROUPS:
            print(f"{case.kind:28s} {n:3d} left out: {n * math.comb(n - 1, hops):,} groups")
            continue
        started = time.process_time()
        value, split = private_chain_floor(problem)
        seconds = time.process_time() - started
        plan = make_plan("skippipe", problem, seed=0)
        own = allocation_data_node_floor(problem, plan.stages)
        floor = free_allocation_floor(problem).value
        print(f"{case.kind:28s} {problem.n:3d} {plan.predicted_makespan_s:9.2f} {own:9.2f} {value:9.2f} {floor:9.2f} "
              f"{seconds:5.1f}", flush=True)
        print("    a split attaining it: " + ", ".join(f"{d} -> {list(o)}" for d, o in split))


if __name__ == "__main__":
    main()
