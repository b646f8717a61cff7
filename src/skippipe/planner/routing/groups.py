"""Private chains: every data node gets its own chain of L-1 nodes that no other data node uses.

When the TC1 caps let a node take all m microbatches of one data node (the homogeneous case:
stage sizes N/L, (L-1)N/L and caps of exactly m), giving each data node a private chain removes
every collision *between* data nodes; only a data node's own microbatches meet, and the
processing-order search arranges those.

``private_chain_sets``: the allocation is given; pick disjoint chains minimising the latest
estimated finish (``trip_floor`` of the chain's round trip). Greedy (slowest data node first),
then pairwise re-optimisation: the latest data node and one other pool their nodes (and the free
ones) and take the best pair of chains out of the pool. The greedy looks ahead by stages only,
so where the jump rule binds it may leave data nodes without a chain that other stage orders
would give one (one site, 62 nodes, S = 9, L = 5, stages of 12, 7, 7 and 6 nodes: chains for 7
of the 12 data nodes, where all 12 fit); an integer programme over the stage orders
(``chain_quota``) then finds how many chains fit, and where that is more the greedy runs again
within its counts (the caller routes the data nodes left over and keeps the quicker). Where
data nodes are left over, other counts with as many chains leave the free nodes on the stages
of a near chain (``near_chain_quotas``), so that a data node left over can go through them and
one chain node. Where the allocation is ours to choose,
``joint_groups.group_allocation`` builds it from such chains.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from skippipe.bounds import trip_floors
from skippipe.planner.floors import trip_floor
from skippipe.planner.problem import Problem
from skippipe.planner.routing.assign import Capacity, route_one
from skippipe.planner.routing.budget import planning_target_s
from skippipe.planner.routing.sequences import RouteCosts, cheapest_chain, cheapest_over_sequences, node_classes

POOL_CHAINS = 20_000  # chains enumerated for one pair of data nodes at most (``_pair_pool``)
NEAR_QUOTAS = 8  # chain counts tried that leave free nodes for the data nodes left over (``near_chain_quotas``)
# ``_improve_pairs``: the CPU seconds of one partner's chain tried (measured on the 2-core machine,
# all its work included: 985 nodes, S = 9, L = 7, 130,309 chains in 38.2 s), and the partners'
# chains all pairs of one allocation may try: ``PAIR_FREE_TRIES`` (2-4 s; the sweep's cases up to
# 120 nodes tried at most 13,496), or more where ``PAIRS_SHARE`` of the planning-time target
# allows more by that estimate (a count, so every machine searches the same; that cluster
# planned in 85 s against a 60-s target without a limit)
PAIR_CHAIN_S = 2.9e-4
PAIR_FREE_TRIES = 15_000
PAIRS_SHARE = 0.15


@dataclass
class GroupCosts:
    """What the estimate of a data node's finish time needs, per node."""

    rc: RouteCosts
    backward: np.ndarray
    memory: np.ndarray
    m: int
    inject_gap: float
    op_gap: float

    @classmethod
    def from_problem(cls, problem: Problem) -> GroupCosts:
        rc = RouteCosts.from_problem(problem)
        cm = problem.cost_model
        return cls(
            rc=rc, backward=rc.forward * cm.backward_factor, memory=np.asarray(problem.memory, dtype=int),
            m=problem.workload.microbatches_per_data_node, inject_gap=cm.inject_gap_s, op_gap=cm.op_gap_s,
        )

    def estimate(self, d: int, round_trip: float, chain: list[int] | tuple[int, ...] = ()) -> float:
        """Estimated finish of data node ``d`` with all its microbatches on one chain: the
        larger of ``work_floor`` and the rounds of a chain node with fewer slots than ``d``
        (``held_rounds``)."""
        if not math.isfinite(round_trip):
            return math.inf
        return self.estimate_and_held(d, round_trip, chain)[0]

    def estimate_and_held(self, d: int, round_trip: float, chain: list[int] | tuple[int, ...]) -> tuple[float, float]:
        """(``estimate``, the ``held_rounds`` in it), each computed once: where the held rounds
        decide the estimate, the group search tries other chain orders."""
        held = self.held_rounds(d, round_trip, chain)
        if not math.isfinite(round_trip):
            return math.inf, held
        return max(self.work_floor(d, round_trip, chain), held), held

    def work_floor(self, d: int, round_trip: float, chain: list[int] | tuple[int, ...]) -> float:
        """The data node's ``trip_floor`` with its own slots, or a chain node's own work if
        that is longer (``estimate`` without the chain nodes' slots; a finite round trip)."""
        est = trip_floor(round_trip, float(self.rc.forward[d]), float(self.backward[d]), self.m, int(self.memory[d]),
                         self.inject_gap, self.op_gap)
        for x in chain:
            est = max(est, self.m * (float(self.rc.node[x]) + 2 * self.op_gap))
        return est

    def held_rounds(self, d: int, trip: float, chain: list[int] | tuple[int, ...]) -> float:
        """``_held_rounds`` of one chain, in plain floats (the same operations in the same
        order, so the same value bit for bit)."""
        rc, m = self.rc, self.m
        k_d = min(int(self.memory[d]), m)
        if not chain or all(min(int(self.memory[x]), m) >= k_d for x in chain):
            return 0.0
        out = 0.0
        after = float(rc.own[d] - rc.node[d]) + float(rc.edge[chain[-1], d])
        for j in range(len(chain) - 1, -1, -1):
            slots = min(int(self.memory[chain[j]]), m)
            hold = float(rc.node[chain[j]]) + after
            rounds = -(-m // max(1, slots))
            if slots < k_d:
                out = max(out, (trip - hold) + rounds * hold + (rounds - 1) * self.op_gap)
            if j:
                after = hold + float(rc.edge[chain[j - 1], chain[j]])
        return out

    def estimates(self, d: int, chains: np.ndarray) -> np.ndarray:
        """``estimate`` of data node ``d`` on each row of ``chains`` (C x k), with the round
        trips summed as ``RouteCosts.round_trip`` sums them: the same values bit for bit."""
        rc, c = self.rc, chains
        nodes = np.zeros(len(c))
        for j in range(c.shape[1]):
            nodes = nodes + rc.node[c[:, j]]
        hops = np.zeros(len(c)) + rc.edge[d, c[:, 0]]
        for j in range(c.shape[1] - 1):
            hops = hops + rc.edge[c[:, j], c[:, j + 1]]
        hops = hops + rc.edge[c[:, -1], d]
        trips = rc.own[d] + nodes + hops
        est = trip_floors(trips, float(rc.forward[d]), float(self.backward[d]), self.m,
                          np.full(len(c), int(self.memory[d])), self.inject_gap, self.op_gap)
        own_work = (self.m * (rc.node[c] + 2 * self.op_gap)).max(axis=1)
        est = np.maximum(np.maximum(est, own_work), self._held_rounds(d, c, trips))
        return np.where(np.isfinite(trips), est, np.inf)

    def _held_rounds(self, d: int, chains: np.ndarray, trips: np.ndarray) -> np.ndarray:
        """Per chain (rows of ``chains``, round trips ``trips``): the latest finish its nodes'
        slots force where a node has fewer slots than ``d`` (else 0). A visit holds one of its
        node's slots from its forward to its backward: its own work, the visits after it, the
        hops from it to ``d`` and back and the loss (``hold``). With k slots the m microbatches
        pass in ceil(m / k) rounds of holds, and the rest of a round trip comes before and
        after: ``trip - hold + rounds x hold``. So a one-slot node last in a chain costs six
        short holds, first in it six whole round trips."""
        rc, c, m = self.rc, chains, self.m
        k_d = min(int(self.memory[d]), m)
        out = np.zeros(len(c))
        slots = np.minimum(self.memory[c], m)
        if not (slots < k_d).any():
            return out
        after = (rc.own[d] - rc.node[d]) + rc.edge[c[:, -1], d]  # the loss and the hop to d and back
        for j in range(c.shape[1] - 1, -1, -1):
            hold = rc.node[c[:, j]] + after
            rounds = -(-m // np.maximum(1, slots[:, j]))
            term = (trips - hold) + rounds * hold + (rounds - 1) * self.op_gap
            out = np.where(slots[:, j] < k_d, np.maximum(out, term), out)
            if j:
                after = hold + rc.edge[c[:, j - 1], c[:, j]]
        return out


# ----------------------------------------------------------------------------- fixed allocation


def _chains_in_pool(
    gc: GroupCosts, d: int, by_stage: list[list[int]], seqs: tuple[tuple[int, ...], ...]
) -> Iterator[tuple[float, list[int]]]:
    """Every chain of data node ``d`` through the pool (``by_stage``), quickest estimate first
    (ties: stage order, then product order); the estimates computed for all at once."""
    blocks = [np.array(list(itertools.product(*[by_stage[s] for s in seq])), dtype=int) for seq in seqs]
    blocks = [b for b in blocks if b.size]
    if not blocks:
        return
    ests = np.concatenate([gc.estimates(d, b) for b in blocks])
    chains = [c for b in blocks for c in b.tolist()]
    for i in np.argsort(ests, kind="stable"):
        yield float(ests[i]), chains[i]


def _best_chain(gc: GroupCosts, d: int, arrays: list[np.ndarray], seqs: tuple[tuple[int, ...], ...], usable: np.ndarray
) -> tuple[float, list[int]]:
    # only the usable nodes (a pool of a few per stage): the same sums and tie order as the full
    # stages with the others at an infinite penalty, without a width-N dynamic programme
    best = cheapest_over_sequences(gc.rc, d, [a[usable[a]] for a in arrays], seqs)
    if not best[1]:
        return best
    return gc.estimate(d, best[0], best[1]), best[1]


def private_chain_sets(
    problem: Problem, stages: list[list[int]], caps: list[int], seqs: tuple[tuple[int, ...], ...], deadline: float | None = None
) -> list[dict[int, list[int]]]:
    """Disjoint chains, one per data node, slowest data node first, for as many data nodes as
    the nodes allow (each a dict in that order): the greedy's, and, where the greedy left some
    data node without one and the stage orders of ``chain_quota`` give more data nodes a chain,
    those chains too (the caller keeps the quicker routing: they may take dearer stage orders);
    empty when not even one fits."""
    gc = GroupCosts.from_problem(problem)
    m = gc.m
    n = problem.n
    data = list(stages[0])
    usable = np.zeros(n, dtype=bool)
    for s in stages[1:]:
        for x in s:
            usable[x] = caps[x] >= m
    # each usable node can join one chain; interchangeable nodes are searched once per class
    one = [1 if usable[x] else 0 for x in range(n)]
    classes = node_classes(problem.transfer_s, problem.forward_s, problem.memory)
    cap = Capacity(stages, one, classes)
    # greedy: the data node with the slowest best chain first
    first = {d: min(cap.chain(gc.rc, d, seq)[0] for seq in seqs) for d in data}
    order = sorted(data, key=lambda d: (-first[d], d))
    found = [_greedy_chains(gc, cap, order, seqs, None)]
    quota = chain_quota(stages, usable, seqs, len(data)) if len(found[0][0]) < len(data) else None
    if quota is not None:
        # the greedy's look-ahead counts stages, not stage orders (the jump rule): it left data
        # nodes without a chain that the stage orders of ``chain_quota`` give one
        for counts in [quota, *near_chain_quotas(stages, usable, seqs, len(data), quota)]:
            more = _greedy_chains(gc, Capacity(stages, one, classes), order, seqs, counts)
            if len(more[0]) > len(found[0][0]) and all(more[0] != chains for chains, _ in found):
                found.append(more)
    out = []
    # partners' chains left to try, for all sets
    tries = [max(PAIR_FREE_TRIES, int(PAIRS_SHARE * planning_target_s(n) / PAIR_CHAIN_S))]
    for chains, est in found:
        free = usable.copy()
        for ch in chains.values():
            free[ch] = False
        _improve_pairs(gc, stages, seqs, chains, est, free, deadline, tries)
        if chains:
            out.append(chains)
    return out


def _greedy_chains(
    gc: GroupCosts, cap: Capacity, order: list[int], seqs: tuple[tuple[int, ...], ...], quota: dict[tuple[int, ...], int] | None,
) -> tuple[dict[int, list[int]], dict[int, float]]:
    """Each data node of ``order`` in turn takes its quickest chain left in ``cap``; with
    ``quota``, only through the stage orders with quota left (each chain uses one)."""
    chains: dict[int, list[int]] = {}
    est: dict[int, float] = {}
    quota = dict(quota) if quota is not None else None
    for k, d in enumerate(order):
        allowed = seqs if quota is None else tuple(q for q in seqs if quota.get(q, 0) > 0)
        best = route_one(gc.rc, cap, d, allowed, len(order) - k - 1 if quota is None else 0)
        if not best[1] or not math.isfinite(best[0]):
            continue  # no chain left for this one: it shares nodes (routed by the caller)
        chains[d] = best[1]
        est[d] = gc.estimate(d, best[0], best[1])
        cap.take(best[1])
        if quota is not None:
            seq = tuple(int(cap.stage_of[x]) for x in best[1])
            quota[seq] = quota.get(seq, 0) - 1
    return chains, est


def chain_quota(
    stages: list[list[int]], usable: np.ndarray, seqs: tuple[tuple[int, ...], ...], wanted: int,
    free: tuple[int, ...] = (),
) -> dict[tuple[int, ...], int] | None:
    """The most private chains (at most ``wanted``) that the usable nodes of each stage allow,
    as a count per stage order (an integer programme: a chain takes one node of each of its
    stages), leaving a usable node of each stage of ``free`` out; None when the programme is
    not solved."""
    if not seqs or wanted <= 0:
        return None
    per_stage = np.array([int(usable[s].sum()) if len(s) else 0 for s in stages], dtype=float)
    per_stage[list(free)] -= 1.0
    if per_stage.min() < 0:
        return None
    uses = np.zeros((len(stages), len(seqs)))
    for j, seq in enumerate(seqs):
        uses[list(seq), j] = 1.0
    rows = np.vstack([uses, np.ones((1, len(seqs)))])
    high = np.concatenate([per_stage, [float(wanted)]])
    res = milp(-np.ones(len(seqs)), constraints=LinearConstraint(rows, -np.inf, high), integrality=np.ones(len(seqs)),
               bounds=Bounds(0, wanted))
    if res.x is None:
        return None
    counts = np.round(res.x).astype(int)
    return {seq: int(c) for seq, c in zip(seqs, counts) if c > 0}


def near_chain_quotas(
    stages: list[list[int]], usable: np.ndarray, seqs: tuple[tuple[int, ...], ...], wanted: int,
    quota: dict[tuple[int, ...], int], most: int = NEAR_QUOTAS,
) -> list[dict[tuple[int, ...], int]]:
    """``chain_quota`` with as many chains as its counts ``quota``, leaving free nodes for a
    *near chain* (a stage order's stages but one, the stage of the chain node its microbatches
    visit): up to ``most`` such counts, one per set of stages of a near chain, spread over
    those sets in their sorted order. Empty where every data node has a chain or where the
    data nodes left over could not take one chain node per microbatch anyway (fewer than
    L - 2 free nodes each).

    Which stages keep the free nodes decides how quickly the data node left over finishes,
    and no rule was found for it: one site, 84 nodes, S = 9, L = 5 (16 chains, one data node
    left over, three free nodes), the 56 sets of three stages gave 54.65-65.27 s first come,
    first served once the leftover was routed (``static._gathered_leftovers``), with the
    good and the bad sets spread over early and late stages alike. So several are routed and
    the quickest kept (``static.chain_candidate``)."""
    if not seqs or len(seqs[0]) < 2:
        return []
    chains = sum(quota.values())
    left = wanted - chains
    spare = sum(int(usable[s].sum()) for s in stages[1:] if len(s)) - chains * len(seqs[0])
    if left <= 0 or spare < left * (len(seqs[0]) - 1):
        return []
    sets = sorted({tuple(sorted(seq[:t] + seq[t + 1:])) for seq in seqs for t in range(len(seq))})
    picked = [sets[round(k * len(sets) / most)] for k in range(most)] if len(sets) > most else sets
    out = []
    for free in dict.fromkeys(picked):
        counts = chain_quota(stages, usable, seqs, wanted, free)
        if counts is not None and sum(counts.values()) == chains:
            out.append(counts)
    return out


def _spares(gc: GroupCosts, stages: list[list[int]], worst: int, free: np.ndarray) -> list[list[int]]:
    """Per stage 1..S-1, its free nodes nearest the data node ``worst`` first (``_pair_pool``)."""
    spares = []
    for s in stages[1:]:
        spare = [int(x) for x in s if free[x]]
        spare.sort(key=lambda x: (gc.rc.edge[worst, x] + gc.rc.node[x], x))
        spares.append(spare)
    return spares


def _pair_pool(
    stages: list[list[int]], seqs: tuple[tuple[int, ...], ...], pair: list[int], spares: list[list[int]], per_stage: int,
) -> list[list[int]] | None:
    """Per stage, the pool of ``_improve_pairs``: the two chains' nodes plus the ``per_stage``
    first ``spares`` (``_spares``: the free nodes nearest the latest data node), fewer where the
    chains through the pool would number more than ``POOL_CHAINS`` (long paths: 5 nodes a stage
    over 8 stages are 390,625 chains per stage order); None where the two chains alone are more
    (two nodes a stage over 19 stages: 524,288 chains per order, and 5,036 orders at S = 24)."""
    k = per_stage
    while True:
        pool = set(pair).union(*(spare[:k] for spare in spares))
        by_stage = [[x for x in s if x in pool] for s in stages]
        if sum(math.prod(len(by_stage[s]) for s in seq) for seq in seqs) <= POOL_CHAINS:
            return by_stage
        if k == 0:
            return None
        k -= 1


def _improve_pairs(
    gc: GroupCosts, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...], chains: dict[int, list[int]],
    est: dict[int, float],
    free: np.ndarray, deadline: float | None, tries: list[int], per_stage: int = 3,
) -> None:
    """Re-optimise the latest data node together with one other, while that helps and
    ``tries[0]`` (the partners' chains it may try, counted down) lasts. The pool is both chains
    plus, per stage, the ``per_stage`` free nodes nearest the latest data node (fewer on long
    paths: ``_pair_pool``)."""
    arrays = [np.asarray(s, dtype=int) for s in stages]
    owner = {x: d for d, ch in chains.items() for x in ch}
    near: dict[int, list[int]] = {}  # per data node: the nodes of its best unconstrained chains
    for _ in range(50 * len(chains)):
        if (deadline is not None and time.perf_counter() > deadline) or tries[0] <= 0:
            return
        worst = max(chains, key=lambda d: (est[d], -d))
        # partners: owners of the nodes on the worst data node's best unconstrained chains
        if worst not in near:
            near[worst] = [x for seq in seqs for x in cheapest_chain(gc.rc, worst, [arrays[s] for s in seq])[1]]
        wanted = {owner[x] for x in near[worst] if x in owner and owner[x] != worst}
        improved = False
        spares = _spares(gc, stages, worst, free)  # free changes only when a pair improves
        for e in sorted(wanted, key=lambda e: (est[e], e)):
            by_stage = _pair_pool(stages, seqs, chains[worst] + chains[e], spares, per_stage)
            if by_stage is None:
                continue
            pool = {x for s in by_stage for x in s}
            current = (max(est[worst], est[e]), est[worst] + est[e])
            best = None
            for e1, c1 in _chains_in_pool(gc, worst, by_stage, seqs):
                if e1 >= current[0]:
                    break
                usable = np.zeros(len(free), dtype=bool)
                usable[[x for x in pool if x not in c1]] = True
                e2, c2 = _best_chain(gc, e, arrays, seqs, usable)
                tries[0] -= 1
                cand = (max(e1, e2), e1 + e2)
                if c2 and cand < current and (best is None or cand < best[0]):
                    best = (cand, c1, e1, c2, e2)
            if best is not None:
                _, c1, e1, c2, e2 = best
                for x in chains[worst] + chains[e]:
                    free[x] = True
                    owner.pop(x, None)
                chains[worst], chains[e], est[worst], est[e] = c1, c2, e1, e2
                for d in (worst, e):
                    for x in chains[d]:
                        free[x] = False
                        owner[x] = d
                improved = True
                break
        if not improved:
            return
