"""The load-balanced routing (``routing.balanced``): valid under the caps, and it spreads the
visits by speed where the cheapest-path greedy fills the fast nodes first."""

from __future__ import annotations

from collections import Counter
from unittest.mock import patch

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_strategies import generated_problems
from skippipe.cluster_gen import random_global_cluster, single_site_cluster
from skippipe.planfile import plan_violations
from skippipe.planner.allocation import allocate
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import sequences
from skippipe.planner.routing.balanced import balanced_candidate, balanced_routes
from skippipe.planner.routing.evaluate import Evaluator
from skippipe.planner.routing.schedule import build_plan
from skippipe.planner.routing.sequences import RouteCosts, cheapest_chain, cheapest_over_sequences, stage_cap_sums
from skippipe.planner.routing.static import static_routes
from skippipe.planner.stage_orders import sequence_quotas, stage_sequences
from skippipe.workload import Workload


def _seqs(problem, stages):
    w = problem.workload
    return stage_sequences(len(stages), w.path_length, w.max_swaps, w.max_jump)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(), st.sampled_from([0.5, 1.0, 2.0]), st.booleans())
def test_balanced_routes_obey_the_path_rules_and_the_caps(problem, weight, by_quotas):
    stages = allocate(problem, seed=0)
    caps = problem.load_caps(stages)
    seqs = _seqs(problem, stages)
    routes = balanced_routes(problem, stages, caps, seqs, weight, by_quotas=by_quotas)
    if routes is None:
        total = len(stages[0]) * problem.workload.microbatches_per_data_node
        # under quotas only when no split of the microbatches over the stage orders fits the caps
        assert not by_quotas or sequence_quotas(seqs, stage_cap_sums(caps, stages), total) is None
        return  # no path under the caps for some microbatch: the candidate is left out
    m = problem.workload.microbatches_per_data_node
    assert Counter(d for d, _ in routes) == {d: m for d in stages[0]}
    visits = Counter(x for _, p in routes for x in p)
    assert all(visits[x] <= caps[x] for x in visits)
    plan = build_plan(problem, stages, routes, "skippipe", 0)
    assert plan_violations(plan) == []


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems())
def test_balanced_candidate_finishes_and_is_scored_as_simulated(problem):
    stages = allocate(problem, seed=0)
    ev = Evaluator(problem, stages)
    got = balanced_candidate(problem, stages, problem.load_caps(stages), _seqs(problem, stages), ev)
    if got is None:
        return
    routes, score = got
    plan = build_plan(problem, stages, routes, "skippipe", 0)
    assert plan.predicted_makespan_s == score.makespan


def test_tight_caps_that_stop_the_greedy_are_routed_under_sequence_quotas():
    # 16 nodes, paths through 7 of 8 stages, one or two slots a node: with the slot-hold term
    # the greedy routing leaves a microbatch without a path (every stage order it could take
    # runs through a stage whose caps are spent); fixing the microbatches per stage order
    # first routes them all, within the caps
    problem = build_problem(
        random_global_cluster(16, 3, speed=(0.5, 2.0), memory=(1, 2)),
        Workload(num_stages=8, path_length=7, microbatches_per_data_node=3, memory=1),
    )
    stages = allocate(problem, seed=0)
    caps, seqs = problem.load_caps(stages), _seqs(problem, stages)
    assert balanced_routes(problem, stages, caps, seqs, 2.0, True) is None
    routes = balanced_routes(problem, stages, caps, seqs, 2.0, True, by_quotas=True)
    assert routes is not None
    assert Counter(d for d, _ in routes) == {d: 3 for d in stages[0]}
    visits = Counter(x for _, p in routes for x in p)
    assert all(visits[x] <= caps[x] for x in visits)
    assert plan_violations(build_plan(problem, stages, routes, "skippipe", 0)) == []


def test_slow_nodes_carry_fewer_visits_than_with_the_cheapest_path_greedy():
    # one site: every path costs the same hops, so the greedy fills the fastest nodes to their
    # caps and leaves the last rounds to the slow ones; the balanced routing spreads the work
    cluster = single_site_cluster(16, seed=3, speed=(0.5, 2.0), memory=(2, 4))
    problem = build_problem(cluster, Workload(num_stages=5, path_length=3, n_layers=20))
    stages = allocate(problem, seed=0)
    caps = problem.load_caps(stages)
    visit = np.asarray(problem.forward_s, dtype=float)
    others = [x for s in stages[1:] for x in s]

    def busiest(routes):
        load = Counter(x for _, p in routes for x in p)
        return max(load[x] * visit[x] for x in others)

    balanced = balanced_routes(problem, stages, caps, _seqs(problem, stages), 1.0)
    greedy = static_routes(problem, stages, caps)
    assert balanced is not None
    assert busiest(balanced) < busiest(greedy)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(), st.integers(0, 2), st.integers(0, 10_000), st.booleans())
def test_batched_sequence_search_equals_one_sequence_at_a_time(problem, swaps, seed, with_penalty):
    rng = np.random.default_rng(seed)
    s = problem.num_stages
    cuts = np.sort(rng.choice(np.arange(1, problem.n), s - 1, replace=False))
    stages = [np.sort(a) for a in np.split(rng.permutation(problem.n), cuts)]
    rc = RouteCosts.from_problem(problem)
    seqs = stage_sequences(s, problem.workload.path_length, swaps, problem.workload.max_jump)
    penalty = np.where(rng.random(problem.n) < 0.3, np.inf, np.round(rng.random(problem.n), 1)) if with_penalty else None
    d = int(stages[0][0])
    expect: tuple[float, list[int]] = (float("inf"), [])
    for seq in seqs:
        cost, chain = cheapest_chain(rc, d, [stages[q] for q in seq], penalty)
        if chain and cost < expect[0]:
            expect = (cost, chain)
    assert cheapest_over_sequences(rc, d, stages, seqs, penalty) == expect
    with patch.object(sequences, "BATCH_LIMIT", 0):  # one by one, prefixes shared (large stages)
        assert cheapest_over_sequences(rc, d, stages, seqs, penalty) == expect
