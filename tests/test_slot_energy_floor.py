"""The slot-energy floor: the visits' activation slots over every stretch of time."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import skippipe.planner.slot_energy_floor as slot_energy
from cluster_strategies import (
    check_below_a_plan,
    floor_and_without,
    generated_problems,
    plan_makespans,
    random_allocation,
)
from skippipe.cluster_gen import single_site_cluster
from skippipe.errors import UserError
from skippipe.planner.floors import free_allocation_floor, set_floors
from skippipe.planner.methods import make_plan, with_allocation
from skippipe.planner.problem import build_problem
from skippipe.planner.slot_energy_floor import (
    _terms,
    _windows,
    most_held,
    position_hosts,
    position_sets,
    slot_energy_floor,
    spans_held,
)
from skippipe.sim import simulate
from skippipe.workload import Workload, least_max_jump


def _few_slots(memory=(1, 2)):
    # 24 nodes of one site, one or two slots each, two microbatches per data node: the data
    # nodes send both out at once, and the visits' slots run out mid-iteration
    cluster = single_site_cluster(24, seed=2, memory=memory)
    return build_problem(cluster, Workload(num_stages=4, path_length=3, microbatches_per_data_node=2, n_layers=12,
                                           max_jump=2, max_swaps=0))


def test_few_slots_raise_the_floor_and_every_plan_stays_above(monkeypatch):
    problem = _few_slots()
    floor, without = floor_and_without(problem, monkeypatch, "slot_energy_floor")
    assert floor.value == floor.slot_energy_s
    assert floor.value > 1.20 * without  # 16.22 -> 20.83 s
    made = plan_makespans(problem, ("naive", "random", "skippipe-no-tc2"), draws=12)
    assert len(made) > 10
    assert floor.value <= min(made) + 1e-6  # skippipe: 20.96 s


def test_a_stage_smaller_than_the_microbatches_out_raises_the_floor(monkeypatch):
    # 14 nodes of one site, one slot each, every path through every stage in order (L = S = 4,
    # max_jump 1): the 4 data nodes' microbatches are out at once, but stage 2 has 3 nodes
    problem = build_problem(single_site_cluster(14, seed=3, memory=(1, 1)),
                            Workload(num_stages=4, path_length=4, microbatches_per_data_node=1, n_layers=12,
                                     max_swaps=1, max_jump=1))
    assert problem.stage_sizes == [4, 4, 3, 3]
    floor = free_allocation_floor(problem).value
    monkeypatch.setattr(slot_energy, "position_sets", lambda p: [])
    without = free_allocation_floor(problem).value
    assert floor > 1.15 * without  # 20.83 -> 24.86 s
    made = plan_makespans(problem, ("naive", "random", "skippipe-no-tc2"), draws=8)
    assert floor <= min(made) + 1e-6  # skippipe: 24.99 s


def test_plenty_of_slots_leave_the_floor():
    problem = _few_slots(memory=(4, 4))
    floor = free_allocation_floor(problem)
    assert slot_energy_floor(problem, set_floors(problem).tf, floor.value) == floor.value


def _spans(plan, result):
    """Per microbatch: data node, injection start, final backward end, and per path position
    (forward start, backward end) on the visited node."""
    ops = {}
    for op in result.ops:
        ops[(op.mb, op.node, op.kind)] = op
    out = []
    for k, mb in enumerate(plan.microbatches):
        d = mb.data_node
        visits = [(ops[(k, x, "F")].start, ops[(k, x, "B")].end) for x in mb.path]
        out.append((d, ops[(k, d, "F")].start, ops[(k, d, "B")].end, visits, mb.path))
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(stages=(3, 5), max_path=4, extra_nodes=2, max_nodes=12),
       st.sampled_from(["naive", "random", "skippipe-no-tc2"]), st.integers(0, 10_000))
def test_simulated_spans_keep_to_their_windows_and_to_the_slots(problem, method, seed):
    """What the floor is made of, checked on simulated plans: every visit's span (forward start
    to backward end) lies in its window, lasts at least its least span, is in a stage its position can take, and the
    spans on a node overlap at most its memory and its largest TC1 cap (``spans_held``) at a
    time, and those of a run of positions at most what the stages hosting them can hold."""
    stages = random_allocation(problem, np.random.default_rng(seed))
    try:
        plan = make_plan(method, with_allocation(problem, stages), seed=0)
    except UserError:  # no valid path, caps or memory deadlock on this allocation
        return
    result = simulate(plan)
    if not result.finished:
        return
    T, terms, eps, held = result.makespan_s, _terms(problem), 1e-6, spans_held(problem)
    spans = _spans(plan, result)
    hosts = position_hosts(problem)
    stage_of = {x: s for s, nodes in enumerate(plan.stages) for x in nodes}
    by_node: dict[int, list[tuple[float, float]]] = {}
    by_position: dict[int, list[tuple[float, float]]] = {}
    for d in {s[0] for s in spans}:
        mine = [s for s in spans if s[0] == d]
        inject = sorted(range(len(mine)), key=lambda q: mine[q][1])
        final = sorted(range(len(mine)), key=lambda q: mine[q][2])
        k = min(int(problem.memory[d]), terms.m)
        start, end, span = _windows(terms, float(problem.forward_s[d]), k, T)
        for q, (_, _, _, visits, path) in enumerate(mine):
            j, i = inject.index(q), final.index(q)
            for p, (begin, finish) in enumerate(visits):
                assert begin >= start[j, p] - eps
                assert finish <= end[i, p] + eps
                assert finish - begin >= span[p] - eps
                by_node.setdefault(path[p], []).append((begin, finish))
                by_position.setdefault(p, []).append((begin, finish))
                assert stage_of[path[p]] in hosts[p]
    for node, spans in by_node.items():
        assert _most_at_once(spans) <= min(problem.memory[node], held[node])
    data = np.zeros(problem.n, dtype=bool)
    data[plan.stages[0]] = True  # the plan's data nodes are eligible: their own floors are below T
    for positions, places in position_sets(problem):
        most = most_held(held, data, len(plan.stages[0]), places)
        assert _most_at_once([span for p in positions for span in by_position.get(p, [])]) <= most + 1e-9


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans (start, end) open at one time (an end before a start at the same time)."""
    events = sorted([(b, 1) for b, _ in spans] + [(f, -1) for _, f in spans])
    return int(np.cumsum([e[1] for e in events]).max()) if events else 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(stages=(3, 5), max_path=4, extra_nodes=2, max_nodes=12),
       st.sampled_from(["naive", "random", "skippipe-no-tc2"]), st.integers(0, 10_000))
def test_slot_energy_floor_is_below_every_plan(problem, method, seed):
    # the floor alone (from a floor of almost nothing), against a plan on any allocation
    check_below_a_plan(slot_energy_floor(problem, set_floors(problem).tf, 1e-3), problem, method, seed)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 9), st.data())
def test_the_wider_hosts_hold_every_stage_order(num_stages, data):
    """Where the stage orders would be too many to enumerate, each position's wider set of
    stages holds every stage the enumerated orders put there."""
    L = data.draw(st.integers(2, num_stages))
    least = least_max_jump(num_stages, L)
    workload = Workload(num_stages=num_stages, path_length=L, max_swaps=data.draw(st.integers(0, 2)),
                        max_jump=data.draw(st.integers(least, max(least, 5))), n_layers=2 * num_stages)
    problem = build_problem(single_site_cluster(num_stages + 4, seed=1), workload)
    exact = position_hosts(problem)
    slot_energy.MAX_ORDERS, kept = 0, slot_energy.MAX_ORDERS
    try:
        wide = position_hosts(problem)
    finally:
        slot_energy.MAX_ORDERS = kept
    assert all(a <= b for a, b in zip(exact, wide))
