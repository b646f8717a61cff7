"""The fastest round trips over every allocation, solved without enumerating paths.

A round trip of a data node d through L-1 = h other nodes, in any order, is a cycle
``d -> x1 -> ... -> xh -> d`` of distinct nodes. ``cheapest_cycles`` finds the least
``edge[d, x1] + w[x1] + edge[x1, x2] + ... + w[xh] + edge[xh, d]`` for every d, exactly, for
h <= 4, in O(N^3) for all data nodes together (enumeration is O(N^(h+1))):

- h <= 3: ``window_walks`` below, whose walks repeat no node within two steps, which for three
  other nodes or fewer makes them cycles;
- h = 4: ``d -> a -> b -> c -> e -> d``; for (a, c) the three best b, for (c, e) given d the
  three best e; b must avoid d and e, e must avoid a and b. Of four better middles at most two
  are excluded, so the best valid pair is among the three best of each (checked against
  enumeration by the tests).

Beyond 4 other nodes, ``window_walks`` bounds the cycle from below: the least closed walk
whose nodes avoid d and do not repeat within two steps (every cycle is one), in O(h N^2) per
data node.

``trip_terms`` uses them for R0 (the fastest round trip, with the data node's own work and
gaps) and the least time out and back that ``floors._round_trips`` enumerates on small
clusters: exact while h <= 4 and the work, about N^3 (9 N^3 for h = 4), is within
``CYCLE_WORK``; else the walk bound while h N^3 is within ``WALK_WORK``; the relaxed bounds of
``relaxed_floors`` always count too (the floors take the larger).
"""

from __future__ import annotations

import math

import numpy as np

from skippipe.planner.problem import Problem
from skippipe.planner.relaxed_floors import round_trip_terms

MAX_HOPS = 4  # the longest round trips solved exactly (L - 1 other nodes)
CYCLE_WORK = 20_000_000  # N^3 (9 N^3 with 4 hops) at most: h = 3 up to 215 nodes, h = 4 up to 130
WALK_WORK = 140_000_000  # hops x N^3 at most for the walk bound: h = 5 up to 300 nodes (about 3 s)


def _best_middles(edge: np.ndarray, w: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """For every pair (a, c): the k least ``edge[a, b] + w[b] + edge[b, c]`` (b not a, not c;
    ``edge`` has inf on its diagonal), ascending, and those b."""
    n = len(w)
    k = min(k, n)
    vals = np.full((n, n, k), math.inf)
    args = np.zeros((n, n, k), dtype=int)
    for a in range(n):
        x = edge[a][:, None] + w[:, None] + edge  # [b, c]
        idx = np.argpartition(x, k - 1, axis=0)[:k] if n > k else np.argsort(x, axis=0)[:k]
        v = np.take_along_axis(x, idx, axis=0)
        order = np.argsort(v, axis=0, kind="stable")
        vals[a] = np.take_along_axis(v, order, axis=0).T
        args[a] = np.take_along_axis(idx, order, axis=0).T
    return vals, args


def cheapest_cycles(edge: np.ndarray, w: np.ndarray, hops: int) -> np.ndarray:
    """Per d: the least cycle through d and ``hops`` distinct other nodes (see the module text).
    ``edge`` is directed (row: from); its diagonal is ignored. inf where no such cycle exists."""
    if not 1 <= hops <= MAX_HOPS:
        raise ValueError(f"cheapest_cycles solves 1..{MAX_HOPS} hops, not {hops}")
    if hops <= 3:
        return window_walks(edge, w, hops)  # three in a row distinct: the walk is the cycle
    n = len(w)
    edge = np.asarray(edge, dtype=float).copy()
    np.fill_diagonal(edge, math.inf)
    w = np.asarray(w, dtype=float)
    out = np.full(n, math.inf)
    if hops >= n:
        return out
    mid, mid_at = _best_middles(edge, w, 3)
    a_idx = np.arange(n)[:, None, None, None]
    b = mid_at[:, :, :, None]  # [a, c, kb, 1]
    k = min(3, n)
    for d in range(n):
        tail = edge + w[None, :] + edge[:, d][None, :]  # [c, e]: c -> e -> d
        tail[:, d] = math.inf
        e_at = np.argpartition(tail, k - 1, axis=1)[:, :k] if n > k else np.argsort(tail, axis=1)[:, :k]
        e_val = np.take_along_axis(tail, e_at, axis=1)  # [c, k]
        e = e_at[None, :, None, :]  # [1, c, 1, ke]
        ok = (b != d) & (b != e) & (e != a_idx)
        pair = np.where(ok, mid[:, :, :, None] + e_val[None, :, None, :], math.inf)
        total = (edge[d] + w)[:, None] + pair.min(axis=(2, 3)) + w[None, :]  # d -> a, then a's work
        np.fill_diagonal(total, math.inf)
        total[d, :] = math.inf
        total[:, d] = math.inf
        out[d] = total.min()
    return out


def window_walks(edge: np.ndarray, w: np.ndarray, hops: int) -> np.ndarray:
    """Per d: the least closed walk ``d -> x1 -> ... -> x_hops -> d`` whose x's avoid d and
    repeat no node within two steps (x_i, x_i+1, x_i+2 distinct). Every round trip is such a
    walk, so this bounds the cheapest cycle from below for any ``hops`` (it is the cycle itself
    for hops <= 3). A walk ending in (a, b) extends to c through the best predecessor of a
    that is not c: the two best predecessors of each a suffice. O(hops N^2) per d."""
    n = len(w)
    edge = np.asarray(edge, dtype=float).copy()
    np.fill_diagonal(edge, math.inf)
    w = np.asarray(w, dtype=float)
    out = np.full(n, math.inf)
    if hops < 1 or hops >= n:
        return out
    if hops == 1:
        return (edge + w[None, :] + edge.T).min(axis=1)
    nodes = np.arange(n)
    for d in range(n):
        walk = (edge[d] + w)[:, None] + edge + w[None, :]  # [x1, x2]
        walk[d, :] = walk[:, d] = math.inf
        for _ in range(hops - 2):
            two = np.argpartition(walk, 1, axis=0)[:2]  # the two best predecessors of each a, best first
            best, second = walk[two[0], nodes], walk[two[1], nodes]
            into = np.where(two[0][:, None] == nodes[None, :], second[:, None], best[:, None])  # [a, c]
            walk = into + edge + w[None, :]
            walk[d, :] = walk[:, d] = math.inf
        out[d] = (walk + edge[:, d][None, :]).min()
    return out


def solvable(problem: Problem) -> bool:
    """Whether ``trip_terms`` solves this problem exactly: paths through at most ``MAX_HOPS``
    other nodes, and the work within ``CYCLE_WORK``."""
    hops = problem.workload.path_length - 1
    return 1 <= hops <= MAX_HOPS and problem.n**3 * (9 if hops == 4 else 1) <= CYCLE_WORK


def trip_terms(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(R0, time out, time back) as ``floors._round_trips`` enumerates them: solved by
    ``cheapest_cycles`` where the problem is ``solvable``, else bounded from below by
    ``window_walks`` while ``hops x N^3`` is within ``WALK_WORK``; None beyond."""
    hops = problem.workload.path_length - 1
    if solvable(problem):
        cycles = cheapest_cycles
    elif hops >= 1 and hops * problem.n**3 <= WALK_WORK:
        cycles = window_walks
    else:
        return None
    edge, visit, own, gaps = round_trip_terms(problem)
    t = np.asarray(problem.transfer_s, dtype=float)
    f = np.asarray(problem.forward_s, dtype=float)
    r0 = own + np.maximum(cycles(edge, visit, hops), gaps)
    out = cycles(t, f, hops)
    back = cycles(t, f * problem.cost_model.backward_factor, hops)
    return r0, out, back
