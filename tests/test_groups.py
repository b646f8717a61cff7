"""Private chains and the joint allocation's group search (``planner.routing.groups``)."""

from __future__ import annotations

import itertools
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from skippipe.bounds import trip_floor, trip_floors
from skippipe.cluster_gen import gcp_regions_cluster, random_global_cluster, single_site_cluster, suite
from skippipe.errors import UserError
from skippipe.planfile import path_rule_violation
from skippipe.planner.allocation import allocate
from skippipe.planner.floors import free_allocation_floor
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import groups, joint_groups
from skippipe.planner.routing.candidates import stage_orders
from skippipe.workload import Workload, least_max_jump


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_long_chains_tried_one_way_round_find_the_same_best_group(seed):
    # a chain and its reverse make the same round trip, so trying each one way round only
    # (chains of 7 nodes or more) finds the same best role split as trying every order
    cluster = random_global_cluster(16, seed=seed, speed=(0.5, 2.0), memory=(1, 3))
    problem = build_problem(cluster, Workload(num_stages=8, path_length=8, microbatches_per_data_node=2, n_layers=24))
    gc = groups.GroupCosts.from_problem(problem)
    eligible = np.ones(problem.n, dtype=bool)
    members = [int(x) for x in np.random.default_rng(seed).permutation(problem.n)[:8]]
    halved = joint_groups._GroupSearch(gc, eligible, 8)
    with patch.object(joint_groups, "HALF_PERMS_FROM", 99):
        full = joint_groups._GroupSearch(gc, eligible, 8)
    assert len(halved.perms) * 2 == len(full.perms)
    (a, chain_a), (b, chain_b) = halved.best(members), full.best(members)
    assert abs(a - b) <= 1e-9 * max(1.0, abs(b))
    assert sorted(chain_a) == sorted(members) and chain_a[0] == chain_b[0]
    assert halved.best(members) == (a, chain_a)  # remembered


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(2, 6), sites=st.sampled_from([None, 2]))
def test_short_groups_tours_from_each_member_at_once_equal_those_one_by_one(seed, size, sites):
    # short groups search the best tour from each member; the search does them in one gather,
    # which must give each member's tour and order exactly (the hops of one site tie)
    cluster = random_global_cluster(12, seed=seed, sites=sites)
    problem = build_problem(cluster, Workload(num_stages=size, path_length=size, n_layers=2 * size))
    search = joint_groups._GroupSearch(groups.GroupCosts.from_problem(problem), np.ones(problem.n, dtype=bool), size)
    members = np.random.default_rng(seed).permutation(problem.n)[:size]
    at_once = search._best_tours(members, range(size))
    assert at_once == [search._best_tours(np.r_[d, np.delete(members, i)], [0])[0] for i, d in enumerate(members)]
    edge = search.gc.rc.edge
    for d, (tour, order) in zip(members, at_once):  # each the quickest tour from its member
        assert order[0] == d and sorted(order) == sorted(int(x) for x in members)
        assert tour == pytest.approx(sum(edge[order[i], order[(i + 1) % size]] for i in range(size)), rel=1e-12)
        quickest = min(sum(edge[a, b] for a, b in zip((d, *rest), (*rest, d)))
                       for rest in itertools.permutations([x for x in members if x != d]))
        assert tour == pytest.approx(quickest, rel=1e-12)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), length=st.integers(2, 6), m=st.integers(1, 8))
def test_pool_estimates_at_once_equal_the_estimates_one_by_one(seed, length, m):
    # the pair pool scores its chains in one array; each value must be exactly what
    # ``estimate`` gives for that chain (the search's order and ties depend on it)
    cluster = random_global_cluster(14, seed=seed, speed=(0.5, 2.0), memory=(1, 4), broken=0.2)
    problem = build_problem(cluster, Workload(num_stages=length, path_length=length, microbatches_per_data_node=m))
    gc = groups.GroupCosts.from_problem(problem)
    rng = np.random.default_rng(seed)
    d = int(rng.integers(problem.n))
    chains = np.array([rng.permutation([x for x in range(problem.n) if x != d])[:length - 1] for _ in range(30)])
    one_by_one = [gc.estimate(d, gc.rc.round_trip(d, c.tolist()), c.tolist()) for c in chains]
    assert gc.estimates(d, chains).tolist() == one_by_one


@settings(max_examples=50, deadline=None)
@given(trip=st.floats(0.0, 500.0), forward=st.floats(0.01, 5.0), m=st.integers(1, 12), slots=st.integers(1, 6))
def test_trip_floors_at_once_equal_trip_floor(trip, forward, m, slots):
    one = trip_floor(trip, forward, 2.0 * forward, m, slots, 0.05, 0.1)
    many = trip_floors(np.array([trip, trip]), forward, 2.0 * forward, m, np.array([slots, slots]), 0.05, 0.1)
    assert many.tolist() == [one, one]


def test_long_groups_search_their_cycle_once_for_every_member():
    # with L >= 8 a group's orders are searched once (``_best_tours`` from one member): every member's round
    # trip is that one cycle, so where no node has fewer slots than another (the estimate
    # is the round trip's alone) the data node and the estimate are those of trying every
    # member with every order of the others (``test_chain_slots`` has the uneven slots)
    cluster = random_global_cluster(20, seed=3, speed=(0.5, 2.0), memory=(3, 3))
    problem = build_problem(cluster, Workload(num_stages=8, path_length=8, microbatches_per_data_node=3))
    gc = groups.GroupCosts.from_problem(problem)
    eligible = np.ones(problem.n, dtype=bool)
    members = list(range(2, 10))
    value, best = joint_groups._GroupSearch(gc, eligible, 8).best(members)
    brute = min(
        (gc.estimate(d, gc.rc.round_trip(d, chain), chain), d)
        for d in members
        for chain in itertools.permutations([x for x in members if x != d])
    )
    assert value == pytest.approx(brute[0], rel=1e-12) and best[0] == brute[1]
    assert sorted(best) == members


def _pool(n: int, stages_n: int, length: int) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """The pair pool of two chains (each stage's first and second node) for a data node of a
    generated cluster: (stages, pool per stage, the chains' nodes)."""
    cluster = random_global_cluster(n, seed=7, speed=(0.5, 2.0), memory=(1, 3))
    problem = build_problem(cluster, Workload(num_stages=stages_n, path_length=length, microbatches_per_data_node=2))
    sizes = problem.stage_sizes
    stages = [list(range(sum(sizes[:s]), sum(sizes[:s + 1]))) for s in range(len(sizes))]
    pair = [s[0] for s in stages[1:]] + [s[1] for s in stages[1:]]
    free = np.ones(problem.n, dtype=bool)
    free[pair + stages[0]] = False
    seqs = (tuple(range(1, length)),)
    gc = groups.GroupCosts.from_problem(problem)
    return stages, groups._pair_pool(stages, seqs, pair, groups._spares(gc, stages, stages[0][0], free), 3), pair


def test_pair_pool_shrinks_the_spares_on_long_paths_only():
    # 60 nodes, 9 stages, paths through 8 of them: the two chains and 3 spares a stage would be
    # 5^8 = 390,625 chains to enumerate; the pool keeps the chains and drops spares until the
    # chains number at most POOL_CHAINS. On short paths it keeps every spare.
    stages, pool, pair = _pool(60, 9, 9)
    assert set(pair) <= {x for s in pool for x in s}
    assert int(np.prod([len(s) for s in pool[1:]])) <= groups.POOL_CHAINS
    assert any(len(s) > 2 for s in pool[1:])  # one spare a stage still fits (3^8 = 6,561)
    stages, pool, pair = _pool(20, 4, 4)
    assert all(len(s) == min(5, len(stage)) for s, stage in zip(pool[1:], stages[1:]))


# one site, 62 equal nodes, S = 9, L = 5: 12 data nodes and 50 others, 48 of them needed for
# private chains; the jump rule (at most 4 stages past the frontier) rules out some stage orders
DEEP_STAGES = [[0, 7, 11, 15, 20, 24, 28, 33, 37, 41, 46, 50], [1, 8, 12, 16, 21, 25, 29], [2, 9, 13, 17, 22, 26, 30],
               [3, 10, 14, 18, 23, 27], [4, 19, 31, 34, 38, 42], [5, 32, 35, 39, 43, 47], [6, 36, 40, 44, 48, 51],
               [45, 49, 52, 53, 54, 55], [56, 57, 58, 59, 60, 61]]


def _deep_problem():
    return build_problem(single_site_cluster(62, 0), Workload(num_stages=9, path_length=5))


def test_the_stage_orders_quota_gives_every_data_node_a_chain_where_the_greedy_does_not():
    problem = _deep_problem()
    stages = DEEP_STAGES
    sets = groups.private_chain_sets(problem, stages, problem.load_caps(stages), stage_orders(problem, stages))
    assert [len(s) for s in sets] == [7, 12]  # the greedy's look-ahead by stages, then the quota's
    chains = sets[1]
    assert sorted(chains) == sorted(stages[0])
    used = [x for ch in chains.values() for x in ch]
    assert len(used) == len(set(used)) == 48  # disjoint
    stage_of = {x: s for s, nodes in enumerate(stages) for x in nodes}
    for ch in chains.values():
        order = [stage_of[x] for x in ch]
        assert 0 not in order and path_rule_violation(order, problem.workload.max_swaps, problem.workload.max_jump) is None


def test_a_deep_single_site_plans_on_private_chains():
    # before the quota: 56.32 s (1.169 x the floor of 48.16 s), seven chains and five data
    # nodes sharing; with a chain each: 49.94 s
    problem = _deep_problem()
    plan = make_plan("skippipe", problem, seed=0)
    assert plan.predicted_makespan_s <= 1.05 * free_allocation_floor(problem).value


@settings(max_examples=25, deadline=None)
@given(n=st.integers(8, 40), num_stages=st.integers(3, 9), length=st.integers(2, 9), jump=st.integers(1, 5),
       seed=st.integers(0, 1000))
def test_the_quota_fits_the_stages_and_counts_at_least_the_greedys_chains(n, num_stages, length, jump, seed):
    length = min(length, num_stages)
    jump = max(jump, least_max_jump(num_stages, length))
    workload = Workload(num_stages=num_stages, path_length=length, max_jump=jump, max_swaps=seed % 2)
    try:
        problem = build_problem(single_site_cluster(n, seed), workload)
    except UserError:
        return  # too few nodes for the stages
    stages = allocate(problem, seed=seed)
    seqs = stage_orders(problem, stages)
    usable = np.ones(problem.n, dtype=bool)
    quota = groups.chain_quota(stages, usable, seqs, len(stages[0]))
    assert quota is not None and sum(quota.values()) <= len(stages[0])
    for s in range(1, num_stages):
        assert sum(c for seq, c in quota.items() if s in seq) <= len(stages[s])
    sets = groups.private_chain_sets(problem, stages, problem.load_caps(stages), seqs)
    assert all(len(chains) <= sum(quota.values()) for chains in sets)


def _uses_each_stage_its_size(windows: list[list[int]], sizes: list[int]) -> bool:
    counts = [0] * len(sizes)
    for win in windows:
        for s in win:
            counts[s] += 1
    return counts[1:] == list(sizes[1:]) and counts[0] == 0


def test_stage_windows_obey_the_jump_rule_where_the_greedy_does_not():
    # equal stages 1-8 of ten nodes, L = 5, max_jump 4: the greedy's windows 1-4 and 5-8 make
    # 0 -> 5, too far (the joint allocation had no groups then); the programme finds valid ones
    sizes = [20] + [10] * 8
    windows = joint_groups.stage_windows(sizes, 20, 1, 4)
    assert windows is not None and len(windows) == 20
    assert all(path_rule_violation(win, 1, 4) is None and win == sorted(win) for win in windows)
    assert _uses_each_stage_its_size(windows, sizes)
    # where the greedy's windows are valid they are kept as they were
    assert joint_groups.stage_windows([6, 4, 4, 4, 3, 3], 6, 1, 4) == [
        [1, 2, 3], [1, 2, 3], [1, 4, 5], [2, 3, 4], [1, 2, 5], [3, 4, 5]]
    # and none where no dealing is valid: three stages each, jumps of one, 4-6 cannot follow 0
    assert joint_groups.stage_windows([2, 1, 1, 1, 1, 1, 1], 2, 0, 1) is None


@settings(max_examples=40, deadline=None)
@given(num_stages=st.integers(3, 9), groups_=st.integers(1, 12), data=st.data())
def test_stage_windows_are_valid_paths_that_use_every_stage_its_size(num_stages, groups_, data):
    k = data.draw(st.integers(1, num_stages - 1))
    jump = data.draw(st.integers(1, 5))
    swaps = data.draw(st.integers(0, 2))
    # stage sizes 1..S-1 summing to groups x k, none above groups
    sizes = [groups_]
    left = groups_ * k
    for s in range(1, num_stages):
        rest = num_stages - 1 - s
        low, high = max(0, left - rest * groups_), min(groups_, left)
        if low > high:
            return
        size = data.draw(st.integers(low, high))
        sizes.append(size)
        left -= size
    if left != 0 or min(sizes[1:]) < 1:
        return
    windows = joint_groups.stage_windows(sizes, groups_, swaps, jump)
    if windows is None:
        return  # no dealing (the programme is exact; the unit test above checks a case with none)
    assert len(windows) == groups_
    assert all(len(win) == k and path_rule_violation(win, swaps, jump) is None for win in windows)
    assert _uses_each_stage_its_size(windows, sizes)


def test_the_joint_allocation_exists_where_the_jump_rule_binds():
    # 12 nodes, one site each, S = 9, L = 3, max_jump 4 (sweep case 375): stages 1-8 of one node
    # each, and the greedy's windows [1, 2], [3, 4], [5, 6], [7, 8] start with jumps of 5 and
    # 7; with valid windows the joint allocation gives every data node a private chain and
    # the plan is its floor (23.30 s before)
    cluster = random_global_cluster(12, seed=375, memory=(1, 1), broken=0.2)
    w = Workload(num_stages=9, path_length=3, microbatches_per_data_node=1, n_layers=27, max_swaps=2, max_jump=4)
    problem = build_problem(cluster, w)
    found = joint_groups.group_allocation(problem)
    assert found is not None
    stages, chains = found
    stage_of = {x: s for s, nodes in enumerate(stages) for x in nodes}
    assert sorted(chains) == sorted(stages[0])
    assert all(path_rule_violation([stage_of[x] for x in chain], 2, 4) is None for chain in chains.values())
    plan = make_plan("skippipe", problem, seed=0)
    floor = free_allocation_floor(problem).value
    assert plan.predicted_makespan_s <= floor * (1 + 1e-6)


def _latest_estimate(search, found) -> float:
    return max(search.best(g)[0] for g in found)


def test_the_group_search_from_random_starts_finds_a_quicker_latest_group():
    # 80 nodes round robin over the 12 GCP regions, S = 6, L = 4: the greedy from the remotest
    # node ends with a group estimated at 64.86 s (regions far apart in one group), the best of
    # the random starts at 48.74 s
    problem = build_problem(gcp_regions_cluster(80), Workload(num_stages=6, path_length=4, n_layers=18))
    D, L = int(problem.stage_sizes[0]), problem.workload.path_length
    assert D * L == problem.n
    search = joint_groups._GroupSearch(groups.GroupCosts.from_problem(problem), np.ones(problem.n, dtype=bool), L)
    with patch.object(joint_groups, "GROUP_STARTS", 1):
        first = joint_groups._searched_groups(search, problem.n, D, L, 0, None)
    searched = joint_groups._searched_groups(search, problem.n, D, L, 0, None)
    assert _latest_estimate(search, searched) < 0.8 * _latest_estimate(search, first)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.sampled_from([12, 15, 20]))
@example(seed=440, n=12).via("two data nodes by speed: 4 spare nodes in no group")
def test_the_group_search_is_never_worse_than_its_first_start(seed, n):
    cluster = random_global_cluster(n, seed=seed, sites=3, speed=(0.5, 2.0))
    problem = build_problem(cluster, Workload(num_stages=4, path_length=4 if n != 15 else 3, n_layers=12))
    D, L = int(problem.stage_sizes[0]), problem.workload.path_length
    search = joint_groups._GroupSearch(groups.GroupCosts.from_problem(problem), np.ones(problem.n, dtype=bool), L)
    with patch.object(joint_groups, "GROUP_STARTS", 1):
        first = joint_groups._searched_groups(search, problem.n, D, L, seed, None)
    searched = joint_groups._searched_groups(search, problem.n, D, L, seed, None)
    if first is None:
        assert searched is None
        return
    members = sorted(x for g in searched for x in g)
    assert len(searched) == D and all(len(g) == L for g in searched) and len(set(members)) == len(members)
    if D * L == problem.n:  # every node in one group; where D x L is less, the nodes left over are spares
        assert members == list(range(problem.n))
    assert _latest_estimate(search, searched) <= _latest_estimate(search, first) + 1e-9


def test_the_group_search_stops_at_its_share_of_the_planning_target():
    # long chains cost thousands of orders a group (847 nodes, L = 8: 44.5 s estimated and 66 s
    # of planning against a 55-s target before the share): with no share the swaps and the
    # random starts are skipped, and the groups of the first start are still a valid allocation
    cluster = random_global_cluster(40, seed=3, memory=(1, 3))
    problem = build_problem(cluster, Workload(num_stages=8, path_length=8, microbatches_per_data_node=4, n_layers=24))
    searches = []
    init = joint_groups._GroupSearch.__init__

    def kept(self, *args, **kwargs):
        init(self, *args, **kwargs)
        searches.append(self)

    with patch.object(joint_groups._GroupSearch, "__init__", kept):
        full = joint_groups.group_allocation(problem)
        with patch.object(joint_groups, "GROUP_SHARE", 0.0):
            capped = joint_groups.group_allocation(problem)
    assert full is not None and capped is not None
    assert searches[1].limit_s == 0.0 < searches[1].spent_s < searches[0].spent_s <= searches[0].limit_s
    stages, chains = capped
    stage_of = {x: s for s, nodes in enumerate(stages) for x in nodes}
    assert [len(s) for s in stages] == list(problem.stage_sizes)
    assert all(path_rule_violation([stage_of[x] for x in chain], 0, 4) is None for chain in chains.values())


def test_the_pair_search_of_private_chains_stops_at_its_share_of_the_planning_target():
    # 985 nodes with S = 9, L = 7 and 141 data nodes tried 130,309 partners' chains (38 s)
    # before the share: with no share the greedy's chains are kept as they are
    case = next(c for c in suite(0, largest=40) if c.kind == "6 sites, mem 1-4 only")
    problem = build_problem(case.cluster, case.workload())
    stages = allocate(problem, seed=0)
    seqs, caps = stage_orders(problem, stages), problem.load_caps(stages)
    gc = groups.GroupCosts.from_problem(problem)

    def latest(chains):
        return max(gc.estimate(d, gc.rc.round_trip(d, ch), ch) for d, ch in chains.items())

    searched = groups.private_chain_sets(problem, stages, caps, seqs)[0]
    with patch.object(groups, "PAIRS_SHARE", 0.0), patch.object(groups, "PAIR_FREE_TRIES", 0):
        greedy = groups.private_chain_sets(problem, stages, caps, seqs)[0]
    assert sorted(greedy) == sorted(searched) and latest(searched) < latest(greedy) - 1e-6
