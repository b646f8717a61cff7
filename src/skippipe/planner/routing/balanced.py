"""Load-balanced routing for uneven compute: a candidate of ``plan_skippipe``.

The TC1 caps give a node visits in proportion to its speed, but they are only caps: the
cheapest-path greedy (``routing.assign``) fills the fastest nodes first, so the slow nodes get
the last rounds' visits and the iteration ends with a tail of slow work. Here each microbatch
(round robin over the data nodes, slowest best round trip first) takes the path that minimises
its round trip plus the work already queued on the nodes it visits: a node with c visits so far
adds c x (its F + B) to the path's cost. A node's queue grows by its own visit time, so a slow
node becomes expensive after fewer visits than a fast one and the visits spread as the nodes'
speeds allow, round by round. Nothing is simulated; the search in ``routing.schedule`` scores it.
"""

from __future__ import annotations

import math

import numpy as np

from skippipe.planner.problem import Problem
from skippipe.planner.routing.evaluate import Evaluator, Route, Score
from skippipe.planner.routing.sequences import RouteCosts, cheapest_over_sequences

# the queue weight: 1.0 counts a queued visit as fully delaying this one
QUEUE_WEIGHT = 1.0
# the queue weights tried (the best simulated one is kept)
WEIGHTS = (0.5, 1.0, 2.0)
# above this many nodes the candidate is skipped (every microbatch searches every stage order)
MAX_NODES = 200


def balanced_routes(
    problem: Problem, stages: list[list[int]], caps: list[int], seqs: tuple[tuple[int, ...], ...],
    weight: float = QUEUE_WEIGHT,
) -> list[Route] | None:
    """Paths that spread the visits by the work queued on each node (see the module text);
    None when some microbatch finds no path under the caps."""
    rc = RouteCosts.from_problem(problem)
    m = problem.workload.microbatches_per_data_node
    arrays = [np.asarray(s, dtype=int) for s in stages]
    left = np.zeros(problem.n, dtype=int)
    for s in stages[1:]:
        left[s] = [int(caps[x]) for x in s]
    queued = np.zeros(problem.n)

    def best_path(d: int, penalty: np.ndarray) -> tuple[float, list[int]]:
        return cheapest_over_sequences(rc, d, arrays, seqs, penalty)

    free = np.zeros(problem.n)
    first = {d: best_path(d, free)[0] for d in stages[0]}
    order = sorted(stages[0], key=lambda d: (-first[d], d))
    paths: dict[int, list[tuple[int, ...]]] = {d: [] for d in order}
    for _ in range(m):
        for d in order:
            penalty = np.where(left > 0, weight * queued, math.inf)
            cost, chain = best_path(d, penalty)
            if not chain:
                return None
            for x in chain:
                left[x] -= 1
                queued[x] += rc.node[x]
            paths[d].append(tuple(int(x) for x in chain))
    return [(int(d), p) for d in stages[0] for p in paths[d]]


def balanced_candidate(
    problem: Problem, stages: list[list[int]], caps: list[int], seqs: tuple[tuple[int, ...], ...], ev: Evaluator,
) -> tuple[list[Route], Score] | None:
    """The best of ``balanced_routes`` at the weights ``WEIGHTS``, scored by ``ev``; when none
    finishes (paths with swaps can wait on each other for memory) the same without swaps.
    None above ``MAX_NODES`` nodes or when no routing finishes."""
    if problem.n > MAX_NODES:
        return None
    no_swaps = tuple(q for q in seqs if list(q) == sorted(q))
    best: tuple[list[Route], Score] | None = None
    for allowed in (seqs, no_swaps):
        for w in WEIGHTS:
            routes = balanced_routes(problem, stages, caps, allowed, w) if allowed else None
            if routes is None:
                continue
            score = ev.score(routes)
            if math.isfinite(score.makespan) and (best is None or score.key() < best[1].key()):
                best = (routes, score)
        if best is not None:
            return best
    return None
