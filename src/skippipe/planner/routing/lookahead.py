"""A timetable routing that looks ahead: each choice scored by the routing it leads to.

The timetable routing (``routing.timetable``) gives each microbatch, in turn, the path whose
final backward ends first: a greedy choice that cannot see what it costs the microbatches
routed after it. Here (a *pilot* or rollout method) each microbatch tries the same
``timetable.TRIED`` best-ranked paths; after each, the rest of the routing is completed
greedily, and the path whose completed routing ends first is kept. The best completed routing
seen is returned, so the result is never slower (reserved) than the greedy timetable. A
completion stops early once a microbatch ends after the best completion so far.

It costs about ``TRIED`` x m / 2 greedy timetables for m microbatches (``lookahead_work``), so
the planner spends it only where it was measured to pay: the slowest group of a cluster planned
in groups of sites with uneven compute, up to 200 nodes (``site_groups.looked_ahead``), within
the planning-time target (below 48 nodes, a share of it). Its work is counted (the timetable's units, and
``ROUTE_WORK`` for each microbatch routed, whose own overhead the units leave out); given a
``limit``, it stops there and returns the quickest completed routing seen so far. Measured on
the 2-core machine (2026-11-30): on the slowest group of the suite's 100-node cluster with
uneven compute and memory (21 nodes) 63.41 -> 57.97 s in 2.4 s; on the whole 30- and 40-node
clusters with uneven compute and memory 0.8-8.3 % quicker at 10-47 s, too slow for their
target; on clusters with even compute, or on a single site, slower than the plans of the other
candidates.
"""

from __future__ import annotations

import math

from skippipe.planner.problem import Problem
from skippipe.planner.routing.timetable import TRIED, Routing, Timetable, estimated_work

# work units counted for each microbatch routed, beside those of the timetable (the path cells
# and operations placed): the overhead of a route, which those leave out. Fitted on the 2-core
# machine (2026-11-30) with ``site_groups.LOOKAHEAD_S_PER_WORK`` over 26 look-aheads on groups
# and clusters of 5-24 nodes (L = 2-8, 6-170 microbatches): of the 13 that took more than 1 s,
# 12 took 0.72-1.17 x the seconds their counted units give and one 1.72 x; the estimate before
# (the cells alone, 2e-6 s each) gave 0.56-3.04 x, short paths with many microbatches the most
ROUTE_WORK = 10
# ``lookahead_work``: the share of the timetable's estimated units a look-ahead counts (its
# completions stop early), and the units estimated per route. Fitted on 19 look-aheads of more
# than 0.5 s (14 of those behind ``ROUTE_WORK``, four groups of the suite's 100-node clusters
# with L = 4 and 30-48 microbatches, fuzz case 568's group of 119): each took 0.65-1.54 x the
# seconds of its estimate
ESTIMATED_SHARE = 0.5
ESTIMATED_ROUTE_WORK = 20


def lookahead_routes(
    problem: Problem, stages: list[list[int]], caps: list[int], seqs: tuple[tuple[int, ...], ...],
    work: list[int] | None = None, limit: int | None = None,
) -> Timetable | None:
    """The routes and processing orders of the look-ahead (see the module text), or None when
    the greedy timetable finds no path for some microbatch. ``work[0]`` grows as in
    ``timetable.timetable_routes``, and by ``ROUTE_WORK`` per microbatch routed; once it passes
    ``limit`` the quickest completed routing so far is returned (the greedy one at least)."""
    work = work if work is not None else [0]
    routing = Routing.start(problem, stages, caps, seqs, work)
    best = routing.copy()
    best_end = _complete(best, math.inf)
    if best_end == math.inf:
        return None
    while (ready := routing.next()) is not None:
        d, t0, still = ready
        choice, choice_key = None, (math.inf, math.inf)
        work[0] += ROUTE_WORK
        for option in routing.options(d, t0, still):
            if limit is not None and work[0] > limit:
                return best.timetable()
            trial = routing.copy()
            trial.commit(d, t0, option)
            end = _complete(trial, best_end)
            if end < best_end:
                best, best_end = trial, end
            if (end, option[0]) < choice_key:
                choice, choice_key = option, (end, option[0])
        if choice is None or choice_key[0] == math.inf:  # no completion beat the best: the greedy choice
            work[0] += ROUTE_WORK
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
        routing.work[0] += ROUTE_WORK
        best = routing.route(d, t0, still)
        if best is None or best[0] >= bound:
            return math.inf
        routing.commit(d, t0, best)
    return routing.makespan


def lookahead_work(problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...]) -> int:
    """The ``work`` units one ``lookahead_routes`` is expected to count (see
    ``ESTIMATED_SHARE``): ``TRIED`` completions of half the microbatches on average per
    microbatch routed, each microbatch as in ``timetable.estimated_work``."""
    microbatches = len(stages[0]) * problem.workload.microbatches_per_data_node
    per_routing = ESTIMATED_SHARE * estimated_work(problem, stages, seqs) + ESTIMATED_ROUTE_WORK * microbatches
    return int(per_routing * (1 + TRIED * (microbatches + 1) / 2))
