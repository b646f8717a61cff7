"""Floors over every allocation that scale to 1,000 nodes (relaxations, no enumeration).

``relaxed_round_trips`` bounds the round trips of ``floors._round_trips`` from below without
enumerating paths. A round trip of a data node d through L-1 other nodes is a cycle of L
distinct nodes; every hop is paid forward and backward (``edge = t + t.T``). The cycle's edges
sum to half the sum, over its nodes, of the two cycle edges at each node, so it is at least
half the sum of each node's two cheapest edges (``a2``). With ``key[x] = visit[x] + a2[x] / 2``
the round trip is at least ``own[d] + max(a2[d] / 2 + (sum of the L-1 smallest keys but d), gaps)``
(with L = 2 the cycle is one edge twice: its cheapest one is used instead).

``capacity_floor`` bounds every plan by the work the nodes outside stage 0 can do. Whatever
the allocation, D data nodes run their own microbatches and the D*m*(L-1) visits go to the
other nodes. A node x serving c visits runs 2c operations (forward and backward) with an
``op_gap`` after each but the last, all after the first forward can arrive (``head``: the
fastest injection plus hop to x from any node) and before the last backward can reach a data
node and run there (``tail``). So in time T node x serves at most
``cap_x(T) = floor((T - head - tail + og) / (visit + 2 og))`` visits. A visit also holds one of
x's M_x activation slots from its forward to its backward there, at least ``hold`` = the visit,
the cheapest hop out of x and back and the quickest loss, so x serves at most
``M_x * floor((T - head - tail) / hold)`` visits. T is feasible only if D
nodes reach their own floor (``trip_floor``) by T and the other nodes' caps sum to the visits;
the D data nodes that lose the least capacity are the eligible ones with the smallest caps.
Feasibility grows with T, so the least feasible T (bisection) bounds every plan.
"""

from __future__ import annotations

import math

import numpy as np

from skippipe.planner.problem import Problem


def round_trip_terms(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """What a round trip is made of, for the floors: ``edge`` (N x N, a hop paid both ways:
    activation out, gradient back), ``visit`` (a visited node's forward and backward), ``own``
    (the data node's forward, loss and backward) and ``gaps`` (the data node's inject and op
    gaps, its least round trip when the path is quicker)."""
    t = np.asarray(problem.transfer_s, dtype=float)
    f = np.asarray(problem.forward_s, dtype=float)
    cm = problem.cost_model
    visit = f * (1.0 + cm.backward_factor)
    own = f * (1.0 + cm.backward_factor + cm.loss_factor)
    return t + t.T, visit, own, cm.inject_gap_s + cm.op_gap_s


def tuple_lag_parts(problem: Problem, tuples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node tuple (P x hops, visited in order): the time between its first and last node
    out (their forwards and the hops between them) and back (their backwards and the hops
    back). A data node's time out and time back add its own hops at both ends."""
    t = np.asarray(problem.transfer_s, dtype=float)
    f = np.asarray(problem.forward_s, dtype=float)
    b = f * problem.cost_model.backward_factor
    hops = tuples.shape[1]
    inner_out = f[tuples].sum(axis=1) + sum(t[tuples[:, i], tuples[:, i + 1]] for i in range(hops - 1))
    inner_back = b[tuples].sum(axis=1) + sum(t[tuples[:, i + 1], tuples[:, i]] for i in range(hops - 1))
    return inner_out, inner_back


def hop_edges(problem: Problem) -> np.ndarray:
    """``round_trip_terms``' edges with no edge from a node to itself (infinite)."""
    edge = round_trip_terms(problem)[0]
    np.fill_diagonal(edge, math.inf)
    return edge


def _smallest_excluding(keys: np.ndarray, k: int, exclude: list[np.ndarray]) -> np.ndarray:
    """Sum of the k smallest ``keys`` leaving out the indices in ``exclude`` (arrays of one shape)."""
    if k <= 0:
        return np.zeros(exclude[0].shape)
    order = np.argsort(keys, kind="stable")
    rank = np.empty(len(keys), dtype=int)
    rank[order] = np.arange(len(keys))
    prefix = np.concatenate([[0.0], np.cumsum(keys[order])])
    ranks = [rank[e] for e in exclude]
    distinct = [np.ones(exclude[0].shape, dtype=bool)] + [
        np.all([exclude[j] != exclude[i] for i in range(j)], axis=0) for j in range(1, len(exclude))]
    count = np.zeros(exclude[0].shape, dtype=int)
    for _ in range(len(exclude) + 1):
        count = sum(((r < k + count) & ok).astype(int) for r, ok in zip(ranks, distinct))
    total = prefix[np.minimum(k + count, len(keys))]
    for e, r, ok in zip(exclude, ranks, distinct):
        total = total - np.where(ok & (r < k + count), keys[e], 0.0)
    return total


def relaxed_round_trips(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Lower bounds on R0[d] and RA[d, x] of ``floors._round_trips`` (see the module text)."""
    n = problem.n
    hops = problem.workload.path_length - 1
    edge = hop_edges(problem)
    _, visit, own, gaps = round_trip_terms(problem)
    nodes = np.arange(n)
    if hops <= 1:
        ra = own[:, None] + np.maximum(edge + visit[None, :], gaps)  # exact: d -> x -> d
        np.fill_diagonal(ra, math.inf)
        return ra.min(axis=1), ra
    two = np.sort(edge, axis=1)[:, :2].sum(axis=1)
    key = visit + two / 2.0
    r0 = own + np.maximum(two / 2.0 + _smallest_excluding(key, hops, [nodes]), gaps)
    dd, xx = np.meshgrid(nodes, nodes, indexing="ij")
    rest = _smallest_excluding(key, hops - 1, [dd, xx])
    ra = own[:, None] + np.maximum(two[:, None] / 2.0 + key[None, :] + rest, gaps)
    np.fill_diagonal(ra, math.inf)
    return r0, ra


def relaxed_lags(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Lower bounds on the least time a microbatch of d is away before its loss (hops out,
    forwards, hop back) and after it (hops and backwards back), over any L-1 distinct other
    nodes. Either way the hops form a cycle through d in ``transfer_s``, in which every node
    has one outgoing and one incoming hop: at least its cheapest one. So the time is at least
    that hop of d plus the L-1 smallest ``op + hop`` of the other nodes (the larger of the
    outgoing and the incoming count)."""
    n = problem.n
    hops = problem.workload.path_length - 1
    if hops <= 0:
        return np.zeros(n), np.zeros(n)
    t = np.asarray(problem.transfer_s, dtype=float).copy()
    np.fill_diagonal(t, math.inf)
    f = np.asarray(problem.forward_s, dtype=float)
    nodes = np.arange(n)
    lags = []
    for op in (f, f * problem.cost_model.backward_factor):
        best = np.zeros(n)
        for cheapest in (t.min(axis=1), t.min(axis=0)):  # outgoing, incoming
            best = np.maximum(best, cheapest + _smallest_excluding(op + cheapest, hops, [nodes]))
        lags.append(best)
    return lags[0], lags[1]


def heads_and_tails(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Per node x, the least time before its first operation (the quickest forward on another
    node plus the hop to x) and after its last one (the hop back from x and the quickest
    backward there)."""
    f = np.asarray(problem.forward_s, dtype=float)
    t = np.asarray(problem.transfer_s, dtype=float).copy()
    np.fill_diagonal(t, math.inf)
    head = (f[:, None] + t).min(axis=0)  # the first forward reaching x
    tail = (t + problem.cost_model.backward_factor * f[None, :]).min(axis=1)  # the last backward leaving x
    return head, tail


def served_visits(T: float, head: np.ndarray, tail: np.ndarray, visit: np.ndarray, og: float) -> np.ndarray:
    """The most visits each node can serve by time T: a forward and a backward each, an
    ``og`` gap after every operation but the last, all between ``head`` and ``T - tail``."""
    return np.maximum(0.0, np.floor((T - head - tail + og) / (visit + 2 * og) + 1e-9))


def capacity_floor(problem: Problem, trip_floors: np.ndarray, tol: float = 1e-6) -> float:
    """The least T at which D data nodes finish their own work and the others can serve every
    visit (see the module text); a floor over every allocation."""
    w = problem.workload
    cm = problem.cost_model
    D = int(problem.stage_sizes[0])
    visits = D * w.microbatches_per_data_node * (w.path_length - 1)
    if visits == 0:
        return float(np.sort(trip_floors)[D - 1])
    f = np.asarray(problem.forward_s, dtype=float)
    og = cm.op_gap_s
    head, tail = heads_and_tails(problem)
    _, visit, _, _ = round_trip_terms(problem)
    hold = visit + hop_edges(problem).min(axis=1) + cm.loss_factor * f.min()
    slots = np.asarray(problem.memory, dtype=float)

    def feasible(T: float) -> bool:
        cap = served_visits(T, head, tail, visit, og)
        cap = np.minimum(cap, slots * np.maximum(0.0, np.floor((T - head - tail) / hold + 1e-9)))
        eligible = np.flatnonzero(trip_floors <= T + 1e-12)
        if len(eligible) < D:
            return False
        lost = np.sort(cap[eligible])[:D].sum()
        return cap.sum() - lost >= visits

    lo = float(np.sort(trip_floors)[D - 1])
    if feasible(lo):
        return lo
    hi = max(lo, 1.0) * 2.0
    while not feasible(hi):
        hi *= 2.0
    while hi - lo > tol * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    return lo  # infeasible, so every plan takes longer
