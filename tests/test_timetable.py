"""Timetable routing (``routing.timetable``): paths and processing orders reserved on the nodes'
timelines, a candidate of ``plan_skippipe``."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench_scripts import load_benchmark
from cluster_strategies import generated_problems
from skippipe.cluster_gen import random_global_cluster, single_site_cluster, suite
from skippipe.planfile import plan_violations
from skippipe.planner import methods
from skippipe.planner.allocation import allocate
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import candidates, pool, timetable, timetabled
from skippipe.planner.routing.candidates import stage_orders
from skippipe.planner.routing.evaluate import Evaluator
from skippipe.planner.routing.schedule import build_plan, plan_skippipe
from skippipe.planner.routing.search import SearchLimits
from skippipe.planner.routing.static import static_routes
from skippipe.planner.routing.timetable import Timeline, estimated_work, timetable_routes
from skippipe.sim import simulate
from skippipe.workload import Workload


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(), st.integers(0, 3), st.sampled_from([0.0, 0.2]), st.booleans())
def test_a_timetable_is_a_valid_plan_that_finishes_no_later_than_reserved(problem, seed, noise, paced):
    stages = allocate(problem, seed=0)
    caps = problem.load_caps(stages)
    got = timetable_routes(problem, stages, caps, stage_orders(problem, stages), random.Random(seed), noise, paced=paced)
    if got is None:
        return
    m = problem.workload.microbatches_per_data_node
    assert Counter(d for d, _ in got.routes) == {d: m for d in stages[0]}
    visits = Counter(x for _, path in got.routes for x in path)
    assert all(visits[x] <= caps[x] for x in visits)  # TC1 caps kept
    plan = build_plan(problem, stages, got.routes, "skippipe", 0, got.orders)
    assert plan_violations(plan) == []  # path rules (CC1-CC3, the jump rule), caps, orders
    result = simulate(plan)
    assert result.finished
    # a node following the reserved order starts every operation no later than reserved
    assert result.makespan_s <= got.makespan + 1e-9


def test_the_reserved_times_are_the_simulated_ones_on_an_uneven_cluster():
    cluster = random_global_cluster(14, seed=5, speed=(0.5, 2.0), memory=(1, 4))
    problem = build_problem(cluster, Workload(num_stages=5, path_length=4))
    stages = allocate(problem, seed=0)
    got = timetable_routes(problem, stages, problem.load_caps(stages), stage_orders(problem, stages))
    assert got is not None
    plan = build_plan(problem, stages, got.routes, "skippipe", 0, got.orders)
    assert abs(plan.predicted_makespan_s - got.makespan) < 1e-6


def test_a_timeline_places_an_operation_in_the_first_gap_that_fits_with_its_gap():
    line = Timeline()
    line.reserve(0.0, 1.0, 0.1, ("F", 0))  # busy until 1.1
    line.reserve(3.0, 1.0, 0.1, ("F", 1))  # busy from 3.0
    assert line.earliest(0.5, 1.0, 0.1) == 1.1  # fits between: 1.1 + 1.1 <= 3.0
    assert line.earliest(0.5, 2.0, 0.1) == 4.1  # does not fit: after the second
    line.hold(0.0, 2.0)
    assert line.earliest_forward(0.5, 0.5, 0.1, slots=1) == 2.0  # waits for the held slot
    assert line.hold_fits(2.0, 5.0, slots=1)
    assert not line.hold_fits(1.5, 5.0, slots=1)


def test_skippipe_keeps_a_timetable_that_leads_with_its_orders():
    # the suite's global uneven compute and memory cluster (30 nodes), where the timetable leads
    case = next(c for c in suite(0, largest=40) if c.kind == "global uneven+mem")
    problem = build_problem(case.cluster, case.workload())
    plan = plan_skippipe(problem, seed=0, budget=400)
    assert plan.meta["candidate"].startswith("timetable")
    assert plan_violations(plan) == []
    sim = simulate(plan)  # the plan's processing orders are the timetable's (searched further)
    assert sim.finished and abs(sim.makespan_s - plan.predicted_makespan_s) < 1e-9


def test_a_timetable_that_leads_with_orders_slower_than_its_routes_first_come_first_served_loses_its_orders():
    # sweep case 413 (30 nodes on one site, S = L = 5, 1-3 slots): the paced timetable leads at
    # 72.98 s with its orders; its routes first come, first served take 72.43 s
    _, cluster, workload = load_benchmark("scheduler_sweep").case(413)
    plan = methods.make_plan("skippipe", build_problem(cluster, workload), seed=0)
    assert plan.meta["candidate"].startswith("timetable")
    served = simulate(dataclasses.replace(plan, processing_order=None), record=False, bound=False).makespan_s
    assert plan.predicted_makespan_s <= served + 1e-9
    assert plan.predicted_makespan_s < 72.9


def _counted_over_estimated(problem, paced: bool) -> float | None:
    """The work one timetable counts over ``estimated_work`` (None when it finds no routing)."""
    stages = allocate(problem, seed=0)
    seqs = stage_orders(problem, stages)
    work = [0]
    if timetable_routes(problem, stages, problem.load_caps(stages), seqs, work=work, paced=paced) is None:
        return None
    return work[0] / estimated_work(problem, stages, seqs)


@pytest.mark.parametrize("kind", ["one per node", "3 sites", "one site"])
def test_above_the_largest_the_work_counted_is_within_2x_of_the_estimate_unpaced_and_under_2x_paced(kind):
    # where the estimate decides (about 3 s a cluster); a paced run may count far less (the
    # ranges measured are in ``estimated_work``'s docstring)
    make = {"one per node": lambda: random_global_cluster(106, seed=1, speed=(0.5, 2.0), memory=(1, 4), broken=0.1),
            "3 sites": lambda: random_global_cluster(104, seed=2, sites=3, speed=(0.5, 2.0), memory=(1, 4)),
            "one site": lambda: single_site_cluster(108, seed=3, speed=(0.5, 2.0), memory=(1, 4))}[kind]
    problem = build_problem(make(), Workload(num_stages=6, path_length=4))
    unpaced, paced = _counted_over_estimated(problem, False), _counted_over_estimated(problem, True)
    assert unpaced is not None and 0.5 <= unpaced <= 2.0
    assert paced is not None and paced <= 2.0


def _no_tc2_start():
    """A 30-node uneven cluster, its allocation, evaluator and the no-tc2 candidate on it."""
    problem = build_problem(random_global_cluster(30, seed=3, speed=(0.5, 2.0), memory=(1, 4)),
                            Workload(num_stages=5, path_length=3))
    stages = allocate(problem, seed=0)
    ev = Evaluator(problem, stages)
    routes = static_routes(problem, stages)
    return problem, stages, ev, [candidates.Candidate("no-tc2", stages, routes, ev.score(routes))]


def test_above_the_largest_cluster_routed_anyway_the_timetables_run_as_the_time_allows(monkeypatch):
    problem, stages, ev, start = _no_tc2_start()

    def timed(per_unit: float) -> list[candidates.Candidate]:
        monkeypatch.setattr(timetabled, "TIMETABLE_S_PER_WORK", per_unit)
        return timetabled.timetable_candidates(problem, start, 0, {id(stages): ev}, SearchLimits(budget=1000), False)

    assert timetabled._timetable_runs(problem, stages) == 2  # up to TIMETABLE_LARGEST: both, whatever the cost
    monkeypatch.setattr(timetabled, "TIMETABLE_LARGEST", 20)
    room = timetabled.TIMETABLE_SHARE * timetabled.planning_target_s(problem.n)
    work = estimated_work(problem, stages, stage_orders(problem, stages))
    for share_of_room, runs in ((0.4, 2), (0.9, 1), (1.1, 0)):  # one run's estimated seconds / the room
        monkeypatch.setattr(timetabled, "TIMETABLE_S_PER_WORK", share_of_room * room / work)
        assert timetabled._timetable_runs(problem, stages) == runs
    assert timed(1.1 * room / work) == []  # none fits: no timetable
    got = timed(0.9 * room / work)  # one fits: the unpaced one
    assert len(got) == 1 and got[0].timed and got[0].name == "timetable (no-tc2)"


def test_the_quicker_start_routes_only_the_paced_timetable_from_paced_only_nodes(monkeypatch):
    problem, stages, ev, start = _no_tc2_start()

    def variants(thorough: bool, paced_only_nodes: int) -> list[bool]:
        monkeypatch.setattr(timetabled, "PACED_ONLY_NODES", paced_only_nodes)
        return [paced for _, paced, _ in timetabled.first_runs(problem, start, thorough)]

    assert variants(False, problem.n + 1) == [False, True]  # a small group: both
    assert variants(False, problem.n) == [True]  # from PACED_ONLY_NODES: the paced one only
    assert variants(True, problem.n) == [False, True]  # the full start: both at any size


def test_the_first_timetables_are_the_same_side_by_side_as_one_after_another(monkeypatch):
    """The first runs go to the planning workers (``pool.map_calls``): the candidate, its
    routes, orders and score, and the work charged are those of one process."""
    problem = build_problem(random_global_cluster(24, seed=5, speed=(0.5, 2.0), memory=(1, 4)),
                            Workload(num_stages=6, path_length=4))
    stages = allocate(problem, seed=0)
    ev = Evaluator(problem, stages)
    routes = static_routes(problem, stages)
    start = [candidates.Candidate("no-tc2", stages, routes, ev.score(routes))]

    def planned(workers: str) -> tuple:
        monkeypatch.setenv("SKIPPIPE_PLANNING_WORKERS", workers)
        limits = SearchLimits(budget=10**6)
        got = timetabled.timetable_candidates(problem, start, 0, {id(stages): ev}, limits, True)
        return [(c.name, c.routes, c.orders, c.score.key()) for c in got], limits.spent

    monkeypatch.setattr(timetabled, "TIMETABLE_FREE_WORK", 0)  # every unit charged
    monkeypatch.setattr(pool, "SIDE_BY_SIDE_S", 0.0)  # every batch to the workers, however small
    units: list[int] = []
    real = timetabled.timetable_routes

    def counted(*args, **kwargs):
        work = args[6]
        before = work[0]
        out = real(*args, **kwargs)
        units.append(work[0] - before)
        return out

    monkeypatch.setattr(timetabled, "timetable_routes", counted)
    one = planned("1")  # all in this process: every routing's work is seen here
    per_sim = timetabled.TIMETABLE_WORK_PER_NODE_SMALL * problem.n
    assert one[0] and len(units) >= 3 and abs(one[1] - sum(units) / per_sim) <= 2  # all of it charged
    assert one == planned("2")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.0, 1e4, allow_subnormal=False), max_size=12))
def test_a_path_is_ranked_by_its_forwards_summed_as_numpy_sums_them(values):
    """The timetable reads the forwards as Python floats; their sum is numpy's to the last bit
    (in order below 8 values, pairwise from 8), so paths rank as they did with arrays."""
    assert timetable._summed(values) == float(np.asarray(values, dtype=float).sum())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 100.0), st.floats(0.01, 30.0)), max_size=40),
       st.floats(0.0, 130.0), st.floats(0.01, 30.0), st.integers(1, 4))
def test_timeline_slot_holds_match_a_scan_of_every_hold(holds, t, length, slots):
    """Only the holds that start within the longest hold before a time are looked at: the
    covering holds, a forward's earliest start with a free slot, whether a hold fits and the
    holds overlapping a span are those of a scan over every hold."""
    line = Timeline()
    for a, dur in holds:
        line.hold(a, a + dur)
    every = [(a, a + dur) for a, dur in holds]
    assert sorted(line._covering(t)) == sorted(b for a, b in every if a <= t < b)
    covering = [b for a, b in every if a <= t < b]
    assert line._covered(t) == (len(covering), min(covering, default=math.inf))
    expected = t if len(covering) < slots else min(covering)
    while len([b for a, b in every if a <= expected < b]) >= slots:
        expected = min(b for a, b in every if a <= expected < b)
    assert line.earliest_forward(t, 1.0, 0.1, slots) == expected
    points = [t] + [a for a, _ in every if t < a < t + length]
    assert line.hold_fits(t, t + length, slots) == all(
        1 + sum(1 for a, b in every if a <= p < b) <= slots for p in points)
    assert sorted(line.overlapping_ends(t, t + length)) == sorted(b for a, b in every if b > t and a < t + length)
