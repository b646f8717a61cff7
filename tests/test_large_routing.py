"""Path search on large clusters (above ``LARGE_NODES`` nodes): each data node's paths use only
the ``LARGE_WIDTH`` nodes per stage nearest to it (``sequences.nearest``), all stage orders in
one batched search (``assign.route_one``), and the balanced and memory-order candidates run
there too. With a width that keeps every node the search is the exact one."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_strategies import generated_problems
from skippipe.cluster_gen import random_global_cluster
from skippipe.errors import UserError
from skippipe.planfile import path_rule_violation, plan_violations
from skippipe.planner.allocation import allocate
from skippipe.planner.allocation.memory_order import memory_ordered
from skippipe.planner.problem import build_problem
from skippipe.planner.routing.assign import Capacity, assign_static, route_one
from skippipe.planner.routing.balanced import balanced_candidate
from skippipe.planner.routing.evaluate import Evaluator
from skippipe.planner.routing.schedule import build_plan, plan_no_tc2, plan_skippipe
from skippipe.planner.routing.sequences import LARGE_NODES, RouteCosts, nearest, node_classes
from skippipe.planner.routing.static import static_routes
from skippipe.planner.stage_orders import stage_sequences
from skippipe.workload import Workload


def _seqs(problem, stages):
    w = problem.workload
    return stage_sequences(len(stages), w.path_length, w.max_swaps, w.max_jump)


@given(st.integers(0, 10_000), st.integers(1, 6))
def test_nearest_keeps_the_cheapest_usable_nodes_in_id_order(seed, width):
    rng = np.random.default_rng(seed)
    n = 12
    t = rng.random((n, n))
    rc = RouteCosts(edge=t + t.T, node=rng.random(n), own=rng.random(n), forward=rng.random(n))
    penalty = np.where(rng.random(n) < 0.3, np.inf, rng.random(n))
    stage = np.arange(1, n)
    (got,) = nearest(rc, 0, [stage], penalty, width)
    usable = [x for x in stage if np.isfinite(penalty[x])]
    cost = {x: rc.edge[0, x] + rc.node[x] + penalty[x] for x in usable}
    want = sorted(sorted(usable, key=lambda x: (cost[x], x))[:width])
    assert got.tolist() == want


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(), st.integers(0, 3))
def test_the_batched_search_over_all_nodes_is_the_exact_one(problem, taken):
    # a width that keeps every node: the batched search finds the same path as the cached one
    stages = allocate(problem, seed=0)
    caps = problem.load_caps(stages)
    rc = RouteCosts.from_problem(problem)
    classes = node_classes(problem.transfer_s, problem.forward_s, problem.memory)
    exact, wide = Capacity(stages, caps, classes), Capacity(stages, caps, classes, width=problem.n)
    seqs = _seqs(problem, stages)
    for k in range(taken + 1):
        for d in stages[0]:
            a, b = route_one(rc, exact, d, seqs, k), route_one(rc, wide, d, seqs, k)
            assert a[1] == b[1] and a[0] == b[0]
            if a[1]:
                exact.take(a[1])
                wide.take(b[1])


def test_a_300_node_uneven_cluster_gets_valid_static_balanced_and_memory_order_routes():
    cluster = random_global_cluster(300, seed=3, sites=20, broken=0.05, speed=(0.5, 2.0), memory=(1, 4))
    problem = build_problem(cluster, Workload(num_stages=7, path_length=4))
    assert problem.n > LARGE_NODES
    stages = allocate(problem, seed=0)
    caps = problem.load_caps(stages)
    m = problem.workload.microbatches_per_data_node
    found = 0
    for st_ in (stages, memory_ordered(problem, stages, "slots")):
        ev = Evaluator(problem, st_)
        got = [static_routes(problem, st_)]
        balanced = balanced_candidate(problem, st_, problem.load_caps(st_), _seqs(problem, st_), ev)
        got += [balanced[0]] if balanced is not None else []
        for routes in got:
            found += 1
            assert Counter(d for d, _ in routes) == {d: m for d in st_[0]}
            visits = Counter(x for _, p in routes for x in p)
            assert all(visits[x] <= problem.load_caps(st_)[x] for x in visits)
            plan = build_plan(problem, st_, routes, "skippipe", 0)
            assert plan_violations(plan) == []  # the path rules, the jump rule among them
            assert np.isfinite(plan.predicted_makespan_s)
    assert found >= 3 and caps


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems())
def test_greedy_paths_rejected_by_finishes_are_returned_unpolished(problem):
    stages = allocate(problem, seed=0)
    caps = problem.load_caps(stages)
    try:
        greedy = assign_static(problem, stages, caps, passes=0)
    except UserError:
        return  # the caps admit no routing
    assert assign_static(problem, stages, caps, finishes=lambda paths: False) == greedy
    assert assign_static(problem, stages, caps, finishes=lambda paths: True) == assign_static(problem, stages, caps)


def test_skippipe_plans_a_300_node_uneven_cluster_validly_and_no_worse_than_no_tc2():
    cluster = random_global_cluster(300, seed=3, sites=20, broken=0.05, speed=(0.5, 2.0), memory=(1, 4))
    problem = build_problem(cluster, Workload(num_stages=7, path_length=4))
    plan = plan_skippipe(problem, seed=0, budget=20)
    assert plan_violations(plan) == []
    stage_of = {x: s for s, nodes in enumerate(plan.stages) for x in nodes}
    w = problem.workload
    for mb in plan.microbatches:  # the jump rule: a visit at most max_jump stages past the frontier
        assert path_rule_violation([stage_of[x] for x in mb.path], w.max_swaps, w.max_jump) is None
    assert plan.predicted_makespan_s <= plan_no_tc2(problem, seed=0).predicted_makespan_s
