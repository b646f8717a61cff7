"""The slot-time floor: round trips and visits must fit in the time of the activation slots."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_strategies import check_below_a_plan, floor_and_without, generated_problems, plan_makespans
from skippipe.cluster_gen import single_site_cluster
from skippipe.planner.floors import free_allocation_floor, set_floors
from skippipe.planner.problem import build_problem
from skippipe.planner.set_floor import SetFloor
from skippipe.planner.slot_time_floor import slot_time_floor
from skippipe.workload import Workload


def _one_slot_each():
    # 10 nodes of one site, speeds 0.5-2x, one slot each: every data node runs its 4 round
    # trips one at a time, and the TC1 caps send a share of the visits to the slow nodes
    cluster = single_site_cluster(10, seed=181, speed=(0.5, 2.0), memory=(1, 1))
    return build_problem(cluster, Workload(num_stages=3, path_length=3, microbatches_per_data_node=4,
                                           max_swaps=1, max_jump=2))


def test_one_slot_per_node_raises_the_floor_and_every_plan_stays_above(monkeypatch):
    problem = _one_slot_each()
    # the neighbour floor counts slots too, and the dear schedules (83.65 s here) the data nodes'
    # own work between the round trips: both left out
    monkeypatch.setattr(SetFloor, "dear_schedules", lambda self, data, *args: 0.0)
    floor, without = floor_and_without(problem, monkeypatch, "slot_time_floor", "neighbour_floor")
    assert floor.value == floor.slot_time_s
    assert floor.value > 1.03 * without  # 80.91 -> 85.57 s
    made = plan_makespans(problem, ("naive", "skippipe-no-tc2"), draws=20)
    assert len(made) > 10
    assert floor.value <= min(made) + 1e-6  # skippipe: 88.76 s


def test_where_the_slots_are_plenty_the_floor_stays():
    problem = _one_slot_each()
    roomy = build_problem(single_site_cluster(10, seed=181, speed=(0.5, 2.0), memory=(4, 4)), problem.workload)
    floor = free_allocation_floor(roomy)
    assert slot_time_floor(roomy, set_floors(roomy).tf, floor.value) == floor.value


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(stages=(3, 5), max_path=4, extra_nodes=2, max_nodes=12),
       st.sampled_from(["naive", "random", "skippipe-no-tc2"]), st.integers(0, 10_000))
def test_slot_time_floor_is_below_every_plan(problem, method, seed):
    # the programme alone (from a floor of almost nothing), against a plan on any allocation
    check_below_a_plan(slot_time_floor(problem, set_floors(problem).tf, 1e-3), problem, method, seed)


def test_every_speed_equal_the_programme_admits_every_generous_makespan():
    """Every speed equal: the stage-0 speed range has width 0. Loosened by 1e-9 only, HiGHS
    found it infeasible at every makespan from 400 nodes (a 500-node cluster got a floor of
    360.68 s where a plan of 61.93 s exists); loosened past the solver's tolerance it is not."""
    from skippipe.planner.slot_time_floor import _Programme

    for n, stages, length in ((400, 6, 4), (500, 9, 5)):
        problem = build_problem(single_site_cluster(n, seed=1), Workload(num_stages=stages, path_length=length))
        tf = set_floors(problem, exact=False).tf
        programme = _Programme(problem, np.asarray(tf, dtype=float))
        assert len(programme.bins) == 1
        for scale in (1.5, 3.0, 10.0):
            assert programme.feasible(scale * float(np.max(tf))), (n, scale)


def test_the_floor_of_a_500_node_cluster_of_even_speed_stays_below_a_plan():
    from skippipe.cluster_gen import gcp_regions_cluster
    from skippipe.planner import methods

    problem = build_problem(gcp_regions_cluster(500), Workload(num_stages=9, path_length=5))
    plan = methods.make_plan("skippipe-no-tc2", problem, seed=0)
    floor = free_allocation_floor(problem)
    assert floor.slot_time_s <= floor.value <= plan.predicted_makespan_s
