"""The fitness of an allocation, and which nodes may be data nodes.

Fitness (lower is better): worst intra-stage link + 2 x closed tour over the stages, where the cost
of going from stage a to stage b is the bottleneck of a bipartite matching between their nodes,
and the tour is counted twice because activations travel forward and gradients back along it.
Links are symmetrised (max of both directions) for the same reason.
"""

from __future__ import annotations

import numpy as np

from skippipe.planner.allocation.matching import _bottleneck_value
from skippipe.planner.allocation.tours import best_tour
from skippipe.planner.problem import Problem

Groups = tuple[tuple[int, ...], ...]  # canonical allocation: group 0 = data nodes, the rest sorted

# A node is a data-node candidate when its score is within this factor of the D-th best.
DATA_NODE_TOLERANCE = 1.02
# Weight of the search's shaping term (see _Evaluator.key).
SHAPING_WEIGHT = 0.1


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
