"""The allocation search around slow links (``slow_link_allocation``), with the flow programmes of
``slow_links``.

From an allocation whose cheapest routing uses a slow link, exchange the stages of two nodes
while the linear relaxation of that routing gets cheaper (data nodes' own compute included),
until no slow link is in use, no exchange helps, or ``SWAP_WORK`` is spent. The exchanges are
taken in one order: first those that move a node at the end of a slow link in use, then the
others. The exchanges of one search share their programme's constraint matrix (only the caps and
the arc costs change), so the current relaxation judges many of them without a programme
(``RenamedRelaxation``): its flow, with the two nodes renamed, bounds an exchange's relaxation
from above where it fits the exchanged allocation's TC1 caps, and its prices of the caps bound it
from below (Lagrange: each microbatch's cheapest way with the caps priced in).

- Each step takes the first exchange that is *surely* cheaper by the bound from above, if there
  is one, and solves only its programme, to go on from it. (On fuzz case 248, 38 nodes, this
  found a start of 162.34 s in 49 programmes, where judging every exchange by its programme
  spent 105 and ended at 240.88 s.)
- Where none is, the exchanges are judged one by one by their relaxations, in the same order,
  and the first cheaper one is taken; those that the bound from below shows cannot be cheaper
  are skipped without a programme and without counting to ``SWAP_WORK``. (On fuzz case 746,
  18 nodes, 1,169 programmes -> 749.)

The integer routing of the result is the candidate's start; the local search of
``plan_skippipe`` goes on from there. Where the result's relaxation is integral, that is an
optimal integer routing and no integer programme is solved (on a 39-node cluster with S = 9,
L = 7 and 17 microbatches per data node the integer programme of the same routing took 2.7 s,
its relaxation 0.19 s); above ``integer_arcs`` arcs none is solved at all: the result is kept
only where its relaxation is integral. Deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from skippipe.planner.problem import Problem
from skippipe.planner.routing.order_graph import order_graph
from skippipe.planner.routing.sequences import RouteCosts
from skippipe.planner.routing.slow_links import (
    INTEGER_FACTOR,
    INTEGRAL_TOL,
    MAX_ARCS,
    Routing,
    arc_cost,
    arc_count,
    integral_paths,
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
# an exchange is taken when its relaxation is cheaper by more than this
CHEAPER_S = 1e-9


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


class RenamedRelaxation:
    """A relaxation of ``stages`` (its flow and its caps' prices, ``Routing.flow`` and
    ``Routing.cap_prices``), judged as if two nodes had exchanged their places. The programmes of
    the two allocations share their constraint matrix (the arcs are positions); only the arcs'
    costs and the caps change.

    - ``change``: the flow, renamed, is feasible in the exchanged programme wherever it fits that
      allocation's caps, so its cost bounds that relaxation from above.
    - ``least``: with the caps priced into the arcs (Lagrange) instead of imposed, each
      microbatch takes its data node's cheapest way through the order graph; m of them each, less
      the prices times the caps, bound the exchanged relaxation from below for any prices >= 0,
      and with the current relaxation's prices they equal it before any exchange (the flow
      polytope without the caps is integral)."""

    def __init__(self, problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...],
                 routing: Routing, own: np.ndarray):
        self.problem, self.stages, self.own = problem, stages, own
        self.rc = RouteCosts.from_problem(problem)
        shape = programme_shape(problem, stages, seqs)
        self.node = np.array([x for s in stages for x in s], dtype=int)  # node at each position
        self.pos = np.empty(problem.n, dtype=int)
        self.pos[self.node] = np.arange(problem.n)
        self.arcs = arcs = shape.arcs
        self.flow, self.prices = routing.flow, routing.cap_prices
        self.touching = [np.flatnonzero((arcs.tail == p) | (arcs.head == p)) for p in range(problem.n)]
        self.visits = shape.cap_rows @ self.flow  # by position (the data nodes' positions take none)
        self.caps = np.asarray(problem.load_caps(stages), dtype=float)
        self.own_now = float(own[stages[0]].sum())
        self.cost = self._arc_cost(self.node, np.arange(len(arcs.tail)))
        graph = order_graph(seqs)
        depth = np.asarray(graph.depth)[arcs.tail_state]
        self.layers = [np.flatnonzero(depth == k) for k in range(int(depth.max()) + 1)]
        self.states = graph.states

    def _arc_cost(self, node: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return arc_cost(self.rc, node[self.arcs.tail[ids]], node[self.arcs.head[ids]], self.arcs.last[ids])

    def _renamed(self, a: int, b: int, exchanged: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The node at each position after the exchange, the caps by node, and the arcs whose
        cost changes."""
        pa, pb = int(self.pos[a]), int(self.pos[b])
        moves_data = pa < len(self.stages[0]) or pb < len(self.stages[0])
        caps = np.asarray(self.problem.load_caps(exchanged), dtype=float) if moves_data else self.caps
        renamed = self.node.copy()
        renamed[pa], renamed[pb] = b, a
        return renamed, caps, np.union1d(self.touching[pa], self.touching[pb])

    def change(self, a: int, b: int, exchanged: list[list[int]]) -> float | None:
        """How much the flow's cost, the data nodes' own compute included, changes when ``a`` and
        ``b`` exchange their places (``exchanged``: the allocation after it); None when the flow
        does not fit that allocation's caps."""
        renamed, caps, ids = self._renamed(a, b, exchanged)
        if np.any(self.visits > caps[renamed] + INTEGRAL_TOL):
            return None
        ids = ids[self.flow[ids] > INTEGRAL_TOL]
        change = float((self._arc_cost(renamed, ids) - self.cost[ids]) @ self.flow[ids])
        return change + float(self.own[exchanged[0]].sum()) - self.own_now

    def least(self, a: int, b: int, exchanged: list[list[int]]) -> float:
        """A lower bound of the exchanged allocation's relaxation, the data nodes' own compute
        included (see the class text)."""
        renamed, caps, ids = self._renamed(a, b, exchanged)
        cost = self.cost.copy()
        cost[ids] = self._arc_cost(renamed, ids)
        pa, pb = int(self.pos[a]), int(self.pos[b])
        followed = self.prices.copy()
        followed[pa], followed[pb] = self.prices[pb], self.prices[pa]
        own = float(self.own[exchanged[0]].sum())
        return max(self._lagrange(cost, prices, caps[renamed]) for prices in (self.prices, followed)) + own

    def _lagrange(self, cost: np.ndarray, prices: np.ndarray, caps: np.ndarray) -> float:
        arcs = self.arcs
        cost = cost + np.where(arcs.last, 0.0, prices[arcs.head])
        data = len(self.stages[0])
        way = np.full((data, self.states, self.problem.n), np.inf)  # cheapest way to (state, position)
        way[np.arange(data), 0, np.arange(data)] = 0.0  # the data nodes hold the first positions
        back = np.full(data, np.inf)
        for ids in self.layers:
            reach = way[arcs.commodity[ids], arcs.tail_state[ids], arcs.tail[ids]] + cost[ids]
            last = arcs.last[ids]
            np.minimum.at(back, arcs.commodity[ids][last], reach[last])
            on = ids[~last]
            np.minimum.at(way, (arcs.commodity[on], arcs.head_state[on], arcs.head[on]), reach[~last])
        m = self.problem.workload.microbatches_per_data_node
        return m * float(back.sum()) - float(prices @ caps)

    def surely_cheaper(self, moves: list[tuple[int, int]], where: dict[int, int]) -> Iterator[list[list[int]]]:
        """The allocations after those of ``moves`` (exchanges of two nodes, in turn) whose renamed
        flow fits and saves more than ``SURELY_S``: their relaxations are surely cheaper."""
        for a, b in moves:
            cand = exchanged_stages(self.stages, a, b, where)
            change = self.change(a, b, cand)
            if change is not None and change < -SURELY_S:
                yield cand

    def maybe_cheaper(self, moves: list[tuple[int, int]], where: dict[int, int],
                      value: float) -> Iterator[list[list[int]]]:
        """The allocations after those of ``moves`` whose lower bound leaves room below ``value``
        (the others' relaxations cannot be cheaper)."""
        for a, b in moves:
            cand = exchanged_stages(self.stages, a, b, where)
            if self.least(a, b, cand) < value - CHEAPER_S:
                yield cand


def searched_allocation(
    problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...], slow: np.ndarray, integer_arcs: int,
) -> tuple[tuple[list[list[int]], dict[int, list[tuple[int, ...]]]] | None, float]:
    """``slow_link_allocation`` from ``stages`` and the estimated CPU of its programmes: one
    search as a call of its own (the searches of one start run side by side in ``pool``'s
    workers, ``candidates.slow_link_candidate``)."""
    work = SwapWork()
    return slow_link_allocation(problem, stages, seqs, slow, work, integer_arcs), work.spent_s


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
        found = min_cost_routing(problem, st, seqs, slow, integral=False)
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
            if v < value - CHEAPER_S:
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
        here = None if loose is None or loose.cap_prices is None else RenamedRelaxation(problem, best, seqs, loose, own)
        found = None if here is None else first_cheaper(here.surely_cheaper(moves, where))
        if found is None:  # nothing surely cheaper: judge each exchange that may be by its relaxation
            found = first_cheaper(here.maybe_cheaper(moves, where, value) if here is not None
                                  else (exchanged_stages(best, a, b, where) for a, b in moves))
        if found is None:
            break  # no exchange helps, or the programmes are spent
        best, value, ends, loose = found
    paths = None if loose is None or loose.flow is None else integral_paths(problem, best, seqs, loose.flow)
    if paths is not None or arcs > integer_arcs:  # the relaxation's routing where it is integral
        work.spent_s += evaluations * programme_s(best, seqs)
        return None if paths is None else (best, paths)
    work.spent_s += (evaluations + INTEGER_FACTOR) * programme_s(best, seqs)
    routing = min_cost_routing(problem, best, seqs, slow, integral=True)
    if routing is None or routing.paths is None:
        return None
    return best, routing.paths
