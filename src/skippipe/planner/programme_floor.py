"""What the programme floors (``slot_time_floor``, ``neighbour_floor``) share: the terms of a
round trip and a visit, a sparse row builder, the feasibility solve and the bisection."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, csr_matrix

from skippipe.planner.problem import Problem
from skippipe.planner.relaxed_floors import heads_and_tails, hop_edges, round_trip_terms

# a solver's "infeasible" is trusted only this far (the floor returned is lowered by it)
SAFETY = 1e-6
# linprog's status for a numerical failure, and how long the simplex may retry such a programme
SOLVE_ERROR = 4
RETRY_SECONDS = 5.0


@dataclass(frozen=True)
class SlotTerms:
    """The terms both programmes are made of, per node where an array."""

    P: int  # visits per path (L - 1)
    D: int  # data nodes
    m: int  # microbatches per data node
    visit: np.ndarray  # a visit's forward and backward (``round_trip_terms``)
    own: np.ndarray  # a data node's own forward, loss and backward
    cheapest: np.ndarray  # each node's hops (paid both ways), cheapest first
    half: np.ndarray  # half of each node's two cheapest hops (L = 2: its cheapest)
    loss: float  # the quickest loss
    head: np.ndarray  # the least time before a node's first operation
    tail: np.ndarray  # and after its last one
    og: float  # the gap after an operation
    slots: np.ndarray  # activation slots
    k: np.ndarray  # slots a data node can use, min(slots, m)
    speed: np.ndarray  # 1 / forward seconds

    @property
    def usable(self) -> bool:
        """Whether every term is finite (else the floor is skipped)."""
        terms = (self.visit, self.own, self.half, self.cheapest[:, 0], self.head, self.tail, self.slots)
        return math.isfinite(self.loss) and all(bool(np.isfinite(a).all()) for a in terms)


def slot_terms(problem: Problem) -> SlotTerms:
    """The ``SlotTerms`` of a problem."""
    w, cm = problem.workload, problem.cost_model
    P, m = w.path_length - 1, w.microbatches_per_data_node
    f = np.asarray(problem.forward_s, dtype=float)
    _, visit, own, _ = round_trip_terms(problem)
    cheapest = np.sort(hop_edges(problem), axis=1)
    head, tail = heads_and_tails(problem)
    slots = np.asarray(problem.memory, dtype=float)
    return SlotTerms(
        P=P, D=int(problem.stage_sizes[0]), m=m, visit=visit, own=own, cheapest=cheapest,
        half=cheapest[:, 0] if P == 1 else cheapest[:, :2].sum(axis=1) / 2.0,
        loss=cm.loss_factor * float(f.min()), head=head, tail=tail, og=cm.op_gap_s, slots=slots,
        k=np.minimum(slots, m), speed=1.0 / f,
    )


class Rows:
    """A sparse matrix built a block of entries at a time."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []

    def add(self, row, col, val) -> None:
        """Entries at ``col`` (variable indices, any shape), rows and values broadcast to it."""
        self.rows.append(np.broadcast_to(row, np.shape(col)).ravel())
        self.cols.append(np.ravel(col))
        self.vals.append(np.broadcast_to(val, np.shape(col)).ravel())

    def matrix(self, shape: tuple[int, int]) -> csr_matrix:
        return coo_matrix((np.concatenate(self.vals), (np.concatenate(self.rows), np.concatenate(self.cols))),
                          shape=shape).tocsr()


def admits(n_vars: int, a_ub, b_ub, a_eq, b_eq, bounds) -> bool:
    """Whether the programme has a solution; only a proven infeasibility says no. HiGHS's
    interior-point solver: its simplex cycled without end on one programme of sweep case 72.
    Where the interior-point solver stops on a solve error (near the least feasible makespan
    of some programmes: a generated 11-node cluster answered feasible at 19.386 and 19.395 s,
    infeasible at 19.40 s, and proved feasible only from 19.415 s), the dual simplex is asked,
    within ``RETRY_SECONDS``; an answer neither gives counts as a solution."""
    args = dict(A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds)
    result = linprog(np.zeros(n_vars), method="highs-ipm", **args)
    if result.status == SOLVE_ERROR:
        result = linprog(np.zeros(n_vars), method="highs-ds", options={"time_limit": RETRY_SECONDS}, **args)
    return bool(result.status != 2)


def least_feasible(feasible: Callable[[float], bool], at_least: float, rel_tol: float, first_step: float) -> float:
    """The least T >= ``at_least`` with ``feasible(T)`` (feasibility grows with T), within
    ``rel_tol`` of T and lowered by ``SAFETY``; the bracket grows from ``first_step`` x
    ``at_least``, doubling. Every T below the answer was shown infeasible, so it is a floor."""
    if feasible(at_least):
        return at_least
    lo, hi = at_least, first_step * at_least
    for _ in range(60):
        if feasible(hi):
            break
        lo, hi = hi, 2.0 * hi
    else:
        return max(at_least, lo * (1.0 - SAFETY))
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    return max(at_least, lo * (1.0 - SAFETY))
