"""A timetable routing that looks ahead: each choice scored by the routing it leads to.

The timetable routing (``routing.timetable``) gives each microbatch, in turn, the path whose
final backward ends first: a greedy choice that cannot see what it costs the microbatches
routed after it. Here (a *pilot* or rollout method) each microbatch tries the same
``timetable.TRIED`` best-ranked paths; after each, the rest of the routing is completed
greedily, and the path whose completed routing ends first is kept. The best completed routing
seen is returned, so the result is never slower (reserved) than the greedy timetable. A
completion stops early once a microbatch ends after the best completion so far.

It costs about ``TRIED`` x m / 2 greedy timetables for m microbatches (``lookahead_work``), so
the planner spends it only where it was measured to pay: the slowest group of a cluster
planned in groups of sites with uneven compute, up to 200 nodes (``site_groups.looked_ahead``),
within the planning-time target. Measured on the 2-core machine (2026-11-30): on the slowest
group of the suite's 100-node cluster with uneven compute and memory (21 nodes) 63.41 -> 57.97 s in 2.4 s; on the
whole 30- and 40-node clusters with uneven compute and memory 0.8-8.3 % quicker at 10-47 s,
too slow for their target; on clusters with even compute, or on a single site, slower than
the plans of the other candidates.
"""

from __future__ import annotations

import math

from skippipe.planner.problem import Problem
from skippipe.planner.routing.timetable import TRIED, Routing, Timetable, estimated_work


def lookahead_routes(
    problem: Problem, stages: list[list[int]], caps: list[int], seqs: tuple[tuple[int, ...], ...],
    work: list[int] | None = None,
) -> Timetable | None:
    """The routes and processing orders of the look-ahead (see the module text), or None when
    the greedy timetable finds no path for some microbatch. ``work[0]`` grows as in
    ``timetable.timetable_routes``."""
    routing = Routing.start(problem, stages, caps, seqs, work if work is not None else [0])
    best = routing.copy()
    best_end = _complete(best, math.inf)
    if best_end == math.inf:
        return None
    while (ready := routing.next()) is not None:
        d, t0, still = ready
        choice, choice_key = None, (math.inf, math.inf)
        for option in routing.options(d, t0, still):
            trial = routing.copy()
            trial.commit(d, t0, option)
            end = _complete(trial, best_end)
            if end < best_end:
                best, best_end = trial, end
            if (end, option[0]) < choice_key:
                choice, choice_key = option, (end, option[0])
        if choice is None or choice_key[0] == math.inf:  # no completion beat the best: the greedy choice
            choice = routing.route(d, t0, still)
        if choice is None:
            break
        routing.commit(d, t0, choice)
    return best.timetable()


def _complete(routing: Routing, bound: float) -> float:
    """Route the rest greedily (``Routing.route``); the makespan, or infinite when a microbatch
    finds no path or ends at or after ``bound``."""
    while (ready := routing.next()) is not None:
        d, t0, still = ready
        best = routing.route(d, t0, still)
        if best is None or best[0] >= bound:
            return math.inf
        routing.commit(d, t0, best)
    return routing.makespan


def lookahead_work(problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...]) -> int:
    """The ``work`` units one ``lookahead_routes`` is expected to count: ``TRIED`` completions
    of half the microbatches on average per microbatch routed, each microbatch as in
    ``timetable.estimated_work``."""
    microbatches = len(stages[0]) * problem.workload.microbatches_per_data_node
    return int(estimated_work(problem, stages, seqs) * (1 + TRIED * (microbatches + 1) / 2))
