"""The slot-time floor: round trips and visits must fit in the time of the activation slots.

A floor over every allocation, for ``floors.free_allocation_floor``. The other floors give
each data node its fastest round trips; where every data node runs its microbatches nearly one
at a time (few slots) and the TC1 caps (visits in proportion to speed) force visits onto slow
nodes, the round trips cannot all be fast, and this floor counts it.

A slot is held from a microbatch's forward on a node to its backward there, and the node runs
that backward next, so the spans from forward start to backward end of the microbatches that
take one slot do not overlap. On a data node d with k = min(M_d, m) slots, the m round trips
(own work, visits and hops) therefore sum to at most k x T. On a node x outside stage 0 a visit
at position p of its path holds a slot through its own forward and backward, the L-1-p visits
after it, the loss and the L-p hops out and back (each at least the cheapest), all within
``[head_x, T - tail_x]`` (``relaxed_floors.heads_and_tails``).

For a makespan T this is a linear programme over every allocation: c[x, p] visits of node x at
path position p (D x m at each position), y[x] in [0, 1] the share of x in stage 0 (sum D,
only nodes whose own floor ``trip_floor`` fits T), and per node x

- visits ``sum_p c[x, p] <= cap_x (1 - y[x])``, cap_x the least of the operations that fit
  its window (``relaxed_floors.served_visits``) and its TC1 cap (``problem.tc1_caps``: its
  speed's share of the visits among the nodes outside stage 0, see below);
- slot time ``sum_p c[x, p] hold[x, p] <= M_x window_x (1 - y[x])``;

and over the cluster

- every hold, each visit counted once per position it follows up to:
  ``sum c[x, p] p visit_x + D m (P loss + sum_p (P - p + 1) hop) <= sum_x M_x window_x (1 - y[x])``;
- the round trips: ``sum c[x, p] (visit_x + half_x) + sum_x y[x] m (own_x + half_x) <= T sum_x y[x] k_x``,
  ``half_x`` half of x's two cheapest hops out and back (every node of a round trip's cycle of
  L >= 3 distinct nodes has two of its edges; with L = 2, its cheapest one).

The TC1 caps depend on the speed the stage-0 nodes take out of the share. The range of that
speed sum (from the D slowest nodes' to the D fastest nodes') is cut into ``SPEED_BINS``
ranges; each is a programme of its own, with ``sum_x y[x] speed_x`` in the range and every cap
at its largest there (the others' speed at its least). T is feasible when one range is.
Finer ranges raise the floor a little more (a 60-node cluster with one slot per node: 1 range
96.57 s, 6: 104.91, 8: 105.86, 12: 106.66, 24: 107.54) at a cost in programmes.

Any plan that finishes by T gives a solution, so the least T with a solution (bisection) bounds
every plan. The programme has N x (L - 1) + N variables; it is solved once at the other floors'
value and the bisection runs only where that is infeasible.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from skippipe.planner.problem import Problem
from skippipe.planner.programme_floor import Rows, admits, least_feasible, slot_terms
from skippipe.planner.relaxed_floors import served_visits
from skippipe.workload import tc1_caps

SPEED_BINS = 8  # ranges of the stage-0 speed sum, each its own programme (its TC1 caps)
REL_TOL = 1e-6  # the bisection stops within this share of the makespan
# each range of the stage-0 speed sum is loosened by this share, past the solver's tolerance
# (more solutions: still a floor). Loosened by 1e-9, a range of width 0 (every speed equal) was
# found infeasible by HiGHS at every makespan (midsize row 8, 500 nodes: a floor of 360.68 s)
RANGE_ROOM = 1e-6


class _Programme:
    """The linear programme of the module text, for any makespan T."""

    def __init__(self, problem: Problem, trip_floors: np.ndarray) -> None:
        t = self.terms = slot_terms(problem)
        P, D, visit = t.P, t.D, t.visit
        hop = float(t.cheapest[:, 0].min())
        pos = np.arange(1, P + 1)
        self.n = problem.n
        self.trip_floors = trip_floors
        # hold[x, p-1]: the visit, the visits after it, its hop and the cheapest others, the loss
        self.hold = (visit[:, None] + (P - pos)[None, :] * (float(visit.min()) + hop)
                     + t.cheapest[:, :1] + t.loss)
        self.position_weight = pos[None, :] * visit[:, None]
        self.fixed_hold = D * t.m * (P * t.loss + hop * float((P - pos + 1).sum()))
        self.trip_visit = visit + t.half
        self.trip_own = t.m * (t.own + t.half)
        ranked = np.sort(t.speed)
        edges = np.linspace(ranked[:D].sum(), ranked[::-1][:D].sum(), SPEED_BINS + 1)
        self.bins = [(float(a), float(b)) for a, b in itertools.pairwise(edges)]
        if edges[-1] <= edges[0]:  # even compute: one range
            self.bins = [(float(edges[0]), float(edges[0]))]

    def feasible(self, T: float) -> bool:
        """Whether some stage-0 speed range admits a solution at makespan T."""
        eligible = self.trip_floors <= T + 1e-12
        return eligible.sum() >= self.terms.D and any(self._solvable(T, eligible, low, high) for low, high in self.bins)

    def _solvable(self, T: float, eligible: np.ndarray, low: float, high: float) -> bool:
        """The programme at makespan T with the stage-0 speed sum in [low, high]; the TC1
        caps share the visits by the least speed the other nodes can then sum to."""
        t, n = self.terms, self.n
        P = t.P
        window = np.maximum(0.0, T - t.head - t.tail)
        room = RANGE_ROOM * (1.0 + high)
        others = t.speed.sum() - high
        tc1 = tc1_caps(t.speed, t.D * t.m * P, others) if others > 1e-12 else np.inf
        cap = np.minimum(served_visits(T, t.head, t.tail, t.visit, t.og), tc1)
        slot_time = t.slots * window
        c = np.arange(n * P).reshape(n, P)  # variable index of c[x, p]; y[x] is n * P + x
        y = n * P + np.arange(n)
        ub = Rows()
        x = np.arange(n)[:, None]
        ub.add(x, c, 1.0)  # visits of x
        ub.add(np.arange(n), y, cap)
        ub.add(n + x, c, self.hold)  # slot time of x
        ub.add(n + np.arange(n), y, slot_time)
        ub.add(2 * n, c, self.position_weight)  # every hold
        ub.add(2 * n, y, -slot_time)
        ub.add(2 * n + 1, c, np.broadcast_to(self.trip_visit[:, None], (n, P)))  # the round trips
        ub.add(2 * n + 1, y, self.trip_own - T * t.k)
        ub.add(2 * n + 2, y, -t.speed)  # the stage-0 speed sum in [low, high]
        ub.add(2 * n + 3, y, t.speed)
        b_ub = np.concatenate([cap, slot_time, [slot_time.sum() - self.fixed_hold, 0.0, room - low, high + room]])
        eq = Rows()
        eq.add(np.broadcast_to(np.arange(P), (n, P)), c, 1.0)
        eq.add(P, y, 1.0)
        b_eq = np.concatenate([np.full(P, float(t.D * t.m)), [float(t.D)]])
        bounds = [(0.0, None)] * (n * P) + [(0.0, 1.0 if ok else 0.0) for ok in eligible]
        return admits(n * P + n, ub.matrix((2 * n + 4, n * P + n)), b_ub, eq.matrix((P + 1, n * P + n)), b_eq, bounds)


def slot_time_floor(problem: Problem, trip_floors: np.ndarray, at_least: float) -> float:
    """The least makespan, at least ``at_least``, that the slot-time programme allows (see the
    module text); ``trip_floors[x]``: a floor of x's own finish as a data node."""
    if problem.workload.path_length < 2 or not math.isfinite(at_least) or at_least <= 0:
        return at_least
    programme = _Programme(problem, np.asarray(trip_floors, dtype=float))
    if not programme.terms.usable:
        return at_least
    return least_feasible(programme.feasible, at_least, REL_TOL, first_step=2.0)
