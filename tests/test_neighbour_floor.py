"""The neighbour floor: each data node's round trips, with who visits whom, must fit its slots."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import skippipe.planner.floors as floors
from cluster_strategies import generated_problems, makespan_on, plan_makespans, random_allocation
from skippipe.cluster_gen import random_global_cluster
from skippipe.planner.floors import free_allocation_floor, set_floors
from skippipe.planner.neighbour_floor import neighbour_floor
from skippipe.planner.problem import build_problem
from skippipe.workload import Workload


def _two_sites():
    # 24 nodes at two sites, 40 % of the links broken, speeds 0.2-3x, two slots each: a data
    # node's round trips are fast only through the nodes of its own site, and they are few
    cluster = random_global_cluster(24, seed=223, sites=2, speed=(0.2, 3.0), memory=(2, 2), broken=0.4)
    return build_problem(cluster, Workload(num_stages=5, path_length=5, microbatches_per_data_node=3,
                                           max_swaps=2, max_jump=1))


def test_two_sites_raise_the_floor_and_every_plan_stays_above(monkeypatch):
    problem = _two_sites()
    floor = free_allocation_floor(problem)
    monkeypatch.setattr(floors, "neighbour_floor", lambda p, tf, at_least: at_least)
    without = free_allocation_floor(problem).value
    assert floor.value == floor.neighbour_s
    assert floor.value > 1.4 * without  # 29.48 -> 48.71 s
    made = plan_makespans(problem, ("random", "skippipe-no-tc2"), draws=16)
    assert len(made) >= 8  # most random allocations leave no routing under the caps
    assert floor.value <= min(made) + 1e-6  # skippipe: 53.35 s


def test_one_site_with_plenty_of_slots_leaves_the_floor(monkeypatch):
    problem = _two_sites()
    one_site = build_problem(random_global_cluster(24, seed=223, sites=1, speed=(0.2, 3.0), memory=(4, 4)),
                             problem.workload)
    floor = free_allocation_floor(one_site).value
    monkeypatch.setattr(floors, "neighbour_floor", lambda p, tf, at_least: at_least)
    assert free_allocation_floor(one_site).value == floor


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(stages=(3, 5), max_path=4, extra_nodes=2, max_nodes=12, sites=True),
       st.sampled_from(["naive", "random", "skippipe-no-tc2"]), st.integers(0, 10_000))
def test_neighbour_floor_is_below_every_plan(problem, method, seed):
    # the programme alone (from a floor of almost nothing), against a plan on any allocation
    value = neighbour_floor(problem, set_floors(problem).tf, 1e-3)
    plan = makespan_on(problem, random_allocation(problem, np.random.default_rng(seed)), method)
    if plan is None:  # no valid path, caps or memory deadlock on this allocation: nothing to bound
        return
    assert value <= plan + 1e-6
