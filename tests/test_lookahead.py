"""The look-ahead timetable (``routing.lookahead``) and its use on the slowest group of a
cluster planned in groups of sites (``site_groups.looked_ahead``)."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_strategies import generated_problems
from skippipe.cluster_gen import random_global_cluster
from skippipe.planfile import plan_violations
from skippipe.planner.allocation import allocate
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import site_groups
from skippipe.planner.routing.candidates import stage_orders
from skippipe.planner.routing.lookahead import lookahead_routes, lookahead_work
from skippipe.planner.routing.schedule import build_plan, plan_skippipe
from skippipe.planner.routing.timetable import timetable_routes
from skippipe.sim import simulate
from skippipe.workload import Workload


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(), st.integers(0, 2))
def test_the_lookahead_is_a_valid_plan_no_slower_than_the_greedy_timetable(problem, seed):
    stages = allocate(problem, seed=seed)
    caps, seqs = problem.load_caps(stages), stage_orders(problem, stages)
    greedy = timetable_routes(problem, stages, caps, seqs)
    got = lookahead_routes(problem, stages, caps, seqs)
    if greedy is None:
        assert got is None
        return
    assert got is not None and got.makespan <= greedy.makespan + 1e-9
    m = problem.workload.microbatches_per_data_node
    assert Counter(d for d, _ in got.routes) == {d: m for d in stages[0]}
    visits = Counter(x for _, path in got.routes for x in path)
    assert all(visits[x] <= caps[x] for x in visits)
    plan = build_plan(problem, stages, got.routes, "skippipe", 0, got.orders)
    assert plan_violations(plan) == []
    result = simulate(plan)
    assert result.finished and result.makespan_s <= got.makespan + 1e-9


def _uneven_problem():
    cluster = random_global_cluster(16, seed=3, speed=(0.5, 2.0), memory=(1, 4))
    return build_problem(cluster, Workload(num_stages=5, path_length=4))


def test_the_lookahead_finds_a_quicker_timetable_on_an_uneven_cluster():
    # the greedy choice of each microbatch costs the ones after it: here the look-ahead is quicker
    problem = _uneven_problem()
    stages = allocate(problem, seed=0)
    caps, seqs = problem.load_caps(stages), stage_orders(problem, stages)
    greedy = timetable_routes(problem, stages, caps, seqs)
    got = lookahead_routes(problem, stages, caps, seqs)
    assert got.makespan < greedy.makespan - 1e-6


def test_the_slowest_group_takes_the_lookahead_only_when_quicker_and_affordable():
    problem = _uneven_problem()
    plan = plan_skippipe(problem, seed=0, budget=200)
    parts = [(list(range(problem.n)), plan)]
    assert site_groups.looked_ahead([problem], parts, 0, room_s=0.0) == parts  # nothing fits: unchanged
    ahead = site_groups.looked_ahead([problem], parts, 0, room_s=1e9)[0][1]
    assert ahead.predicted_makespan_s < plan.predicted_makespan_s - 1e-6  # 85.52 -> 83.84 s here
    assert ahead.meta["lookahead"] and plan_violations(ahead) == []
    assert simulate(ahead).makespan_s == ahead.predicted_makespan_s


def test_a_work_limit_stops_the_lookahead_with_the_best_routing_completed_so_far():
    problem = _uneven_problem()
    stages = allocate(problem, seed=0)
    caps, seqs = problem.load_caps(stages), stage_orders(problem, stages)
    greedy = timetable_routes(problem, stages, caps, seqs)
    full_work, cut_work = [0], [0]
    full = lookahead_routes(problem, stages, caps, seqs, full_work)
    none = lookahead_routes(problem, stages, caps, seqs, [0], limit=0)
    assert none.routes == greedy.routes and none.makespan == greedy.makespan  # nothing looked ahead
    cut = lookahead_routes(problem, stages, caps, seqs, cut_work, limit=full_work[0] // 3)
    assert full_work[0] // 3 < cut_work[0] < full_work[0]  # stopped within one completion of the limit
    assert full.makespan <= cut.makespan <= greedy.makespan
    plan = build_plan(problem, stages, cut.routes, "skippipe", 0, cut.orders)
    assert plan_violations(plan) == [] and simulate(plan).makespan_s <= cut.makespan + 1e-9


def test_the_lookahead_work_estimate_follows_what_it_counts():
    # the estimate decides whether a look-ahead starts; the count, where it stops
    problem = _uneven_problem()
    stages = allocate(problem, seed=0)
    caps, seqs = problem.load_caps(stages), stage_orders(problem, stages)
    work = [0]
    lookahead_routes(problem, stages, caps, seqs, work)
    assert 0.5 < work[0] / lookahead_work(problem, stages, seqs) < 2.0
