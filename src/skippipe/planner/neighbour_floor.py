"""The neighbour floor: each data node's round trips, with who visits whom, must fit its slots.

A floor over every allocation, for ``floors.free_allocation_floor``. The other floors give
every data node its fastest round trips on its own, or (``slot_time_floor``) pool the round
trips of all data nodes. Where the network is split (sites joined by broken or slow links) a
data node's round trips are fast only through the nodes near it, and those nodes can take only
so many visits; this floor counts which data node's visits go where.

As in ``slot_time_floor``, the m round trips of a data node d with k_d = min(M_d, m) slots sum
to at most k_d x T. A round trip through the nodes x_1..x_P (P = L - 1, distinct, other than
d) is d's own work, the visits, and a cycle of hops through d and every x_i. That cycle is at
least half of each of its nodes' two cheapest hops (``half``), and it is at least the way
there and back to the farthest x_i, so at least the mean over the x_i of ``2 sp(d, x_i)``
(``sp``: shortest paths over the hops, each hop paid both ways). For a makespan T this is a
linear programme over every allocation: z[d, x] visits of d's microbatches at x, y[d] in
[0, 1] the share of d in stage 0 (sum D, only nodes whose own floor ``trip_floor`` fits T), and

- d's visits: ``sum_x z[d, x] = m P y[d]``, at most ``m y[d]`` at one node (a path visits a
  node once);
- d's round trips, by either bound on the hops:
  ``sum_x z[d, x] (visit_x + half_x) + m (own_d + half_d) y[d] <= k_d T y[d]`` and
  ``sum_x z[d, x] (visit_x + 2 sp(d, x) / P) + m own_d y[d] <= k_d T y[d]``;
- x's visits: ``sum_d z[d, x] <= cap_x (1 - y[x])``, cap_x the least of the visits that fit
  its window (``relaxed_floors.served_visits``) and its TC1 cap at its largest (the stage-0
  nodes the D fastest); and ``sum_d z[d, x] hold_x <= M_x window_x (1 - y[x])``, a visit
  holding one of x's slots at least through its forward and backward, the cheapest hop out of
  x and back, and the quickest loss.

Any plan that finishes by T gives a solution, so the least T with one bounds every plan. The
programme has about N^2 variables, so it runs up to ``MAX_NODES`` nodes; it is solved once at
the other floors' value, and bisected only where that is infeasible.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from skippipe.planner.problem import Problem
from skippipe.planner.programme_floor import Rows, admits, least_feasible, slot_terms
from skippipe.planner.relaxed_floors import hop_edges, served_visits
from skippipe.workload import largest_tc1_caps

MAX_NODES = 120  # above it the programme (about N^2 variables, 0.1-5 s a solve at 100 nodes) is skipped
REL_TOL = 1e-3  # the bisection stops within this share of the makespan


def finite_edges(edge: np.ndarray) -> csr_matrix:
    """The finite entries of ``edge`` as a graph for ``scipy.sparse.csgraph``, zeros included:
    a dense matrix would lose every entry within 1e-8 of 0 (free hops) as "no edge"."""
    rows, cols = np.nonzero(np.isfinite(edge))
    return csr_matrix((edge[rows, cols], (rows, cols)), shape=edge.shape)


class _Programme:
    """The linear programme of the module text, for any makespan T."""

    def __init__(self, problem: Problem, trip_floors: np.ndarray) -> None:
        t = self.terms = slot_terms(problem)
        self.n = problem.n
        edge = hop_edges(problem)
        self.there_and_back = 2.0 * shortest_path(finite_edges(edge), directed=True) / t.P
        self.hold = t.visit + t.cheapest[:, 0] + t.loss
        self.trip_floors = trip_floors
        self.tc1 = largest_tc1_caps(t.speed, t.D * t.m * t.P, t.D)

    def feasible(self, T: float) -> bool:
        """Whether the programme has a solution at makespan T."""
        t, n = self.terms, self.n
        P, m = t.P, t.m
        data = np.flatnonzero(self.trip_floors <= T + 1e-12)
        E = len(data)
        if E < t.D:
            return False
        window = np.maximum(0.0, T - t.head - t.tail)
        cap = np.minimum(served_visits(T, t.head, t.tail, t.visit, t.og), self.tc1)
        slot_time = t.slots * window
        z = np.arange(E * n).reshape(E, n)  # z[i, x]: visits of data node data[i] at x
        y = E * n + np.arange(E)
        ub = Rows()
        x = np.arange(n)[None, :]
        ub.add(x, z, 1.0)  # visits of x, and its slot time
        ub.add(data, y, cap[data])
        ub.add(n + x, z, self.hold[None, :])
        ub.add(n + data, y, slot_time[data])
        r = 2 * n + np.arange(E)[:, None]
        trip = t.visit[None, :] + t.half[None, :]  # round trips, half of each node's cheapest hops
        ub.add(r, z, trip)
        ub.add(r[:, 0], y, m * (t.own[data] + t.half[data]) - T * t.k[data])
        reach = np.isfinite(self.there_and_back[data])  # no visits where no hops lead
        far = np.where(reach, self.there_and_back[data], 0.0)
        ub.add(r + E, z, t.visit[None, :] + far)  # and there and back to each node visited
        ub.add(r[:, 0] + E, y, m * t.own[data] - T * t.k[data])
        spread = 2 * n + 2 * E + z
        ub.add(spread, z, 1.0)  # a node once per path
        ub.add(spread, np.broadcast_to(y[:, None], z.shape), -float(m))
        b_ub = np.concatenate([cap, slot_time, np.zeros(2 * E + E * n)])
        eq = Rows()
        eq.add(np.broadcast_to(np.arange(E)[:, None], z.shape), z, 1.0)  # d's visits
        eq.add(np.arange(E), y, -float(m * P))
        eq.add(E, y, 1.0)  # the data nodes
        b_eq = np.concatenate([np.zeros(E), [float(t.D)]])
        size = E * n + E
        upper = np.full(size, np.inf)
        upper[z[~reach]] = 0.0
        upper[z[np.arange(E), data]] = 0.0  # no visits to oneself
        upper[y] = 1.0
        bounds = np.stack([np.zeros(size), upper], axis=1)
        return admits(size, ub.matrix((2 * n + 2 * E + E * n, size)), b_ub, eq.matrix((E + 1, size)), b_eq, bounds)


def neighbour_floor(problem: Problem, trip_floors: np.ndarray, at_least: float) -> float:
    """The least makespan, at least ``at_least``, that the neighbour programme allows (see the
    module text); ``trip_floors[x]``: a floor of x's own finish as a data node."""
    if problem.workload.path_length < 2 or problem.n > MAX_NODES or not math.isfinite(at_least) or at_least <= 0:
        return at_least
    programme = _Programme(problem, np.asarray(trip_floors, dtype=float))
    if not programme.terms.usable:
        return at_least
    return least_feasible(programme.feasible, at_least, REL_TOL, first_step=1.25)
