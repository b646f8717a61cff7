"""Data nodes chosen for their own work and their round trips: a candidate of ``plan_skippipe``.

A data node runs its microbatches' embedding and first-stage forward, the loss and the final
backward, and every round trip of its microbatches starts and ends there: on uneven compute
the iteration often ends at one data node, slow itself or with slow round trips, while a
faster node elsewhere carries visits. The allocation search picks data nodes for the network
and the groups, not for this; the TC1 caps (visits in proportion to speed) are only caps.

``data_node_search`` starts from an allocation with its balanced routing (``routing.balanced``)
and exchanges each of the ``LATEST`` data nodes that finish last in simulation with each node
outside stage 0 (of any stage; it takes that node's place, so the stage sizes and the node set
stay): every such
exchange is routed with the balanced routing at the queue weight and slot-hold setting that
won on the start and scored by the simulator (``Evaluator``), and the best is kept when it
beats the current allocation. It goes on from there, at most ``MAX_EXCHANGES`` times. Above
``MAX_NODES`` nodes only the data node that finishes last is exchanged, and only with a
shortlist (``partners``): the ``SHORTLIST`` fastest nodes outside stage 0 and the ``SHORTLIST``
whose cheapest round trip as a data node in its place is quickest, and the caller charges its
routings to the search budget (``ROUTING_CHARGE``); above ``LARGEST`` nodes the candidate is
skipped. The
data-node floor (fastest round trip + ``trip_floor``) is no guide here: on the suite's global
uneven cluster (N = 24) the exchange that lowered the balanced routing's simulated makespan
most (65.44 s -> 61.31 s) raised that floor (47.36 s -> 48.36 s); the waits come from round
trips that share nodes, which the simulator sees and the floor does not.
"""

from __future__ import annotations

import math

import numpy as np

from skippipe.planner.problem import Problem
from skippipe.planner.routing.balanced import VARIANTS, balanced_routes
from skippipe.planner.routing.budget import operations
from skippipe.planner.routing.evaluate import Evaluator, Route, Score
from skippipe.planner.routing.pool import map_calls, planning_workers, split
from skippipe.planner.routing.sequences import RouteCosts, cheapest_over_sequences

# at most this many accepted exchanges
MAX_EXCHANGES = 4
# the data nodes (latest finish first) whose exchanges are tried at each step
LATEST = 3
# above this many nodes the candidate is skipped (measured up to the suite's 100-node clusters)
LARGEST = 100
# the data nodes tried at each step above MAX_NODES nodes
LATEST_LARGE = 1
# up to this many nodes every node outside stage 0 is an exchange partner; above it only a
# shortlist (``partners``) is (at 40 nodes, S = 9, one step of every exchange costs seconds)
MAX_NODES = 32
# seconds of one exchange's balanced routing and its simulation, per operation of an iteration
# (measured 8.8-22 us on clusters of 12-32 nodes): the exchanges of a step run side by side only
# where their estimate is worth the workers (``pool.map_calls``)
ROUTING_S_PER_OP = 1.5e-5
# the shortlist: this many fastest nodes and this many with the cheapest round trips as data nodes
SHORTLIST = 4
# above MAX_NODES nodes each balanced routing the candidate runs is charged to the search budget
# as this many simulations (at N = 100 a routing and its scoring take about 0.07 s CPU, a
# simulation of the path search about 3 ms)
ROUTING_CHARGE = 20


def _routed(
    problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...], settings: tuple[tuple[float, bool], ...],
    known: Score | None = None, tally: list[int] | None = None,
) -> tuple[tuple[float, bool], list[Route], Score] | None:
    """The best balanced routing of ``stages`` over ``settings`` (setting, routes, score);
    None when none finishes. With ``known``, the best score already found for these stages
    and settings (``balanced_candidate``), the first setting that reaches it is the best one
    and the later ones are not tried. Each routing run adds 1 to ``tally[0]``."""
    ev = Evaluator(problem, stages)
    caps = problem.load_caps(stages)
    best = None
    for w, holds in settings:
        routes = balanced_routes(problem, stages, caps, seqs, w, holds)
        if tally is not None:
            tally[0] += 1
        if routes is None:
            continue
        score = ev.score(routes)
        if math.isfinite(score.makespan) and (best is None or score < best[2]):
            best = ((w, holds), routes, score)
            if known is not None and score.key() == known.key():
                break
    return best


def exchanged(stages: list[list[int]], d: int, x: int) -> list[list[int]]:
    """``stages`` with data node ``d`` and node ``x`` (outside stage 0) exchanged."""
    out = []
    for s, nodes in enumerate(stages):
        if s == 0:
            out.append(sorted([y for y in nodes if y != d] + [x]))
        elif x in nodes:
            out.append(sorted([y for y in nodes if y != x] + [d]))
        else:
            out.append(sorted(nodes))
    return out


def partners(
    problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...], d: int, k: int | None = None,
    thorough: bool = True,
) -> list[int]:
    """The exchange partners of data node ``d`` above ``MAX_NODES`` nodes: the ``k`` (default ``SHORTLIST``) fastest
    nodes outside stage 0 and the ``k`` whose cheapest round trip (own work, visits and hops,
    nothing queued) as a data node in ``d``'s place is quickest; every node outside stage 0
    up to ``MAX_NODES`` nodes (``thorough=False``: the shortlist at any size). Sorted, ties
    broken by node id."""
    others = sorted(x for s in stages[1:] for x in s)
    if thorough and problem.n <= MAX_NODES:
        return others
    k = SHORTLIST if k is None else k
    forward = problem.forward_s
    fastest = sorted(others, key=lambda x: (float(forward[x]), x))[:k]
    rc = RouteCosts.from_problem(problem)

    def trip(x: int) -> float:
        arrays = [np.asarray(s, dtype=int) for s in exchanged(stages, d, x)]
        return cheapest_over_sequences(rc, x, arrays, seqs)[0]

    trips = {x: trip(x) for x in others}
    cheapest = sorted(others, key=lambda x: (trips[x], x))[:k]
    return sorted(set(fastest) | set(cheapest))


def _best_exchange(
    problem: Problem, cur: list[list[int]], pairs: list[tuple[int, int]], seqs: tuple[tuple[int, ...], ...],
    setting: tuple[float, bool], score: Score,
) -> tuple[tuple[list[list[int]], list[Route], Score] | None, int]:
    """Of the exchanges ``pairs`` of ``cur``, the first whose balanced routing (at ``setting``)
    scores least and below ``score`` (stages, routes, score; None when none does), and how many
    routings were run."""
    best, tally = None, [0]
    for d, x in pairs:
        trial = exchanged(cur, d, x)
        found = _routed(problem, trial, seqs, (setting,), tally=tally)
        if found is not None and found[2] < score and (best is None or found[2] < best[2]):
            best = (trial, found[1], found[2])
    return best, tally[0]


def data_node_search(
    problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...], known: Score | None = None,
    tally: list[int] | None = None, thorough: bool = True,
) -> tuple[list[list[int]], list[Route], Score] | None:
    """An allocation whose data nodes were exchanged while that lowered the simulated score of
    the balanced routing (see the module text), with that routing and its score; None when no
    exchange helps or no balanced routing finishes. ``known``: the balanced routing's score on
    ``stages`` when the caller has it (saves routings, changes nothing); ``tally[0]`` counts the
    balanced routings run. ``thorough=False``: as above ``MAX_NODES`` nodes at any size."""
    full = thorough and problem.n <= MAX_NODES
    start = _routed(problem, stages, seqs, VARIANTS, known, tally)
    if start is None:
        return None
    setting, routes, score = start
    cur = [sorted(int(x) for x in s) for s in stages]
    changed = False
    for _ in range(MAX_EXCHANGES):
        best: tuple[list[list[int]], list[Route], Score] | None = None
        count = LATEST if full else LATEST_LARGE
        latest = list(score.latest[:count]) or cur[0][:count]
        pairs = [(d, x) for d in latest for x in partners(problem, cur, seqs, d, thorough=full)]
        # the exchanges of a step are independent: in runs side by side (the first best in
        # ``pairs``' order is kept, as one run would keep it)
        runs = map_calls(_best_exchange, [(problem, cur, run, seqs, setting, score)
                                          for run in split(pairs, planning_workers())],
                         len(pairs) * operations(problem) * ROUTING_S_PER_OP)
        for found, routings in runs:
            if tally is not None:
                tally[0] += routings
            if found is not None and (best is None or found[2] < best[2]):
                best = found
        if best is None:
            break
        cur, routes, score = best
        changed = True
    if not changed:
        return None
    final = _routed(problem, cur, seqs, VARIANTS, tally=tally)  # every setting on the final allocation
    if final is not None and final[2] < score:
        routes, score = final[1], final[2]
    return cur, routes, score
