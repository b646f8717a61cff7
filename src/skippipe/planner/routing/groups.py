"""Private chains: every data node gets its own chain of L-1 nodes that no other data node uses.

When the TC1 caps let a node take all m microbatches of one data node (the homogeneous case:
stage sizes N/L, (L-1)N/L and caps of exactly m), giving each data node a private chain removes
every collision *between* data nodes; only a data node's own microbatches meet, and the
processing-order search arranges those. Two builders:

- ``private_chains``: the allocation is given; pick disjoint chains minimising the latest
  estimated finish (``trip_floor`` of the chain's round trip). Greedy (slowest data node first),
  then pairwise re-optimisation: the latest data node and one other pool their nodes (and the
  free ones) and take the best pair of chains out of the pool.
- ``group_allocation``: the allocation is ours to choose (joint search). Split the nodes into
  groups of one data node + L-1 chain nodes minimising the latest estimated finish (greedy
  groups of near neighbours, then node swaps between the latest group and the others), then
  hand out stage labels so that every stage gets its size and each chain visits its stages in
  increasing order.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

from skippipe.planfile import path_rule_violation
from skippipe.planner.floors import trip_floor
from skippipe.planner.problem import Problem
from skippipe.planner.routing.assign import Capacity, route_one
from skippipe.planner.routing.sequences import RouteCosts, cheapest_chain, cheapest_over_sequences, node_classes

POOL_CHAINS = 20_000  # chains enumerated for one pair of data nodes at most (``_pair_pool``)


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
        data node's ``trip_floor``, or a chain node's own work if that is longer."""
        if not math.isfinite(round_trip):
            return math.inf
        slots = min([int(self.memory[d])] + [int(self.memory[x]) for x in chain])
        est = trip_floor(round_trip, float(self.rc.forward[d]), float(self.backward[d]), self.m, slots,
                         self.inject_gap, self.op_gap)
        for x in chain:
            est = max(est, self.m * (float(self.rc.node[x]) + 2 * self.op_gap))
        return est


# ----------------------------------------------------------------------------- fixed allocation


def _chains_in_pool(
    gc: GroupCosts, d: int, by_stage: list[list[int]], seqs: tuple[tuple[int, ...], ...]
) -> list[tuple[float, list[int]]]:
    out = []
    for seq in seqs:
        for nodes in itertools.product(*[by_stage[s] for s in seq]):
            out.append((gc.estimate(d, gc.rc.round_trip(d, nodes), nodes), list(nodes)))
    out.sort(key=lambda t: t[0])
    return out


def _best_chain(gc: GroupCosts, d: int, arrays: list[np.ndarray], seqs: tuple[tuple[int, ...], ...], usable: np.ndarray
) -> tuple[float, list[int]]:
    # only the usable nodes (a pool of a few per stage): the same sums and tie order as the full
    # stages with the others at an infinite penalty, without a width-N dynamic programme
    best = cheapest_over_sequences(gc.rc, d, [a[usable[a]] for a in arrays], seqs)
    if not best[1]:
        return best
    return gc.estimate(d, best[0], best[1]), best[1]


def private_chains(
    problem: Problem, stages: list[list[int]], caps: list[int], seqs: tuple[tuple[int, ...], ...], deadline: float | None = None
) -> dict[int, list[int]] | None:
    """Disjoint chains, one per data node, slowest data node first, for as many data nodes as
    the nodes allow (a dict in that order; None when not even one fits)."""
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
    cap = Capacity(stages, one, node_classes(problem.transfer_s, problem.forward_s, problem.memory))
    # greedy: the data node with the slowest best chain first
    first = {d: min(cap.chain(gc.rc, d, seq)[0] for seq in seqs) for d in data}
    order = sorted(data, key=lambda d: (-first[d], d))
    chains: dict[int, list[int]] = {}
    est: dict[int, float] = {}
    for k, d in enumerate(order):
        best = route_one(gc.rc, cap, d, seqs, len(order) - k - 1)
        if not best[1] or not math.isfinite(best[0]):
            continue  # no chain left for this one: it shares nodes (routed by the caller)
        chains[d] = best[1]
        est[d] = gc.estimate(d, best[0], best[1])
        cap.take(best[1])
    free = usable.copy()
    for ch in chains.values():
        free[ch] = False
    _improve_pairs(gc, stages, seqs, chains, est, free, deadline)
    return chains or None


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
) -> list[list[int]]:
    """Per stage, the pool of ``_improve_pairs``: the two chains' nodes plus the ``per_stage``
    first ``spares`` (``_spares``: the free nodes nearest the latest data node), fewer where the
    chains through the pool would number more than ``POOL_CHAINS`` (long paths: 5 nodes a stage
    over 8 stages are 390,625 chains per stage order)."""
    k = per_stage
    while True:
        pool = set(pair).union(*(spare[:k] for spare in spares))
        by_stage = [[x for x in s if x in pool] for s in stages]
        if k == 0 or sum(math.prod(len(by_stage[s]) for s in seq) for seq in seqs) <= POOL_CHAINS:
            return by_stage
        k -= 1


def _improve_pairs(
    gc: GroupCosts, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...], chains: dict[int, list[int]],
    est: dict[int, float],
    free: np.ndarray, deadline: float | None, per_stage: int = 3,
) -> None:
    """Re-optimise the latest data node together with one other, while that helps. The pool
    is both chains plus, per stage, the ``per_stage`` free nodes nearest the latest data node
    (fewer on long paths: ``_pair_pool``)."""
    arrays = [np.asarray(s, dtype=int) for s in stages]
    owner = {x: d for d, ch in chains.items() for x in ch}
    near: dict[int, list[int]] = {}  # per data node: the nodes of its best unconstrained chains
    for _ in range(50 * len(chains)):
        if deadline is not None and time.perf_counter() > deadline:
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
            pool = {x for s in by_stage for x in s}
            current = (max(est[worst], est[e]), est[worst] + est[e])
            best = None
            for e1, c1 in _chains_in_pool(gc, worst, by_stage, seqs):
                if e1 >= current[0]:
                    break
                usable = np.zeros(len(free), dtype=bool)
                usable[[x for x in pool if x not in c1]] = True
                e2, c2 = _best_chain(gc, e, arrays, seqs, usable)
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


# ----------------------------------------------------------------------------- joint allocation


def stage_windows(sizes: list[int], groups: int) -> list[list[int]] | None:
    """Stages for each group's chain: ``groups`` sets of L-1 distinct stages (1..S-1) using
    stage s exactly sizes[s] times, each sorted; None if impossible."""
    need = list(sizes[1:])
    total = sum(need)
    if groups <= 0 or total % groups:
        return None
    k = total // groups
    if k < 1 or max(need) > groups:
        return None
    out = []
    for _ in range(groups):
        order = sorted(range(len(need)), key=lambda s: (-need[s], s))[:k]
        if any(need[s] <= 0 for s in order):
            return None
        for s in order:
            need[s] -= 1
        out.append(sorted(s + 1 for s in order))
    return out


# chains of this many nodes or more (5,040 orders) are tried one way round only
HALF_PERMS_FROM = 7


class _GroupSearch:
    """Groups of size L (data node first, then its chain in visiting order)."""

    def __init__(self, gc: GroupCosts, eligible: np.ndarray, size: int) -> None:
        self.gc = gc
        self.eligible = eligible
        self.size = size
        perms = np.array(list(itertools.permutations(range(size - 1))), dtype=int)
        if size - 1 >= HALF_PERMS_FROM:
            # a chain and its reverse make the same round trip (hops counted both ways): keep the
            # one that starts lower, which is also the first of the two in this order
            perms = perms[perms[:, 0] < perms[:, -1]]
        self.perms = perms
        self.known: dict[tuple[int, ...], tuple[float, list[int]]] = {}

    def best(self, nodes: list[int]) -> tuple[float, list[int]]:
        """Best role split of one group: (estimate, [data node, chain...]); remembered by the
        members in the order given (the swaps of the search meet the same groups again)."""
        key = tuple(int(x) for x in nodes)
        if key not in self.known:
            self.known[key] = self._best(nodes)
        value, members = self.known[key]
        return value, list(members)

    def _best(self, nodes: list[int]) -> tuple[float, list[int]]:
        gc = self.gc
        best: tuple[float, list[int]] = (math.inf, list(nodes))
        arr = np.asarray(nodes, dtype=int)
        for i, d in enumerate(nodes):
            if not self.eligible[d]:
                continue
            rest = np.delete(arr, i)
            chains = rest[self.perms]  # P x (L-1)
            route = np.concatenate([np.full((len(chains), 1), d), chains, np.full((len(chains), 1), d)], axis=1)
            tours = gc.rc.edge[route[:, :-1], route[:, 1:]].sum(axis=1)
            j = int(np.argmin(tours))
            trip = float(gc.rc.own[d] + gc.rc.node[rest].sum() + tours[j])
            chain = [int(x) for x in chains[j]]
            e = gc.estimate(d, trip, chain)
            if e < best[0]:
                best = (e, [int(d), *chain])
        return best


def group_allocation(
    problem: Problem, seed: int = 0, deadline: float | None = None
) -> tuple[list[list[int]], dict[int, list[int]]] | None:
    """Our own allocation built from groups (see the module text): (stages, chain per data
    node), or None when the stage sizes do not split into such groups."""
    w = problem.workload
    sizes = list(problem.stage_sizes)
    L = w.path_length
    n = problem.n
    D = sizes[0]
    if D * L != n:
        return None
    windows = stage_windows(sizes, D)
    if windows is None or any(path_rule_violation(win, w.max_swaps, w.max_jump) for win in windows):
        return None
    gc = GroupCosts.from_problem(problem)
    from skippipe.planner.allocation import data_node_candidates

    eligible = np.zeros(n, dtype=bool)
    eligible[data_node_candidates(problem)] = True
    search = _GroupSearch(gc, eligible, L)
    groups = _initial_groups(search, n, D, L, seed)
    if groups is None:
        return None
    groups = _improve_groups(search, groups, deadline)
    # stage labels: the i-th chain node gets the i-th smallest stage of its window; the
    # slowest groups get the windows with the smallest jumps (fewest stages skipped)
    scored = sorted((search.best(g) for g in groups), key=lambda t: -t[0])
    wins = sorted(windows, key=lambda win: (win[-1] - win[0], win))
    stages: list[list[int]] = [[] for _ in range(len(sizes))]
    chains: dict[int, list[int]] = {}
    for (_, members), win in zip(scored, wins):
        d, chain = members[0], members[1:]
        stages[0].append(d)
        for x, s in zip(chain, win):
            stages[s].append(x)
        chains[d] = chain
    stages = [sorted(s) for s in stages]
    caps = problem.load_caps(stages)
    if any(caps[x] < gc.m for ch in chains.values() for x in ch):
        return None
    return stages, chains


def _initial_groups(search: _GroupSearch, n: int, D: int, L: int, seed: int) -> list[list[int]] | None:
    """Greedy: the node farthest from its neighbours first, with its nearest free nodes."""
    edge = search.gc.rc.edge
    rng = np.random.default_rng(seed)
    free = np.ones(n, dtype=bool)
    groups: list[list[int]] = []
    for _ in range(D):
        idx = np.flatnonzero(free)
        sub = edge[np.ix_(idx, idx)].copy()
        np.fill_diagonal(sub, np.inf)
        k = min(L - 1, len(idx) - 1)
        near = np.sort(sub, axis=1)[:, :k].sum(axis=1) + rng.random(len(idx)) * 1e-9
        seed_node = int(idx[int(np.argmax(near))])
        group = [seed_node]
        free[seed_node] = False
        while len(group) < L:
            cand = np.flatnonzero(free)
            if not len(cand):
                return None
            cost = edge[np.ix_(group, cand)].sum(axis=0)
            x = int(cand[int(np.argmin(cost))])
            group.append(x)
            free[x] = False
        if not any(search.eligible[x] for x in group):
            # swap in the nearest eligible free node for the group's last member
            cand = np.flatnonzero(free & search.eligible)
            if not len(cand):
                return None
            x = int(cand[int(np.argmin(edge[group[0], cand]))])
            free[group[-1]] = True
            group[-1] = x
            free[x] = False
        groups.append(group)
    return groups


def _partners(search: _GroupSearch, groups: list[list[int]], worst: int, limit: int = 24) -> list[int]:
    """The groups nearest to the worst one (all of them when there are few)."""
    others = [h for h in range(len(groups)) if h != worst]
    if len(others) <= limit:
        return others
    edge = search.gc.rc.edge
    near = {h: float(edge[np.ix_(groups[worst], groups[h])].min()) for h in others}
    return sorted(others, key=lambda h: (near[h], h))[:limit]


def _improve_groups(search: _GroupSearch, groups: list[list[int]], deadline: float | None) -> list[list[int]]:
    """Swap nodes between the latest group and any other while the swap lowers the larger of
    the two estimates (node by node, best swap first)."""
    est = [search.best(g)[0] for g in groups]
    for _ in range(200 * len(groups)):
        if deadline is not None and time.perf_counter() > deadline:
            break
        worst = max(range(len(groups)), key=lambda i: (est[i], -i))
        best = None
        for h in _partners(search, groups, worst):
            for a in range(len(groups[worst])):
                for b in range(len(groups[h])):
                    g1 = list(groups[worst])
                    g2 = list(groups[h])
                    g1[a], g2[b] = g2[b], g1[a]
                    e1, e2 = search.best(g1)[0], search.best(g2)[0]
                    cand = max(e1, e2)
                    if cand < est[worst] - 1e-9 and (best is None or (cand, e1 + e2) < best[0]):
                        best = ((cand, e1 + e2), h, g1, g2, e1, e2)
        if best is None:
            break
        _, h, g1, g2, e1, e2 = best
        groups[worst], groups[h], est[worst], est[h] = g1, g2, e1, e2
    return groups
