"""Small clusters: every allocation ranked by its balanced routing, the best planned too.

On a cluster of a handful of nodes the allocation search (``planner.allocation``) and the
data-node exchanges (``routing.data_nodes``) settle on one allocation from every seed, and
the exact optimum over every allocation (``benchmarks/exact_small.py``) is often on another:
on 6-7-node clusters with broken links ``skippipe`` ended 1.11-1.13 x the optimum, on 5-node
ones with uneven compute up to 1.26 x. Where the allocations of the stage sizes are few
(``EVERY_ALLOCATION_MOST``), each is routed by the balanced routing
(``balanced.balanced_candidate``) and scored by the simulator; the ``KEEP`` best are planned
with the allocation fixed (``plan_skippipe``, a ``KEEP``-th of the default budget each), and
``methods`` keeps the quickest of those and the plan of the usual search. All of it only where
its estimated seconds fit beside the usual search's within the planning-time target
(``ranked_budget``): the ranking at ``RANK_OP_S`` per allocation and operation of an
iteration, the plans at the search's ``SIM_OP_S`` per simulated operation. Counts only: the
same plans on every machine.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from skippipe.planner.problem import Problem
from skippipe.planner.routing.balanced import balanced_candidate
from skippipe.planner.routing.budget import PLANNING_SHARE, SIM_OP_S, default_budget, operations, planning_target_s
from skippipe.planner.routing.candidates import stage_orders
from skippipe.planner.routing.evaluate import Evaluator

# allocations routed at most (6-7 nodes with S = 4: 60-630, 0.1-2.4 s)
EVERY_ALLOCATION_MOST = 1_000
# the best-ranked allocations planned in full
KEEP = 3
# seconds of the ranking per allocation and operation of an iteration (measured 41-122 us on six
# fuzz and small exact cases of 5-9 nodes: several balanced routings each, every one simulated)
RANK_OP_S = 1.2e-4


def allocation_count(sizes: list[int]) -> int:
    """How many allocations of ``sum(sizes)`` nodes to stages of ``sizes`` there are."""
    count, left = 1, sum(sizes)
    for size in sizes:
        count *= math.comb(left, size)
        left -= size
    return count


def allocations(sizes: list[int], n: int) -> Iterator[list[list[int]]]:
    """Every allocation of nodes ``0..n-1`` to stages of ``sizes`` (each stage sorted), in a
    fixed order."""

    def fill(rest: tuple[int, ...], k: int) -> Iterator[list[list[int]]]:
        if k == len(sizes):
            yield []
            return
        for chosen in itertools.combinations(rest, sizes[k]):
            left = tuple(x for x in rest if x not in chosen)
            for tail in fill(left, k + 1):
                yield [list(chosen), *tail]

    yield from fill(tuple(range(n)), 0)


def few_allocations(problem: Problem) -> bool:
    """Whether the allocations are ours to choose and few enough to route every one."""
    sizes = [int(s) for s in problem.stage_sizes]
    return problem.fixed_stages is None and sum(sizes) == problem.n and allocation_count(sizes) <= EVERY_ALLOCATION_MOST


def ranked_budget(problem: Problem) -> int | None:
    """The search budget of each ranked allocation's plan (a ``KEEP``-th of the default), or
    None where the allocations are not ``few_allocations`` or the ranking and those plans
    (estimated, see the module text) do not fit beside the usual search within
    ``PLANNING_SHARE`` of the planning-time target (a 9-node cluster with 17 microbatches per
    data node: 3.0 s planned alone, 12.4 s with them, and no quicker)."""
    if not few_allocations(problem):
        return None
    budget = default_budget(problem)
    ops = operations(problem)
    search_s = budget * SIM_OP_S * ops  # the usual search's, and the ranked plans' together
    rank_s = allocation_count([int(s) for s in problem.stage_sizes]) * ops * RANK_OP_S
    if 2 * search_s + rank_s > PLANNING_SHARE * planning_target_s(problem.n):
        return None
    return max(1, budget // KEEP)


def ranked_allocations(problem: Problem, keep: int = KEEP) -> list[list[list[int]]]:
    """The ``keep`` allocations whose balanced routing the simulator scores quickest (ties:
    the earlier in ``allocations``' order); allocations with no routing that finishes are left
    out."""
    scored = []
    for k, stages in enumerate(allocations([int(s) for s in problem.stage_sizes], problem.n)):
        found = balanced_candidate(problem, stages, problem.load_caps(stages), stage_orders(problem, stages),
                                   Evaluator(problem, stages))
        if found is not None and math.isfinite(found[1].makespan):
            scored.append((found[1].key(), k, stages))
    scored.sort(key=lambda item: (item[0], item[1]))
    return [stages for _, _, stages in scored[:keep]]
