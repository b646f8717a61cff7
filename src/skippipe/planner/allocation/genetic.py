"""Node -> stage allocation in the spirit of DT-FM's GCMA (genetic search + local refinement).

An allocation splits the N nodes into S groups of the sizes ``problem.stage_sizes``; group 0 are
the data nodes, the other groups are put in pipeline order by the cheapest closed tour through
group 0. Its fitness (lower is better) is

    worst intra-stage link  +  2 x closed tour over the stages,

where the cost of going from stage a to stage b is the bottleneck of a bipartite matching between
their nodes (the slowest hop the best set of disjoint a->b links must use), and the tour is counted
twice because activations travel forward and gradients back along it. Links are symmetrised
(max of both directions) for the same reason.

Heterogeneous compute: the data nodes run all m of their microbatches (embedding, first layers,
head and loss) and no other node can take that work, while the visits to later stages are shared
in proportion to speed (``Problem.load_caps``). So the data nodes are chosen among the nodes that
would be the best data nodes -- smallest ``m * (1 + loss + backward) * forward_s``, and with
enough memory for few round trips -- before the network is considered (``data_node_candidates``).
On a homogeneous cluster every node is a candidate and the network alone decides.

Unequal sizes: stage 0 has its own size; among stages 1..S-1 the tour may only reorder groups of
equal size, so ``problem.stage_sizes`` holds position by position.

Search: a small population -- nearest-neighbour "chain" and "block" constructions and random
allocations -- each first pulled apart where badly linked nodes share a stage (``separate``:
swaps that lower the count of intra-stage links as slow as the worst one, which moves where the
max is stuck), then refined by node swaps between stages; then generations of crossover
(children keep what both parents agree on), mutation and refinement. The search follows the
fitness plus a small shaping term (see ``_Evaluator.key``) and returns the allocation with the
best fitness it evaluated. Deterministic for a seed: the budget counts fitness evaluations;
``time_limit_s`` only cuts the search short (and then the result can depend on the machine's
speed). About 0.3 s for 20 nodes and 2 s for 1,000 on one core.
"""

from __future__ import annotations

import itertools
import math
import time
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from skippipe.errors import UserError
from skippipe.planner.problem import Problem

Groups = tuple[tuple[int, ...], ...]  # canonical allocation: group 0 = data nodes, the rest sorted

# Brute force a bottleneck matching when it has at most this many injective assignments.
_BRUTE_FORCE_LIMIT = 720
# A node is a data-node candidate when its score is within this factor of the D-th best.
DATA_NODE_TOLERANCE = 1.02
# Weight of the search's shaping term (see _Evaluator.key).
SHAPING_WEIGHT = 0.1
# ``separate``: at most this many drops of the worst intra-stage link, and recorded steps scored.
_SEPARATE_LEVELS = 32
_SEPARATE_SCORED = 6


# ------------------------------------------------------------------------------ matchings


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
    perms = _permutations(c, k)
    if perms is not None:
        return float(cost[np.arange(k), perms].max(axis=1).min())
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
        feasible = lambda t: _has_full_matching(cost <= t)  # noqa: E731
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

        def augment(r: int, seen: set[int]) -> bool:
            for col in adj[r]:
                if col in seen:
                    continue
                seen.add(col)
                if col not in owner or augment(owner[col], seen):
                    owner[col] = r
                    return True
            return False

        return all(augment(r, set()) for r in range(len(adj)))

    return feasible


@lru_cache(maxsize=64)
def _permutations(c: int, k: int) -> np.ndarray | None:
    """All injective maps of k rows into c columns, as an array, when there are few enough."""
    if math.perm(c, k) > _BRUTE_FORCE_LIMIT:
        return None
    return np.array(list(itertools.permutations(range(c), k)), dtype=int).reshape(-1, k)


# ------------------------------------------------------------------------------ tours


def best_tour(
    pair_cost: np.ndarray, group_sizes: list[int] | None = None, slot_sizes: list[int] | None = None
) -> tuple[list[int], float]:
    """Cheapest closed tour through all stages starting at stage 0 (symmetric costs).

    ``order[i]`` is the group at pipeline position i. With ``group_sizes`` and ``slot_sizes``
    (nodes per group, nodes wanted at each position) only orders that put a group of the right
    size at every position count, so unequal stage sizes stay where the workload wants them.
    Exact up to 9 stages (enumeration) and up to 13 (Held-Karp); beyond that nearest neighbour
    followed by 2-opt. Of the two directions of a tour, the one whose first hop is cheaper.
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
    if s - 1 <= 8:
        perms = _tour_permutations(s)
        perms = perms[(gs[perms] == want[None, 1:]).all(axis=1)]
        closed = np.concatenate([np.zeros((len(perms), 1), dtype=int), perms, np.zeros((len(perms), 1), dtype=int)], axis=1)
        totals = pair_cost[closed[:, :-1], closed[:, 1:]].sum(axis=1)
        best = int(np.argmin(totals))
        order, cost = [0, *perms[best].tolist()], float(totals[best])
    elif s <= 13:
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


def _held_karp(cost: np.ndarray, gs: np.ndarray, want: np.ndarray) -> tuple[list[int], float]:
    s = cost.shape[0]
    m = s - 1  # groups 1..s-1 are bits 0..m-1; a mask with p bits fills positions 1..p
    full = 1 << m
    fits = [[bool(gs[j + 1] == want[p]) for j in range(m)] for p in range(s)]
    dp = np.full((full, m), np.inf)
    parent = np.full((full, m), -1, dtype=int)
    for j in range(m):
        if fits[1][j]:
            dp[1 << j, j] = cost[0, j + 1]
    sub = cost[1:, 1:]
    for mask in range(1, full):
        row = dp[mask]
        if not np.isfinite(row).any():
            continue
        pos = bin(mask).count("1") + 1  # the position the next group takes
        cand = row[:, None] + sub  # from i (in mask) to j
        best_from = np.argmin(cand, axis=0)
        best_val = cand[best_from, np.arange(m)]
        for j in range(m):
            if mask & (1 << j) or not fits[pos][j]:
                continue
            nxt = mask | (1 << j)
            if best_val[j] < dp[nxt, j]:
                dp[nxt, j] = best_val[j]
                parent[nxt, j] = best_from[j]
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
                trial = list(tour)
                trial[i], trial[j] = trial[j], trial[i]
                if total(trial) < total(tour) - 1e-12:
                    tour, improved = trial, True
    return tour[:-1], total(tour)


# ------------------------------------------------------------------------------ fitness


class _Evaluator:
    """Fitness of allocations with the per-stage and per-stage-pair numbers cached."""

    def __init__(self, links: np.ndarray, slot_sizes: list[int] | None = None) -> None:
        self.links = links
        self.slot_sizes = slot_sizes
        self.intra_cache: dict[tuple[int, ...], tuple[float, float]] = {}
        self.pair_cache: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}
        self.fit_cache: dict[Groups, tuple[float, float]] = {}
        self.evaluations = 0
        self.best: tuple[float, Groups] | None = None  # lowest fitness seen

    def intra(self, group: tuple[int, ...]) -> float:
        return self.intra_stats(group)[0]

    def intra_stats(self, group: tuple[int, ...]) -> tuple[float, float]:
        """(worst, mean) link between the nodes of one stage."""
        v = self.intra_cache.get(group)
        if v is None:
            if len(group) > 1:
                idx = np.array(group)
                sub = self.links[idx[:, None], idx]
                v = (float(sub.max()), float(sub.sum()) / (len(group) * (len(group) - 1)))
            else:
                v = (0.0, 0.0)
            self.intra_cache[group] = v
        return v

    def pair(self, a: tuple[int, ...], b: tuple[int, ...]) -> float:
        key = (a, b) if a < b else (b, a)
        v = self.pair_cache.get(key)
        if v is None:
            v = _bottleneck_value(self.links[np.array(key[0])[:, None], np.array(key[1])])
            self.pair_cache[key] = v
        return v

    def pair_matrix(self, groups: Groups) -> np.ndarray:
        s = len(groups)
        m = np.zeros((s, s))
        for i in range(s):
            for j in range(i + 1, s):
                m[i, j] = m[j, i] = self.pair(groups[i], groups[j])
        return m

    def tour(self, groups: Groups, pairs: np.ndarray) -> tuple[list[int], float]:
        sizes = [len(g) for g in groups]
        return best_tour(pairs, sizes, self.slot_sizes or sizes)

    def key(self, groups: Groups) -> tuple[float, float]:
        """(search score, fitness). The max terms of the fitness leave wide plateaus (one bad
        link in a stage hides every other improvement), so the search follows the fitness plus
        a small shaping term -- per stage the worst and the mean link, and the mean stage-pair
        bottleneck -- while the best allocation by fitness alone is remembered."""
        v = self.fit_cache.get(groups)
        if v is None:
            self.evaluations += 1
            stats = [self.intra_stats(g) for g in groups]
            pairs = self.pair_matrix(groups)
            _, tour = self.tour(groups, pairs)
            s = len(groups)
            mean_pair = float(pairs.sum()) / max(1, s * (s - 1))
            fitness = max(x for x, _ in stats) + 2.0 * tour
            shape = sum(x + y for x, y in stats) + mean_pair
            v = (fitness + SHAPING_WEIGHT * shape, fitness)
            self.fit_cache[groups] = v
            if self.best is None or fitness < self.best[0]:
                self.best = (fitness, groups)
        return v


def _links(problem: Problem) -> np.ndarray:
    t = np.asarray(problem.transfer_s, dtype=float)
    return np.maximum(t, t.T)


def allocation_fitness(problem: Problem, stages: list[list[int]], ordered: bool = False) -> float:
    """Worst intra-stage link + 2 x closed tour of stage-to-stage bottleneck matchings.

    With ``ordered`` the tour follows the stages as listed (0, 1, ..., S-1, back to 0);
    otherwise the cheapest tour through stage 0, as ``allocate`` orders them.
    """
    ev = _Evaluator(_links(problem))
    groups = tuple(tuple(sorted(int(x) for x in s)) for s in stages)  # sizes as listed stay put
    intra = max(ev.intra(g) for g in groups)
    pairs = ev.pair_matrix(groups)
    s = len(groups)
    if ordered:
        tour = float(sum(pairs[i, (i + 1) % s] for i in range(s))) if s > 1 else 0.0
    else:
        tour = ev.tour(groups, pairs)[1]
    return intra + 2.0 * tour


# ------------------------------------------------------------------------------ data nodes


def data_node_scores(problem: Problem) -> np.ndarray:
    """Seconds a node would need at least as a data node: its own compute for m microbatches,
    or ceil(m / memory) round trips (its compute plus L-1 stages at the median speed)."""
    w = problem.workload
    cm = problem.cost_model
    f = np.asarray(problem.forward_s, dtype=float)
    m = w.microbatches_per_data_node
    own = f * (1.0 + cm.loss_factor + cm.backward_factor)
    round_trip = own + (w.path_length - 1) * (1.0 + cm.backward_factor) * float(np.median(f))
    trips = np.ceil(m / np.maximum(1, np.asarray(problem.memory, dtype=float)))
    return np.maximum(m * own, trips * round_trip)


def data_node_candidates(problem: Problem) -> list[int]:
    """Nodes allowed in stage 0: those whose data-node score is within 2 % of the D-th best."""
    d = problem.stage_sizes[0]
    scores = data_node_scores(problem)
    cutoff = float(np.sort(scores)[d - 1]) * DATA_NODE_TOLERANCE + 1e-12
    return [i for i in range(problem.n) if scores[i] <= cutoff]


# ------------------------------------------------------------------------------ search


@dataclass
class _Search:
    problem: Problem
    rng: np.random.Generator
    ev: _Evaluator
    sizes: list[int]
    eligible: np.ndarray  # bool per node: may be a data node
    budget: int  # fitness evaluations
    deadline: float | None

    def out_of_time(self) -> bool:
        if self.ev.evaluations >= self.budget:
            return True
        return self.deadline is not None and time.perf_counter() > self.deadline

    # -- representation: labels[node] = group; group 0 = data nodes
    def canon(self, labels: np.ndarray) -> Groups:
        s = len(self.sizes)
        groups = [tuple(int(x) for x in np.flatnonzero(labels == g)) for g in range(s)]
        return (groups[0], *sorted(groups[1:]))

    def labels_of(self, groups: Groups) -> np.ndarray:
        labels = np.empty(self.problem.n, dtype=int)
        for g, nodes in enumerate(groups):
            labels[list(nodes)] = g
        return labels

    def random_labels(self) -> np.ndarray:
        n = self.problem.n
        labels = np.empty(n, dtype=int)
        cand = np.flatnonzero(self.eligible)
        data = self.rng.choice(cand, size=self.sizes[0], replace=False)
        rest = self.rng.permutation(np.setdiff1d(np.arange(n), data))
        labels[data] = 0
        start = 0
        for g, size in enumerate(self.sizes[1:], start=1):
            labels[rest[start : start + size]] = g
            start += size
        return labels

    def walk(self) -> list[int]:
        """All nodes, nearest neighbour first from a random start."""
        n = self.problem.n
        links = self.ev.links
        start = int(self.rng.integers(n))
        order, seen = [start], np.zeros(n, dtype=bool)
        seen[start] = True
        jitter = self.rng.random((n,)) * 1e-9
        for _ in range(n - 1):
            nxt = int(np.argmin(np.where(seen, np.inf, links[order[-1]] + jitter)))
            order.append(nxt)
            seen[nxt] = True
        return order

    def chain_labels(self) -> np.ndarray:
        """Network-aware start: deal stage labels along a nearest-neighbour walk so that nearby
        nodes land in different stages (short chains, cheap stage-to-stage matchings)."""
        n = self.problem.n
        order = self.walk()
        # evenly spread label positions: stage g's i-th label sits at (i + 0.5) * n / size_g
        slots = sorted(((i + 0.5) * n / size, g) for g, size in enumerate(self.sizes) for i in range(size))
        labels = np.empty(n, dtype=int)
        for node, (_, g) in zip(order, slots):
            labels[node] = g
        return self.repair(labels, order)

    def block_labels(self) -> np.ndarray:
        """Network-aware start: cut a nearest-neighbour walk into consecutive blocks, one per
        stage (close stage members, cheap gradient averaging inside each stage)."""
        order = self.walk()
        labels = np.empty(self.problem.n, dtype=int)
        groups = self.rng.permutation(len(self.sizes))
        start = 0
        for g in groups:
            labels[order[start : start + self.sizes[g]]] = g
            start += self.sizes[g]
        return self.repair(labels, order)

    def repair(self, labels: np.ndarray, order: list[int] | None = None) -> np.ndarray:
        """Swap ineligible data nodes with eligible nodes of other stages (nearest in ``order``)."""
        bad = [v for v in range(len(labels)) if labels[v] == 0 and not self.eligible[v]]
        if not bad:
            return labels
        pos = {v: i for i, v in enumerate(order)} if order else {v: v for v in range(len(labels))}
        free = [v for v in range(len(labels)) if labels[v] != 0 and self.eligible[v]]
        for v in bad:
            w = min(free, key=lambda u: (abs(pos[u] - pos[v]), u))
            free.remove(w)
            labels[v], labels[w] = labels[w], 0
        return labels

    # -- separating badly linked nodes: cheap moves on the worst intra-stage links alone
    def separate(self, labels: np.ndarray, max_moves: int | None = None) -> np.ndarray:
        """Lower the worst intra-stage link by swaps that reduce the number of intra-stage links
        at least as slow as the current worst (a count moves where a max is stuck); whenever no
        such link is left, the worst link has dropped: record the allocation and go on. Of the
        recorded allocations the one with the best search score is returned (the shuffling can
        hurt the stage-to-stage matchings, which the score weighs against the gain)."""
        links = self.ev.links
        n, s = self.problem.n, len(self.sizes)
        labels = labels.copy()
        eligible = self.eligible
        max_moves = 4 * n if max_moves is None else max_moves
        recorded = [labels.copy()]
        onehot = np.zeros((n, s))
        cols = self.rng.permutation(n)
        moves = levels = 0
        while moves < max_moves and levels < _SEPARATE_LEVELS:
            levels += 1
            same = labels[:, None] == labels[None, :]
            np.fill_diagonal(same, False)
            intra = np.where(same, links, -np.inf)
            worst = float(intra.max())
            if not np.isfinite(worst):
                break
            slow = (links >= worst).astype(float)
            np.fill_diagonal(slow, 0.0)
            onehot[:] = 0.0
            onehot[np.arange(n), labels] = 1.0
            k = slow @ onehot  # k[x, g]: slow links from x into stage g
            while moves < max_moves:
                own = k[np.arange(n), labels]
                us = np.flatnonzero(own > 0)
                if us.size == 0:
                    recorded.append(labels.copy())
                    break
                if us.size > 32:  # large clusters: a sample of the badly placed nodes per move
                    us = np.sort(self.rng.choice(us, size=32, replace=False))
                # swap u (stage a) with w (stage b): change in the number of slow intra links
                a = labels[us][:, None]
                b = labels[None, :]
                delta = (
                    k[us[:, None], b] - slow[us][:, :]
                    - own[us][:, None]
                    + k[np.arange(n)[None, :], a] - slow[:, us].T
                    - own[None, :]
                )
                allowed = (a != b) & ~((a == 0) & ~eligible[None, :]) & ~((b == 0) & ~eligible[us][:, None])
                delta = np.where(allowed, delta, np.inf)[:, cols]  # columns in a random order
                i, j = np.unravel_index(int(np.argmin(delta)), delta.shape)
                if not delta[i, j] < 0:
                    moves = max_moves  # stuck at this level: stop
                    break
                u = int(us[i])
                w = int(cols[j])
                la, lb = int(labels[u]), int(labels[w])
                labels[u], labels[w] = lb, la
                k[:, la] += slow[:, w] - slow[:, u]
                k[:, lb] += slow[:, u] - slow[:, w]
                moves += 1
        # score a few of the recorded allocations: the first, the last, and log-spaced between
        picks = sorted({0, len(recorded) - 1, *(2**i for i in range(len(recorded).bit_length()))} & set(range(len(recorded))))
        limit = max(_SEPARATE_SCORED, 6000 // n)
        if len(recorded) <= limit:
            picks = list(range(len(recorded)))
        elif len(picks) > limit:
            picks = picks[-limit:]
        if 0 not in picks:
            picks = [0, *picks[1:]]
        canon = {i: self.canon(recorded[i]) for i in picks}
        best = min(picks, key=lambda i: self.ev.key(canon[i]))
        return recorded[best]

    # -- local refinement: first-improvement swaps between stages
    def refine(self, labels: np.ndarray) -> tuple[np.ndarray, tuple[float, float]]:
        """Swap pairs of nodes between stages while that improves the key. Nodes with the worst
        link to their own stage are tried first, each against the others in random order."""
        s = len(self.sizes)
        groups = [tuple(int(x) for x in np.flatnonzero(labels == g)) for g in range(s)]
        best = self.ev.key((groups[0], *sorted(groups[1:])))
        n = self.problem.n
        eligible = self.eligible
        links = self.ev.links
        improved = True
        while improved and not self.out_of_time():
            improved = False
            same = labels[:, None] == labels[None, :]
            badness = np.where(same, links, 0.0).max(axis=1) + self.rng.random(n) * 1e-9
            # small clusters: random order (explores better); large: worst-placed nodes first
            us = np.argsort(-badness) if n > 24 else self.rng.permutation(n)
            for u in us:
                u = int(u)
                for v in self.rng.permutation(n):
                    v = int(v)
                    lu, lv = int(labels[u]), int(labels[v])
                    if lu == lv or (lu == 0 and not eligible[v]) or (lv == 0 and not eligible[u]):
                        continue
                    gu = tuple(sorted([x for x in groups[lu] if x != u] + [v]))
                    gv = tuple(sorted([x for x in groups[lv] if x != v] + [u]))
                    trial = list(groups)
                    trial[lu], trial[lv] = gu, gv
                    key = self.ev.key((trial[0], *sorted(trial[1:])))
                    if self.out_of_time():
                        return labels, best
                    if key < best:
                        best, improved, groups = key, True, trial
                        labels[u], labels[v] = lv, lu
                        break
                if improved:
                    break
        return labels, best

    # -- crossover: keep what both parents agree on (after aligning B's stage labels to A's)
    def crossover(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        s = len(self.sizes)
        overlap = np.zeros((s - 1, s - 1))
        for g in range(1, s):
            for h in range(1, s):
                overlap[g - 1, h - 1] = np.count_nonzero((a == g) & (b == h))
        rows, cols = linear_sum_assignment(-overlap)
        remap = np.zeros(s, dtype=int)
        remap[cols + 1] = rows + 1
        b = remap[b]
        child = np.where(a == b, a, -1)
        need = [self.sizes[g] - int(np.count_nonzero(child == g)) for g in range(s)]
        loose = self.rng.permutation(np.flatnonzero(child < 0))
        # data slots first, from eligible loose nodes; if too few, take eligible agreed nodes
        data_loose = [v for v in loose if self.eligible[v]]
        for v in data_loose[: need[0]]:
            child[v] = 0
        need[0] -= min(need[0], len(data_loose))
        if need[0] > 0:
            return a.copy()
        rest = [v for v in loose if child[v] < 0]
        labels_left = [g for g in range(1, s) for _ in range(need[g])]
        for v, g in zip(rest, self.rng.permutation(labels_left)):
            child[v] = g
        return child

    def mutate(self, labels: np.ndarray, swaps: int) -> np.ndarray:
        n = self.problem.n
        out = labels.copy()
        for _ in range(swaps):
            u, v = self.rng.choice(n, size=2, replace=False)
            if out[u] == out[v]:
                continue
            if (out[u] == 0 and not self.eligible[v]) or (out[v] == 0 and not self.eligible[u]):
                continue
            out[u], out[v] = out[v], out[u]
        return out


def _default_budget(n: int, s: int) -> int:
    """Fitness evaluations the search may spend (deterministic, not time-based). An evaluation
    costs about s^2 bottleneck matchings whose size grows with n, so larger clusters get fewer."""
    if n <= 24:
        return 4000
    return max(30, int(4000 * (24 / n) ** 1.5))


def allocate(problem: Problem, seed: int = 0, time_limit_s: float | None = None) -> list[list[int]]:
    """Node -> stage allocation: stage 0 = data nodes, then the stages in pipeline order.

    A fixed allocation in the cluster (``problem.fixed_stages``) is returned unchanged.
    """
    if problem.fixed_stages is not None:
        return [list(map(int, s)) for s in problem.fixed_stages]
    sizes = list(problem.stage_sizes)
    n = problem.n
    if sum(sizes) != n or any(x < 1 for x in sizes):
        raise UserError(f"stage sizes {sizes} do not split the cluster's {n} nodes")
    rng = np.random.default_rng(seed)
    eligible = np.zeros(n, dtype=bool)
    eligible[data_node_candidates(problem)] = True
    ev = _Evaluator(_links(problem), sizes)
    deadline = None if time_limit_s is None else time.perf_counter() + float(time_limit_s)
    search = _Search(problem, rng, ev, sizes, eligible, _default_budget(n, len(sizes)), deadline)

    best_groups = _run_search(search)
    order, _ = ev.tour(best_groups, ev.pair_matrix(best_groups))
    return [sorted(best_groups[g]) for g in order]


def _run_search(search: _Search) -> Groups:
    n = search.problem.n
    pop_size = 8 if n <= 40 else 4
    population: list[tuple[tuple[float, float], np.ndarray]] = []
    # first evaluation is always made, so there is an answer whatever the budget
    starts = [search.chain_labels(), search.block_labels()]
    starts += [search.chain_labels() for _ in range(pop_size // 2 - 2)]
    starts += [search.random_labels() for _ in range(pop_size - len(starts))]
    for labels in starts:
        if search.out_of_time() and population:
            break
        labels, key = search.refine(search.separate(labels))
        population.append((key, labels))
    stale = 0
    while not search.out_of_time() and stale < 8 and len(population) > 1:
        population.sort(key=lambda kv: kv[0])
        best_before = population[0][0]
        i, j = _tournament(search.rng, len(population)), _tournament(search.rng, len(population))
        if i == j:
            j = (i + 1) % len(population)
        child = search.crossover(population[i][1], population[j][1])
        child = search.mutate(child, swaps=max(1, n // 10))
        child, key = search.refine(child)
        canon = search.canon(child)
        if key < population[-1][0] and all(search.canon(p) != canon for _, p in population):
            population[-1] = (key, child)
        population.sort(key=lambda kv: kv[0])
        stale = stale + 1 if population[0][0] >= best_before else 0
    assert search.ev.best is not None
    return search.ev.best[1]


def _tournament(rng: np.random.Generator, size: int) -> int:
    """Index of the better of two random members (the population is sorted best first)."""
    a, b = rng.integers(size), rng.integers(size)
    return int(min(a, b))


def random_allocation(problem: Problem, rng: np.random.Generator) -> list[list[int]]:
    """A random split into the stage sizes (stage 0 from the data-node candidates), ignoring
    the network; the stages in the order drawn."""
    sizes = list(problem.stage_sizes)
    cand = np.array(data_node_candidates(problem))
    data = sorted(int(x) for x in rng.choice(cand, size=sizes[0], replace=False))
    rest = [int(x) for x in rng.permutation(np.setdiff1d(np.arange(problem.n), data))]
    stages, start = [data], 0
    for size in sizes[1:]:
        stages.append(sorted(rest[start : start + size]))
        start += size
    return stages
