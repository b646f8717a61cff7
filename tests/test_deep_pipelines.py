"""Deep pipelines and long paths (S and L from 10 to 50): the planner's enumerations stay bounded.

Before, a path of 12 stages made the joint allocation list the 11! orders of every chain (66 s,
8.9 GB on 20 nodes; 14 stages ran out of 24 GB), 20 stages with L = 20 made the stage orders'
search walk 13.9 million dead prefixes for 19 orders, and 20 stages with L = 10 (196,529 orders)
planned for more than five minutes."""

from __future__ import annotations

import itertools
from unittest.mock import patch

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from skippipe.cli import main
from skippipe.cluster_gen import random_global_cluster
from skippipe.errors import WorkloadError
from skippipe.limits import MAX_STAGE_ORDERS
from skippipe.planfile import path_rule_violation, plan_violations
from skippipe.planner import stage_orders
from skippipe.planner.allocation import tours
from skippipe.planner.allocation.tours import best_tour
from skippipe.planner.baselines import _valid_subsets
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import groups, joint_groups
from skippipe.planner.stage_orders import check_stage_orders, count_stage_orders, stage_sequences
from skippipe.workload import Workload


@settings(max_examples=150, deadline=None)
@given(s=st.integers(2, 8), L=st.integers(2, 8), swaps=st.integers(0, 2), jump=st.integers(1, 8),
       limit=st.integers(0, 300))
def test_stage_orders_are_every_valid_permutation_and_counted_without_listing(s, L, swaps, jump, limit):
    L = min(L, s)
    every = tuple(p for p in itertools.permutations(range(1, s), L - 1) if path_rule_violation(list(p), swaps, jump) is None)
    assert stage_sequences(s, L, swaps, jump) == every  # the same orders, in the same (sorted) order
    assert count_stage_orders(s, L, swaps, jump) == len(every)
    counted = count_stage_orders(s, L, swaps, jump, limit=limit)
    assert (counted > limit) == (len(every) > limit) and counted <= len(every)


def test_long_paths_list_their_few_orders_without_walking_dead_prefixes():
    calls = []

    def counted(*args):
        calls.append(1)
        return path_rule_violation(*args)

    stage_sequences.cache_clear()
    with patch.object(stage_orders, "path_rule_violation", counted):
        orders = stage_sequences(20, 20, 1, 4)
    stage_sequences.cache_clear()
    # every stage once: in order, or with one adjacent pair swapped (18 ways)
    assert len(orders) == 19 and all(sorted(o) == list(range(1, 20)) for o in orders)
    assert len(calls) < 20_000, len(calls)  # 13.9 million without the cut
    assert list(_valid_subsets(list(range(1, 30)), 29, 20)) == [tuple(range(1, 30))]


def test_a_workload_with_too_many_stage_orders_is_refused_in_one_line(tmp_path, capsys):
    assert count_stage_orders(14, 8, 1, 4) == 5_664 <= MAX_STAGE_ORDERS
    check_stage_orders(14, 8, 1, 4)  # taken
    try:
        check_stage_orders(20, 10, 1, 4)
    except WorkloadError as exc:
        assert exc.key == "path_length" and exc.where == "workload"
    else:
        raise AssertionError("196,529 stage orders were taken")
    out = tmp_path / "plan.json"
    args = ["plan", "--cluster", "gcp-2025/geo-distributed/40", "--stages", "20", "--path-length", "10", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "more than 6,000 stage orders" in err and "max_jump" in err, err
    assert not out.exists()


def test_long_chains_take_one_exact_tour_per_group_instead_of_every_order():
    cluster = random_global_cluster(14, seed=5, speed=(0.5, 2.0), memory=(1, 3))
    problem = build_problem(cluster, Workload(num_stages=10, path_length=10, microbatches_per_data_node=2, n_layers=20))
    gc = groups.GroupCosts.from_problem(problem)
    eligible = np.ones(problem.n, dtype=bool)
    members = [int(x) for x in np.random.default_rng(5).permutation(problem.n)[:10]]
    toured = joint_groups._GroupSearch(gc, eligible, 10)
    with patch.object(joint_groups, "TOUR_FROM", 99):
        listed = joint_groups._GroupSearch(gc, eligible, 10)
    assert toured.perms.size < 100 and len(listed.perms) == 181_440  # 9! / 2 orders, one way round
    (a, chain_a), (b, _) = toured.best(members), listed.best(members)
    assert abs(a - b) <= 1e-9 * max(1.0, abs(b))  # Held-Karp is exact at 10 nodes
    assert sorted(chain_a) == sorted(members)
    assert toured.spent_s > 0 and toured.work > 0  # counted against the group search's share


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), s=st.integers(tours.HELD_KARP_MOST + 1, 30))
def test_long_stage_tours_are_two_opt_and_exchange_optimal_and_cost_what_they_say(seed, s):
    rng = np.random.default_rng(seed)
    cost = rng.random((s, s)) * 10
    cost = np.round(cost + cost.T, 2)
    sizes = [5, *rng.integers(1, 4, size=s - 1).tolist()]
    wanted = [5, *rng.permutation(sizes[1:]).tolist()]
    order, total = best_tour(cost, sizes, wanted)
    closed = [*order, 0]
    assert sorted(order) == list(range(s)) and all(sizes[g] == wanted[k] for k, g in enumerate(order))
    assert abs(total - sum(cost[closed[k], closed[k + 1]] for k in range(s))) < 1e-9
    for i, j in itertools.combinations(range(1, s), 2):  # no exchange of two groups of one size is cheaper
        if sizes[order[i]] == sizes[order[j]]:
            swapped = list(closed)
            swapped[i], swapped[j] = swapped[j], swapped[i]
            assert sum(cost[swapped[k], swapped[k + 1]] for k in range(s)) >= total - 1e-9


def test_a_deep_pipeline_plans_on_its_joint_allocation():
    cluster = random_global_cluster(14, seed=3, speed=(0.5, 2.0))
    problem = build_problem(cluster, Workload(num_stages=12, path_length=12, n_layers=24, microbatches_per_data_node=2))
    plan = make_plan("skippipe", problem, seed=0)
    assert plan_violations(plan) == []
    assert all(len(mb.path) == 11 for mb in plan.microbatches)


def test_the_windows_of_a_deep_pipeline_are_found_by_a_bounded_programme():
    # 5,115 windows of 8 stages (S = 16, L = 9, jump 4); with HiGHS's presolve the programme took
    # 6.2 s and its 5-s safety net gave up (no windows, so no joint allocation, on this machine only)
    sizes, groups_, k, jump = [2, 2, *[1] * 14], 2, 8, 4
    options, solve = [], joint_groups.milp

    def spy(*args, **kwargs):
        options.append(dict(kwargs["options"]))  # a copy: HiGHS's wrapper pops what it reads
        return solve(*args, **kwargs)

    with patch.object(joint_groups, "WINDOW_SECONDS", 60.0), patch.object(joint_groups, "milp", spy):
        windows = joint_groups.stage_windows(sizes, groups_, 0, jump)
    assert [o["node_limit"] for o in options] == [joint_groups.WINDOW_NODES]  # a count, the same on every machine
    assert windows is not None and len(windows) == groups_
    assert all(len(w) == k and path_rule_violation(w, 0, jump) is None for w in windows)
    used = np.bincount([s for w in windows for s in w], minlength=len(sizes))
    assert used[1:].tolist() == sizes[1:]


def test_stage_quotas_are_kept_and_the_caller_gets_its_own_copy():
    seqs = stage_sequences(8, 4, 1, 4)
    caps, total = [0, 5, 5, 5, 5, 5, 5, 5], 10
    first = stage_orders.sequence_quotas(seqs, caps, total)
    assert first is not None and sum(first.values()) == total
    loads = np.zeros(8, dtype=int)
    for seq, count in first.items():
        loads[list(seq)] += count
    assert all(loads[s] <= caps[s] for s in range(1, 8))
    first.clear()
    again = stage_orders.sequence_quotas(list(map(list, seqs)), caps, total)
    assert again == stage_orders.sequence_quotas(seqs, caps, total) != {}
    assert stage_orders.sequence_quotas(seqs, [0, 1, 1, 1, 1, 1, 1, 1], total) is None  # 30 visits, 7 of room


def test_random_plans_with_thousands_of_stage_sets_obey_the_caps():
    from skippipe.planner.baselines import random_plan

    cluster = random_global_cluster(19, seed=1, speed=(0.5, 2.0))
    problem = build_problem(cluster, Workload(num_stages=16, path_length=9, max_swaps=0, n_layers=32,
                                              microbatches_per_data_node=4))
    assert len(list(_valid_subsets(list(range(1, 16)), 8, 4))) > 1_000  # the sets are sampled first
    plan = random_plan(problem, seed=0)
    assert plan_violations(plan) == []


@settings(max_examples=40, deadline=None)
@given(s=st.integers(8, 14), L=st.integers(4, 9), swaps=st.integers(0, 2), jump=st.integers(2, 6))
def test_the_routing_takes_a_spread_of_the_orders_without_swaps_first(s, L, swaps, jump):
    L = min(L, s)
    if count_stage_orders(s, L, swaps, jump, limit=MAX_STAGE_ORDERS) > MAX_STAGE_ORDERS:
        return
    every = stage_sequences(s, L, swaps, jump)
    kept = stage_orders.spread_orders(s, L, swaps, jump)
    if len(every) <= stage_orders.ROUTING_ORDERS:
        assert kept == every
        return
    plain = [seq for seq in every if list(seq) == sorted(seq)]
    assert len(kept) == stage_orders.ROUTING_ORDERS == len(set(kept)) and set(kept) <= set(every)
    assert list(kept) == sorted(kept)
    assert sum(1 for seq in kept if list(seq) == sorted(seq)) == min(len(plain), stage_orders.ROUTING_ORDERS)


def test_the_routing_takes_every_order_where_the_caps_cannot_carry_the_spread(monkeypatch):
    monkeypatch.setattr(stage_orders, "ROUTING_ORDERS", 2)
    stage_orders.spread_orders.cache_clear()
    try:
        every = stage_sequences(6, 4, 0, 4)  # three of stages 1..5, ascending
        kept = stage_orders.spread_orders(6, 4, 0, 4)
        assert kept == ((1, 2, 3), (1, 4, 5))  # both through stage 1
        roomy = [0, 9, 9, 9, 9, 9]
        assert stage_orders.routing_orders(roomy, 4, 4, 0, 4) == kept
        no_stage_one = [0, 0, 9, 9, 9, 9]  # every microbatch must leave stage 1 out
        assert stage_orders.routing_orders(no_stage_one, 4, 4, 0, 4) == every
    finally:
        stage_orders.spread_orders.cache_clear()


@settings(max_examples=15, deadline=None)
@given(caps=st.lists(st.integers(0, 14), min_size=13, max_size=13), total=st.integers(1, 16))
@example(caps=[14] * 13, total=16).via("a split exists")
@example(caps=[0, 0, 0, 0, *[14] * 9], total=3).via("stages 1-4 full: no first visit within the jump")
def test_stage_quotas_over_thousands_of_orders_split_exactly_when_a_split_exists(caps, total):
    from scipy.optimize import LinearConstraint, milp

    seqs = stage_sequences(14, 8, 1, 4)  # 5,664 orders: the relaxation first, then a few hundred of them
    assert len(seqs) > stage_orders.ROUTING_ORDERS
    stage_caps = [0, *caps]
    got = stage_orders.sequence_quotas(seqs, stage_caps, total)
    a = np.zeros((14, len(seqs)))
    for j, seq in enumerate(seqs):
        a[list(seq), j] = 1.0
    rows = [LinearConstraint(a, -np.inf, stage_caps), LinearConstraint(np.ones((1, len(seqs))), total, total)]
    every = milp(np.zeros(len(seqs)), constraints=rows, integrality=np.ones(len(seqs)), bounds=(0, total))
    assert (got is None) == (every.x is None)
    if got is not None:
        loads = np.zeros(14, dtype=int)
        for seq, count in got.items():
            loads[list(seq)] += count
        assert sum(got.values()) == total and all(loads[s] <= stage_caps[s] for s in range(14))


def test_a_pair_of_long_chains_too_many_to_list_is_left_out():
    # two data nodes' chains through 19 of 23 stages: 2 nodes a stage, 524,288 chains per order
    # (before, the pair search listed them all and S = 24, L = 20 had not planned after 90 s)
    stages = [[0, 1], *[[2 * s, 2 * s + 1] for s in range(1, 24)]]
    seqs = stage_sequences(24, 20, 0, 2)
    pair = [x for s in stages[1:20] for x in s]
    assert groups._pair_pool(stages, seqs, pair, [[] for _ in stages], per_stage=3) is None
    short = stage_sequences(24, 3, 0, 2)  # two stages a chain: at most 4 chains per order
    pool = groups._pair_pool(stages, short, pair, [[] for _ in stages], per_stage=3)
    assert pool is not None and [len(p) for p in pool[1:20]] == [2] * 19
