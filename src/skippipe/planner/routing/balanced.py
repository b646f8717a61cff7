"""Load-balanced routing for uneven compute: a candidate of ``plan_skippipe``.

The TC1 caps give a node visits in proportion to its speed, but they are only caps: the
cheapest-path greedy (``routing.assign``) fills the fastest nodes first, so the slow nodes get
the last rounds' visits and the iteration ends with a tail of slow work. Here each microbatch
(round robin over the data nodes, slowest best round trip first) takes the path that minimises
its round trip plus the work already queued on the nodes it visits: a node with c visits so far
adds c x (its F + B) to the path's cost. A node's queue grows by its own visit time, so a slow
node becomes expensive after fewer visits than a fast one and the visits spread as the nodes'
speeds allow, round by round. Nothing is simulated; the search in ``routing.schedule`` scores it.
Above ``sequences.LARGE_NODES`` nodes a microbatch looks only at the 16 usable nodes per stage nearest its
data node (``sequences.nearest``) and fewer variants are tried (``LARGE_VARIANTS``): about 1.5 s
a routing at 1,000 nodes.

Memory: a visit holds one of the node's activation slots from its forward to its backward
there, i.e. for the rest of the round trip (the later visits, hops and the loss): long at the
first position of a path, short at the last. A node with M slots whose visits hold h seconds
in all needs at least h / M seconds, so with ``holds`` the queue a node adds to a path is
the larger of its queued work and its queued hold time over M (both variants are tried). A
node with one slot early in the paths then becomes expensive after a visit or two, and the
visits go where the slots are.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from skippipe.planner.problem import Problem
from skippipe.planner.routing.evaluate import Evaluator, Route, Score
from skippipe.planner.routing.sequences import (
    RouteCosts,
    SequenceSearch,
    cheapest_over_sequences,
    nearest,
    search_width,
    stage_cap_sums,
)
from skippipe.planner.stage_orders import sequence_quotas

# the queue weight: 1.0 counts a queued visit as fully delaying this one
QUEUE_WEIGHT = 1.0
# the queue weights tried (the best simulated one is kept)
WEIGHTS = (0.5, 1.0, 2.0)
# the (weight, holds) pairs tried: every weight without and with the slot-hold term
VARIANTS = tuple(itertools.product(WEIGHTS, (False, True)))
# on large clusters (``search_width`` not None: a microbatch searches only the ``LARGE_WIDTH``
# nodes per stage nearest its data node, every stage order still) only these (weight, holds)
# pairs are tried
LARGE_VARIANTS = ((1.0, False), (2.0, True))


def balanced_routes(
    problem: Problem, stages: list[list[int]], caps: list[int], seqs: tuple[tuple[int, ...], ...],
    weight: float = QUEUE_WEIGHT, holds: bool = False, width: int | None = None, by_quotas: bool = False,
) -> list[Route] | None:
    """Paths that spread the visits by the work queued on each node (see the module text),
    with ``holds`` by the larger of the work and the slot-hold time per slot; None when some
    microbatch finds no path under the caps. With ``by_quotas`` the microbatches per stage
    order are fixed first by ``sequence_quotas`` (as ``assign_static`` does where its greedy
    gets stuck), so that tight caps (L close to S) cannot leave a microbatch without a path;
    None then only when no such split exists."""
    quotas = None
    if by_quotas:
        total = len(stages[0]) * problem.workload.microbatches_per_data_node
        quotas = sequence_quotas(seqs, stage_cap_sums(caps, stages), total)
        if quotas is None:
            return None
    rc = RouteCosts.from_problem(problem)
    left_orders = dict(quotas) if quotas is not None else None
    stage_of = {int(x): s for s, st in enumerate(stages) for x in st} if quotas is not None else {}
    m = problem.workload.microbatches_per_data_node
    arrays = [np.asarray(s, dtype=int) for s in stages]
    left = np.zeros(problem.n, dtype=int)
    for s in stages[1:]:
        left[s] = [int(caps[x]) for x in s]
    queued = np.zeros(problem.n)
    held = np.zeros(problem.n)  # slot-seconds held by the visits so far
    slots = np.maximum(1, np.asarray(problem.memory, dtype=float))
    loss = np.asarray(problem.forward_s, dtype=float) * problem.cost_model.loss_factor

    searches: dict[tuple[tuple[int, ...], ...], SequenceSearch] = {}  # by the orders allowed

    def best_path(d: int, penalty: np.ndarray) -> tuple[float, list[int]]:
        allowed = seqs if left_orders is None else tuple(q for q in seqs if left_orders.get(q, 0) > 0)
        if width is None:
            if allowed not in searches:
                searches[allowed] = SequenceSearch(rc, arrays, allowed)
            return searches[allowed].cheapest(d, penalty)
        return cheapest_over_sequences(rc, d, nearest(rc, d, arrays, penalty, width), allowed, penalty)

    free = np.zeros(problem.n)
    first = {d: best_path(d, free)[0] for d in stages[0]}
    order = sorted(stages[0], key=lambda d: (-first[d], d))
    paths: dict[int, list[tuple[int, ...]]] = {d: [] for d in order}
    for _ in range(m):
        for d in order:
            load = np.maximum(queued, held / slots) if holds else queued
            penalty = np.where(left > 0, weight * load, math.inf)
            cost, chain = best_path(d, penalty)
            if not chain:
                return None
            if left_orders is not None:
                left_orders[tuple(stage_of[int(x)] for x in chain)] -= 1
            for x, hold in zip(chain, slot_holds(rc, d, chain, float(loss[d]))):
                left[x] -= 1
                queued[x] += rc.node[x]
                held[x] += hold
            paths[d].append(tuple(int(x) for x in chain))
    return [(int(d), p) for d in stages[0] for p in paths[d]]


def slot_holds(rc: RouteCosts, d: int, chain: list[int], loss: float) -> list[float]:
    """Seconds each visit of the path ``chain`` of data node ``d`` holds its slot without
    waiting: its forward and backward, every later visit, the hops out and back from it and
    the loss on ``d``."""
    route = [d, *chain, d]
    holds, rest = [], loss + float(rc.edge[route[-2], d])
    for i in range(len(chain) - 1, -1, -1):
        x = chain[i]
        holds.append(float(rc.node[x]) + rest)
        rest += float(rc.node[x]) + float(rc.edge[route[i], x])
    return holds[::-1]


def balanced_candidate(
    problem: Problem, stages: list[list[int]], caps: list[int], seqs: tuple[tuple[int, ...], ...], ev: Evaluator,
) -> tuple[list[Route], Score] | None:
    """The best of ``balanced_routes`` at the weights ``WEIGHTS``, without and with the
    slot-hold term, scored by ``ev``; when none finishes (paths with swaps can wait on each
    other for memory) the same without swaps; when still none, the same two under sequence
    quotas (``by_quotas``: tight caps stopped every greedy routing).
    Above ``sequences.LARGE_NODES`` nodes: the ``LARGE_VARIANTS`` over the ``LARGE_WIDTH`` nearest nodes
    per stage. None when no routing finishes."""
    width = search_width(problem.n)
    variants = LARGE_VARIANTS if width is not None else VARIANTS
    no_swaps = tuple(q for q in seqs if list(q) == sorted(q))
    best: tuple[list[Route], Score] | None = None
    for by_quotas in (False, True):
        for allowed in (seqs, no_swaps):
            for w, holds in variants:
                routes = balanced_routes(problem, stages, caps, allowed, w, holds, width, by_quotas) if allowed else None
                if routes is None:
                    continue
                score = ev.score(routes)
                if math.isfinite(score.makespan) and (best is None or score.key() < best[1].key()):
                    best = (routes, score)
            if best is not None:
                return best
    return None
