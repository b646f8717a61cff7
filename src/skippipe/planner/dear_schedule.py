"""The floor of a data-node set from its data nodes' own schedules when some microbatches must
take dear trips (for ``set_floor.SetFloor``; torch-free).

``serial_floor.serial_trip_floor`` solves a data node's own operations (injection, loss, final
backward, one at a time, at most k microbatches out) with every microbatch away for at least
the fastest time out and time back. ``set_floor.dear_visits_floor`` counts how many
microbatches the TC1 caps force onto dear nodes, but as whole round trips on slot chains,
without the data node's own work between them. This term does both at once:

- for a set D, take any set C of *cheap* nodes outside D (here: the nodes in order of their
  fastest round trip from D, every prefix). The nodes of C take at most their TC1 caps, so at
  least V = visits - caps(C) visits land on the other nodes, the *dear* ones;
- a microbatch of d visits L-1 distinct nodes outside D (stage 0 holds only the data nodes,
  and a path visits it only at its own one, CC2), so it is of one of three kinds: no dear
  visit, one, or two or more (at most ``top`` = min(L-1, dear nodes) of them). Each kind is
  away at least the least time out and the least time back over the node tuples of its kind
  (d's tuples: every L-1 distinct nodes outside D, in any order, a relaxation of the stage
  rules), lowered so that the kinds' times do not decrease with the dear visits;
- with a1 microbatches of the second kind and a2 of the third, d finishes no sooner than its
  own schedule with those lags (``serial_floor.kinds_schedule``, the search of
  ``serial_trip_floor`` with several kinds: the microbatches of one kind are alike, so each
  kind's operations may be taken first in, first out), and the microbatches of D cover at
  least V dear visits: the sum over d of a1 + top x a2 is at least V;
- so the least T at which every d can take a share (a1, a2) with a finish at most T, the
  shares covering V, bounds every plan with data nodes D; the term is the largest over the
  prefixes C.

Each question "can d finish before T with this share?" is a search with T as its cutoff that
stops at the first schedule below T. Finishes never decrease when a lag grows, so an answer
found under longer lags (a yes) or shorter ones (a no) is reused; the lags are rounded down to
``LAG_QUANTUM_S`` and T to ``RESOLUTION_S`` so that sets and prefixes ask the same questions.
Everything is counted in search steps and look-ups, never timed: a search stops at
``MAX_STEPS`` and the term at ``BUDGET_STEPS`` over every set of a problem (then every
question is answered yes, which keeps the floor valid); each set costs the budget one step per
``TUPLES_PER_STEP`` tuples x data nodes, and the term is skipped where the problem has more
than ``MAX_TUPLES`` node tuples.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from skippipe.planner.problem import Problem
from skippipe.planner.relaxed_floors import tuple_lag_parts
from skippipe.serial_floor import MAX_STEPS, kinds_schedule

MAX_TUPLES = 200_000  # node tuples (L-1 distinct nodes in order) of a problem at most (else no term)
TUPLES_PER_STEP = 50  # a set's tuples x data nodes count this many to one step of the budget
RESOLUTION_S = 0.05  # the finishes asked about are multiples of this
LAG_QUANTUM_S = 0.05  # lags rounded down to this, so that answers are reused
MAX_FINISH_S = 1e7  # the least cover is not searched beyond this (the term then gives it)
BUDGET_STEPS = 600_000  # search steps and look-ups over every set of one problem at most (about 4 s of CPU)

@dataclass
class DearSchedules:
    """``dear_schedule_floor`` for the sets of one problem: what the searches found (for each
    data node's speed, slots and share of kinds: lags under which the finish is below some T,
    and lags under which it is not) and a budget of search steps and look-ups over every set
    (``budget``; once spent, every question is answered yes, which keeps the floor valid)."""

    problem: Problem
    budget: int = field(default_factory=lambda: BUDGET_STEPS)
    spent: int = 0
    known: dict = field(default_factory=dict)  # (speed, slots, share, lags) -> [lb, ub]
    found: dict = field(default_factory=dict)  # (speed, slots, share) -> ([(lags, ub)], [(lags, lb)])
    covered: dict = field(default_factory=dict)  # (speed, slots, kinds' lags, top, T) -> ``_most_covered``
    hint: int | None = None  # the prefix that decided the last set
    tuples: np.ndarray | None = None  # every L-1 distinct nodes in order (made on first use)
    parts: tuple[np.ndarray, np.ndarray] | None = None  # ``tuple_lag_parts`` of ``tuples``
    lags: dict = field(default_factory=dict)  # d -> (time out, time back) over ``tuples``

    def lags_of(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        """Time out and time back of d's microbatches over every tuple (tuples through d too),
        as ``floors._enumerated_trips`` counts them."""
        if self.tuples is None:
            pv = self.problem.workload.path_length - 1
            self.tuples = np.array(list(itertools.permutations(range(self.problem.n), pv)), dtype=np.int32).reshape(-1, pv)
        if self.parts is None:
            self.parts = tuple_lag_parts(self.problem, self.tuples)
        if d not in self.lags:
            t = np.asarray(self.problem.transfer_s, dtype=float)
            first, last = self.tuples[:, 0], self.tuples[:, -1]
            self.lags[d] = (t[d, first] + self.parts[0] + t[last, d], t[d, last] + self.parts[1] + t[first, d])
        return self.lags[d]

    def below(self, d: int, shares: tuple[int, int, int], lags: tuple, T: float) -> bool:
        """Can d's own operations, with ``shares`` microbatches of the three kinds, finish before T?

        A finish never decreases when a lag grows, so an answer found under other lags answers
        this one where those lags are all at least these (a yes) or all at most (a no). The lags
        come rounded down to ``LAG_QUANTUM_S`` (``_kind_lags``)."""
        p, cm = self.problem, self.problem.cost_model
        flat = tuple(x if c else 0.0 for c, lag in zip(shares, lags) for x in lag)
        forward, slots = float(p.forward_s[d]), max(1, min(int(p.memory[d]), sum(shares)))
        self.spent += 1
        bounds = self.known.setdefault((forward, slots, shares, flat), [0.0, math.inf])
        if bounds[1] < T:
            return True
        if bounds[0] >= T:
            return False
        yes, no = self.found.setdefault((forward, slots, shares), ([], []))
        self.spent += len(yes) + len(no)
        if any(ub < T and all(a >= b for a, b in zip(other, flat)) for other, ub in yes):
            return True
        if any(lb >= T and all(a <= b for a, b in zip(other, flat)) for other, lb in no):
            return False
        if self.spent > self.budget:
            return True  # not searched: a yes keeps the floor valid
        kinds = [(c, flat[2 * i], flat[2 * i + 1]) for i, c in enumerate(shares)]
        value, steps = kinds_schedule(forward, kinds, slots, cm.loss_factor, cm.backward_factor, cm.inject_gap_s,
                                      cm.op_gap_s, T, first_below=True)
        self.spent += steps
        if steps > MAX_STEPS:
            return True
        if value < T:
            bounds[1] = value
            yes.append((flat, value))
            return True
        bounds[0] = max(bounds[0], T)
        no.append((flat, T))
        return False


def _kind_lags(out: np.ndarray, back: np.ndarray, dear_count: np.ndarray, top: int) -> tuple:
    """((out, back) of the kinds no / one / two or more dear visits), the least over their tuples,
    lowered so that they do not decrease from one kind to the next."""
    lags = []
    for sel in (dear_count == 0, dear_count == 1, dear_count >= 2 if top >= 2 else np.zeros_like(dear_count, bool)):
        lags.append((float(out[sel].min()) if sel.any() else math.inf, float(back[sel].min()) if sel.any() else math.inf))
    for i in (1, 0):  # a kind's lags at most the next kind's: more dear visits never lower a finish
        lags[i] = (min(lags[i][0], lags[i + 1][0]), min(lags[i][1], lags[i + 1][1]))
    # rounded down (a shorter lag never delays a finish), so sets with nearly the same trips
    # ask the same questions
    return tuple(tuple(math.floor(x / LAG_QUANTUM_S) * LAG_QUANTUM_S if math.isfinite(x) else x for x in lag)
                 for lag in lags)


def dear_schedule_floor(ds: DearSchedules, data: tuple[int, ...], others: np.ndarray, caps: np.ndarray,
                        through: np.ndarray, visits: int, floor_so_far: float, cutoff: float = math.inf) -> float:
    """The term of the module text for the set ``data`` (0 where it is skipped or cannot raise
    ``floor_so_far``; ``cutoff`` where it is at least that). ``others``: the nodes outside the set,
    with TC1 caps ``caps`` and fastest round trip from the set ``through`` (the order the cheap
    prefixes are taken in)."""
    p = ds.problem
    m, pv = p.workload.microbatches_per_data_node, p.workload.path_length - 1
    if pv <= 0 or visits <= 0 or math.perm(p.n, pv) > MAX_TUPLES or ds.spent > ds.budget:
        return 0.0
    lags = {d: ds.lags_of(d) for d in data}  # over every tuple (``ds.tuples``, made on first use)
    in_set = np.zeros(p.n, dtype=bool)
    in_set[list(data)] = True
    keep = ~in_set[ds.tuples].any(axis=1)  # a path visits stage 0 only at its own data node (CC2)
    tuples = ds.tuples[keep]
    if not len(tuples):
        return 0.0
    ds.spent += len(tuples) * len(data) // TUPLES_PER_STEP
    lags = {d: (out[keep], back[keep]) for d, (out, back) in lags.items()}
    order = np.argsort(through, kind="stable")
    cost = through[order]
    dear_visits = visits - np.concatenate([[0], np.cumsum(caps[order])[:-1]])
    value = 0.0
    levels = list(range(1, len(order)))
    if ds.hint in levels:  # the prefix that decided the last set first: it often decides this one
        levels.remove(ds.hint)
        levels.insert(0, ds.hint)
    for j in levels:
        V = int(dear_visits[j])
        if V <= 0 or not math.isfinite(cost[j]) or cost[j] == cost[j - 1] or ds.spent > ds.budget:
            continue
        top = min(pv, len(order) - j)
        if V > len(data) * m * top:
            return math.inf  # a microbatch visits a node at most once: no plan has these data nodes
        dear = np.zeros(p.n, dtype=bool)
        dear[others[order[j:]]] = True
        dear_count = dear[tuples].sum(axis=1)
        kind_lags = {d: _kind_lags(*lags[d], dear_count, top) for d in data}
        at_cutoff = math.floor(cutoff / RESOLUTION_S) if cutoff < math.inf else None
        if at_cutoff is not None and not _covers(ds, data, kind_lags, m, top, V, at_cutoff):
            ds.hint = j
            return at_cutoff * RESOLUTION_S  # not below the best set: enough
        level = math.floor(max(value, floor_so_far) / RESOLUTION_S)
        if _covers(ds, data, kind_lags, m, top, V, level):
            continue  # the data nodes can take the dear visits before ``level``: nothing to raise
        ds.hint = j
        value = max(value, _least_cover(ds, data, kind_lags, m, top, V, level, at_cutoff) * RESOLUTION_S)
    return value


def _most_covered(ds: DearSchedules, d: int, lags: tuple, m: int, top: int, T: float) -> int:
    """The most dear visits d can take with a finish below T (-1 when none): the largest
    a1 + top x a2 over the shares whose finish is below T. Finishes do not decrease with a1 or
    a2, so the shares below T form a staircase, walked with a2 up and a1 down."""
    key = (float(ds.problem.forward_s[d]), int(ds.problem.memory[d]), lags, top, T)
    if key not in ds.covered:
        ds.covered[key] = _walk_staircase(ds, d, lags, m, top, T)
    return ds.covered[key]


def _walk_staircase(ds: DearSchedules, d: int, lags: tuple, m: int, top: int, T: float) -> int:
    """``_most_covered``, searched."""
    most, a1 = -1, m
    for a2 in range(m + 1):
        a1 = min(a1, m - a2)
        while a1 >= 0 and not ds.below(d, (m - a1 - a2, a1, a2), lags, T):
            a1 -= 1
        if a1 < 0:
            break
        most = max(most, a1 + top * a2)
    return most


def _covers(ds: DearSchedules, data, kind_lags, m: int, top: int, V: int, at: int) -> bool:
    """Can every data node take a share finishing before T = ``at`` x ``RESOLUTION_S``, the
    shares covering V visits? (T on that grid, so that the sets and prefixes ask the same
    questions and the answers are looked up.)"""
    T = at * RESOLUTION_S
    total = 0
    for d in data:
        most = _most_covered(ds, d, kind_lags[d], m, top, T)
        if most < 0:
            return False
        total += most
    return total >= V


def _least_cover(ds: DearSchedules, data, kind_lags, m: int, top: int, V: int, level: int,
                 covered: int | None = None) -> int:
    """The largest T found (in steps of ``RESOLUTION_S``, by doubling, then bisection) at which
    the data nodes cannot take the dear visits, given that they cannot at ``level`` and can at
    ``covered``: no plan with these data nodes finishes before it."""
    lo = level  # not covered at lo
    step = max(1, covered - lo if covered is not None else math.ceil(0.02 * lo))
    while not _covers(ds, data, kind_lags, m, top, V, lo + step):
        lo += step
        step *= 2
        if lo * RESOLUTION_S > MAX_FINISH_S or ds.spent > ds.budget:
            return lo
    hi = lo + step  # covered at hi
    while hi - lo > 1 and ds.spent <= ds.budget:
        mid = (lo + hi) // 2
        if _covers(ds, data, kind_lags, m, top, V, mid):
            hi = mid
        else:
            lo = mid
    return lo
