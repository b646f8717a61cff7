"""The SkipPipe path scheduler: path building blocks, both methods' plans, search guarantees."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skippipe.cluster import Cluster, load_cluster
from skippipe.errors import UserError
from skippipe.planfile import path_rule_violation, plan_violations
from skippipe.planner.allocation import allocate
from skippipe.planner.floors import allocation_data_node_floor, trip_floor
from skippipe.planner.problem import build_problem
from skippipe.planner.routing.evaluate import Evaluator, Incremental
from skippipe.planner.routing.schedule import plan_no_tc2, plan_skippipe
from skippipe.planner.routing.sequences import RouteCosts, cheapest_path, node_classes, prefix_tree
from skippipe.planner.stage_orders import sequence_quotas, stage_sequences
from skippipe.reference import reference_problem, reference_stages
from skippipe.sim import simulate
from skippipe.workload import Workload, least_max_jump

# SKIPPIPE_ROUTE_EXAMPLES=200 for a deeper run of the property tests
FAST = settings(max_examples=int(os.environ.get("SKIPPIPE_ROUTE_EXAMPLES", "12")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- random problems


@st.composite
def problems(draw, heterogeneous: bool = True):
    """Small random clusters: random links, optionally uneven compute and memory, random S/L."""
    S = draw(st.integers(3, 5))
    L = draw(st.integers(2, S))
    n = draw(st.integers(S + 1, 13))
    seed = draw(st.integers(0, 10_000))
    rng = np.random.default_rng(seed)
    t = rng.uniform(0.3, 4.0, size=(n, n))
    if draw(st.booleans()):
        t = (t + t.T) / 2
    np.fill_diagonal(t, 0.0)
    forward = rng.uniform(0.3, 2.0, size=n) if heterogeneous and draw(st.booleans()) else np.full(n, 1.0)
    memory = rng.integers(1, 5, size=n) if heterogeneous and draw(st.booleans()) else None
    cluster = Cluster(name="random", n=n, transfer_s=t, forward_s=forward, memory=memory)
    workload = Workload(
        num_stages=S, path_length=L, microbatches_per_data_node=draw(st.integers(1, 5)),
        memory=draw(st.integers(1, 4)), n_layers=2 * S,
        max_swaps=draw(st.integers(0, 2)), max_jump=draw(st.integers(least_max_jump(S, L), max(4, least_max_jump(S, L)))),
    )
    return build_problem(cluster, workload)


def finished(plan) -> float:
    res = simulate(plan, record=False)
    assert res.finished, res.unfinished
    return res.makespan_s


# ----------------------------------------------------------------------------- building blocks


@given(S=st.integers(2, 7), L=st.integers(2, 7), swaps=st.integers(0, 2), jump=st.integers(0, 5))
@settings(max_examples=60, deadline=None)
def test_stage_sequences_are_exactly_the_valid_orders(S, L, swaps, jump):
    L = min(L, S)
    brute = {p for p in itertools.permutations(range(1, S), L - 1) if path_rule_violation(list(p), swaps, jump) is None}
    assert set(stage_sequences(S, L, swaps, jump)) == brute


@given(problems(heterogeneous=True))
@FAST
def test_cheapest_path_matches_brute_force(problem):
    stages = [list(range(problem.stage_sizes[0]))]
    start = problem.stage_sizes[0]
    for size in problem.stage_sizes[1:]:
        stages.append(list(range(start, start + size)))
        start += size
    w = problem.workload
    seqs = stage_sequences(len(stages), w.path_length, w.max_swaps, w.max_jump)
    rc = RouteCosts.from_problem(problem)
    for d in stages[0]:
        cost, path = cheapest_path(rc, d, stages, seqs)
        brute = min(
            (rc.round_trip(d, nodes) for seq in seqs for nodes in itertools.product(*[stages[s] for s in seq])),
            default=float("inf"),
        )
        assert cost == pytest.approx(brute)
        if path:
            assert rc.round_trip(d, path) == pytest.approx(cost)


def test_node_classes_group_interchangeable_nodes():
    p = build_problem(load_cluster("gcp-2025/geo-distributed/30"), Workload())
    cls = node_classes(p.transfer_s, p.forward_s, p.memory)
    locs = p.cluster.locations
    for i in range(p.n):
        for j in range(p.n):
            assert (cls[i] == cls[j]) == (locs[i] == locs[j])
    # a node with its own compute speed leaves its location's class
    c = load_cluster("gcp-2025/geo-distributed/30")
    c.compute_speed = np.ones(30)
    c.compute_speed[0] = 2.0
    p2 = build_problem(c, Workload())
    cls2 = node_classes(p2.transfer_s, p2.forward_s, p2.memory)
    assert all(cls2[0] != cls2[j] for j in range(1, 30))


# ----------------------------------------------------------------------------- the methods


def caps_leave_no_routing(problem, seed: int) -> bool:
    """Certificate that no plan exists: the stage capacities under the TC1 caps cannot take
    the microbatches (integer program over stage sequences)."""
    stages = allocate(problem, seed=seed)
    w = problem.workload
    caps = problem.load_caps(stages)
    seqs = stage_sequences(len(stages), w.path_length, w.max_swaps, w.max_jump)
    stage_caps = [0] + [sum(caps[x] for x in s) for s in stages[1:]]
    return sequence_quotas(seqs, stage_caps, len(stages[0]) * w.microbatches_per_data_node) is None


@given(problems(heterogeneous=True), st.integers(0, 3))
@FAST
def test_both_methods_give_valid_finishing_plans(problem, seed):
    try:
        base = plan_no_tc2(problem, seed=seed)
    except UserError as exc:
        assert "load caps" in str(exc) and caps_leave_no_routing(problem, seed)
        return
    ours = plan_skippipe(problem, seed=seed, budget=150)
    for plan in (base, ours):
        assert plan_violations(plan) == []
        assert len(plan.microbatches) == problem.stage_sizes[0] * problem.workload.microbatches_per_data_node
        finished(plan)
    # never worse than skippipe-no-tc2 on the same instance and seed
    assert finished(ours) <= finished(base) + 1e-9
    assert ours.predicted_makespan_s == pytest.approx(finished(ours))


@given(problems(heterogeneous=True))
@FAST
def test_no_plan_beats_the_data_node_floor(problem):
    if caps_leave_no_routing(problem, 0):
        return
    for plan in (plan_no_tc2(problem), plan_skippipe(problem, budget=100)):
        assert finished(plan) >= allocation_data_node_floor(problem, plan.stages) - 1e-9


def test_trip_floor_is_reached_on_the_shipped_instance():
    """The sharper floor is attained: the shipped instance's last data node cannot do better."""
    problem = reference_problem("shipped")
    floor = allocation_data_node_floor(problem, reference_stages("shipped"))
    assert floor == pytest.approx(33.0538, abs=1e-3)
    assert trip_floor(10.0, 1.0, 1.5, 3, 3, 0.1, 0.1) == pytest.approx(2 * 1.1 + 10.0)
    plan = plan_skippipe(problem, seed=0, budget=3000)
    assert finished(plan) == pytest.approx(floor, abs=1e-6)
    assert plan_violations(plan) == []


def test_skippipe_beats_the_reference_on_the_current_instance():
    problem = reference_problem("current")
    plan = plan_skippipe(problem, seed=0, budget=1500)
    assert plan.stages == reference_stages("current")  # the fixed allocation is kept
    assert finished(plan) < 77.72  # the reference's SkipPipe in its own simulator
    assert plan.processing_order is None or plan_violations(plan) == []


def test_deterministic_for_a_seed():
    problem = build_problem(load_cluster("gcp20-shipped-free"), Workload())
    a = plan_skippipe(problem, seed=3, budget=400)
    b = plan_skippipe(problem, seed=3, budget=400)
    assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)


def test_time_limit_is_respected(fake_clock):
    """With a budget it could never spend, the search stops at the time limit (a fake clock that
    advances 10 ms per reading, so the test does not depend on the machine's speed)."""
    problem = build_problem(load_cluster("gcp-2025/geo-distributed/60"), Workload())
    plan = plan_skippipe(problem, seed=0, time_limit_s=1.5, budget=10**9)
    assert fake_clock.readings < 10**5
    assert plan_violations(plan) == []
    finished(plan)


def test_own_allocation_changes_with_heterogeneous_nodes():
    """Faster nodes take more visits (caps follow speed) and slow ones fewer."""
    c = load_cluster("gcp-2025/geo-distributed/20")
    c.compute_speed = np.where(np.arange(20) % 2 == 0, 2.0, 0.5)
    p = build_problem(c, Workload())
    plan = plan_skippipe(p, seed=0, budget=300)
    assert plan_violations(plan) == []
    load = plan.load_per_node()
    data = set(plan.stages[0])
    fast = [load[x] for x in range(20) if x % 2 == 0 and x not in data]
    slow = [load[x] for x in range(20) if x % 2 == 1 and x not in data]
    assert fast and slow and np.mean(fast) > np.mean(slow)


# ----------------------------------------------------------------------------- the evaluator


@given(problems(heterogeneous=True))
@FAST
def test_component_scores_equal_whole_plan_simulation(problem):
    if caps_leave_no_routing(problem, 0):
        return
    plan = plan_no_tc2(problem)
    routes = [(mb.data_node, tuple(mb.path)) for mb in plan.microbatches]
    ev = Evaluator(problem, plan.stages)
    score = ev.score(routes)
    res = simulate(plan, record=False)
    assert score.makespan == pytest.approx(res.makespan_s, abs=1e-9)
    per_node: dict[int, float] = {}
    for mb in plan.microbatches:
        per_node[mb.data_node] = max(per_node.get(mb.data_node, 0.0), res.finish_s[mb.id])
    assert sorted(score.finishes) == pytest.approx(sorted(per_node.values()))


def test_planning_does_not_import_torch():
    code = "import sys, skippipe.planner.routing.schedule; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@given(problems(heterogeneous=True), st.integers(0, 1000))
@FAST
def test_incremental_scores_equal_full_scores(problem, seed):
    """Score updates after random exchanges and path swaps equal a fresh whole-routing score."""
    if caps_leave_no_routing(problem, 0):
        return
    plan = plan_no_tc2(problem)
    routes = [(mb.data_node, tuple(mb.path)) for mb in plan.microbatches]
    ev = Evaluator(problem, plan.stages)
    state = Incremental(ev, routes)
    rng = np.random.default_rng(seed)
    assert state.score.key() == ev.score(routes).key()
    for _ in range(15 if len(routes) > 1 else 0):
        i, j = (int(x) for x in rng.choice(len(routes), size=2, replace=False))
        new = list(state.routes)
        (di, pi), (dj, pj) = new[i], new[j]
        new[i], new[j] = (di, pj), (dj, pi)
        score, proposal = state.propose(new, [i, j])
        assert score.key() == ev.score(new).key()
        if rng.random() < 0.5:
            state.accept(proposal)
            assert state.score.key() == ev.score(state.routes).key()


# ----------------------------------------------------------------------------- free-allocation floor


def _tiny_free_problem(seed: int, n: int, sizes: tuple[int, ...], L: int, m: int, memory: int):
    rng = np.random.default_rng(seed)
    t = rng.uniform(0.3, 1.5, size=(n, n))
    t[0, :] += 3.0  # a remote node: every plan must still route its load (TC1 caps sum to the visits)
    t[:, 0] += 3.0
    np.fill_diagonal(t, 0.0)
    cluster = Cluster(name="tiny", n=n, transfer_s=t, forward_s=np.full(n, 1.0))
    w = Workload(num_stages=len(sizes), path_length=L, microbatches_per_data_node=m, memory=memory,
                 n_layers=2 * len(sizes), max_swaps=1, max_jump=4, stage_sizes=sizes)
    return build_problem(cluster, w)


def _brute_force_best(problem) -> float:
    """Least simulated makespan over every allocation and every routing under the caps."""
    n = problem.n
    sizes = problem.stage_sizes
    m = problem.workload.microbatches_per_data_node
    L = problem.workload.path_length
    best = float("inf")
    for data in itertools.combinations(range(n), sizes[0]):
        rest = [x for x in range(n) if x not in data]
        labels = set()
        for perm in itertools.permutations(rest):
            parts, k = [list(data)], 0
            for s in sizes[1:]:
                parts.append(sorted(perm[k:k + s]))
                k += s
            labels.add(tuple(tuple(p) for p in parts))
        for stages in labels:
            stages = [list(s) for s in stages]
            caps = problem.load_caps(stages)
            seqs = stage_sequences(len(sizes), L, problem.workload.max_swaps, problem.workload.max_jump)
            paths = [tuple(nodes) for seq in seqs for nodes in itertools.product(*[stages[s] for s in seq])]
            owners = [d for d in data for _ in range(m)]
            for choice in itertools.product(paths, repeat=len(owners)):
                load = {}
                for p in choice:
                    for x in p:
                        load[x] = load.get(x, 0) + 1
                if any(load.get(x, 0) > caps[x] for x in rest):
                    continue
                from skippipe.planfile import Microbatch
                mbs = [Microbatch(id=i, data_node=d, path=list(p)) for i, (d, p) in enumerate(zip(owners, choice))]
                plan = problem.make_plan(stages, mbs, method="brute", seed=0)
                assert not plan_violations(plan)
                best = min(best, simulate(plan, record=False, bound=False).makespan_s)
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n, sizes, L, m, memory", [(6, (2, 2, 2), 2, 2, 1), (5, (1, 2, 2), 3, 2, 1)])
def test_free_allocation_floor_holds_by_brute_force(seed, n, sizes, L, m, memory):
    from skippipe.planner.floors import free_allocation_floor

    problem = _tiny_free_problem(seed, n, sizes, L, m, memory)
    floor = free_allocation_floor(problem)
    assert floor.exhaustive
    set_free = free_allocation_floor(problem, max_sets=0)  # the weaker bound without the loads
    assert not set_free.exhaustive and set_free.value <= floor.value + 1e-9
    best = _brute_force_best(problem)
    assert floor.value <= best + 1e-9
    assert floor.value >= 0.95 * best  # close: equal on most of these


def test_free_allocation_floor_counts_the_remote_load():
    """On the tiny instance with a remote node the load term is what binds (the remote node
    cannot be a data node cheaply, and whoever visits it is slow)."""
    from skippipe.planner.floors import free_allocation_floor

    problem = _tiny_free_problem(0, 6, (2, 2, 2), 2, 2, 1)
    assert free_allocation_floor(problem).value > free_allocation_floor(problem, max_sets=0).value + 0.5


def test_free_allocation_floor_of_the_current_instance_is_above_the_target():
    """Issue 5, target 3 (own allocation <= 0.70 x 77.72 s = 54.40 s) cannot be met."""
    from skippipe.planner.floors import free_allocation_floor

    problem = build_problem(load_cluster("gcp20-current-free"), reference_problem("current").workload)
    floor = free_allocation_floor(problem)
    # 54.60 s before the data nodes' own schedules with the dear trips counted (2026-11-28);
    # 55.438 s before their searches tried the earliest-starting operation first (2026-12-02:
    # more of them finish within their step caps and prove that a data node cannot finish sooner)
    assert floor.exhaustive and floor.value == pytest.approx(55.809, abs=0.005)
    assert floor.value > 0.70 * 77.72


# ----------------------------------------------------------------------------- no-tc2 load rule


def test_no_tc2_keeps_each_round_within_the_slots_on_the_current_instance():
    """The static load rule: a data node injects round by round (M at a time) and no node gets
    more microbatches of one round than it has activation slots (a path within the limit
    exists on this instance, and no path beyond it is less than half as costly)."""
    from skippipe.planner.routing.assign import round_of

    problem = reference_problem("current")
    plan = plan_no_tc2(problem)
    per_round: dict[tuple[int, int], int] = {}
    k_of: dict[int, int] = {}
    for mb in sorted(plan.microbatches, key=lambda mb: mb.id):
        k = k_of.get(mb.data_node, 0)
        k_of[mb.data_node] = k + 1
        r = round_of(problem, mb.data_node, k)
        for x in mb.path:
            per_round[(r, x)] = per_round.get((r, x), 0) + 1
    assert max(per_round.values()) <= int(problem.memory.min())
    assert max(per_round.values()) == int(problem.memory.min())  # the rule binds here


def test_no_tc2_is_no_worse_than_the_reference_no_tc2_plan():
    """Our collision-blind baseline against the reference's own no-TC2 plan, same allocation,
    same simulator (current-code instance)."""
    from skippipe.reference import reference_plan

    ours = simulate(plan_no_tc2(reference_problem("current")), record=False).makespan_s
    theirs = simulate(reference_plan("current", "nonca"), record=False).makespan_s
    assert ours <= theirs


@given(st.integers(2, 9), st.integers(2, 5), st.integers(0, 2), st.integers(1, 4))
def test_prefix_tree_rebuilds_every_stage_order_from_distinct_prefixes(stages, length, swaps, jump):
    seqs = stage_sequences(stages, min(length, stages), swaps, jump)
    if not seqs:
        return
    levels = prefix_tree(seqs)
    assert len(levels) == len(seqs[0])
    assert list(levels[-1].stage) == [s[-1] for s in seqs]  # the last level keeps the orders' order
    rebuilt = [[int(s)] for s in levels[0].stage]
    for level in levels[1:]:
        rebuilt = [[*rebuilt[int(p)], int(s)] for s, p in zip(level.stage, level.parent, strict=True)]
        assert len({tuple(r) for r in rebuilt}) == len(rebuilt)  # each prefix once
    assert [tuple(r) for r in rebuilt] == list(seqs)
    for i, level in enumerate(levels[:-1]):
        assert len(level.stage) == len({s[: i + 1] for s in seqs})
