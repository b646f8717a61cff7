"""Default stage sizes (``Workload.sizes_for``): stages that the TC1 caps let carry the visits."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.cluster_gen import random_global_cluster, single_site_cluster
from skippipe.planfile import plan_violations
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.planner.stage_orders import sequence_quotas, stage_sequences
from skippipe.workload import Workload, least_max_jump, tc1_caps


def _workload(s: int, length: int, m: int) -> Workload:
    return Workload(num_stages=s, path_length=length, microbatches_per_data_node=m,
                    max_jump=max(4, least_max_jump(s, length)), n_layers=max(24, s))


def test_every_stage_visited_by_every_microbatch_gets_room():
    # 19 nodes, S = L = 5, 4 microbatches: D = round(19 / 5) = 4 gave stages [4, 4, 4, 4, 3],
    # whose last stage takes 3 x ceil(64 / 15) = 15 visits of the 16 microbatches that all
    # visit it, so every method refused; 3 data nodes leave four stages of 4
    problem = build_problem(single_site_cluster(19, 0), _workload(5, 5, 4))
    assert problem.stage_sizes == [3, 4, 4, 4, 4]
    plan = make_plan("naive", problem, seed=0)
    assert plan_violations(plan) == []


def test_sizes_that_carry_are_kept():
    assert _workload(6, 4, 6).sizes_for(20) == [5, 3, 3, 3, 3, 3]
    assert _workload(9, 5, 6).sizes_for(100) == [20, 10, 10, 10, 10, 10, 10, 10, 10]
    # uneven speeds can carry what even ones cannot: the faster nodes go to the smaller stage
    assert _workload(5, 5, 4).sizes_for(19, [1.0] * 15 + [2.0] * 4) == [4, 4, 4, 4, 3]
    assert _workload(5, 5, 4).sizes_for(19) == [3, 4, 4, 4, 4]


@settings(max_examples=40, deadline=None)
@given(s=st.integers(2, 6), extra=st.integers(0, 14), m=st.integers(1, 6), data=st.data())
def test_naive_plans_on_even_clusters(s, extra, m, data):
    """On a single site with even compute the default sizes always admit a plan (33 of 744
    such shapes up to 30 nodes were refused before, all with L = S)."""
    length = data.draw(st.integers(2, s))
    n = s + extra
    problem = build_problem(single_site_cluster(n, 0), _workload(s, length, m))
    assert sum(problem.stage_sizes) == n and min(problem.stage_sizes) >= 1
    plan = make_plan("naive", problem, seed=0)
    assert plan_violations(plan) == []


def test_generated_cluster_with_broken_links_plans():
    # sweep case 37: 8 nodes over 4 sites, a fifth of the links between sites broken, one
    # slot each, S = L = 5, 7 microbatches: D = 2 gave stages the caps [20, 20, 10, 10] for
    # 14 microbatches that each visit all four, and every method refused
    cluster = random_global_cluster(8, seed=37, sites=4, memory=(1, 1), broken=0.2)
    workload = Workload(num_stages=5, path_length=5, microbatches_per_data_node=7, max_jump=2, max_swaps=2, n_layers=15)
    problem = build_problem(cluster, workload)
    assert problem.stage_sizes == [4, 1, 1, 1, 1]
    assert plan_violations(make_plan("skippipe-no-tc2", problem, seed=0)) == []


def test_sizes_follow_the_jump_rule():
    # fuzz case 465: 8 nodes, S = 5, L = 3, max_jump 2, one swap: the paths are (1, 2), (1, 3),
    # (2, 1), (2, 3), (2, 4), so stage 4 is reached only through stage 2. The even split
    # [3, 2, 1, 1, 1] gives stages 1-4 the caps [42, 21, 21, 21]: 21 microbatches on (2, 4)
    # leave stage 2 none, and stage 1 pairs only with stage 3, 21 more: 42 of 51. Every
    # method refused; the extra node on stage 2 carries them
    workload = Workload(num_stages=5, path_length=3, microbatches_per_data_node=17, max_jump=2, max_swaps=1, n_layers=15)
    problem = build_problem(single_site_cluster(8, 0), workload)
    assert problem.stage_sizes == [3, 1, 2, 1, 1]
    assert plan_violations(make_plan("skippipe-no-tc2", problem, seed=0)) == []


def test_default_sizes_suit_the_stage_orders_where_the_jump_rule_binds():
    """Every shape of an even single-site cluster in this grid (S = 3-7, S to S + 6 nodes, 6 or
    17 microbatches, every L, the least two ``max_jump`` that reach the last stage, 0-1 swaps):
    the default sizes' TC1 caps admit a split of the microbatches over the allowed stage orders.
    Counting a visit per microbatch a stage, as before, 28 of these 1,120 shapes were refused."""
    refused = []
    for s, extra, m, swaps in itertools.product(range(3, 8), range(7), (6, 17), (0, 1)):
        for length in range(2, s + 1):
            for jump in range(least_max_jump(s, length), min(s, least_max_jump(s, length) + 1) + 1):
                w = Workload(num_stages=s, path_length=length, microbatches_per_data_node=m, max_jump=jump,
                             max_swaps=swaps, n_layers=24)
                n = s + extra
                sizes = build_problem(single_site_cluster(n, 0), w).stage_sizes
                microbatches = sizes[0] * m
                cap = int(tc1_caps([1.0] * (n - sizes[0]), microbatches * (length - 1), n - sizes[0])[0])
                seqs = stage_sequences(s, length, swaps, jump)
                if sequence_quotas(seqs, [0] + [cap * k for k in sizes[1:]], microbatches) is None:
                    refused.append((s, n, m, length, jump, swaps, sizes))
    assert refused == []
