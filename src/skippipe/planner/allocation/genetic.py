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

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from skippipe.errors import UserError
from skippipe.planner.allocation.fitness import Groups, _Evaluator, _links, data_node_candidates
from skippipe.planner.allocation.stage_caps import balance_stage_caps
from skippipe.planner.problem import Problem

# ``separate``: at most this many drops of the worst intra-stage link, and recorded steps scored.
_SEPARATE_LEVELS = 32
_SEPARATE_SCORED = 6


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

    A fixed allocation in the cluster (``problem.fixed_stages``) is returned unchanged; the
    searched one is repaired where its stages' TC1 caps cannot carry the visits
    (``stage_caps.balance_stage_caps``).
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
    return balance_stage_caps(problem, [sorted(best_groups[g]) for g in order])


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
