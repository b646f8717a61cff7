"""``routing.every_allocation``: small clusters are planned on their best-ranked allocations too."""

from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from skippipe.cluster_gen import single_site_cluster
from skippipe.planner.methods import make_plan, with_allocation
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import every_allocation
from skippipe.planner.routing.budget import default_budget
from skippipe.planner.routing.every_allocation import allocation_count, allocations, few_allocations, ranked_allocations
from skippipe.workload import Workload


@given(sizes=st.lists(st.integers(1, 3), min_size=1, max_size=4).filter(lambda s: sum(s) <= 8))
@example(sizes=[2, 2, 1, 1])  # the exact small clusters' sizes
def test_every_allocation_once_and_the_count_says_how_many(sizes):
    n = sum(sizes)
    seen = [tuple(tuple(s) for s in stages) for stages in allocations(sizes, n)]
    assert len(seen) == len(set(seen)) == allocation_count(sizes)
    assert allocation_count(sizes) == math.factorial(n) // math.prod(math.factorial(s) for s in sizes)
    for stages in seen:
        assert [len(s) for s in stages] == sizes and sorted(x for s in stages for x in s) == list(range(n))
        assert all(list(s) == sorted(s) for s in stages)


def _small(seed: int):
    cluster = single_site_cluster(5, seed, speed=(0.5, 2.0), memory=(1, 3))
    return build_problem(cluster, Workload(num_stages=4, path_length=3, microbatches_per_data_node=2, max_swaps=0))


def test_only_small_clusters_whose_allocation_is_free_are_ranked():
    problem = _small(1)
    assert few_allocations(problem)
    assert not few_allocations(with_allocation(problem, ranked_allocations(problem, keep=1)[0]))
    big = build_problem(single_site_cluster(12, 0), Workload(num_stages=4, path_length=3))
    assert allocation_count([int(s) for s in big.stage_sizes]) > every_allocation.EVERY_ALLOCATION_MOST
    assert not few_allocations(big)


def test_the_ranked_allocations_plan_a_small_cluster_at_its_exact_optimum():
    # 5 nodes, compute 0.5-2x: the usual search plans 27.25 s; the exact optimum over every
    # allocation (benchmarks/exact_small.py, CP-SAT) is 23.58-23.64 s
    problem = _small(6955)
    plan = make_plan("skippipe", problem, seed=0)
    assert plan.predicted_makespan_s <= 23.64 + 1e-6
    assert plan.meta["candidate"] == "every allocation"


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_a_small_cluster_is_never_planned_slower_than_its_usual_search(seed):
    problem = _small(seed)
    with_ranked = make_plan("skippipe", problem, seed=0)
    original = every_allocation.EVERY_ALLOCATION_MOST
    try:
        every_allocation.EVERY_ALLOCATION_MOST = 0  # the usual search alone
        alone = make_plan("skippipe", problem, seed=0)
    finally:
        every_allocation.EVERY_ALLOCATION_MOST = original
    assert with_ranked.predicted_makespan_s <= alone.predicted_makespan_s + 1e-9


def test_the_ranked_plans_are_skipped_where_they_would_not_fit_the_planning_target():
    light = _small(6955)
    assert every_allocation.ranked_budget(light) == default_budget(light) // every_allocation.KEEP
    # 9 nodes on one site, S = L = 2, 17 microbatches per data node (as fuzz case 31): the usual
    # search alone is estimated at 4.4 s, its ranking at 5.1 s: 3.0 s planned without them, 12.4 s with
    heavy = build_problem(single_site_cluster(9, 31, speed=(0.05, 3.0)),
                          Workload(num_stages=2, path_length=2, microbatches_per_data_node=17, max_jump=2))
    assert few_allocations(heavy)
    assert every_allocation.ranked_budget(heavy) is None
