"""Default stage sizes (``Workload.sizes_for``): stages that the TC1 caps let carry the visits."""

from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.cluster_gen import random_global_cluster, single_site_cluster
from skippipe.planfile import plan_violations
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.workload import Workload, least_max_jump


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
