"""The joint allocation from private chains: the allocation is ours to choose.

``group_allocation`` splits the nodes into groups of one data node + L-1 chain nodes minimising
the latest estimated finish (``groups.GroupCosts.estimate``; greedy groups of near neighbours,
then node swaps between the latest group and the others), then hands out stage labels so that
every stage gets its size and each chain visits its stages in increasing order, a valid path
(``stage_windows``). Each data node then has a private chain (``groups``), so no two data
nodes' microbatches meet. Where the cluster has a few nodes more than the D groups of L take
(41 nodes, L = 5, D = 8), those are in no group (the search swaps them with the latest
group's nodes where that helps) and take the stages' places that the windows leave
(``group_places.spare_places``). Where it has too few (43 nodes, L = 5, D = 9: 34 nodes for
nine chains of four), G = (N - D) // (L - 1) groups are searched, the D - G data nodes left
over are chosen first (``group_places.leftover_data_nodes``) and share visited nodes as
``static.routes_on_chains`` routes them. Before, neither kind of cluster had a joint
allocation at all.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from skippipe.planfile import path_rule_violation
from skippipe.planner.allocation.tours import best_tour
from skippipe.planner.problem import Problem
from skippipe.planner.routing.budget import planning_target_s
from skippipe.planner.routing.group_places import enough_chain_nodes, leftover_data_nodes, spare_places
from skippipe.planner.routing.groups import GroupCosts
from skippipe.planner.stage_orders import stage_sequences


def stage_windows(sizes: list[int], groups: int, max_swaps: int, max_jump: int) -> list[list[int]] | None:
    """Stages for each group's chain: ``groups`` sets of L-1 distinct stages (1..S-1) using
    stage s exactly sizes[s] times, each sorted and a valid path in that order; None if
    impossible. First greedily, each window the stages that the most chains still need; where
    that breaks the path rule (with the jump rule binding, 1-4 and 5-8 of 8 stages are not two
    windows: 0 -> 5 is too far), how many groups take each valid window is one small integer
    programme (HiGHS), the windows' spans (last stage - first) as short as it can."""
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
            break
        for s in order:
            need[s] -= 1
        out.append(sorted(s + 1 for s in order))
    if len(out) == groups and all(path_rule_violation(win, max_swaps, max_jump) is None for win in out):
        return out
    return _valid_windows(sizes, groups, k, max_jump)


def _valid_windows(sizes: list[int], groups: int, k: int, max_jump: int) -> list[list[int]] | None:
    """``stage_windows`` by the integer programme over the valid windows of k stages (the
    stage orders with no swap: a window is visited in increasing order)."""
    valid = [list(win) for win in stage_sequences(len(sizes), k + 1, 0, max_jump)]
    if not valid:
        return None
    uses = np.array([[1.0 if s in win else 0.0 for win in valid] for s in range(1, len(sizes))])
    rows = np.vstack([uses, np.ones((1, len(valid)))])
    target = np.array([*sizes[1:], groups], dtype=float)
    span = np.array([win[-1] - win[0] for win in valid], dtype=float)
    options = {"node_limit": WINDOW_NODES, "time_limit": WINDOW_SECONDS, "presolve": len(valid) <= PRESOLVE_WINDOWS}
    res = milp(c=span, constraints=LinearConstraint(rows, target, target), integrality=np.ones(len(valid)),
               bounds=Bounds(0, groups), options=options)
    if res.x is None:
        return None
    counts = np.round(res.x).astype(int)
    return [list(win) for win, c in zip(valid, counts) for _ in range(c)]


# starts of the group search (the greedy from the remotest node, then from random ones), up to
# MANY_STARTS_NODES nodes: on the suite's gcp 12 regions (100 nodes) the first start ends with
# a latest estimate of 64.65 s, four of ten random ones at 56.81 s
GROUP_STARTS = 8
MANY_STARTS_NODES = 200
# chain orders estimated (``_GroupSearch.work``) beyond which no more random starts are made,
# and none where the first start took a quarter of it (the 100-node cluster: 81,000, then
# 560,000 with its eight starts)
GROUP_WORK = 1_000_000
# a safety net on the windows' programme (seconds of HiGHS; 70 windows at S = 9 take milliseconds);
# what bounds it is its branch-and-bound nodes, a count, so that every machine finds the same windows
WINDOW_SECONDS = 5.0
WINDOW_NODES = 200
# HiGHS's presolve alone took 6.2 s on the 5,115 windows of S = 16, L = 9 (the programme without
# it 0.13 s, the same optimum): beyond this many windows it is left out
PRESOLVE_WINDOWS = 1_000
# chains of this many nodes or more (5,040 orders) are tried one way round only, and a group's
# orders are searched once for all its members (``_best_tours`` from one member)
HALF_PERMS_FROM = 7
# chains of this many nodes or more (9! = 362,880 orders: gigabytes of index arrays, and 13! at
# L = 14 more than the machine's memory) are not enumerated: a group's tour is ``best_tour``'s
# (Held-Karp up to ``tours.HELD_KARP_MOST`` nodes, 2-opt beyond), estimated at TOUR_S CPU seconds a
# group (measured: 0.2-2.1 ms for 10-13 nodes by Held-Karp, 0.5-3.6 ms for 14-20 by 2-opt)
TOUR_FROM = 9
TOUR_S = 4e-3
# the CPU seconds of one member's role estimated and of one chain order's tour (measured on the
# 2-core machine: 847 nodes with L = 8, 107,624 groups of 2,520 orders in 44.6 s)
GROUP_MEMBER_S = 2.4e-5
GROUP_ORDER_S = 8.8e-8
# the share of the planning-time target the group search may take by that estimate (a count, so
# every machine searches the same): the swaps stop there and no more starts are made. Only long
# chains on large clusters reach it (847 nodes with L = 8: 44.5 s estimated, 0.81 of the
# target; the sweep's cases at most 0.39, 119 nodes with L = 7)
GROUP_SHARE = 0.3


class _GroupSearch:
    """Groups of size L (data node first, then its chain in visiting order)."""

    def __init__(self, gc: GroupCosts, eligible: np.ndarray, size: int) -> None:
        self.gc = gc
        self.eligible = eligible
        self.size = size
        # long chains: tried one way round, every data node of a group closing the same cycle
        self.one_way = size - 1 >= HALF_PERMS_FROM
        self.tours = size - 1 >= TOUR_FROM  # not enumerated: one tour per group (``best_tour``)
        perms = np.zeros((1, size - 1), dtype=int)
        if not self.tours:
            perms = np.array(list(itertools.permutations(range(size - 1))), dtype=int)
        if self.one_way and not self.tours:
            # a chain and its reverse make the same round trip (hops counted both ways): keep the
            # one that starts lower, which is also the first of the two in this order
            perms = perms[perms[:, 0] < perms[:, -1]]
        self.perms = perms
        self.known: dict[tuple[int, ...], tuple[float, list[int]]] = {}
        self.work = 0  # chain orders estimated so far (groups not met before x their orders)
        self.outside: set[int] = set()  # nodes no group may take (the data nodes left without a chain)
        # the estimated CPU seconds of the role splits estimated so far (``GROUP_MEMBER_S``, ``GROUP_ORDER_S``)
        self.spent_s = 0.0
        self.limit_s = GROUP_SHARE * planning_target_s(len(eligible))

    def best(self, nodes: list[int]) -> tuple[float, list[int]]:
        """Best role split of one group: (estimate, [data node, chain...]); remembered by the
        members in the order given (the swaps of the search meet the same groups again)."""
        key = tuple(int(x) for x in nodes)
        if key not in self.known:
            self.known[key] = self._best(nodes)
            tours = 1 if self.one_way else self.size
            order_s = TOUR_S if self.tours else GROUP_ORDER_S * tours * len(self.perms)
            self.work += int(order_s / GROUP_ORDER_S) if self.tours else len(self.perms)
            self.spent_s += GROUP_MEMBER_S * self.size + order_s
        value, members = self.known[key]
        return value, list(members)

    def _best(self, nodes: list[int]) -> tuple[float, list[int]]:
        gc = self.gc
        best: tuple[float, list[int]] = (math.inf, list(nodes))
        arr = np.asarray(nodes, dtype=int)
        # long groups: every data node closes the same cycle; short ones: the best tour from each
        cycles = self._best_tours(arr, [0]) * len(nodes) if self.one_way else self._best_tours(arr, range(len(arr)))
        for i, d in enumerate(nodes):
            if not self.eligible[d]:
                continue
            rest = np.delete(arr, i)
            tour, order = cycles[i]
            k = order.index(int(d))
            chain = order[k + 1:] + order[:k]
            trip = float(gc.rc.own[d] + gc.rc.node[rest].sum() + tour)
            e, held = gc.estimate_and_held(int(d), trip, chain)
            if held >= e > 0.0:  # the slots decide: other orders may do better
                e, chain = self._slot_order(int(d), chain, e)
            if e < best[0]:
                best = (e, [int(d), *chain])
        return best

    def _slot_order(self, d: int, chain: list[int], est: float) -> tuple[float, list[int]]:
        """Where the slots of a chain node decide ``d``'s estimate, the tour is not the whole
        story (a one-slot node first in the chain holds a slot for nearly a whole round trip,
        last for its own visit, one hop out and back and the loss): the tour the other way
        round and both ways sorted by slots (most first, stably) are estimated too, the
        tour's kept on a tie. (Every order of every group made the group search about 6 x
        slower on a 40-node cluster with S = 9, L = 5, and its plans no quicker.)"""
        gc = self.gc
        best = (est, chain)
        back = chain[::-1]
        for order in (back, *(sorted(c, key=lambda x: -min(int(gc.memory[x]), gc.m)) for c in (chain, back))):
            if order != chain:
                e = gc.estimate(d, gc.rc.round_trip(d, order), order)
                if e < best[0] - 1e-9:
                    best = (e, order)
        return best

    def _best_tours(self, arr: np.ndarray, starts: range | list[int]) -> list[tuple[float, list[int]]]:
        """Per member ``arr[i]`` of ``starts``: the quickest tour from it through the others (in
        their order in ``arr``) and back, over ``self.perms`` (one way round for long groups:
        hops count both ways), as (its hop seconds, its members from ``arr[i]`` on); all in one
        gather. A round trip is such a cycle whichever member is the data node, so long groups
        search their orders from one member only, short ones from each. From ``TOUR_FROM``
        chain nodes, ``best_tour`` instead of every order (the starts are then ``[0]``)."""
        if self.tours:
            order, cost = best_tour(self.gc.rc.edge[np.ix_(arr, arr)])
            return [(float(cost), [int(arr[j]) for j in order])]
        k = len(arr)
        others = np.array([[j for j in range(k) if j != i] for i in starts], dtype=int)
        chains = arr[others][:, self.perms]  # [start, order, chain position]
        first = np.broadcast_to(arr[list(starts), None, None], (len(others), len(self.perms), 1))
        route = np.concatenate([first, chains, first], axis=2)
        tours = self.gc.rc.edge[route[:, :, :-1], route[:, :, 1:]].sum(axis=2)
        best = tours.argmin(axis=1)
        return [(float(tours[r, j]), [int(arr[i]), *(int(x) for x in chains[r, j])])
                for r, (i, j) in enumerate(zip(starts, best))]


def group_allocation(
    problem: Problem, seed: int = 0, deadline: float | None = None, leftovers: bool = True,
) -> tuple[list[list[int]], dict[int, list[int]]] | None:
    """Our own allocation built from groups (see the module text): (stages, chain per data
    node), or None when the stage sizes do not split into such groups. ``leftovers=False``:
    None where the nodes are too few for D groups (the quicker start of a large cluster's
    groups: there the 1,000-node gcp suite row went 57.13 -> 57.53 s and the uneven one took
    9 s more with them)."""
    w = problem.workload
    sizes = list(problem.stage_sizes)
    L = w.path_length
    n = problem.n
    D = sizes[0]
    G = min(D, (n - D) // (L - 1)) if L > 1 else D  # groups: D, or fewer where nodes are short
    if G < D and not leftovers:
        return None
    spared = spare_places(sizes, n - D - G * (L - 1))
    if spared is None or G < 1:
        return None
    chain_sizes, spare_stages = spared
    windows = stage_windows(chain_sizes, G, w.max_swaps, w.max_jump)
    if windows is None or not enough_chain_nodes(problem, D, G):
        return None
    gc = GroupCosts.from_problem(problem)
    from skippipe.planner.allocation import data_node_candidates

    eligible = np.zeros(n, dtype=bool)
    eligible[data_node_candidates(problem)] = True
    search = _GroupSearch(gc, eligible, L)
    leftover = leftover_data_nodes(gc, eligible, D - G, L)
    if leftover is None:
        return None
    search.outside = set(leftover)
    groups = _searched_groups(search, n, G, L, seed, deadline)
    if groups is None:
        return None
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
    taken = {x for g in groups for x in g} | search.outside
    stages[0] += leftover
    for s, x in zip(spare_stages, (x for x in range(n) if x not in taken)):
        stages[s].append(x)
    stages = [sorted(s) for s in stages]
    caps = problem.load_caps(stages)
    if any(caps[x] < gc.m for ch in chains.values() for x in ch):
        return None
    return stages, chains


def _searched_groups(
    search: _GroupSearch, n: int, D: int, L: int, seed: int, deadline: float | None
) -> list[list[int]] | None:
    """The groups of the least latest estimate over ``GROUP_STARTS`` starts, each improved by
    ``_improve_groups``: the greedy from the remotest node, then greedy ones from random nodes
    (deterministic for ``seed``); a later start is kept only where its latest estimate is lower
    (on the suite's gcp one per region and aws-2022 geo-distributed the random starts tie it
    with a lower sum of estimates, and plan 0.3-0.6 % slower). Up to ``MANY_STARTS_NODES``
    nodes only, and the random starts only while the chain orders estimated stay within
    ``GROUP_WORK`` (long chains cost thousands of orders a group: a 27-node cluster with
    L = 9 went from 2.5 to 23 s of CPU with every start)."""
    rng = np.random.default_rng(seed)
    best: tuple[float, list[list[int]]] | None = None
    first_work = 0
    for start in range(GROUP_STARTS if n <= MANY_STARTS_NODES else 1):
        if start and (search.work > GROUP_WORK or 4 * first_work > GROUP_WORK or search.spent_s > search.limit_s
                      or (deadline is not None and time.perf_counter() > deadline)):
            break
        groups = _initial_groups(search, n, D, L, rng, remotest_first=start == 0)
        if groups is None:
            continue  # no eligible data node left for a group from this start
        groups = _improve_groups(search, groups, deadline)
        if start == 0:
            first_work = search.work
        latest = max(search.best(g)[0] for g in groups)
        if best is None or latest < best[0] - 1e-9:
            best = (latest, groups)
    return best[1] if best is not None else None


def _initial_groups(
    search: _GroupSearch, n: int, D: int, L: int, rng: np.random.Generator, remotest_first: bool = True
) -> list[list[int]] | None:
    """Greedy: a group starts from the free node farthest from its neighbours (or a random free
    node), with its nearest free nodes."""
    edge = search.gc.rc.edge
    free = np.ones(n, dtype=bool)
    free[list(search.outside)] = False
    groups: list[list[int]] = []
    for _ in range(D):
        idx = np.flatnonzero(free)
        sub = edge[np.ix_(idx, idx)].copy()
        np.fill_diagonal(sub, np.inf)
        k = min(L - 1, len(idx) - 1)
        near = np.sort(sub, axis=1)[:, :k].sum(axis=1) + rng.random(len(idx)) * 1e-9
        seed_node = int(idx[int(np.argmax(near))]) if remotest_first else int(rng.choice(idx))
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
    the two estimates (node by node, best swap first), or between the latest group and the
    nodes in no group (a cluster with more nodes than the groups take) while that lowers its
    estimate."""
    est = [search.best(g)[0] for g in groups]
    n = len(search.eligible)

    def in_no_group() -> list[int]:
        taken = {x for g in groups for x in g} | search.outside
        return [x for x in range(n) if x not in taken]

    spares = in_no_group()
    for _ in range(200 * len(groups)):
        if (deadline is not None and time.perf_counter() > deadline) or search.spent_s > search.limit_s:
            break
        worst = max(range(len(groups)), key=lambda i: (est[i], -i))
        best = None
        for a in range(len(groups[worst])):
            for spare in spares:
                g1 = list(groups[worst])
                g1[a] = spare
                e1 = search.best(g1)[0]
                if e1 < est[worst] - 1e-9 and (best is None or (e1, e1) < best[0]):
                    best = ((e1, e1), None, g1, None, e1, None)
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
        groups[worst], est[worst] = g1, e1
        if h is not None:
            groups[h], est[h] = g2, e2
        else:
            spares = in_no_group()  # a spare swapped in, a member out
    return groups
