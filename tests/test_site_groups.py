"""Clusters of sites planned whole and in groups (``planner.routing.site_groups``): when the
candidate is tried, that the grouped plan is valid and keeps each group to itself, that
``skippipe`` keeps the quicker of the two, and above 200 nodes the groups alone (where the
cluster has sites and their planning fits the time target) behind the safety net."""

from __future__ import annotations

import pytest

from skippipe.cluster_gen import random_global_cluster, single_site_cluster, suite
from skippipe.planfile import plan_violations
from skippipe.planner import methods
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import budget, decompose
from skippipe.planner.routing import site_groups as G
from skippipe.planner.routing.budget import default_budget
from skippipe.planner.routing.schedule import plan_no_tc2, plan_skippipe
from skippipe.sim import simulate
from skippipe.workload import Workload

WORKLOAD = Workload(num_stages=4, path_length=3)


def test_groups_only_where_the_cluster_has_sites():
    sites = build_problem(random_global_cluster(60, seed=1, sites=4), WORKLOAD)
    groups = G.site_groups(sites)
    assert groups is not None and len(groups) >= 2
    assert sorted(i for g in groups for i in g) == list(range(60))
    assert min(len(g) for g in groups) >= G.GROUP_NODES
    # one site: groups there would be arbitrary
    assert G.site_groups(build_problem(single_site_cluster(60, seed=1), WORKLOAD)) is None
    # too small, or the stage sizes fixed by the user
    assert G.site_groups(build_problem(random_global_cluster(G.SPLIT_NODES - 1, seed=1, sites=4), WORKLOAD)) is None
    fixed = Workload(num_stages=4, path_length=3, stage_sizes=(12, 16, 16, 16))
    assert G.site_groups(build_problem(random_global_cluster(60, seed=1, sites=4), fixed)) is None


def test_grouped_plan_is_valid_and_keeps_each_group_to_itself(small_split):
    problem = build_problem(random_global_cluster(30, seed=3, sites=3, speed=(0.5, 2.0)), WORKLOAD)
    groups = G.site_groups(problem)
    assert groups is not None
    plan = G.grouped_plan(problem, groups, seed=0, time_limit_s=None)
    assert plan is not None and plan_violations(plan) == []
    assert [len(s) for s in plan.stages] == problem.stage_sizes
    group_of = {node: k for k, g in enumerate(groups) for node in g}
    for mb in plan.microbatches:
        assert {group_of[node] for node in mb.route()} == {group_of[mb.data_node]}
    assert plan.meta["candidate"] == G.CANDIDATE
    assert sum(plan.meta["group_data_nodes"]) == problem.stage_sizes[0]
    assert plan.predicted_makespan_s == pytest.approx(simulate(plan, record=False).makespan_s)


def test_from_24_nodes_two_groups_of_sites_are_tried():
    assert G.SPLIT_NODES == 2 * G.SMALL_GROUP_NODES  # the least cluster that splits into two groups
    groups = G.site_groups(build_problem(random_global_cluster(25, seed=2, sites=2), WORKLOAD))
    assert groups is not None and sorted(len(g) for g in groups) == [12, 13]
    # from 2 x GROUP_NODES nodes a group holds GROUP_NODES or more
    assert G.least_group(2 * G.GROUP_NODES - 1) == G.SMALL_GROUP_NODES
    groups = G.site_groups(build_problem(random_global_cluster(33, seed=3, sites=2), WORKLOAD))
    assert groups is not None and sorted(len(g) for g in groups) == [16, 17]


def test_the_whole_search_beside_the_groups_has_all_its_budget_below_48_nodes():
    small = build_problem(random_global_cluster(G.HALF_BUDGET_NODES - 1, seed=1, sites=4), WORKLOAD)
    large = build_problem(random_global_cluster(G.HALF_BUDGET_NODES, seed=1, sites=4), WORKLOAD)
    assert G.whole_budget(small) is None  # the default search: never slower than it alone
    assert G.whole_budget(large) == default_budget(large) // 2


def test_a_40_node_cluster_of_six_sites_is_planned_in_groups():
    """The suite's "global, 6 sites" of seed 2: planned whole only, as before the candidate
    was tried below 48 nodes, it took 62.36 s; the groups of sites plan it at 59.86 s."""
    case = next(c for c in suite(2, largest=40) if c.kind == "global, 6 sites")
    problem = build_problem(case.cluster, case.workload())
    plan = methods.make_plan("skippipe", problem, seed=2)
    assert plan_violations(plan) == []
    assert plan.meta["candidate"] == G.CANDIDATE
    assert plan.predicted_makespan_s < 0.97 * 62.36


@pytest.mark.parametrize("seed", [3, 5])  # on 3 the whole plan is quicker, on 5 the grouped one
def test_skippipe_keeps_the_quicker_of_whole_and_grouped(small_split, seed):
    problem = build_problem(random_global_cluster(30, seed=seed, sites=3, speed=(0.5, 2.0), memory=(1, 4)), WORKLOAD)
    groups = G.site_groups(problem)
    assert groups is not None
    whole = plan_skippipe(problem, seed=0, budget=G.whole_budget(problem),
                          fallbacks=lambda stages: methods._fallbacks(problem, stages, seed=0))
    grouped = G.grouped_plan(problem, groups, seed=0, time_limit_s=None)
    plan = methods.make_plan("skippipe", problem, seed=0)
    assert plan_violations(plan) == []
    candidates = [whole.predicted_makespan_s] + ([] if grouped is None else [grouped.predicted_makespan_s])
    assert plan.predicted_makespan_s == pytest.approx(min(candidates))
    if grouped is not None:  # the other candidate's makespan is recorded
        recorded = plan.meta.get("whole_makespan_s", plan.meta.get("grouped_makespan_s"))
        assert recorded == pytest.approx(max(candidates), rel=1e-6)
    # the default budget is counted, not timed: planning twice gives the same plan
    again = methods.make_plan("skippipe", problem, seed=0)
    assert again.predicted_makespan_s == plan.predicted_makespan_s
    assert [mb.path for mb in again.microbatches] == [mb.path for mb in plan.microbatches]


def test_above_the_decompose_size_groups_need_sites_and_time(large_path, monkeypatch):
    sites = build_problem(random_global_cluster(30, seed=3, sites=3, speed=(0.5, 2.0)), WORKLOAD)
    groups = G.site_groups(sites)
    assert groups is not None and len(groups) >= 2
    assert G.grouped_wall_estimate(sites, groups) < budget.PLANNING_SHARE * budget.planning_target_s(30)
    # one node per site: groups would be arbitrary
    assert not G.has_sites(build_problem(random_global_cluster(300, seed=1), WORKLOAD).transfer_s)
    assert G.site_groups(build_problem(random_global_cluster(30, seed=3, speed=(0.5, 2.0)), WORKLOAD)) is None
    # groups whose starts would not fit the planning-time target are not planned
    monkeypatch.setattr(G, "GROUP_PLAN_S", 1.0)
    assert G.site_groups(sites) is None


def test_above_the_decompose_size_groups_alone_behind_the_safety_net(large_path):
    problem = build_problem(random_global_cluster(30, seed=3, sites=3, speed=(0.5, 2.0), memory=(1, 4)), WORKLOAD)
    groups = G.site_groups(problem)
    grouped = G.grouped_plan(problem, groups, seed=0, time_limit_s=None, thorough=False)
    base = plan_no_tc2(problem, seed=0)
    base_s = simulate(base, record=False).makespan_s
    nets = [p.predicted_makespan_s for _, p in methods._fallbacks(problem, base.stages, seed=0)]
    plan = methods.make_plan("skippipe", problem, seed=0)
    assert plan_violations(plan) == []
    assert plan.predicted_makespan_s == pytest.approx(min([grouped.predicted_makespan_s, base_s, *nets]))
    assert "whole_makespan_s" not in plan.meta  # the whole cluster is not searched


def test_the_wall_clock_estimate_shares_a_batch_over_the_workers(large_path):
    sites = build_problem(random_global_cluster(30, seed=3, sites=3, speed=(0.5, 2.0)), WORKLOAD)
    groups = G.site_groups(sites)
    sizes = decompose.apportion(sites.stage_sizes, groups, 1.0 / sites.forward_s)
    subs = [decompose.sub_problem(sites, g, row) for g, row in zip(groups, sizes)]
    one = [G.batch_wall_s([sub]) for sub in subs]
    assert one == [G.GROUP_PLAN_S * sub.n**2 * sub.num_stages for sub in subs]
    assert max(one) <= G.batch_wall_s(subs) < sum(one)  # the workers share a batch
    assert G.batch_wall_s([subs[0], subs[0]]) == pytest.approx(one[0])  # two alike side by side
    assert [id(s) for s in decompose.fresh_groups(subs + subs, ()).values()] == [id(s) for s in subs]  # one plan per cost
    assert [id(s) for s in decompose.fresh_groups(subs, {decompose.cost_key(subs[0])}).values()] == [id(s) for s in subs[1:]]
    assert G.grouped_wall_estimate(sites, groups) == pytest.approx(G.batch_wall_s(subs) + G.SINGLE_ROUNDS * max(one))


def test_the_thorough_estimate_counts_the_search_and_its_microbatches(large_path):
    # below 200 nodes a group is planned with the thorough start and GROUP_BUDGET simulations,
    # which grow with the microbatches (fuzz case 1828, 141 nodes with 17 microbatches per data
    # node: 2.4 s estimated without the search, the groups took about 27 s)
    estimates = []
    for m in (2, 6, 17):
        sites = build_problem(random_global_cluster(30, seed=3, sites=3, speed=(0.5, 2.0)),
                              Workload(num_stages=4, path_length=3, microbatches_per_data_node=m))
        groups = G.site_groups(sites)
        sizes = decompose.apportion(sites.stage_sizes, groups, 1.0 / sites.forward_s)
        sub = decompose.sub_problem(sites, groups[0], sizes[0])
        search = (decompose.GROUP_BUDGET * budget.SIM_OP_S + G.THOROUGH_START_OP_S) * budget.operations(sub)
        assert G.group_plan_s(sub, thorough=True) == pytest.approx(G.group_plan_s(sub) + search)
        estimates.append(G.grouped_wall_estimate(sites, groups, thorough=True))
        assert estimates[-1] > G.grouped_wall_estimate(sites, groups)
    assert estimates == sorted(estimates) and estimates[-1] > 2 * estimates[0]


@pytest.mark.parametrize("room_s", [0.0, 1e9])
def test_rounds_of_many_moves_only_while_their_estimate_fits(large_path, monkeypatch, room_s):
    problem = build_problem(random_global_cluster(30, seed=1, sites=4, speed=(0.5, 2.0), memory=(1, 4)), WORKLOAD)
    groups = G.site_groups(problem)
    asked: list[bool] = []
    probed_rows = decompose.probed_rows

    def spy(*args, **kwargs):
        def affordable(rows):
            asked.append(args[5](rows))
            return asked[-1]
        return probed_rows(*args[:5], affordable, **kwargs)

    monkeypatch.setattr(decompose, "probed_rows", spy)
    plan = G.grouped_plan(problem, groups, seed=0, time_limit_s=None, thorough=False, room_s=room_s)
    assert plan is not None and plan_violations(plan) == []
    # two rounds of many moves with room; without, the first is refused and no other asked for
    assert asked == ([True, True] if room_s > 0 else [False])


@pytest.mark.parametrize("cpu_s", [0.0, 1e9])
def test_below_48_nodes_a_split_after_the_first_only_while_its_cpu_fits_beside_the_whole_search(
    small_split, monkeypatch, cpu_s
):
    # the whole search runs beside the groups with its full budget: the groups get one worker, and
    # each split after the first (many moves or one) is probed only while its plans' counted CPU
    # (``group_plan_s``) fits the target's share there (``benchmarks/planning_time_heavy.py``
    # case 25)
    problem = build_problem(random_global_cluster(30, seed=1, sites=4, speed=(0.5, 2.0), memory=(1, 4)), WORKLOAD)
    groups = G.site_groups(problem)
    counted: list[bool] = []
    monkeypatch.setattr(G, "group_plan_s", lambda sub, thorough=False: counted.append(thorough) or cpu_s)
    asked: list[bool] = []
    probed_rows = decompose.probed_rows

    def spy(*args, **kwargs):
        assert kwargs == {"single_free": False}

        def affordable(rows):
            asked.append(args[5](rows))
            return asked[-1]
        return probed_rows(*args[:5], affordable, **kwargs)

    monkeypatch.setattr(decompose, "probed_rows", spy)
    plan = G.grouped_plan(problem, groups, seed=0, time_limit_s=None)
    assert plan is not None and plan_violations(plan) == []
    assert counted and set(counted) == {True}  # each group counted with its thorough start
    # with room every split asked for is probed; without, the first of many moves and the first
    # single move are refused, and nothing else is asked for
    assert asked == ([True] * len(asked) if cpu_s == 0 else [False, False]) and asked
