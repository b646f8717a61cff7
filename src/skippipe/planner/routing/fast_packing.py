"""An allocation searched by packing paths over fast links: quick to score, so it can search far.

Where some links only trickle (``slow_links.slow_link_mask``), the allocation search
(``planner.allocation``) ranks allocations by their stage-to-stage tours and may leave the TC1
caps no way to route every microbatch over fast links; the routing programmes of
``slow_links`` that repair this are built only up to ``slow_links.MAX_ARCS`` arcs. Sweep case
4150 (38 nodes in sites, S = 8, L = 7, two swaps): the first allocation's routings cross slow
links (655.63 s); the data-node exchanges leave them at a floor of 42.71 s (plan 44.05 s),
while an allocation over fast links with a floor of 28.71 s exists.

``packed_allocation`` scores an allocation by packing every microbatch's path greedily
(``Packer``): the data nodes in turn, each path found depth-first along the graph of the valid
stage orders (``order_graph``) over fast links alone, every node within its TC1 cap
(``Problem.load_caps``), the nodes with the most visits left first. The score is (the
microbatches left without a path, the slowest data node's packed round trips dealt over its
slots, longest first). From the start it exchanges the stages of two nodes (stage 0 too: the
data nodes change) while the score falls, first improvement in a seeded order; where none
helps, three random exchanges from the best so far, and on, until ``PACK_WORK`` microbatch
routings are spent (a count: every machine plans the same). The best allocation is returned
with its packed paths when they all keep to fast links.
"""

from __future__ import annotations

import random

import numpy as np

from skippipe.planner.problem import Problem
from skippipe.planner.routing.exchange import slot_estimate
from skippipe.planner.routing.order_graph import order_graph
from skippipe.planner.routing.sequences import RouteCosts
from skippipe.planner.routing.slow_link_search import exchanged_stages

# microbatch routings one search may spend (sweep case 4150, 10 microbatches: 2,000 allocations, 1.1 s)
PACK_WORK = 20_000
# fewer allocations than this within ``PACK_WORK`` (a routing per microbatch each): no search
# (985 nodes with 141 data nodes of 8 microbatches: 17 allocations in 6.5 s of a 60-s target)
PACK_LEAST_ALLOCATIONS = 50
KICK_EXCHANGES = 3

Score = tuple[int, float]
Paths = dict[int, list[tuple[int, ...]]]


class Packer:
    """Greedy packing of every microbatch's path over fast links (see the module text)."""

    def __init__(self, problem: Problem, seqs: tuple[tuple[int, ...], ...], fast: np.ndarray) -> None:
        self.problem = problem
        self.fast = fast
        self.m = problem.workload.microbatches_per_data_node
        self.costs = RouteCosts.from_problem(problem)
        graph = order_graph(seqs)
        self.final = graph.final
        self.steps: dict[int, list[tuple[int, int]]] = {}
        for q, stage, nxt in graph.steps:
            self.steps.setdefault(q, []).append((stage, nxt))
        self.routings = 0  # microbatch routings spent

    def score(self, stages: list[list[int]]) -> tuple[Score, Paths]:
        """(microbatches left without a path, slowest data node's slot chain), the packed paths."""
        left = list(self.problem.load_caps(stages))
        paths: Paths = {d: [] for d in stages[0]}
        failures = 0
        for _ in range(self.m):
            for d in stages[0]:
                self.routings += 1
                path = self._path(stages, left, d)
                if path is None:
                    failures += 1
                    continue
                for x in path:
                    left[x] -= 1
                paths[d].append(path)
        return (failures, max(self._chain(d, p) for d, p in paths.items())), paths

    def _chain(self, d: int, paths: list[tuple[int, ...]]) -> float:
        """The longest of d's slots when its round trips are dealt to them longest first."""
        return slot_estimate([self.costs.round_trip(d, p) for p in paths], int(self.problem.memory[d]), 0.0)

    def _path(self, stages: list[list[int]], left: list[int], d: int) -> tuple[int, ...] | None:
        path: list[int] = []
        return tuple(path) if self._walk(stages, left, d, 0, d, path, set()) else None

    def _walk(
        self, stages: list[list[int]], left: list[int], d: int, q: int, at: int, path: list[int], dead: set[tuple[int, int]],
    ) -> bool:
        """Extend ``path`` from state q at node ``at`` over fast links back to d (depth first,
        the nodes with most visits left first); ``dead``: the (state, node) pairs that fail.
        A method, not a nested function: a recursive closure makes a reference cycle per call."""
        fast = self.fast
        if q == self.final:
            return bool(fast[at, d])
        if (q, at) in dead:
            return False
        for stage, nxt in self.steps[q]:
            ahead = sorted((y for y in stages[stage] if left[y] > 0 and fast[at, y] and y not in path),
                           key=lambda y: -left[y])
            for y in ahead:
                path.append(y)
                if self._walk(stages, left, d, nxt, y, path, dead):
                    return True
                path.pop()
        dead.add((q, at))
        return False


def packed_allocation(
    problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...], slow: np.ndarray, seed: int = 0,
    work: int = PACK_WORK,
) -> tuple[list[list[int]], Paths] | None:
    """The best allocation found from ``stages`` and its packed paths, all over fast links
    (see the module text); None when none is found within ``work`` routings, or when those
    would score fewer than ``PACK_LEAST_ALLOCATIONS`` allocations."""
    if work < PACK_LEAST_ALLOCATIONS * len(stages[0]) * problem.workload.microbatches_per_data_node:
        return None
    fast = ~slow
    np.fill_diagonal(fast, False)
    packer = Packer(problem, seqs, fast)
    rng = random.Random(seed)
    current = [list(map(int, s)) for s in stages]
    value, paths = packer.score(current)
    best, best_value, best_paths = current, value, paths
    n = problem.n
    while packer.routings < work:
        where = {x: k for k, s in enumerate(current) for x in s}
        pairs = [(a, b) for a in range(n) for b in range(a + 1, n) if where[a] != where[b]]
        rng.shuffle(pairs)
        for a, b in pairs:
            if packer.routings >= work:
                break
            cand = exchanged_stages(current, a, b, where)
            v, p = packer.score(cand)
            if v < value:
                current, value, paths = cand, v, p
                break
        else:  # no exchange helps: kick the best so far
            current = [list(s) for s in best]
            for _ in range(KICK_EXCHANGES):
                a, b = rng.sample(range(n), 2)
                where = {x: k for k, s in enumerate(current) for x in s}
                if where[a] != where[b]:
                    current = exchanged_stages(current, a, b, where)
            value, paths = packer.score(current)
        if value < best_value:
            best, best_value, best_paths = current, value, paths
    return (best, best_paths) if best_value[0] == 0 else None
