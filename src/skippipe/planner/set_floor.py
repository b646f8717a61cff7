"""The floor of one data-node set, for ``floors.free_allocation_floor``.

For a set D of data nodes (the nodes of stage 0), ``SetFloor.value`` is the largest of:

- each d in D finishes no sooner than its own floor ``tf[d]`` (the closed form and the solved
  schedule of its fastest round trip through any other nodes);
- a visit to node x is a microbatch of some d in D, whose round trip is at least the fastest
  one through x, RA(d, x): d then finishes no sooner than ``slow_one`` of it. Ordered by that
  finish (the least over D), the nodes before the first whose TC1 caps, summed, take every
  visit cannot take them all, so one visit lands on that node or a dearer one
  (``covered_floor``; a node the others' caps cannot spare is the case of one node). Where
  broken links split the cluster, the nodes near the data nodes are too few for their visits;
- counted, not only one: at a cost c, the nodes whose fastest round trip (from any d in D) is
  cheaper than c cannot take more than their caps, so the rest of the visits land on dearer
  nodes, each microbatch taking at most one visit per node; those microbatches hold their data
  node's slots for at least c each, and a data node's slots run its microbatches as at most k
  chains back to back. The least finish of the best dealing of them over D
  (``dear_visits_floor``; where a node behind broken links must take several visits, every
  trip through it crosses a slow link, and few slots make those trips run one after another);
- with the round trips enumerated (``set_trips``), both again with every round trip kept off
  D's other nodes, which no path visits (stage 0 is visited only at the own data node, CC2);
- and the dear trips with each data node's own work between them: how many dear visits the
  data nodes can take while their own schedules (injections, losses, final backwards, the trips
  of each microbatch out) finish by T (``dear_schedule.dear_schedule_floor``);
- where every path visits every node outside D (N - D = L - 1), the slots of each such node x:
  each microbatch of each d holds one of x's slots from its forward on x to its backward there,
  through the hops to d and back and the loss (``held_slots``).

Each term holds for every allocation with data nodes D, path choice and processing order, so
the least value over the sets bounds every plan.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.sparse.csgraph import shortest_path

from skippipe.bounds import trip_floor
from skippipe.planner.dear_schedule import RESOLUTION_S, DearSchedules, dear_schedule_floor
from skippipe.planner.neighbour_floor import finite_edges
from skippipe.planner.problem import Problem, shared_caps
from skippipe.planner.routing.sequences import node_classes
from skippipe.planner.set_trips import SetTrips
from skippipe.serial_floor import serial_trip_floor, serial_trip_floor_above


def slow_one(ra: float, r0: float, m: int, k: int, og: float) -> float:
    """Least finish of a data node with one round trip >= ra and m - 1 others >= r0 on k chains.

    Its microbatches hold its slots from injection to last backward and a slot's next injection
    waits ``og`` after that backward, so they form at most k chains run back to back; the chain
    holding the slow one, with c microbatches, lasts at least ra + (c - 1)(r0 + og), and the
    other m - c fill k - 1 chains."""
    best = math.inf
    for c in range(1, m + 1):
        slow = ra + (c - 1) * (r0 + og)
        rest = m - c
        if rest and k <= 1:
            continue
        q = math.ceil(rest / (k - 1)) if rest else 0
        other = q * r0 + (q - 1) * og if q else 0.0
        best = min(best, max(slow, other))
    return best


def covered_floor(through: np.ndarray, caps: np.ndarray, visits: int) -> float:
    """The least finish of a data-node set whose ``visits`` land on nodes that take at most
    ``caps`` each, where a visit to node i makes some data node finish no sooner than
    ``through[i]``: the nodes cheaper than the answer cannot take every visit (their caps sum
    to less), so one visit lands on a node at least that dear (0 when nothing is visited)."""
    if visits <= 0 or not len(through):
        return 0.0
    order = np.argsort(through, kind="stable")
    covered = np.cumsum(caps[order])
    k = int(np.searchsorted(covered, visits))  # the first prefix whose caps take every visit
    return float(through[order[min(k, len(order) - 1)]])


def chain_floors(m: int, chains: np.ndarray, slow: np.ndarray, fast: np.ndarray, og: float) -> np.ndarray:
    """[j, i, c] (c = 0..m): a lower bound on the finish of data node i when it runs c round
    trips of at least ``slow[j]`` and m - c of at least ``fast[i]`` (every trip at least that) on
    ``chains[i]`` slot chains (trips back to back, ``og`` after each): some chain holds
    ceil(c / k) of the slow ones; some holds ceil(m / k) trips; and the chains hold every trip,
    with at least m - k gaps between. Non-decreasing in c."""
    c = np.arange(m + 1)[None, None, :]
    k = np.asarray(chains, dtype=int)[None, :, None]
    r = np.asarray(fast, dtype=float)[None, :, None]
    t = np.maximum(np.asarray(slow, dtype=float)[:, None, None], r)
    a = -(-c // k)
    q = -(-m // k)
    one = np.where(a > 0, a * t + (a - 1) * og, 0.0)
    spread = (c * t + (m - c) * r + (m - k) * og) / k
    return np.maximum(np.maximum(one, q * r + (q - 1) * og), spread)


# ``least_dealings`` compares every finish with every candidate at once up to this many cells
# (quicker with the reference's 6 microbatches: 24 against 144 us); beyond, row by row in sorted
# copies (96 microbatches on 5 data nodes: 0.36 against 2.0 ms)
BROADCAST_CELLS = 200_000


def least_dealings(floors: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per j: the least T such that ``counts[j]`` items dealt over the rows of ``floors[j]``
    (row i taking c items finishes no sooner than ``floors[j, i, c]``, non-decreasing in c)
    leave every row's finish at most T, the best dealing's latest finish (inf when none)."""
    if floors.size * (floors.size // max(1, len(floors))) <= BROADCAST_CELLS:  # small: every row against every T at once
        values = floors.reshape(len(floors), -1)
        takes = (floors[:, :, :, None] <= values[:, None, None, :]).sum(axis=2) - 1  # [j, i, T]
        ok = (takes >= 0).all(axis=1) & (takes.sum(axis=1) >= counts[:, None])
        return np.where(ok, values, np.inf).min(axis=1)
    out = np.full(len(floors), np.inf)
    for j, rows in enumerate(floors):
        values = rows.ravel()  # every finish is a candidate T
        # [i, T]: the most row i takes, one less than its finishes at most T (counted in a sorted
        # copy: the same count, in m log m instead of m^2 for every T)
        takes = np.stack([np.searchsorted(row, values, side="right") for row in np.sort(rows, axis=1)]) - 1
        ok = (takes >= 0).all(axis=0) & (takes.sum(axis=0) >= counts[j])
        if ok.any():
            out[j] = values[ok].min()
    return out


def dear_visits_floor(ra: np.ndarray, r0: np.ndarray, chains: np.ndarray, caps: np.ndarray, visits: int,
                      m: int, path_visits: int, og: float) -> float:
    """The floor of a data-node set from how many of its microbatches must take dear trips.

    ``ra[d, x]``: the fastest round trip of data node d (row) through node x (column, the nodes
    outside the set, with TC1 caps ``caps``); ``r0[d]``: its fastest round trip; ``chains[d]``
    its slot chains; ``visits`` the visits to deal, at most ``path_visits`` per microbatch and
    one per node. At each cost c (a column's least trip), the columns cheaper than c take at
    most their caps, so the rest of the visits land on dearer columns. A microbatch makes at
    most min(path_visits, dearer columns) of them, so at least visits left / that many
    microbatches take trips of at least c; their best dealing over the data nodes
    (``least_dealings`` of ``chain_floors``) bounds the finish. The largest over the costs where
    some data node must take two or more (with one each, ``covered_floor`` and ``slow_one``
    count it)."""
    if visits <= 0 or path_visits <= 0 or not ra.size:
        return 0.0
    through = ra.min(axis=0)
    order = np.argsort(through, kind="stable")
    cost = through[order]
    first = np.r_[True, cost[1:] != cost[:-1]]  # of equal costs the first counts the most visits
    dear_visits = visits - np.concatenate([[0], np.cumsum(caps[order])[:-1]])
    counts = -(-dear_visits // np.minimum(path_visits, len(order) - np.arange(len(order))))
    use = first & (dear_visits > 0) & np.isfinite(cost) & (counts > len(r0))
    if not use.any():
        return 0.0
    return float(least_dealings(chain_floors(m, chains, cost[use], r0, og), counts[use]).max())


class SetFloor:
    """The floor of each data-node set of a problem (see the module text)."""

    def __init__(self, problem: Problem, tf: np.ndarray, r0: np.ndarray, ra: np.ndarray,
                 set_trips: SetTrips | None) -> None:
        self.problem = problem
        self.tf = tf
        self.r0 = r0
        self.ra = ra
        self.set_trips = set_trips
        cm, w = problem.cost_model, problem.workload
        self.f = np.asarray(problem.forward_s, dtype=float)
        self.mem = np.asarray(problem.memory, dtype=int)
        self.m = w.microbatches_per_data_node
        self.visits = int(problem.stage_sizes[0]) * self.m * (w.path_length - 1)
        n = problem.n
        self.schedules = DearSchedules(problem)
        self._classes: np.ndarray | None = None  # ``node_classes``, for the dear schedules
        self._found: dict[tuple[int, ...], tuple[float, float, float]] = {}  # classes -> (value, floor, cutoff)
        self.at_least = 0.0  # a floor of the problem already (the capacity floor): no set need go below
        self.holds = forced_holds(problem) if n - int(problem.stage_sizes[0]) == w.path_length - 1 else None
        self.slow = np.full((n, n), math.inf)
        for d in range(n):
            for x in range(n):
                if x != d and math.isfinite(ra[d, x]):
                    self.slow[d, x] = max(tf[d], slow_one(ra[d, x], r0[d], self.m, self._chains(d), cm.op_gap_s))

    def _chains(self, d: int) -> int:
        return max(1, min(int(self.mem[d]), self.m))

    def value(self, data: tuple[int, ...], cutoff: float = math.inf, schedules: bool = True) -> float:
        """The floor of the set ``data`` (stops early at ``cutoff``; the dear schedules, the
        costliest term, only with ``schedules``)."""
        val = self.spread(data, cutoff)
        if val < cutoff:
            val = max(val, self.dear(data))
        if self.set_trips is not None and val < cutoff:
            val = max(val, self.apart(data, cutoff))
        if schedules and self.set_trips is not None and val < cutoff:
            val = max(val, self.dear_schedules(data, val, cutoff))
        return val

    def must_visit(self, data: tuple[int, ...]) -> np.ndarray:
        """The nodes outside ``data`` that some microbatch must visit: the others' TC1 caps
        alone cannot take the visits."""
        others, caps = self._others_and_caps(data)
        return others[self.visits - (caps.sum() - caps) > 0]

    def _others_and_caps(self, data: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """The nodes outside ``data``, in id order, and their TC1 caps (``shared_caps``)."""
        mask = np.ones(self.problem.n, dtype=bool)
        mask[list(data)] = False
        others = np.flatnonzero(mask)
        return others, shared_caps(self.f, others, self.visits)

    def spread(self, data: tuple[int, ...], cutoff: float = math.inf) -> float:
        """The floor of the set with round trips through any other nodes."""
        idx = list(data)
        val = float(self.tf[idx].max())
        if val >= cutoff:
            return val
        others, caps = self._others_and_caps(data)
        through = self.slow[np.ix_(idx, others)].min(axis=0)
        val = max(val, covered_floor(through, caps, self.visits))
        if self.holds is not None and val < cutoff:
            val = max(val, held_slots(self.holds, data, others, self.m, self.mem))
        return val

    def dear(self, data: tuple[int, ...]) -> float:
        """The floor of the set from the dear trips its microbatches must take
        (``dear_visits_floor``)."""
        idx = list(data)
        others, caps = self._others_and_caps(data)
        chains = np.array([self._chains(d) for d in idx])
        return dear_visits_floor(self.ra[np.ix_(idx, others)], self.r0[idx], chains, caps, self.visits, self.m,
                                 self.problem.workload.path_length - 1, self.problem.cost_model.op_gap_s)

    def dear_schedules(self, data: tuple[int, ...], floor_so_far: float = 0.0, cutoff: float = math.inf) -> float:
        """The floor of the set from its data nodes' own schedules with the dear trips their
        microbatches must take (``dear_schedule.dear_schedule_floor``; 0 where it cannot raise
        ``floor_so_far``; stops at ``cutoff``). Sets that differ only by interchangeable nodes
        (``node_classes``: swapping them changes no cost) have the same floor, found once."""
        if self._classes is None:
            p = self.problem
            self._classes = node_classes(p.transfer_s, p.forward_s, p.memory)
        key = tuple(sorted(int(self._classes[d]) for d in data))
        floor_so_far = max(floor_so_far, self.at_least)
        if key in self._found:  # a lower bound of this set whatever it was asked with
            value, asked_floor, asked_cutoff = self._found[key]
            if (value >= floor_so_far or asked_floor <= floor_so_far) and (value < asked_cutoff or cutoff <= asked_cutoff):
                return value
        idx = list(data)
        others, caps = self._others_and_caps(data)
        through = self.ra[np.ix_(idx, others)].min(axis=0)
        value = dear_schedule_floor(self.schedules, data, others, caps, through, self.visits, floor_so_far, cutoff)
        stopped_at = math.floor(cutoff / RESOLUTION_S) * RESOLUTION_S if cutoff < math.inf else math.inf
        self._found[key] = (value, floor_so_far, stopped_at)
        return value

    def apart(self, data: tuple[int, ...], cutoff: float = math.inf) -> float:
        """The floor of the set with round trips kept off its other data nodes (solved
        schedules only while the rest stays below ``cutoff``; ``serial_trip_floor`` caches them)."""
        if self.set_trips is None:
            return 0.0
        cm, m = self.problem.cost_model, self.m
        in_set = np.zeros(self.problem.n, dtype=bool)
        in_set[list(data)] = True
        trips = {d: self.set_trips.avoiding(d, in_set) for d in data}
        val = 0.0
        for d, (trip, _, _) in trips.items():
            val = max(val, float(self.tf[d]), closed_floor(self.problem, d, trip))
        for d, (_, t_out, t_back) in trips.items():
            if val >= cutoff:
                return val
            val = serial_trip_floor_above(*serial_args(self.problem, d, t_out, t_back), val)
        for x in self.must_visit(data):
            if val >= cutoff:
                return val
            through = math.inf
            for d, (trip, _, _) in trips.items():
                ra = self.set_trips.avoiding_through(d, in_set, int(x))
                through = min(through, max(float(self.tf[d]), slow_one(ra, trip, m, self._chains(d), cm.op_gap_s)))
                if through <= val:
                    break  # x cannot raise the floor
            val = max(val, through)
        return val


def forced_holds(problem: Problem) -> np.ndarray:
    """[d, x]: the least time a microbatch of data node d holds a slot of node x it visits: x's
    forward and backward, the loss on d, and the way from x to d and back between them (the
    microbatch's loss is on d), each way at least the shortest path over the hops."""
    t = np.asarray(problem.transfer_s, dtype=float).copy()
    np.fill_diagonal(t, 0.0)
    way = shortest_path(finite_edges(t), directed=True)  # way[a, b]: the least hops from a to b
    f = np.asarray(problem.forward_s, dtype=float)
    cm = problem.cost_model
    return (cm.loss_factor * f)[:, None] + (f * (1.0 + cm.backward_factor))[None, :] + way.T + way


def held_slots(holds: np.ndarray, data: tuple[int, ...], others: np.ndarray, m: int, memory: np.ndarray) -> float:
    """The floor of a data-node set whose paths visit every node outside it: a node's slot is
    held from a forward to the backward there, and the node runs that backward before another
    forward can take the slot, so the m microbatches of each data node d hold x's k slots for at
    least m x ``holds[d, x]`` between them, within [0, T] on k slots."""
    load = m * holds[np.ix_(list(data), others)].sum(axis=0) / np.maximum(1, memory[others])
    return float(load.max()) if len(load) else 0.0


def closed_floor(problem: Problem, d: int, trip: float) -> float:
    """``trip_floor`` of data node d with round trips of at least ``trip`` (inf when inf)."""
    cm, f = problem.cost_model, float(problem.forward_s[d])
    return trip_floor(trip, f, f * cm.backward_factor, problem.workload.microbatches_per_data_node,
                      max(1, int(problem.memory[d])), cm.inject_gap_s, cm.op_gap_s)


def serial_args(problem: Problem, d: int, t_out: float, t_back: float) -> tuple:
    """The arguments of ``serial_trip_floor`` for data node d with these least times out and back."""
    cm, m = problem.cost_model, problem.workload.microbatches_per_data_node
    return (float(problem.forward_s[d]), t_out, t_back, m, max(1, int(problem.memory[d])),
            cm.loss_factor, cm.backward_factor, cm.inject_gap_s, cm.op_gap_s)


def solved_floor(problem: Problem, d: int, t_out: float, t_back: float) -> float:
    """``serial_trip_floor`` of data node d with these least times out and back (0 where the
    search stops at its step cap)."""
    return serial_trip_floor(*serial_args(problem, d, t_out, t_back)) or 0.0
