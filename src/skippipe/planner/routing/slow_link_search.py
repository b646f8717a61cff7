"""The allocation search around slow links (``slow_link_allocation``), with the flow programmes of
``slow_links``.

From an allocation whose cheapest routing uses a slow link, exchange the stages of two nodes
while the linear relaxation of that routing gets cheaper (data nodes' own compute included),
until no slow link is in use, no exchange helps, or ``SWAP_WORK`` is spent. The exchanges are
taken in one order: first those that move a node at the end of a slow link in use, then the
others. Each step takes the first of them that is *surely* cheaper, if there is one: the current
relaxation's flow, with the two nodes renamed (``RenamedFlow``), fits the exchanged
allocation's TC1 caps and costs less than the current relaxation. That flow is feasible in the
exchanged allocation's programme (same constraint matrix; only the caps and the arc costs change),
so its cost bounds that relaxation from above and no programme is needed to judge the exchange;
one is solved only to go on from it. Where no exchange is surely cheaper, the exchanges are
judged one by one by their relaxations, in the same order, and the first cheaper one is taken.
(On fuzz case 248, 38 nodes, this found a start of 162.34 s in 49 programmes, where judging every
exchange by its programme spent 105 and ended at 240.88 s.)

The integer routing of the result is the candidate's start; the local search of
``plan_skippipe`` goes on from there. Above ``integer_arcs`` arcs no integer programme is
solved: the result is kept only where its relaxation is integral, which makes that an optimal
integer routing. Deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from skippipe.planner.problem import Problem
from skippipe.planner.routing.sequences import RouteCosts
from skippipe.planner.routing.slow_links import (
    INTEGER_FACTOR,
    INTEGRAL_TOL,
    MAX_ARCS,
    Routing,
    arc_count,
    min_cost_routing,
    programme_s,
    programme_shape,
)

# the allocation search solves at most this many arcs' worth of relaxations (relaxations x arcs
# per relaxation; sweep case 27, 24 nodes, needed 73 relaxations). Each search has its own: with
# 4 s of estimated CPU for all the searches of a start together, two generated 13-node clusters
# with half their links broken and S = 9 planned at 2,997 s instead of 136 s and 735 s instead
# of 101 s (their searches need 11-39 relaxations to leave the slow links)
SWAP_WORK = 200_000
# an exchange is surely cheaper when its renamed flow saves more than this (seconds of round trips)
SURELY_S = 1e-6


@dataclass
class SwapWork:
    """The estimated CPU seconds (``programme_s``) of the programmes that the allocation
    searches of one start solved: ``budget.allocation_starts`` expects as much of each start."""

    spent_s: float = 0.0


def exchanged_stages(stages: list[list[int]], a: int, b: int, where: dict[int, int]) -> list[list[int]]:
    """``stages`` with nodes ``a`` and ``b`` in each other's places (``where``: node -> its stage)."""
    out = [list(s) for s in stages]
    out[where[a]][out[where[a]].index(a)] = b
    out[where[b]][out[where[b]].index(b)] = a
    return out


class RenamedFlow:
    """The flow of a relaxation of ``stages`` (``Routing.flow``), costed as if two nodes had
    exchanged their places: the arcs are positions, so the flow stays feasible in the exchanged
    allocation's programme wherever it fits that allocation's caps."""

    def __init__(self, problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...],
                 flow: np.ndarray, own: np.ndarray):
        self.problem, self.stages, self.own = problem, stages, own
        self.rc = RouteCosts.from_problem(problem)
        shape = programme_shape(problem, stages, seqs)
        self.node = np.array([x for s in stages for x in s], dtype=int)  # node at each position
        self.pos = np.empty(problem.n, dtype=int)
        self.pos[self.node] = np.arange(problem.n)
        used = np.flatnonzero(flow > INTEGRAL_TOL)
        self.tail, self.head, self.last = shape.arcs.tail[used], shape.arcs.head[used], shape.arcs.last[used]
        self.flow = flow[used]
        self.touching = [np.flatnonzero((self.tail == p) | (self.head == p)) for p in range(problem.n)]
        self.visits = shape.matrix[: problem.n] @ flow  # by position (the data nodes' positions take none)
        self.caps = np.asarray(problem.load_caps(stages), dtype=float)

    def _arc_cost(self, node: np.ndarray, ids: np.ndarray) -> np.ndarray:
        t, h = node[self.tail[ids]], node[self.head[ids]]
        return self.rc.edge[t, h] + np.where(self.last[ids], 0.0, self.rc.node[h])

    def change(self, a: int, b: int, exchanged: list[list[int]]) -> float | None:
        """How much the flow's cost, the data nodes' own compute included, changes when ``a`` and
        ``b`` exchange their places (``exchanged``: the allocation after it); None when the flow
        does not fit that allocation's caps."""
        pa, pb = int(self.pos[a]), int(self.pos[b])
        moves_data = pa < len(self.stages[0]) or pb < len(self.stages[0])
        caps = np.asarray(self.problem.load_caps(exchanged), dtype=float) if moves_data else self.caps
        renamed = self.node.copy()
        renamed[pa], renamed[pb] = b, a
        if np.any(self.visits > caps[renamed] + INTEGRAL_TOL):
            return None
        ids = np.union1d(self.touching[pa], self.touching[pb])
        change = float((self._arc_cost(renamed, ids) - self._arc_cost(self.node, ids)) @ self.flow[ids])
        return change + float(self.own[exchanged[0]].sum() - self.own[self.stages[0]].sum())

    def surely_cheaper(self, moves: list[tuple[int, int]], where: dict[int, int]) -> Iterator[list[list[int]]]:
        """The allocations after those of ``moves`` (exchanges of two nodes, in turn) whose renamed
        flow fits and saves more than ``SURELY_S``: their relaxations are surely cheaper."""
        for a, b in moves:
            cand = exchanged_stages(self.stages, a, b, where)
            change = self.change(a, b, cand)
            if change is not None and change < -SURELY_S:
                yield cand


def slow_link_allocation(
    problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...], slow: np.ndarray,
    work: SwapWork | None = None, integer_arcs: int = MAX_ARCS,
) -> tuple[list[list[int]], dict[int, list[tuple[int, ...]]]] | None:
    """An allocation and an integer routing that use fewer of the ``slow`` links than ``stages``
    (see the module text); with a fixed allocation only the routing. None when nothing is won,
    or above ``integer_arcs`` arcs when the relaxation of the result is not integral. The
    programmes' estimated CPU is added to ``work``."""
    work = SwapWork() if work is None else work
    arcs = arc_count(stages, seqs)  # of every programme below: the exchanges keep the stage sizes
    if arcs > MAX_ARCS:
        return None  # no programme is built
    own = RouteCosts.from_problem(problem).own * problem.workload.microbatches_per_data_node

    def relaxed(st: list[list[int]]) -> tuple[float, set[int], Routing | None]:
        found = min_cost_routing(problem, st, seqs, slow, integral=False, read_integral=arcs > integer_arcs)
        if found is None:
            return np.inf, set(), None
        return found.cost + float(own[st[0]].sum()), found.slow_nodes, found

    def first_cheaper(exchanges: Iterator[list[list[int]]]) -> tuple | None:
        """The first of ``exchanges`` whose relaxation is cheaper than ``value``, with it (value,
        slow-link ends, routing); None when none is before the programmes are spent."""
        nonlocal evaluations
        for cand in exchanges:
            if evaluations >= most:
                return None
            v, e, r = relaxed(cand)
            evaluations += 1
            if v < value - 1e-9:
                return cand, v, e, r
        return None

    best = [list(map(int, s)) for s in stages]
    value, ends, loose = relaxed(best)
    evaluations = 1
    most = max(1, SWAP_WORK // max(1, arcs))
    while problem.fixed_stages is None and ends and evaluations < most:
        where = {v: k for k, s in enumerate(best) for v in s}
        firsts = sorted(ends) + [a for a in range(problem.n) if a not in ends]
        moves = [(a, b) for i, a in enumerate(firsts) for b in firsts[i + 1:] if where[a] != where[b]]
        surely = None if loose is None or loose.flow is None else RenamedFlow(problem, best, seqs, loose.flow, own)
        found = None if surely is None else first_cheaper(surely.surely_cheaper(moves, where))
        if found is None:  # nothing surely cheaper: judge each exchange by its relaxation
            found = first_cheaper(exchanged_stages(best, a, b, where) for a, b in moves)
        if found is None:
            break  # no exchange helps, or the programmes are spent
        best, value, ends, loose = found
    if arcs > integer_arcs:  # no integer programme: the relaxation's routing where it is integral
        work.spent_s += evaluations * programme_s(best, seqs)
        return None if loose is None or loose.paths is None else (best, loose.paths)
    work.spent_s += (evaluations + INTEGER_FACTOR) * programme_s(best, seqs)
    routing = min_cost_routing(problem, best, seqs, slow, integral=True)
    if routing is None or routing.paths is None:
        return None
    return best, routing.paths
