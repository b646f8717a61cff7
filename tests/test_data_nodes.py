"""The data-node exchange candidate of the path scheduler (``routing.data_nodes``)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_strategies import generated_problems
from skippipe.cluster_gen import random_global_cluster
from skippipe.planfile import plan_violations
from skippipe.planner.allocation import allocate
from skippipe.planner.problem import Problem, build_problem
from skippipe.planner.routing import pool
from skippipe.planner.routing.balanced import balanced_candidate
from skippipe.planner.routing.data_nodes import MAX_NODES, data_node_search, exchanged, partners
from skippipe.planner.routing.evaluate import Evaluator
from skippipe.planner.routing.schedule import build_plan, plan_skippipe
from skippipe.planner.routing.sequences import RouteCosts, cheapest_over_sequences
from skippipe.planner.stage_orders import stage_sequences
from skippipe.workload import Workload


def _seqs(problem: Problem, stages: list[list[int]]) -> tuple[tuple[int, ...], ...]:
    w = problem.workload
    return stage_sequences(len(stages), w.path_length, w.max_swaps, w.max_jump)


def _same_shape(a: list[list[int]], b: list[list[int]]) -> bool:
    return [len(s) for s in a] == [len(s) for s in b] and sorted(x for s in a for x in s) == sorted(x for s in b for x in s)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(1, 4), st.data())
def test_exchanged_keeps_stage_sizes_and_the_node_set(n_stages, size, data):
    nodes = list(range(n_stages * size + data.draw(st.integers(0, 3))))
    stages = [nodes[i * size:(i + 1) * size] for i in range(n_stages - 1)] + [nodes[(n_stages - 1) * size:]]
    d = data.draw(st.sampled_from(stages[0]))
    x = data.draw(st.sampled_from([y for s in stages[1:] for y in s]))
    out = exchanged(stages, d, x)
    assert _same_shape(out, stages)
    assert x in out[0] and d not in out[0]
    s_x = next(k for k, s in enumerate(stages) if x in s)
    assert d in out[s_x] and x not in out[s_x]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(max_nodes=14))
def test_search_keeps_sizes_and_nodes_and_beats_its_start(problem):
    stages = allocate(problem, seed=0)
    seqs = _seqs(problem, stages)
    found = data_node_search(problem, stages, seqs)
    if found is None:
        return
    new_stages, routes, score = found
    assert _same_shape(new_stages, stages)
    ev = Evaluator(problem, new_stages)
    assert ev.score(routes).key() == score.key()  # the score is the simulator's
    plan = build_plan(problem, new_stages, routes, "skippipe", 0)
    assert plan_violations(plan) == []
    start = balanced_candidate(problem, stages, problem.load_caps(stages), seqs, Evaluator(problem, stages))
    assert start is not None and score < start[1]


def _slow_data_node_problem() -> tuple[Problem, list[list[int]], int]:
    cluster = random_global_cluster(20, seed=3, sites=4, speed=(0.8, 1.2))
    wl = Workload(num_stages=5, path_length=4, n_layers=20)
    stages = allocate(build_problem(cluster, wl), seed=0)
    slow = stages[0][0]
    speed = np.array(cluster.compute_speed, dtype=float)
    speed[slow] = 0.25  # one data node 4x slower than the rest, on the same allocation
    problem = build_problem(dataclasses.replace(cluster, compute_speed=speed), wl)
    return problem, stages, slow


def test_a_very_slow_data_node_is_exchanged_and_the_plan_is_not_slower():
    problem, stages, slow = _slow_data_node_problem()
    seqs = _seqs(problem, stages)
    start = balanced_candidate(problem, stages, problem.load_caps(stages), seqs, Evaluator(problem, stages))
    found = data_node_search(problem, stages, seqs)
    assert start is not None and found is not None
    new_stages, routes, score = found
    assert slow not in new_stages[0]
    assert slow in (x for s in new_stages[1:] for x in s)
    # the candidate's plan file, simulated as a whole, is quicker than the balanced routing's on the start
    plan = build_plan(problem, new_stages, routes, "skippipe", 0)
    before = build_plan(problem, stages, start[0], "skippipe", 0)
    assert plan_violations(plan) == []
    assert plan.predicted_makespan_s < before.predicted_makespan_s


def test_the_candidate_is_off_on_a_fixed_allocation_and_on_even_compute():
    problem, stages, _ = _slow_data_node_problem()
    fixed = build_problem(dataclasses.replace(problem.cluster, stages=stages), problem.workload)
    assert plan_skippipe(fixed, seed=0, budget=50).meta["candidate"] in ("no-tc2", "private-chains", "balanced")
    even = build_problem(dataclasses.replace(problem.cluster, compute_speed=np.ones(problem.n)), problem.workload)
    assert not plan_skippipe(even, seed=0, budget=50).meta["candidate"].startswith("data nodes")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(stages=(3, 5), extra_nodes=30, max_nodes=40), st.integers(1, 4))
def test_the_shortlist_above_max_nodes_has_the_fastest_node_and_the_cheapest_round_trip(problem, k):
    assert problem.n > MAX_NODES
    stages = allocate(problem, seed=0)
    seqs = _seqs(problem, stages)
    others = sorted(x for s in stages[1:] for x in s)
    rc = RouteCosts.from_problem(problem)
    for d in stages[0]:
        short = partners(problem, stages, seqs, d, k)
        assert short == sorted(set(short)) and set(short) <= set(others) and 1 <= len(short) <= 2 * k
        assert min(others, key=lambda x: (float(problem.forward_s[x]), x)) in short

        trips = {x: cheapest_over_sequences(rc, x, [np.asarray(s, dtype=int) for s in exchanged(stages, d, x)], seqs)[0]
                 for x in others}
        assert min(others, key=lambda x: (trips[x], x)) in short


@settings(max_examples=10, deadline=None)
@given(generated_problems(max_nodes=14))
def test_up_to_max_nodes_every_node_outside_stage_0_is_a_partner(problem):
    stages = allocate(problem, seed=0)
    for d in stages[0]:
        assert partners(problem, stages, _seqs(problem, stages), d, 1) == sorted(x for s in stages[1:] for x in s)


def test_a_known_start_score_changes_nothing():
    problem, stages, _ = _slow_data_node_problem()
    seqs = _seqs(problem, stages)
    start = balanced_candidate(problem, stages, problem.load_caps(stages), seqs, Evaluator(problem, stages))
    assert start is not None
    with_known = data_node_search(problem, stages, seqs, start[1])
    without = data_node_search(problem, stages, seqs)
    assert with_known is not None and without is not None
    assert with_known[0] == without[0] and with_known[1] == without[1] and with_known[2].key() == without[2].key()


def test_the_tally_counts_every_balanced_routing(monkeypatch):
    from skippipe.planner.routing import data_nodes

    calls = [0]
    real = data_nodes.balanced_routes

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(data_nodes, "balanced_routes", counted)
    monkeypatch.setenv("SKIPPIPE_PLANNING_WORKERS", "1")  # every routing in this process, where they are counted
    problem, stages, _ = _slow_data_node_problem()
    tally = [0]
    assert data_node_search(problem, stages, _seqs(problem, stages), tally=tally) is not None
    assert tally[0] == calls[0] > len(data_nodes.VARIANTS)


def test_the_exchanges_of_a_step_side_by_side_find_what_one_process_finds(monkeypatch):
    """Each step's exchanges are split into runs for the planning workers (``pool.map_calls``);
    the first best in order is kept, so the allocation, routes, score and routings counted are
    those of one process (where ties in score are likely: a cluster of one speed but one node)."""
    problem, stages, _ = _slow_data_node_problem()
    seqs = _seqs(problem, stages)
    monkeypatch.setattr(pool, "SIDE_BY_SIDE_S", 0.0)  # every batch to the workers, however small

    def searched(workers: str) -> tuple:
        monkeypatch.setenv("SKIPPIPE_PLANNING_WORKERS", workers)
        tally = [0]
        found = data_node_search(problem, stages, seqs, tally=tally)
        assert found is not None
        return found[0], found[1], found[2].key(), tally[0]

    one = searched("1")
    assert one == searched("2") == searched("3")
