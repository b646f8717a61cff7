"""The data nodes' own schedules with dear trips: the schedule search and the set term."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_strategies import generated_problems, makespan_on, random_allocation
from skippipe.cluster_gen import suite
from skippipe.planner.floors import free_allocation_floor, set_floors
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.planner.set_floor import SetFloor
from skippipe.serial_floor import kinds_schedule, serial_trip_floor

FACTORS = (0.25, 1.5, 0.09, 0.13)  # loss and backward factors, inject and op gaps (the defaults)


def _every_order(forward: float, kinds: list[tuple[int, float, float]], slots: int) -> float:
    """The least finish over every order of every microbatch's three operations (no first in,
    first out, no pruning), each started as early as it can."""
    loss_f, bwd_f, inject_gap, op_gap = FACTORS
    f, loss, bwd = forward, loss_f * forward, bwd_f * forward
    lags = [(o, b) for c, o, b in kinds for _ in range(c)]
    m = len(lags)
    k = max(1, min(slots, m))
    best = math.inf

    def go(stage: list[int], ready: list[float], free: float, finish: float) -> None:
        nonlocal best
        if all(s == 3 for s in stage):
            best = min(best, finish)
            return
        out = sum(1 for s in stage if s in (1, 2))
        for i in range(m):
            s = stage[i]
            if s == 3 or (s == 0 and out >= k):
                continue
            start = max(free, ready[i])
            length, gap, lag = ((f, inject_gap, lags[i][0]), (loss, op_gap, lags[i][1]), (bwd, op_gap, 0.0))[s]
            stage[i], old = s + 1, ready[i]
            ready[i] = start + length + lag
            go(stage, ready, start + length + gap, max(finish, start + length) if s == 2 else finish)
            stage[i], ready[i] = s, old

    go([0] * m, [0.0] * m, 0.0, 0.0)
    return best


kinds_lists = st.lists(st.tuples(st.integers(0, 2), st.floats(0.5, 12.0), st.floats(0.5, 15.0)), min_size=1, max_size=3)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.3, 3.0), kinds_lists, st.integers(1, 3))
def test_the_search_is_the_least_finish_over_every_order(forward, kinds, slots):
    if not 1 <= sum(c for c, _, _ in kinds) <= 4:
        return
    value, _ = kinds_schedule(forward, kinds, slots, *FACTORS, max_steps=10**7)
    assert math.isclose(value, _every_order(forward, kinds, slots), rel_tol=1e-12, abs_tol=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.3, 3.0), st.floats(0.5, 12.0), st.floats(0.5, 15.0), st.integers(1, 6), st.integers(1, 4),
       st.integers(1, 3))
def test_one_kind_split_in_parts_is_the_serial_floor(forward, out, back, m, slots, parts):
    kinds = [(m // parts + (1 if i < m % parts else 0), out, back) for i in range(parts)]
    value, _ = kinds_schedule(forward, kinds, slots, *FACTORS, max_steps=10**7)
    assert math.isclose(value, serial_trip_floor(forward, out, back, m, slots, *FACTORS), rel_tol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.3, 3.0), kinds_lists, st.integers(1, 4), st.floats(0.0, 10.0), st.integers(0, 2))
def test_longer_lags_never_finish_sooner_and_the_cutoffs_keep_their_promises(forward, kinds, slots, more, which):
    if not 1 <= sum(c for c, _, _ in kinds) <= 6:
        return
    exact, _ = kinds_schedule(forward, kinds, slots, *FACTORS, max_steps=10**7)
    longer = [(c, o + more * (i == which % len(kinds)), b) for i, (c, o, b) in enumerate(kinds)]
    assert kinds_schedule(forward, longer, slots, *FACTORS, max_steps=10**7)[0] >= exact - 1e-9
    # below the least finish the cutoff is all it says; above it, the first schedule found is
    # below the cutoff and no sooner than the least finish
    assert kinds_schedule(forward, kinds, slots, *FACTORS, cutoff=exact - 0.5, max_steps=10**7)[0] == exact - 0.5
    found, _ = kinds_schedule(forward, kinds, slots, *FACTORS, cutoff=exact + 0.5, max_steps=10**7, first_below=True)
    assert exact - 1e-9 <= found < exact + 0.5


def test_a_cut_search_gives_a_bound_below_the_least_finish():
    kinds = [(3, 5.85, 8.05), (1, 9.6, 11.8), (2, 10.69, 12.89)]
    exact, steps = kinds_schedule(2.2, kinds, 3, *FACTORS, max_steps=10**7)
    cut, cut_steps = kinds_schedule(2.2, kinds, 3, *FACTORS, max_steps=50)
    assert steps > 50 and cut_steps > 50
    assert 0 < cut < exact


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(stages=(3, 5), max_path=4, extra_nodes=2, max_nodes=10),
       st.sampled_from(["naive", "random", "skippipe-no-tc2"]), st.integers(0, 10_000))
def test_the_term_is_below_every_plan_with_those_data_nodes(problem, method, seed):
    stages = random_allocation(problem, np.random.default_rng(seed))
    made = makespan_on(problem, stages, method)
    if made is None:  # no valid path, caps or memory deadlock on this allocation: nothing to bound
        return
    assert set_floors(problem).dear_schedules(tuple(stages[0])) <= made + 1e-6


def test_gcp_one_per_region_the_dear_regions_cost_the_data_nodes_time():
    # 12 nodes, one per GCP region, S = 5, L = 3: the far regions (Australia and Asia) take
    # 24 of the 48 visits, so at least 12 microbatches leave on trips through them, and the
    # data node that runs them also runs its own work: 55.83 s before, 57.04 s now
    case = suite(0, 12)[0]
    problem = build_problem(case.cluster, case.workload())
    floor = free_allocation_floor(problem).value
    data = (2, 6, 7, 11)  # the set whose floor was least before
    sets = set_floors(problem)
    assert sets.dear_schedules(data) > 1.03 * sets.value(data, schedules=False)
    assert floor > 1.02 * 55.83
    assert floor <= make_plan("skippipe", problem, seed=0).predicted_makespan_s + 1e-6


def test_without_the_schedules_the_floor_is_as_before(monkeypatch):
    case = suite(0, 12)[0]
    problem = build_problem(case.cluster, case.workload())
    monkeypatch.setattr(SetFloor, "dear_schedules", lambda self, data, *args: 0.0)
    assert math.isclose(free_allocation_floor(problem).value, 55.8276, abs_tol=1e-3)


def test_a_step_counts_more_above_twelve_microbatches():
    # a step's bound runs over the microbatches not yet back, so the caps count work: a search cut
    # at its root (cutoff 0) takes one step, counted m / 12 with more than 12 microbatches
    assert kinds_schedule(2.2, [(6, 5.0, 7.0)], 3, *FACTORS, cutoff=0.0) == (0.0, 1)
    assert kinds_schedule(2.2, [(12, 5.0, 7.0)], 3, *FACTORS, cutoff=0.0) == (0.0, 1)
    assert kinds_schedule(2.2, [(30, 5.0, 7.0), (18, 6.0, 8.0)], 3, *FACTORS, cutoff=0.0) == (0.0, 4)
    # and a search past its cap stops after cap x 12 / m steps, said to be past the cap
    value, steps = kinds_schedule(2.2, [(96, 5.0, 7.0)], 3, *FACTORS, max_steps=1_200)
    assert steps > 1_200 and value > 0.0
