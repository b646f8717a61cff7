"""The default search budget (``routing.budget.default_budget``): simulations counted, so a
plan does not depend on the machine, and bounded by the work of one simulation so that heavy
workloads still plan within the planning-time target."""

from __future__ import annotations

import pytest

from skippipe.cluster_gen import random_global_cluster
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import budget
from skippipe.workload import Workload


def _problem(n: int, stages: int, length: int, m: int):
    cluster = random_global_cluster(n, seed=3, speed=(0.5, 2.0), memory=(1, 3))
    return build_problem(cluster, Workload(num_stages=stages, path_length=length, microbatches_per_data_node=m))


def _ops(problem) -> int:
    w = problem.workload
    return int(problem.stage_sizes[0]) * w.microbatches_per_data_node * (2 * w.path_length + 1)


@pytest.mark.parametrize("n", [12, 20, 24, 30])
def test_light_workloads_keep_the_count_by_nodes(n):
    problem = _problem(n, 4, 3, 6)
    assert budget.default_budget(problem) == 4000 + 40 * n


@pytest.mark.parametrize(
    ("n", "stages", "length", "m"), [(40, 8, 7, 8), (40, 9, 9, 8), (60, 9, 9, 8), (100, 9, 5, 6), (201, 9, 8, 6)]
)
def test_heavy_workloads_get_fewer_simulations_within_the_time_target(n, stages, length, m):
    # 40 nodes, L = 7, 8 microbatches per data node: 5,600 simulations took 12.1 s (target 10 s);
    # 201 nodes, L = 8: 7,920 simulations (the count by size alone) took 47.2 s
    problem = _problem(n, stages, length, m)
    simulations = budget.default_budget(problem)
    by_size = 4000 + 40 * min(n, 100)
    assert simulations < (by_size if n <= budget.BUDGET_FULL_NODES else by_size * (budget.BUDGET_FULL_NODES / n) ** 2)
    assert simulations * _ops(problem) * budget.SIM_OP_S <= budget.PLANNING_SHARE * budget.planning_target_s(n) + 1e-9


def test_the_planning_target_runs_from_10_s_to_60_s():
    targets = [budget.planning_target_s(n) for n in (12, 40, 70, 100, 550, 1000, 2000)]
    assert targets == pytest.approx([10.0, 10.0, 20.0, 30.0, 45.0, 60.0, 60.0])


def test_above_the_full_size_the_search_leaves_a_share_to_the_start():
    # a 448-node cluster (149 data nodes, L = 3, 7 microbatches) whose search was estimated at
    # 90 % of the target planned past it: the start (allocation, candidate routings) came on top
    problem = _problem(300, 5, 3, 8)
    assert problem.n > budget.BUDGET_FULL_NODES
    simulations = budget.default_budget(problem)
    target = budget.planning_target_s(problem.n)
    searched = simulations * _ops(problem) * budget.SIM_OP_S
    assert searched <= (budget.PLANNING_SHARE - budget.START_SHARE) * target + 1e-9
    assert searched > (budget.PLANNING_SHARE - budget.START_SHARE) * target - _ops(problem) * budget.SIM_OP_S
    by_size = int(8000 * (budget.BUDGET_FULL_NODES / problem.n) ** 2)
    assert simulations < by_size  # the time share binds here, not the count by size
