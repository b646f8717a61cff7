"""The chains' estimate counts the slots of every chain node (``groups.GroupCosts``): a visit
holds a slot from its forward to its backward, so a node with fewer slots than its data node
costs little last in a chain and a whole round trip per microbatch first in it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.bounds import trip_floor
from skippipe.cluster import Cluster
from skippipe.cluster_gen import random_global_cluster, single_site_cluster
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import groups, joint_groups
from skippipe.workload import Workload


def _one_site(memory: list[int]) -> Cluster:
    base = single_site_cluster(len(memory), seed=0)
    return Cluster(name="one-site-slots", n=len(memory), latency_ms=base.latency_ms, bandwidth_GBps=base.bandwidth_GBps,
                   compute_speed=base.compute_speed, memory=np.array(memory))


def test_a_one_slot_node_costs_less_last_in_a_chain_than_first():
    problem = build_problem(_one_site([3, 1, 3, 3, 3]), Workload(num_stages=5, path_length=5))
    gc = groups.GroupCosts.from_problem(problem)
    last, first = [2, 3, 4, 1], [1, 2, 3, 4]
    trip = gc.rc.round_trip(0, last)
    assert gc.rc.round_trip(0, first) == pytest.approx(trip)  # one site: the same round trip
    three = trip_floor(trip, float(gc.rc.forward[0]), float(gc.backward[0]), gc.m, 3, gc.inject_gap, gc.op_gap)
    # first: the one slot is held for all of the round trip but the data node's own forward,
    # backward and first hop, six times over
    hold = trip - float(gc.rc.node[0]) - float(gc.rc.edge[0, 1])
    assert gc.estimate(0, trip, first) == pytest.approx(trip + (gc.m - 1) * (hold + gc.op_gap))
    # last: it holds only its visit, the loss and one hop there and back; the data node's own
    # three slots decide, as with three slots on every node
    assert gc.estimate(0, trip, last) == pytest.approx(three)
    assert gc.estimate(0, trip, last) < 0.5 * gc.estimate(0, trip, first)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), length=st.integers(2, 6))
def test_with_no_chain_node_short_of_slots_the_estimate_is_the_data_nodes_trip_floor(seed, length):
    cluster = random_global_cluster(12, seed=seed, speed=(0.5, 2.0), memory=(1, 4))
    problem = build_problem(cluster, Workload(num_stages=length, path_length=length))
    gc = groups.GroupCosts.from_problem(problem)
    rng = np.random.default_rng(seed)
    d = int(np.argmin(gc.memory))
    chain = [int(x) for x in rng.permutation([x for x in range(problem.n) if x != d])[:length - 1]]
    trip = gc.rc.round_trip(d, chain)
    floor = trip_floor(trip, float(gc.rc.forward[d]), float(gc.backward[d]), gc.m, int(gc.memory[d]), gc.inject_gap,
                       gc.op_gap)
    own = max(gc.m * (float(gc.rc.node[x]) + 2 * gc.op_gap) for x in chain)
    assert gc.estimate(d, trip, chain) == max(floor, own)


def test_the_joint_allocation_puts_the_nodes_short_of_slots_last_in_their_chains():
    # one site, even compute: every order makes the same round trip, so only the slots tell
    # the orders apart; the one-slot nodes go last (a two-slot node's three rounds of holds
    # fit beside the data node's own two rounds wherever it goes)
    memory = [3] * 15
    for x in (1, 6, 11):
        memory[x] = 1
    for x in (2, 7):
        memory[x] = 2
    problem = build_problem(_one_site(memory), Workload(num_stages=5, path_length=5))
    stages, chains = joint_groups.group_allocation(problem)
    assert sorted(chain[-1] for chain in chains.values()) == [1, 6, 11]
    assert sorted(stages[4]) == [1, 6, 11]  # the last stage of every window


def test_uneven_slots_on_even_compute_plan_well_below_the_slot_blind_chains():
    # 40 nodes at 6 sites, every node as fast, 1-4 slots (the suite's "global, 6 sites" with
    # even compute, seed 4): the chains that ignored where their one-slot nodes sat ran those
    # data nodes one microbatch at a time (110.18 s); with the slots counted 63.13 s
    base = random_global_cluster(40, seed=7, sites=6, broken=0.1, speed=(0.5, 2.0), memory=(1, 4))
    cluster = Cluster(name="six-sites-even", n=40, latency_ms=base.latency_ms, bandwidth_GBps=base.bandwidth_GBps,
                      compute_speed=np.ones(40), memory=base.memory)
    problem = build_problem(cluster, Workload(num_stages=9, path_length=5))
    plan = make_plan("skippipe", problem, seed=4)
    assert plan.predicted_makespan_s < 0.7 * 110.18


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_long_groups_short_of_slots_are_never_estimated_above_their_cycle(seed):
    # chains of 7 nodes or more are not tried in every order (5,040 and more); with uneven
    # slots the cycle, both ways round and sorted by slots, is: never above the cycle alone
    # for any member, never below the best of every order
    cluster = random_global_cluster(16, seed=seed, speed=(0.5, 2.0), memory=(1, 3))
    problem = build_problem(cluster, Workload(num_stages=8, path_length=8, microbatches_per_data_node=3))
    gc = groups.GroupCosts.from_problem(problem)
    members = [int(x) for x in np.random.default_rng(seed).permutation(problem.n)[:8]]
    search = joint_groups._GroupSearch(gc, np.ones(problem.n, dtype=bool), 8)
    value, best = search.best(members)
    assert sorted(best) == sorted(members)
    assert value == pytest.approx(gc.estimate(best[0], gc.rc.round_trip(best[0], best[1:]), best[1:]), rel=1e-12)
    _, cycle = search._best_tours(np.asarray(members), [0])[0]
    for k, d in enumerate(cycle):
        chain = cycle[k + 1:] + cycle[:k]
        assert value <= gc.estimate(d, gc.rc.round_trip(d, chain), chain) + 1e-9
    every = min(gc.estimates(d, np.array(list(itertools.permutations([x for x in members if x != d])))).min()
                for d in members)
    assert value >= every - 1e-9
