"""The fastest round trips solved by dynamic programming equal the enumerated ones, and raise
the floor over every allocation where the paths are too many to enumerate."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_strategies import floors_switched_off, generated_problems
from skippipe.cluster_gen import random_global_cluster
from skippipe.errors import UserError
from skippipe.planner import cycle_trips
from skippipe.planner.cycle_trips import cheapest_cycles, solvable, trip_terms, window_walks
from skippipe.planner.floors import _round_trips, free_allocation_floor
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.workload import Workload


def _enumerated(edge: np.ndarray, w: np.ndarray, hops: int) -> list[float]:
    n = len(w)
    best = []
    for d in range(n):
        costs = [edge[d, p[0]] + sum(w[x] for x in p) + sum(edge[a, b] for a, b in zip(p, p[1:])) + edge[p[-1], d]
                 for p in itertools.permutations([x for x in range(n) if x != d], hops)]
        best.append(min(costs, default=math.inf))
    return best


@st.composite
def weighted_graphs(draw):
    n = draw(st.integers(2, 8))
    hops = draw(st.integers(1, 4))
    # few distinct values: many ties, where a wrong exclusion would show
    values = st.sampled_from([0.0, 1.0, 2.0, 3.5, math.inf]) if draw(st.booleans()) else st.floats(0, 10)
    edge = np.array(draw(st.lists(values, min_size=n * n, max_size=n * n)), dtype=float).reshape(n, n)
    w = np.array(draw(st.lists(st.floats(0, 5), min_size=n, max_size=n)), dtype=float)
    return edge, w, hops


@settings(max_examples=300, deadline=None)
@given(weighted_graphs())
def test_cheapest_cycles_equal_enumeration(graph):
    edge, w, hops = graph
    got = cheapest_cycles(edge, w, hops)
    want = _enumerated(edge, w, hops)
    for g, x in zip(got, want):
        assert (math.isinf(g) and math.isinf(x)) or g == pytest.approx(x, abs=1e-9)


def _window_walks_enumerated(edge: np.ndarray, w: np.ndarray, hops: int) -> list[float]:
    n = len(w)
    best = []
    for d in range(n):
        others = [x for x in range(n) if x != d]
        costs = [edge[d, p[0]] + sum(w[x] for x in p) + sum(edge[a, b] for a, b in zip(p, p[1:])) + edge[p[-1], d]
                 for p in itertools.product(others, repeat=hops)
                 if all(len({*p[i:i + 3]}) == len(p[i:i + 3]) for i in range(hops))]
        best.append(min(costs, default=math.inf) if hops < n else math.inf)
    return best


@settings(max_examples=200, deadline=None)
@given(weighted_graphs(), st.integers(1, 6))
def test_window_walks_are_the_least_walks_and_bound_the_cycles(graph, hops):
    edge, w, _ = graph
    edge, w = edge[:6, :6], w[:6]  # product over nodes^hops stays small
    got = window_walks(edge, w, hops)
    cycles = _enumerated(edge, w, hops) if hops < len(w) else [math.inf] * len(w)
    for g, walk, cycle in zip(got, _window_walks_enumerated(edge, w, hops), cycles):
        assert (math.isinf(g) and math.isinf(walk)) or g == pytest.approx(walk, abs=1e-9)
        assert g <= cycle + 1e-9
        if hops <= 3:  # three in a row distinct: the walk is a cycle
            assert (math.isinf(g) and math.isinf(cycle)) or g == pytest.approx(cycle, abs=1e-9)


def test_cheapest_cycles_refuses_longer_paths():
    with pytest.raises(ValueError):
        cheapest_cycles(np.ones((6, 6)), np.ones(6), 5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(stages=(3, 6), max_path=5, max_nodes=12))
def test_solved_trip_terms_equal_the_enumerated_ones(problem):
    assert solvable(problem)
    solved = trip_terms(problem)
    assert solved is not None
    r0, _, out, back = _round_trips(problem)
    for got, want in zip(solved, (r0, out, back)):
        finite = np.isfinite(want)
        assert np.array_equal(finite, np.isfinite(got))
        assert np.allclose(got[finite], want[finite], atol=1e-9)


def test_solved_trips_raise_the_floor_where_paths_are_too_many(monkeypatch):
    # 60 nodes, L = 5: 60 x 59 x 58 x 57 x 56 paths are too many to enumerate
    cluster = random_global_cluster(60, seed=3, sites=12, speed=(0.5, 2.0), memory=(1, 4), broken=0.05)
    problem = build_problem(cluster, Workload(num_stages=8, path_length=5))
    solved = free_allocation_floor(problem)
    monkeypatch.setattr(cycle_trips, "CYCLE_WORK", 0)  # the relaxed round trips alone
    relaxed = free_allocation_floor(problem)
    assert not solved.exact_trips and not relaxed.exact_trips
    assert solved.solved_trips and not relaxed.solved_trips
    assert solved.value > relaxed.value * 1.02


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(generated_problems(stages=(6, 8), max_path=8, extra_nodes=1, max_nodes=10).filter(lambda p: p.workload.path_length >= 6),
       st.sampled_from(["naive", "random"]))
def test_floor_with_long_paths_stays_below_the_enumerated_floor_and_the_plans(problem, method):
    # paths through 5-7 other nodes: the walk bound, not the exact solver
    enumerated = free_allocation_floor(problem, max_tuples=10**7)
    bounded = free_allocation_floor(problem, max_tuples=1)
    assert bounded.value <= enumerated.value * (1 + 1e-5)
    try:
        plan = make_plan(method, problem, seed=0)
    except UserError:
        return
    assert bounded.value <= plan.predicted_makespan_s + 1e-6


def test_walk_bound_raises_the_floor_with_long_paths(monkeypatch):
    # 60 nodes, one site each, L = 6 of S = 6: paths through 5 other nodes
    cluster = random_global_cluster(60, seed=4, speed=(0.5, 2.0))
    problem = build_problem(cluster, Workload(num_stages=6, path_length=6))
    assert not solvable(problem) and trip_terms(problem) is not None
    # the walk bound alone: the programme floors (which raise both values here) switched off
    floors_switched_off(monkeypatch, "slot_time_floor", "neighbour_floor")
    walked = free_allocation_floor(problem)
    monkeypatch.setattr(cycle_trips, "WALK_WORK", 0)
    relaxed = free_allocation_floor(problem)
    assert walked.value > relaxed.value * 1.02


def test_large_clusters_keep_the_relaxed_trips():
    cluster = random_global_cluster(400, seed=1, sites=20)
    problem = build_problem(cluster, Workload(num_stages=9, path_length=5))
    assert not solvable(problem) and trip_terms(problem) is None
