"""The neighbour floor: each data node's round trips, with who visits whom, must fit its slots."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_strategies import check_below_a_plan, floor_and_without, floors_switched_off, generated_problems, plan_makespans
from skippipe.cluster import cluster_from_dict
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
    floor, without = floor_and_without(problem, monkeypatch, "neighbour_floor")
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
    floors_switched_off(monkeypatch, "neighbour_floor")
    assert free_allocation_floor(one_site).value == floor


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(stages=(3, 5), max_path=4, extra_nodes=2, max_nodes=12, sites=True),
       st.sampled_from(["naive", "random", "skippipe-no-tc2"]), st.integers(0, 10_000))
def test_neighbour_floor_is_below_every_plan(problem, method, seed):
    # the programme alone (from a floor of almost nothing), against a plan on any allocation
    check_below_a_plan(neighbour_floor(problem, set_floors(problem).tf, 1e-3), problem, method, seed)


def test_free_hops_are_hops_not_missing_links():
    # a measured transfer matrix may hold 0 s hops (processes on one host); scipy's dense graphs
    # read any entry within 1e-8 of 0 as "no edge". Free hops within two sites, 2 s between
    # them: the nodes of a site looked 8 s apart (through the other site) and the floor was
    # 19.75 s over a 14.95-s plan (with every hop free, no node was reachable: 3.3e19 s)
    transfer = np.full((12, 12), 2.0)
    transfer[:6, :6] = transfer[6:, 6:] = 0.0
    problem = build_problem(cluster_from_dict({"transfer_s": transfer.tolist()}),
                            Workload(num_stages=4, path_length=3, microbatches_per_data_node=4, n_layers=8))
    floor = free_allocation_floor(problem)
    assert 0.0 < floor.neighbour_s <= floor.value
    made = plan_makespans(problem, ("skippipe-no-tc2", "random"), draws=4)
    assert made and floor.value <= min(made) + 1e-6
    assert neighbour_floor(problem, set_floors(problem).tf, 1e-3) <= min(made) + 1e-6
