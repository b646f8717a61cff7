"""Where every path visits every node outside stage 0 (N - D = L - 1), each of those nodes holds
a slot for every microbatch through its way to its data node and back (``set_floor.held_slots``)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_strategies import makespan_on
from skippipe.cluster_gen import random_global_cluster
from skippipe.planner.allocation import random_allocation
from skippipe.planner.floors import free_allocation_floor
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.planner.set_floor import forced_holds, held_slots
from skippipe.workload import Workload


def _forced_problem(s: int, data: int, seed: int, sites, broken: float, memory, m: int):
    """S = L, stage 0 of ``data`` nodes and S - 1 stages of one node: every path visits them all."""
    cluster = random_global_cluster(data + s - 1, seed=seed, sites=sites, speed=(0.5, 2.0), memory=memory,
                                    broken=broken)
    return build_problem(cluster, Workload(num_stages=s, path_length=s, microbatches_per_data_node=m, n_layers=3 * s,
                                           stage_sizes=(data, *[1] * (s - 1))))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(3, 6), st.integers(1, 4), st.integers(0, 10_000), st.sampled_from([None, 2, 3]),
       st.sampled_from([0.0, 0.3]), st.sampled_from([(1, 1), (1, 2), (1, 4)]), st.integers(1, 5),
       st.sampled_from(["naive", "random", "skippipe-no-tc2", "skippipe"]))
def test_the_held_slots_are_below_every_plan_with_those_data_nodes(s, data, seed, sites, broken, memory, m, method):
    problem = _forced_problem(s, data, seed, sites, broken, memory, m)
    stages = random_allocation(problem, np.random.default_rng(seed))
    plan = makespan_on(problem, stages, method)
    if plan is None:
        return  # no valid plan there: nothing to bound
    others = np.array([x for x in range(problem.n) if x not in stages[0]])
    value = held_slots(forced_holds(problem), tuple(stages[0]), others, m, np.asarray(problem.memory))
    assert 0.0 < value <= plan + 1e-6


def test_two_sites_a_slow_link_apart_with_one_slot_each():
    # sweep case 9133: 13 nodes at two sites 312.9 s apart, S = L = 8, one slot on every node. Every
    # microbatch of a data node at the other site from a pipeline node holds that node's only slot
    # across both crossings; the other floors counted the crossings per data node only (5,937.52 s)
    cluster = random_global_cluster(13, seed=9133, sites=5, memory=(1, 1), broken=0.5)
    problem = build_problem(cluster, Workload(num_stages=8, path_length=8, microbatches_per_data_node=8, n_layers=24,
                                              max_jump=2, max_swaps=2))
    floor = free_allocation_floor(problem).value
    plan = make_plan("skippipe", problem, seed=0).predicted_makespan_s
    assert 15_000.0 < floor <= plan


def test_no_term_where_paths_may_leave_a_node_out():
    problem = build_problem(random_global_cluster(12, seed=1, memory=(1, 1)),
                            Workload(num_stages=4, path_length=3, microbatches_per_data_node=4, n_layers=12))
    from skippipe.planner.floors import set_floors

    assert set_floors(problem).holds is None
