"""Routing around links that only trickle: a candidate of ``plan_skippipe``.

A cluster whose sorted link costs jump by ``SLOW_GAP`` x or more has *slow links* (broken
ones that only trickle): one hop over such a link can cost more than the rest of the iteration.
When the cluster stays joined without them (else ``decompose.islands`` splits it), the TC1 caps
still spread the visits over every node, and an allocation chosen for its stage-to-stage tour
may leave the caps no way to route every microbatch over fast links alone.

``min_cost_routing``: the cheapest static routing of an allocation under the TC1 caps, as an
integer flow programme (HiGHS). Per data node d: one unit of flow per microbatch from d along
the graph of the valid stage orders (``order_graph``: the orders with their shared beginnings
and endings merged), through one node of each stage of its order, and back to d; an arc costs
its two hops (activation forward, gradient back) and the compute of the node it enters; every
node takes at most its cap of visits in all. The programme of an allocation differs from that
of another with the same stage sizes only in which node sits where, so it is built once, in
positions (``_shape``), and renamed.

``slow_link_search.slow_link_allocation`` searches the allocations with these programmes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import coo_matrix, csr_matrix

from skippipe.planner.problem import Problem
from skippipe.planner.routing.order_graph import order_graph
from skippipe.planner.routing.sequences import RouteCosts

# the flow programme is built only up to this many arcs (its relaxation about 0.15 s, the
# integer programme about 0.3 s on one core; 30 nodes, S = 6, L = 4 has 4,776, 40 nodes with
# S = 5, L = 3 6,071)
MAX_ARCS = 10_000
# from the memory dealings of a start that keeps to fast links (``candidates.slow_link_candidate``)
# the integer routing is solved only up to this many arcs: such a search is kept only when it
# beats the start, and an integer routing of a larger programme can take seconds (2.1 s at
# 5,634 arcs, the suite's 30-node cluster with S = 8, L = 5, where the relaxation takes 0.1 s;
# 1.3-1.8 s at 8,080 arcs). Above it the routing is kept only where the relaxation is integral
DEALING_MAX_ARCS = 4_000
# the CPU of one relaxation: RELAX_BASE_S + RELAX_CELL_S x arcs x rows, measured on the 2-core
# machine on twelve programmes of 346-6,071 arcs (4.5 to 69 ms, within 20 %); an integer
# routing about INTEGER_FACTOR x that (2.0-2.5 x measured, once 8.8 x)
RELAX_BASE_S = 4e-3
RELAX_CELL_S = 1.5e-8
INTEGER_FACTOR = 2.0
# a safety net on HiGHS (seconds) for the integer routing: those above take at most a few
MILP_SECONDS = 10.0
# a relaxation whose flows are all within this of whole numbers is an integer routing
INTEGRAL_TOL = 1e-7
# links this many times dearer than every cheaper one are slow (cut apart into islands by
# ``decompose.islands`` when the others leave the cluster in parts)
SLOW_GAP = 20.0


def slow_link_cutoff(transfer_s: np.ndarray) -> float | None:
    """The dearest fast link: where the sorted link costs (dearer way of each pair) jump by
    ``SLOW_GAP`` x or more, the cost below the jump; None when there is no such jump."""
    n = transfer_s.shape[0]
    both = np.maximum(transfer_s, transfer_s.T)
    costs = np.unique(both[~np.eye(n, dtype=bool)])
    if len(costs) < 2 or costs[0] <= 0:
        return None
    jump = costs[1:] / costs[:-1]
    k = int(np.argmax(jump))
    return float(costs[k]) if jump[k] >= SLOW_GAP else None


def slow_link_mask(transfer_s: np.ndarray) -> np.ndarray | None:
    """Which links are slow (N x N, symmetric): the dearer way above ``slow_link_cutoff``;
    None when the cluster has no slow links."""
    cutoff = slow_link_cutoff(transfer_s)
    if cutoff is None:
        return None
    return np.maximum(transfer_s, transfer_s.T) > cutoff


@dataclass
class _Arcs:
    """The arcs of the flow programme: per arc its data node, tail and head node, and the states
    of the order graph it leaves and enters (``order_graph``; -1: back to the data node)."""

    data: np.ndarray
    tail: np.ndarray
    head: np.ndarray
    commodity: np.ndarray  # index of the data node in stage 0
    last: np.ndarray  # bool: the hop back to the data node
    tail_state: np.ndarray
    head_state: np.ndarray


@dataclass
class Routing:
    cost: float  # seconds of static round trips (hops both ways, compute of the visits)
    paths: dict[int, list[tuple[int, ...]]] | None  # per data node (integer routings only)
    slow_nodes: set[int]  # nodes at either end of a slow link the routing uses
    flow: np.ndarray | None = None  # the relaxation's flow per arc, by position (None: integer routings)
    # the relaxation's prices (dual values, >= 0) of the TC1 caps, by position (None: integer routings)
    cap_prices: np.ndarray | None = None


def min_cost_routing(
    problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...], slow: np.ndarray | None,
    integral: bool, fast_only: bool = False,
) -> Routing | None:
    """The cheapest routing of every data node's m microbatches under the TC1 caps (see the
    module text); ``slow``: the slow links (``slow_link_mask``), with ``fast_only`` never used.
    A relaxation's flow is not read back as paths (``integral_paths`` does that).
    None when none exists or the programme has more than ``MAX_ARCS`` arcs."""
    m = problem.workload.microbatches_per_data_node
    count = arc_count(stages, seqs)
    if count > MAX_ARCS or count == 0:
        return None
    rc = RouteCosts.from_problem(problem)
    shape = _shape(problem.n, tuple(len(s) for s in stages), seqs, m)
    node = np.array([x for s in stages for x in s], dtype=int)  # node at each position
    arcs = shape.arcs_of(node)
    cost = arc_cost(rc, arcs.tail, arcs.head, arcs.last)
    on_slow = np.zeros(count, dtype=bool) if slow is None else slow[arcs.tail, arcs.head]
    caps = np.asarray(problem.load_caps(stages), dtype=float)[node]  # the caps, row by position
    bound = np.where(on_slow & fast_only, 0.0, float(m))
    if integral:
        upper = shape.upper.copy()
        upper[: problem.n] = caps
        res = milp(c=cost, constraints=LinearConstraint(shape.matrix, shape.lower, upper),
                   integrality=np.ones(count), bounds=Bounds(0, bound), options={"time_limit": MILP_SECONDS})
        x, prices = (res.x if res.success else None), None
    else:  # the same programme as a linear one, for the caps' prices too
        x, prices = _relaxation(shape, cost, caps, bound)
    if x is None:
        return None
    rounded = np.round(x)
    flow = rounded if integral else x
    hops = (flow > 1e-6) & on_slow
    ends = {int(v) for v in np.concatenate([arcs.tail[hops], arcs.head[hops]])}
    paths = _decompose(arcs, rounded.astype(int), stages[0]) if integral else None
    return Routing(float(cost @ flow), paths, ends, None if integral else x, prices)


def integral_paths(problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...],
                   flow: np.ndarray) -> dict[int, list[tuple[int, ...]]] | None:
    """The paths of a relaxation's ``flow`` (by position) of ``stages`` where every arc's flow is
    within ``INTEGRAL_TOL`` of a whole number, per data node; else None. An integral optimum of
    the relaxation is an optimal integer routing."""
    rounded = np.round(flow)
    if not np.all(np.abs(flow - rounded) <= INTEGRAL_TOL):
        return None
    node = np.array([x for s in stages for x in s], dtype=int)
    return _decompose(programme_shape(problem, stages, seqs).arcs_of(node), rounded.astype(int), stages[0])


def arc_cost(rc: RouteCosts, tail: np.ndarray, head: np.ndarray, last: np.ndarray) -> np.ndarray:
    """The cost of arcs from node ``tail`` to node ``head``: the two hops (activation forward,
    gradient back) and, unless the arc is the ``last`` one back to the data node, the compute of
    the node it enters."""
    return rc.edge[tail, head] + np.where(last, 0.0, rc.node[head])


def _relaxation(shape: _Shape, cost: np.ndarray, caps: np.ndarray, bound: np.ndarray
                ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The linear relaxation (HiGHS through ``linprog``, its rows in the order ``milp`` has them):
    its flow and the caps' prices; (None, None) when it has none."""
    n = len(caps)
    res = linprog(cost, A_ub=shape.cap_rows, b_ub=caps, A_eq=shape.flow_rows, b_eq=shape.upper[n:],
                  bounds=np.column_stack([np.zeros(len(cost)), bound]), method="highs",
                  options={"time_limit": MILP_SECONDS})
    if res.status != 0 or res.x is None:
        return None, None
    return res.x, np.maximum(0.0, -np.asarray(res.ineqlin.marginals))


def arc_count(stages: list[list[int]], seqs: tuple[tuple[int, ...], ...]) -> int:
    """Arcs of the flow programme: per data node, per step of the order graph, the node pairs."""
    return programme_size(stages, seqs)[0]


def programme_size(stages: list[list[int]], seqs: tuple[tuple[int, ...], ...]) -> tuple[int, int]:
    """(arcs, rows) of the flow programme of an allocation."""
    return _counts(tuple(len(s) for s in stages), seqs)


@lru_cache(maxsize=64)
def _counts(sizes: tuple[int, ...], seqs: tuple[tuple[int, ...], ...]) -> tuple[int, int]:
    """(arcs, rows) of the flow programme for these stage sizes."""
    graph = order_graph(seqs)
    held = [1] + [sum(sizes[s] for s in stages) for stages in graph.entering()[1:]]  # nodes a state holds
    per_data = sum(held[q] * sizes[stage] for q, stage, _ in graph.steps) + held[graph.final]
    rows = sum(sizes) + sizes[0] * (1 + sum(held[1:]))
    return sizes[0] * per_data, rows


@dataclass(frozen=True)
class _Shape:
    """The flow programme of every allocation with these stage sizes, in positions (the
    nodes of stage 0, then of stage 1, ...): an allocation only renames the nodes, so the
    arcs' positions, the constraint matrix and its bounds but the caps are built once."""

    arcs: _Arcs  # tail, head and data hold positions
    matrix: csr_matrix
    lower: np.ndarray
    upper: np.ndarray  # the first N rows (the caps, by position) are set per allocation
    cap_rows: csr_matrix  # the first N rows of ``matrix``
    flow_rows: csr_matrix  # the others (each data node's total and flow conservation: equalities)

    def arcs_of(self, node: np.ndarray) -> _Arcs:
        """The arcs with the positions replaced by ``node[position]``."""
        a = self.arcs
        return _Arcs(node[a.data], node[a.tail], node[a.head], a.commodity, a.last, a.tail_state, a.head_state)


@lru_cache(maxsize=8)
def _shape(n: int, sizes: tuple[int, ...], seqs: tuple[tuple[int, ...], ...], m: int) -> _Shape:
    bounds = np.cumsum((0, *sizes))
    positions = [list(range(int(a), int(b))) for a, b in zip(bounds, bounds[1:])]
    arcs, rows, cols, lower, upper = _build(n, positions, seqs, m)
    matrix = coo_matrix((cols[1], (rows, cols[0])), shape=(len(lower), len(arcs.tail))).tocsr()
    return _Shape(arcs, matrix, lower, upper, matrix[:n], matrix[n:])


def _build(
    n: int, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...], m: int
) -> tuple[_Arcs, np.ndarray, tuple[np.ndarray, np.ndarray], np.ndarray, np.ndarray]:
    """Arcs and the constraint matrix in coordinates: rows = caps of the non-data nodes (their
    bounds left open), then per data node its total and flow conservation at every (state,
    node) of its order graph."""
    graph = order_graph(seqs)
    into = graph.entering()
    held = [np.array([], dtype=int)] + [np.concatenate([np.asarray(stages[s], dtype=int) for s in sorted(st)])
                                        for st in into[1:]]
    cols_of = {k: [] for k in ("data", "tail", "head", "commodity", "last", "tail_state", "head_state")}
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    signs: list[np.ndarray] = []
    lower: list[float] = [-np.inf] * n
    upper: list[float] = [np.inf] * n  # the caps: set per allocation (``min_cost_routing``)
    col = 0
    for di, d in enumerate(stages[0]):
        total_row = len(lower)
        lower.append(float(m))
        upper.append(float(m))
        base = len(lower)  # conservation rows: per state but the start, per node it holds
        offsets = np.cumsum([0] + [len(h) for h in held[1:]])
        lower += [0.0] * int(offsets[-1])
        upper += [0.0] * int(offsets[-1])
        source = np.array([d])
        moves = [(q, np.asarray(stages[s], dtype=int), nxt) for q, s, nxt in graph.steps]
        moves.append((graph.final, source, -1))  # back to the data node
        for q, targets, nxt in moves:
            tails = source if q == 0 else held[q]
            tail = np.repeat(tails, len(targets))
            head = np.tile(targets, len(tails))
            ids = np.arange(col, col + len(tail))
            col += len(tail)
            last = nxt < 0
            for key, val in (("data", d), ("tail", tail), ("head", head), ("commodity", di), ("last", last),
                             ("tail_state", q), ("head_state", nxt)):
                cols_of[key].append(np.broadcast_to(val, ids.shape).copy() if np.ndim(val) == 0 else val)
            if q == 0:
                rows.append(np.full(len(ids), total_row))
                cols.append(ids)
                signs.append(np.ones(len(ids)))
            else:  # leaves the node it holds at state q
                pos = np.repeat(np.arange(len(tails)), len(targets))
                rows.append(base + offsets[q - 1] + pos)
                cols.append(ids)
                signs.append(-np.ones(len(ids)))
            if not last:  # enters a node at state nxt: conservation there and its cap
                where = {int(x): i for i, x in enumerate(held[nxt])}
                pos = np.array([where[int(x)] for x in targets])
                rows += [base + offsets[nxt - 1] + np.tile(pos, len(tails)), head]
                cols += [ids, ids]
                signs += [np.ones(len(ids)), np.ones(len(ids))]
    arcs = _Arcs(**{k: np.concatenate(v) for k, v in cols_of.items()})
    return (arcs, np.concatenate(rows), (np.concatenate(cols), np.concatenate(signs)), np.array(lower),
            np.array(upper))


def _decompose(arcs: _Arcs, flow: np.ndarray, data_nodes: list[int]) -> dict[int, list[tuple[int, ...]]]:
    """Integer flows read back as paths: per data node, follow arcs with flow left from the
    data node, each from the (state, node) the previous one entered."""
    paths: dict[int, list[tuple[int, ...]]] = {int(d): [] for d in data_nodes}
    left = flow.copy()
    for c in np.unique(arcs.commodity[flow > 0]):
        ids = np.flatnonzero(arcs.commodity == c)
        d = int(arcs.data[ids[0]])
        while True:
            first = ids[(arcs.tail_state[ids] == 0) & (left[ids] > 0)]
            if len(first) == 0:
                break
            path: list[int] = []
            arc = int(first[0])
            while not arcs.last[arc]:
                left[arc] -= 1
                path.append(int(arcs.head[arc]))
                nxt = ids[(arcs.tail_state[ids] == arcs.head_state[arc]) & (arcs.tail[ids] == arcs.head[arc])
                          & (left[ids] > 0)]
                arc = int(nxt[0])
            left[arc] -= 1
            paths[d].append(tuple(path))
    return paths


def programme_shape(problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...]) -> _Shape:
    """The flow programme of ``stages``, in positions (``_Shape``; cached per stage sizes)."""
    return _shape(problem.n, tuple(len(s) for s in stages), seqs, problem.workload.microbatches_per_data_node)


def programme_s(stages: list[list[int]], seqs: tuple[tuple[int, ...], ...]) -> float:
    """The estimated CPU of one relaxation of ``min_cost_routing`` (see ``RELAX_CELL_S``)."""
    arcs, rows = programme_size(stages, seqs)
    return RELAX_BASE_S + RELAX_CELL_S * arcs * rows


def uses_slow_link(slow: np.ndarray, routes: list[tuple[int, tuple[int, ...]]]) -> bool:
    """Whether a round trip of ``routes`` crosses one of the ``slow`` links."""
    for d, path in routes:
        trip = [d, *path, d]
        if any(slow[a, b] for a, b in zip(trip, trip[1:])):
            return True
    return False
