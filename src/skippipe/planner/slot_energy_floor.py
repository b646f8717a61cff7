"""The slot-energy floor: the visits' activation slots over every stretch of time.

A floor over every allocation, for ``floors.free_allocation_floor``. The other floors count
each data node's round trips and the slots' time over the whole iteration; where slots are few
and a data node's microbatches are out at once, their visits must hold slots at the same time,
and the slots of the nodes outside stage 0 run out in the middle of the iteration. This floor
counts that, by energetic reasoning over stretches of time.

*A visit's span.* A forward takes one of its node's activation slots and the backward there
returns it; the node runs one operation at a time, so the spans from a visit's forward start to
its backward end on one node overlap at most ``memory`` at a time, and at most its visits, its
TC1 cap, which is at most its share with the fastest nodes in stage 0 (``spans_held``). The
span of the visit at path position p (1..P, P = L - 1) lasts at least
``span_p = (P - p + 1)(f + b + 2 hop) + loss`` (its forward, the forwards after it, the loss,
the backwards back to it and their hops; f, b, hop the least forward, backward and hop of the
cluster).

*A data node's microbatches.* Number them by injection, j = 0..m-1, and by final backward,
i = 0..m-1. With k = min(M, m) slots (M its memory) and F, B its forward and backward:

- injection j starts no sooner than ``H_j = j (F + inject_gap)``, and for j >= k no sooner than
  the (j - k)-th final backward's end and a gap (a slot must be free; the first ends no sooner
  than a whole round trip, the next each a backward and a gap later);
- the i-th final backward ends no later than ``T - Q_i``: the m - 1 - i final backwards after
  it (each with its gap), and for i < m - k the injection it frees a slot for, with a whole
  round trip after it;
- so the span of the visit at position p of the microbatch (j, i) lies in
  ``[H_j + F + hop + (p - 1)(f + hop), T - Q_i - (p - 1)(b + hop) - hop - B]``.

Which injection rank goes with which final-backward rank is the plan's choice: for each
stretch of time the least over every pairing is taken (an assignment problem, m x m, for the
``ASSIGNED_STRETCHES`` fullest stretches; elsewhere its row and column minima bound it).

*The floor.* For a stretch [t1, t2], a span of at least ``span`` inside the window [e, l]
covers at least ``min(t2 - t1, span, e + span - t1, t2 - l + span)`` of it. Over every
microbatch of the D data nodes, the covered time must fit in what the nodes outside stage 0
can hold, ``(sum over every node of spans_held - the same over D) (t2 - t1)``. D is the
allocation's choice: per stretch, the D nodes whose covered time plus spans held is least
(among the nodes whose own floor as a data node, ``trip_floor``, fits T). A makespan T for
which some stretch (between two points of the windows' ends and an even grid over [0, T]) is
over-full has no plan: the least T without one (bisection) is the floor.

*Stages.* A visit at path position p is in one of the stages some allowed stage order puts
there (``position_hosts``; with L = S and no room to swap, exactly stage p). So the spans of a
run of positions must also fit in what the nodes of those stages can hold (``position_sets``):
stages of s nodes in all at most the s largest ``spans_held`` of the nodes outside stage 0,
which is at most the s largest once the D eligible nodes that hold least are taken out
(``most_held``). With every path
through every stage, a stage with fewer places than the microbatches out at once makes them
wait (14 nodes of one slot, L = S = 4, stage 2 of 3 nodes for 4 data nodes: 20.83 -> 24.86 s,
plan 24.99 s).

The covered time only grows with a data node's forward time, so the data nodes are taken in
kinds (their memory and spans held, and ``FORWARD_BINS`` bins of their forward time, each bin
at its least forward): a floor still, from far fewer assignment problems. The kinds, the
stretches and the stretches given assignment problems are the same whichever nodes may be data
nodes, so lower data-node floors (relaxed round trips) never give a higher floor. Measured (2026-11-28)
on one-site clusters of 24-60 nodes with one or two slots a node: 15.26 -> 20.83 s (plan
20.96 s), 28.51 -> 33.39 s, 53.17 -> 58.05 s; with one to four slots, 24 nodes, m = 2: 14.54
-> 16.79 s; where slots and caps leave room it stays under the other floors (every row of the
suite).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from skippipe.planner.problem import Problem
from skippipe.planner.programme_floor import least_feasible
from skippipe.planner.stage_orders import stage_sequences
from skippipe.workload import largest_tc1_caps

GRID_POINTS = 40  # ends of the stretches tried, evenly over [0, T], and the spans' window ends
MAX_POINTS = 120  # stretch ends at most
ASSIGNED_STRETCHES = 64  # the fullest stretches (by the bound) get the assignment problems
FORWARD_BINS = 4  # bins of the data nodes' forward time, per memory
ASSIGN_MAX_M = 8  # above this many microbatches the pairing is bounded by its row and column minima only
# the bisection stops within this share of the makespan: fine enough that the floor from relaxed
# round trips (a lower ``at_least``) cannot come out above the one from enumerated trips by more
# than rounding (at 1e-4 a 9-node cluster gave 28.07893 against 28.07845 s)
REL_TOL = 1e-6
UNFIT = 1e12  # a pair of ranks whose spans cannot fit, in the assignment problem
MAX_M = 64  # with more microbatches per data node the floor is not computed (its arrays grow as m)
MAX_ORDERS = 200_000  # stage orders enumerated for ``position_hosts`` at most


@dataclass(frozen=True)
class _Terms:
    """What the spans are made of (see the module text)."""

    m: int  # microbatches per data node
    P: int  # visits per path
    hop: float  # the least hop
    f: float  # the least forward
    backward_factor: float
    loss_factor: float
    og: float  # the gap after an operation
    ig: float  # the gap after an injection


def _terms(problem: Problem) -> _Terms:
    w, cm = problem.workload, problem.cost_model
    t = np.asarray(problem.transfer_s, dtype=float).copy()
    np.fill_diagonal(t, math.inf)
    return _Terms(m=w.microbatches_per_data_node, P=w.path_length - 1, hop=float(t.min()),
                  f=float(np.min(problem.forward_s)), backward_factor=cm.backward_factor,
                  loss_factor=cm.loss_factor, og=cm.op_gap_s, ig=cm.inject_gap_s)


def _windows(t: _Terms, forward: float, k: int, T: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(earliest span start [j, p], latest span end [i, p], least span [p]) for a data node
    with this forward time and k slots, at makespan T (see the module text)."""
    m, P, hop = t.m, t.P, t.hop
    loss, back, b = t.loss_factor * forward, t.backward_factor * forward, t.backward_factor * t.f
    trip = forward + 2 * (P + 1) * hop + P * (t.f + b) + loss + back  # the quickest round trip
    ends = trip + np.arange(m) * (back + t.og)  # the earliest end of each final backward
    j = np.arange(m)
    heads = j * (forward + t.ig)
    heads[k:] = np.maximum(heads[k:], ends[: m - k] + t.og)
    i = np.arange(m)
    tails = (m - 1 - i) * (back + t.og)
    tails[: m - k] = np.maximum(tails[: m - k], t.og + trip)
    p = np.arange(1, P + 1)
    start = heads[:, None] + (forward + hop + (p - 1) * (t.f + hop))[None, :]
    end = T - tails[:, None] - ((p - 1) * (b + hop) + hop + back)[None, :]
    span = (P - p + 1) * (t.f + b + 2 * hop) + loss
    return start, end, span


def _covered(start: np.ndarray, end: np.ndarray, span: np.ndarray, t1: np.ndarray, t2: np.ndarray,
             by_position: bool = False) -> np.ndarray:
    """[stretch, j, i] (with ``by_position`` [stretch, j, i, p]): the least time the spans of
    microbatch (j, i) cover of each stretch; inf where one of its spans cannot fit its window."""
    lo, hi, d = t1[:, None, None, None], t2[:, None, None, None], span[None, None, None, :]
    s, e = start[None, :, None, :], end[None, None, :, :]
    cover = np.maximum(0.0, np.minimum(np.minimum(hi - lo, d), np.minimum(s + d - lo, hi - e + d)))
    fits = (end[None, :, :] - start[:, None, :] >= span - 1e-9).all(axis=2)
    if by_position:
        return np.where(fits[None, :, :, None], cover, math.inf)
    return np.where(fits[None], cover.sum(axis=3), math.inf)


def _position_bounds(start: np.ndarray, end: np.ndarray, span: np.ndarray, t1: np.ndarray, t2: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """([stretch, p], [stretch, p]): per path position, the covered time of every injection
    rank paired with the last final-backward rank, and of every final-backward rank with the
    first injection rank. The covered time only shrinks with an earlier start or a later end,
    and the first injection starts earliest and the last final backward ends latest, so the
    first is a row's least and the second a column's: the larger of their sums over any set of
    positions bounds the least pairing from below."""
    rows = _covered(start, end[-1:], span, t1, t2, by_position=True).sum(axis=(1, 2))
    cols = _covered(start[:1], end, span, t1, t2, by_position=True).sum(axis=(1, 2))
    return rows, cols


def _least_pairing(cost: np.ndarray) -> np.ndarray:
    """[stretch]: the least sum over a pairing of injection and final-backward ranks."""
    out = np.maximum(cost.min(axis=2).sum(axis=1), cost.min(axis=1).sum(axis=1))
    finite = np.where(np.isfinite(cost), cost, UNFIT)
    for s in np.flatnonzero(np.isfinite(out)):
        rows, cols = linear_sum_assignment(finite[s])
        total = finite[s][rows, cols].sum()
        out[s] = math.inf if total >= UNFIT else total
    return out


def _kinds(problem: Problem, held: np.ndarray) -> list[tuple[float, int, float, np.ndarray]]:
    """(least forward, memory, spans held, members) of every node, by memory and spans held
    and ``FORWARD_BINS`` bins of their forward time. The same for every makespan, so that a
    node that may be a data node at more makespans (a lower ``trip_floor``) never raises the
    floor."""
    f = np.asarray(problem.forward_s, dtype=float)
    memory = np.asarray(problem.memory, dtype=int)
    kinds = []
    for mem, most in sorted({(int(memory[x]), float(held[x])) for x in range(problem.n)}):
        nodes = np.flatnonzero((memory == mem) & (held == most))
        for part in np.array_split(nodes[np.argsort(f[nodes], kind="stable")], FORWARD_BINS):
            if len(part):
                kinds.append((float(f[part].min()), mem, most, part))
    return kinds


def spans_held(problem: Problem) -> np.ndarray:
    """The most spans each node can hold at a time outside stage 0: its memory, and no more
    than its largest TC1 cap (its share of the visits when the stage-0 nodes are the fastest)."""
    w = problem.workload
    D = int(problem.stage_sizes[0])
    caps = largest_tc1_caps(1.0 / np.asarray(problem.forward_s, dtype=float),
                            D * w.microbatches_per_data_node * (w.path_length - 1), D)
    return np.minimum(np.asarray(problem.memory, dtype=float), caps)


class _Energy:
    def __init__(self, problem: Problem, trip_floors: np.ndarray) -> None:
        self.problem = problem
        self.terms = _terms(problem)
        self.trip_floors = np.asarray(trip_floors, dtype=float)
        self.D = int(problem.stage_sizes[0])
        self.held = spans_held(problem)
        self.held_sum = float(self.held.sum())
        self.position_sets = position_sets(problem)
        self.kinds = _kinds(problem, self.held)

    def feasible(self, T: float) -> bool:
        """Whether no stretch is over-full at makespan T (see the module text)."""
        t = self.terms
        eligible = self.trip_floors <= T + 1e-12
        if eligible.sum() < self.D:
            return False
        windows = [_windows(t, forward, min(mem, t.m), T) for forward, mem, _, _ in self.kinds]
        t1, t2 = _stretches(T, windows)
        counts = np.array([int(eligible[members].sum()) for _, _, _, members in self.kinds])
        supply = self.held_sum * (t2 - t1)
        by_position = [_position_bounds(*w, t1, t2) for w in windows]
        bounds = np.stack([np.maximum(r.sum(axis=1), c.sum(axis=1)) for r, c in by_position], axis=1)
        kind_held = np.array([kind[2] for kind in self.kinds])
        values = bounds + kind_held[None, :] * (t2 - t1)[:, None]
        need = _least_need(values, counts, self.D)
        if _over_full(need, supply).any():
            return False
        sums = _RunSums([x for rc in by_position for x in rc])  # every kind's rows and columns, over runs
        for positions, places in self.position_sets:  # the stages that can host these positions
            most = most_held(self.held, eligible, self.D, places)
            both = sums.over(positions[0], positions[-1] + 1)
            part = np.maximum(both[:, 0::2], both[:, 1::2])
            if _over_full(_least_need(part, counts, self.D), most * (t2 - t1)).any():
                return False
        if t.m > ASSIGN_MAX_M:
            return True
        # the fullest stretches, any node a data node: the same ones at every eligibility
        every = np.array([len(members) for _, _, _, members in self.kinds])
        top = np.argsort(supply - _least_need(values, every, self.D), kind="stable")[:ASSIGNED_STRETCHES]
        paired = np.stack([_least_pairing(_covered(*w, t1[top], t2[top])) for w in windows], axis=1)
        need = _least_need(paired + kind_held[None, :] * (t2 - t1)[top, None], counts, self.D)
        return not _over_full(need, supply[top]).any()


def position_hosts(problem: Problem) -> list[set[int]]:
    """Per path position (0-based), the stages a visit there can be in: those at that place in
    some stage order the path rules allow (where the orders could number more than
    ``MAX_ORDERS``, a wider set: the places of an increasing order, one further each way with
    swaps)."""
    w = problem.workload
    S, P = w.num_stages, w.path_length - 1
    if math.perm(S - 1, P) > MAX_ORDERS:
        swap = 1 if w.max_swaps > 0 else 0
        return [set(range(max(1, p + 1 - swap), min(S - 1, S - P + p + swap) + 1)) for p in range(P)]
    orders = stage_sequences(S, w.path_length, w.max_swaps, w.max_jump)
    return [{order[p] for order in orders} for p in range(P)]


class _RunSums:
    """Sums of (stretches x positions) arrays over runs of positions, all arrays in one step:
    prefix sums of the finite entries and counts of the infinite ones (a run holding one sums
    to inf). With L = 50 the runs of positions are 1,175, and summing each one anew took 26 of
    the floor's 38 s."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        x = np.stack(arrays, axis=2).transpose(1, 0, 2)  # [position, stretch, array]
        finite = np.isfinite(x)
        zero = np.zeros((1, *x.shape[1:]))
        self.finite = np.concatenate([zero, np.cumsum(np.where(finite, x, 0.0), axis=0)])
        self.infinite = np.concatenate([zero, np.cumsum(~finite, axis=0)])

    def over(self, a: int, b: int) -> np.ndarray:
        """[stretch, array]: the sums over positions a..b-1."""
        return np.where(self.infinite[b] > self.infinite[a], np.inf, self.finite[b] - self.finite[a])


def position_sets(problem: Problem) -> list[tuple[list[int], int]]:
    """(path positions, how many nodes the stages that can host them have) for every run of
    consecutive positions short of all (``position_hosts`` says which stages a position can
    take)."""
    P = problem.workload.path_length - 1
    hosts = position_hosts(problem)
    if not all(hosts):
        return []
    return [(list(range(a, b + 1)), sum(problem.stage_sizes[s] for s in set().union(*hosts[a:b + 1])))
            for a in range(P) for b in range(a, P) if b - a + 1 < P]


def most_held(held: np.ndarray, eligible: np.ndarray, D: int, places: int) -> float:
    """The most spans ``places`` nodes outside stage 0 can hold at a time: the ``places``
    largest ``held`` once the D eligible nodes that hold least are taken out (taking out a
    node that holds less never leaves less)."""
    out = np.zeros(len(held), dtype=bool)
    candidates = np.flatnonzero(eligible)
    out[candidates[np.argsort(held[candidates], kind="stable")[:D]]] = True
    rest = np.sort(held[~out])[::-1]
    return float(rest[:places].sum())


def _stretches(T: float, windows: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the stretches tried: every pair of points of an even grid over [0, T]
    and of the spans' window ends, at most ``MAX_POINTS`` points (evenly chosen)."""
    points = [np.linspace(0.0, T, GRID_POINTS)]
    for start, end, span in windows:
        points += [start.ravel(), (start + span).ravel(), end.ravel(), (end - span).ravel()]
    pts = np.unique(np.clip(np.concatenate(points), 0.0, T))
    if len(pts) > MAX_POINTS:
        pts = pts[np.unique(np.linspace(0, len(pts) - 1, MAX_POINTS).round().astype(int))]
    a, b = np.triu_indices(len(pts), k=1)
    return pts[a], pts[b]


def _over_full(need: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Where the covered time is more than the room, past rounding."""
    return need > room * (1 + 1e-9) + 1e-9


def _least_need(values: np.ndarray, counts: np.ndarray, D: int) -> np.ndarray:
    """[stretch]: the sum of the D least values, ``counts[c]`` nodes having ``values[:, c]``."""
    order = np.argsort(values, axis=1, kind="stable")
    n = counts[order]
    taken = np.minimum(n, np.maximum(0, D - (np.cumsum(n, axis=1) - n)))
    return (np.where(taken > 0, np.take_along_axis(values, order, axis=1), 0.0) * taken).sum(axis=1)


def slot_energy_floor(problem: Problem, trip_floors: np.ndarray, at_least: float) -> float:
    """The least makespan, at least ``at_least``, with no over-full stretch (see the module
    text); ``trip_floors[x]``: a floor of x's own finish as a data node."""
    w = problem.workload
    if w.path_length < 2 or w.microbatches_per_data_node > MAX_M or not math.isfinite(at_least) or at_least <= 0:
        return at_least
    energy = _Energy(problem, trip_floors)
    if not (math.isfinite(energy.terms.hop) and energy.terms.hop >= 0):
        return at_least
    return least_feasible(energy.feasible, at_least, REL_TOL, first_step=1.5)
