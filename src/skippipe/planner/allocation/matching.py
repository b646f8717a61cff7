"""Bottleneck bipartite matchings: the slowest hop the best set of disjoint a -> b links must use.

The cost of going from one stage's nodes to the next stage's nodes is the bottleneck of a
matching between them (every node of the smaller group paired with a distinct node of the other).
Small problems are brute-forced over injective assignments; larger ones bisect over the distinct
link costs with a maximum bipartite matching as the feasibility test.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from functools import lru_cache

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

# Brute force a bottleneck matching when it has at most this many injective assignments.
_BRUTE_FORCE_LIMIT = 720


def bottleneck_matching(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Match min(r, c) rows of an r x c cost matrix to distinct columns, minimising the largest
    matched cost (the bottleneck); among those matchings, the one with the smallest total.

    Returns (rows, cols, bottleneck) with rows ascending; an empty matrix gives a bottleneck of 0.
    """
    cost = np.asarray(cost, dtype=float)
    if cost.ndim != 2:
        raise ValueError("bottleneck_matching needs a 2-D cost matrix")
    r, c = cost.shape
    if r == 0 or c == 0:
        return np.zeros(0, dtype=int), np.zeros(0, dtype=int), 0.0
    threshold = _bottleneck_value(cost)
    allowed = cost <= threshold
    finite = cost[allowed]
    penalty = float(np.abs(finite).sum()) + 1.0 + float(np.abs(cost[np.isfinite(cost)]).max(initial=0.0))
    rows, cols = linear_sum_assignment(np.where(allowed, cost, penalty))
    assert np.all(allowed[rows, cols]), "bottleneck matching: min-sum step left the threshold"
    return rows.astype(int), cols.astype(int), float(threshold)


def _bottleneck_value(cost: np.ndarray) -> float:
    """Only the bottleneck of ``bottleneck_matching`` (fast: brute force when tiny, else a
    binary search over thresholds with a maximum bipartite matching at each)."""
    if cost.shape[0] > cost.shape[1]:
        cost = cost.T
    k, c = cost.shape
    if k == 0:
        return 0.0
    if k == 1:
        return float(cost.min())
    cells = _injective_cells(c, k)
    if cells is not None:
        return float(cost.ravel()[cells].max(axis=1).min())
    # every row must be matched: the bottleneck is at least the worst row's best link
    # (and, when square, the worst column's best link); it is often exactly that
    low = float(cost.min(axis=1).max())
    if k == c:
        low = max(low, float(cost.min(axis=0).max()))
    if k <= 16:
        values = np.unique(cost[cost >= low])
        feasible = _small_feasibility(cost)
    else:
        # the min-sum assignment's worst link bounds the bottleneck from above
        rows, cols = linear_sum_assignment(cost)
        high = float(cost[rows, cols].max())
        values = np.unique(cost[(cost >= low) & (cost <= high)])

        def feasible(t: float) -> bool:
            return _has_full_matching(cost <= t)

    if feasible(values[0]):
        return float(values[0])
    lo, hi = 1, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(values[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(values[lo])


def _has_full_matching(adjacency: np.ndarray) -> bool:
    """Can every row (rows <= columns) be matched to its own column? (scipy, large graphs)"""
    k, c = adjacency.shape
    counts = adjacency.sum(axis=1)
    if not counts.all():
        return False
    indptr = np.zeros(k + 1, dtype=np.int32)
    np.cumsum(counts, out=indptr[1:])
    indices = np.nonzero(adjacency)[1].astype(np.int32)
    graph = csr_matrix((np.ones(indices.size, dtype=np.int8), indices, indptr), shape=(k, c))
    match = maximum_bipartite_matching(graph, perm_type="column")
    return bool(np.all(match >= 0))


def _small_feasibility(cost: np.ndarray):
    """For small graphs: a test 'can every row get its own column at cost <= t?' by Kuhn's
    augmenting paths over each row's columns sorted by cost (pure Python, no set-up per t)."""
    order = np.argsort(cost, axis=1, kind="stable")
    cols = order.tolist()
    sorted_costs = np.take_along_axis(cost, order, axis=1).tolist()

    def feasible(t: float) -> bool:
        adj = [row_cols[: bisect_right(row_costs, t)] for row_cols, row_costs in zip(cols, sorted_costs)]
        owner: dict[int, int] = {}
        return all(_augment(r, adj, owner, set()) for r in range(len(adj)))

    return feasible


def _augment(r: int, adj: list[list[int]], owner: dict[int, int], seen: set[int]) -> bool:
    """Kuhn's augmenting path from row r (a module function: a nested recursive one would make
    a reference cycle per call, left to the garbage collector)."""
    for col in adj[r]:
        if col in seen:
            continue
        seen.add(col)
        if col not in owner or _augment(owner[col], adj, owner, seen):
            owner[col] = r
            return True
    return False


@lru_cache(maxsize=64)
def _injective_cells(c: int, k: int) -> np.ndarray | None:
    """All injective maps of k rows into c columns, one per row of the array, each as the flat
    indices of its cells in a k x c matrix, when there are few enough."""
    if math.perm(c, k) > _BRUTE_FORCE_LIMIT:
        return None
    maps = np.array(list(itertools.permutations(range(c), k)), dtype=int).reshape(-1, k)
    return np.arange(k) * c + maps
