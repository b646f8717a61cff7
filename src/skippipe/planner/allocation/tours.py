"""Stage tours: the order of stages 1..S-1 as the cheapest closed tour through stage 0, where only
groups of equal size may trade places (exhaustive for few stages, Held-Karp, then 2-opt)."""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np

# stages a tour takes by Held-Karp at most (exact; 2-opt beyond). The allocation's search asks for
# thousands of tours: at 13 stages (1.3 ms each) they took 24 of a 40-node plan's 54 CPU seconds
# (S = 13, L = 7: planned in 20.1 s, 10.4 s with 11; S = 12, L = 5: 11.7 -> 7.8 s, the same plan)
HELD_KARP_MOST = 11


def best_tour(
    pair_cost: np.ndarray, group_sizes: list[int] | None = None, slot_sizes: list[int] | None = None
) -> tuple[list[int], float]:
    """Cheapest closed tour through all stages starting at stage 0 (symmetric costs).

    ``order[i]`` is the group at pipeline position i. With ``group_sizes`` and ``slot_sizes``
    (nodes per group, nodes wanted at each position) only orders that put a group of the right
    size at every position count, so unequal stage sizes stay where the workload wants them.
    Exact up to 8 stages (enumeration) and up to ``HELD_KARP_MOST`` (Held-Karp, 30 times quicker
    than enumeration at 9); beyond that nearest neighbour followed by 2-opt. Of the two directions
    of a tour, the one whose first hop is cheaper.
    """
    s = pair_cost.shape[0]
    if s == 1:
        return [0], 0.0
    if group_sizes is None or slot_sizes is None:
        gs = want = np.ones(s, dtype=int)  # no size constraint
    else:
        gs, want = np.asarray(group_sizes), np.asarray(slot_sizes)
    if sorted(gs[1:].tolist()) != sorted(want[1:].tolist()) or gs[0] != want[0]:
        raise ValueError(f"best_tour: group sizes {gs.tolist()} cannot fill positions of sizes {want.tolist()}")
    if s - 1 <= 7:
        perms, hops = _fitting_tours(s, gs.astype(np.int64).tobytes(), want.astype(np.int64).tobytes())
        totals = pair_cost.ravel()[hops].sum(axis=1)
        best = int(np.argmin(totals))
        order, cost = [0, *perms[best].tolist()], float(totals[best])
    elif s <= HELD_KARP_MOST:
        order, cost = _held_karp(pair_cost, gs, want)
    else:
        order, cost = _two_opt(pair_cost, gs, want)
    reverse = [0, *reversed(order[1:])]
    if (
        len(order) > 2
        and pair_cost[0, order[-1]] < pair_cost[0, order[1]]
        and all(gs[g] == want[i] for i, g in enumerate(reverse))
    ):
        order = reverse
    return order, cost


@lru_cache(maxsize=16)
def _tour_permutations(s: int) -> np.ndarray:
    return np.array(list(itertools.permutations(range(1, s))), dtype=int).reshape(-1, s - 1)


@lru_cache(maxsize=256)
def _fitting_tours(s: int, sizes_key: bytes, want_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The orders of groups 1..s-1 that put a group of the wanted size at every position (in
    ``_tour_permutations`` order), and each closed tour's hops as flat indices into an s x s
    cost matrix. Built once per pattern of sizes: the allocation search asks for the same
    pattern tens of thousands of times (at 8 stages 5,040 orders, of which a few hundred fit)."""
    gs = np.frombuffer(sizes_key, dtype=np.int64)
    want = np.frombuffer(want_key, dtype=np.int64)
    perms = _tour_permutations(s)
    perms = perms[(gs[perms] == want[None, 1:]).all(axis=1)]
    zero = np.zeros((len(perms), 1), dtype=int)
    closed = np.concatenate([zero, perms, zero], axis=1)
    return perms, closed[:, :-1] * s + closed[:, 1:]


@lru_cache(maxsize=64)
def _held_karp_layers(m: int, fits_key: bytes) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """Per popcount layer 2..m of Held-Karp: every (mask, j) with bit j set where group j fits
    position popcount(mask), as arrays (masks, groups j, masks without j)."""
    fits = np.frombuffer(fits_key, dtype=bool).reshape(m + 1, m)
    masks = np.arange(1 << m)
    popcount = np.array([bin(x).count("1") for x in range(1 << m)])
    layers = []
    for pos in range(2, m + 1):
        layer = masks[popcount == pos]
        picked = [(layer[(layer >> j) & 1 == 1], j) for j in range(m) if fits[pos][j]]
        sel = np.concatenate([p for p, _ in picked]) if picked else np.zeros(0, dtype=int)
        js = np.concatenate([np.full(len(p), j) for p, j in picked]) if picked else np.zeros(0, dtype=int)
        layers.append((sel, js, sel ^ (1 << js)))
    return tuple(layers)


def _held_karp(cost: np.ndarray, gs: np.ndarray, want: np.ndarray) -> tuple[list[int], float]:
    """Held-Karp, one popcount layer at a time and vectorised over its (mask, j) pairs:
    ``dp[mask, j]`` (group j placed last, at position popcount(mask)) pulls from ``mask``
    without j. The layers' index arrays depend only on the sizes and are built once."""
    s = cost.shape[0]
    m = s - 1  # groups 1..s-1 are bits 0..m-1; a mask with p bits fills positions 1..p
    full = 1 << m
    fits = np.asarray(want)[:, None] == np.asarray(gs)[None, 1:]  # fits[p, j]: group j+1 may sit at p
    dp = np.full((full, m), np.inf)
    parent = np.full((full, m), -1, dtype=int)
    for j in range(m):
        if fits[1][j]:
            dp[1 << j, j] = cost[0, j + 1]
    sub = cost[1:, 1:]
    for sel, js, prev in _held_karp_layers(m, fits.tobytes()):
        if not len(sel):
            continue
        cand = dp[prev] + sub[:, js].T
        arg = cand.argmin(axis=1)
        val = cand[np.arange(len(sel)), arg]
        dp[sel, js] = val
        parent[sel, js] = np.where(np.isfinite(val), arg, -1)
    last = dp[full - 1] + cost[1:, 0]
    j = int(np.argmin(last))
    total = float(last[j])
    order, mask = [], full - 1
    while j >= 0:
        order.append(j + 1)
        pj = int(parent[mask, j])
        mask &= ~(1 << j)
        j = pj
    return [0, *reversed(order)], total


def _two_opt(cost: np.ndarray, gs: np.ndarray, want: np.ndarray) -> tuple[list[int], float]:
    s = cost.shape[0]
    order, left = [0], set(range(1, s))
    for pos in range(1, s):
        fitting = [j for j in left if gs[j] == want[pos]]
        nxt = min(fitting, key=lambda j: (cost[order[-1], j], j))
        order.append(nxt)
        left.remove(nxt)
    tour = order + [0]

    def total(t: list[int]) -> float:
        return float(sum(cost[t[i], t[i + 1]] for i in range(s)))

    improved = True
    while improved:
        improved = False
        for i in range(1, s - 1):
            for j in range(i + 1, s):
                a, b, c, d = tour[i - 1], tour[i], tour[j], tour[j + 1]
                if cost[a, c] + cost[b, d] < cost[a, b] + cost[c, d] - 1e-12:
                    trial = tour[:i] + tour[i : j + 1][::-1] + tour[j + 1 :]
                    if all(gs[g] == want[k] for k, g in enumerate(trial[:-1])):
                        tour, improved = trial, True
        for i in range(1, s - 1):  # exchange two groups of the same size
            for j in range(i + 1, s):
                if gs[tour[i]] != gs[tour[j]]:
                    continue
                swapped = {i: tour[j], j: tour[i]}  # the exchange, judged by the hops (k, k + 1) it changes
                if sum(cost[swapped.get(k, tour[k]), swapped.get(k + 1, tour[k + 1])] - cost[tour[k], tour[k + 1]]
                       for k in {i - 1, i, j - 1, j}) < -1e-12:
                    tour[i], tour[j] = tour[j], tour[i]
                    improved = True
    return tour[:-1], total(tour)
