"""Small clusters: every allocation ranked by its balanced routing, the best planned too.

On a cluster of a handful of nodes the allocation search (``planner.allocation``) and the
data-node exchanges (``routing.data_nodes``) settle on one allocation from every seed, and
the exact optimum over every allocation (``benchmarks/exact_small.py``) is often on another:
on 6-7-node clusters with broken links ``skippipe`` ended 1.11-1.13 x the optimum, on 5-node
ones with uneven compute up to 1.26 x. Where the allocations of the stage sizes are few
(``EVERY_ALLOCATION_MOST``), each is routed by the balanced routing
(``balanced.balanced_candidate``) and scored by the simulator; the ``KEEP`` best are planned
with the allocation fixed (``plan_skippipe``, its default budget), and ``methods`` keeps the
quickest of those and the plan of the usual search. Counts only: the same plans on every
machine.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from skippipe.planner.problem import Problem
from skippipe.planner.routing.balanced import balanced_candidate
from skippipe.planner.routing.candidates import stage_orders
from skippipe.planner.routing.evaluate import Evaluator

# allocations routed at most (6-7 nodes with S = 4: 60-630, 0.1-2.4 s)
EVERY_ALLOCATION_MOST = 1_000
# the best-ranked allocations planned in full
KEEP = 3


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
