"""The iteration simulator and the lower bounds: hand-checked timings, rules, property tests."""

from __future__ import annotations

import dataclasses
import itertools
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skippipe.bounds import DataNodeLoad, compute_bound, data_node_floor, lower_bound, memory_floor
from skippipe.errors import PlanError
from skippipe.planfile import Constraints, Costs, Microbatch, Plan, path_rule_violation, plan_violations
from skippipe.sim import route_finish_times, simulate
from skippipe.sim_ops import RouteOps


def make_plan(
    stages: list[list[int]],
    transfer: np.ndarray,
    forward: list[float] | float,
    mbs: list[Microbatch],
    memory: int | list[int] = 3,
    path_length: int | None = None,
    order: dict[int, list[str]] | None = None,
    **cost_kw: float,
) -> Plan:
    n = transfer.shape[0]
    fwd = np.full(n, float(forward)) if np.isscalar(forward) else np.asarray(forward, dtype=float)
    L = path_length if path_length is not None else (len(mbs[0].path) + 1 if mbs else 2)
    return Plan(
        stages=stages,
        layers=[[s] for s in range(len(stages))],
        memory=[memory] * n if isinstance(memory, int) else list(memory),
        constraints=Constraints(path_length=L, max_swaps=1, max_jump=4, max_load=None),
        costs=Costs(transfer_s=np.asarray(transfer, dtype=float), forward_s=fwd, **cost_kw),
        microbatches=mbs,
        processing_order=order,
    )


def line(n: int, hop: float) -> np.ndarray:
    t = np.full((n, n), hop)
    np.fill_diagonal(t, 0.0)
    return t


def test_no_torch_import():
    code = (
        "import sys, skippipe.sim, skippipe.bounds, skippipe.reference, skippipe.viz, skippipe.commands.simulate;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_one_microbatch_by_hand():
    # data node 0, then node 1 (stage 1), node 2 (stage 2); asymmetric hops
    T = np.array([[0, 1.0, 5.0], [2.0, 0, 0.5], [3.0, 0.25, 0]])
    plan = make_plan([[0], [1], [2]], T, [1.0, 2.0, 4.0], [Microbatch(7, 0, [1, 2])])
    res = simulate(plan)
    got = [(o.node, o.kind, o.start, o.end) for o in sorted(res.ops, key=lambda o: o.start)]
    expect, t = [], 0.0
    for node, kind, dur, hop in [
        (0, "F", 1.0, 1.0), (1, "F", 2.0, 0.5), (2, "F", 4.0, 3.0),  # forward, last hop 2 -> 0
        (0, "L", 0.25, 5.0),  # head + loss on the data node, gradient 0 -> 2
        (2, "B", 6.0, 0.25), (1, "B", 3.0, 2.0), (0, "B", 1.5, 0.0),
    ]:
        expect.append((node, kind, t, t + dur))
        t += dur + hop
    assert [(node, kind) for node, kind, _, _ in got] == [(node, kind) for node, kind, _, _ in expect]
    assert [x for _, _, a, b in got for x in (a, b)] == pytest.approx([x for _, _, a, b in expect for x in (a, b)])
    assert res.finished and res.unfinished == []
    assert res.makespan_s == pytest.approx(expect[-1][3])
    assert res.busy_s == pytest.approx([1.0 + 0.25 + 1.5, 2.0 + 3.0, 4.0 + 6.0])
    assert res.processing_order() == {0: ["F7", "L7", "B7"], 1: ["F7", "B7"], 2: ["F7", "B7"]}


def test_gaps_after_injection_and_other_ops():
    # two microbatches released together on one data node, path length 1 (no hops):
    # F0, then (0.09 s inject gap) its loss and backward, 0.13 s apart, before new work F1
    plan = make_plan([[0], [1]], line(2, 1.0), 1.0, [Microbatch(0, 0, []), Microbatch(1, 0, [])], path_length=1)
    ops = sorted(simulate(plan).ops, key=lambda o: o.start)
    assert [(o.kind, o.mb) for o in ops] == [("F", 0), ("L", 0), ("B", 0), ("F", 1), ("L", 1), ("B", 1)]
    starts = [0.0, 1.09, 1.09 + 0.25 + 0.13, 1.47 + 1.5 + 0.13]
    assert [o.start for o in ops[:4]] == pytest.approx(starts)
    assert ops[4].start == pytest.approx(starts[3] + 1.0 + 0.09)


def test_memory_limit_delays_forward_until_backward():
    plan = make_plan([[0], [1]], line(2, 0.5), 1.0, [Microbatch(0, 0, [1]), Microbatch(1, 0, [1])], memory=[3, 1])
    res = simulate(plan)
    by = {(o.node, o.kind, o.mb): o for o in res.ops}
    assert by[(1, "F", 1)].start >= by[(1, "B", 0)].end + 0.13 - 1e-12
    # the data node (memory 3) injects both at once
    assert by[(0, "F", 1)].start == pytest.approx(1.09)


def test_data_node_memory_counts_own_microbatches():
    plan = make_plan([[0], [1]], line(2, 0.5), 1.0, [Microbatch(0, 0, [1]), Microbatch(1, 0, [1])], memory=[1, 3])
    res = simulate(plan)
    by = {(o.node, o.kind, o.mb): o for o in res.ops}
    assert by[(0, "F", 1)].start == pytest.approx(by[(0, "B", 0)].end + 0.13)


def test_release_and_after_gate_injection():
    mbs = [Microbatch(0, 0, [1]), Microbatch(1, 0, [1], release_s=2.0, after=0), Microbatch(2, 0, [1], release_s=0.5)]
    res = simulate(make_plan([[0], [1]], line(2, 0.5), 1.0, mbs))
    by = {(o.node, o.kind, o.mb): o for o in res.ops}
    assert by[(0, "F", 2)].start >= 0.5
    assert by[(0, "F", 1)].start >= max(2.0, res.finish_s[0])
    assert by[(0, "F", 1)].ready == pytest.approx(res.finish_s[0])


@pytest.mark.parametrize("release, expected", [(3.25, ["F0", "B0", "F1", "B1"]), (3.2, ["F0", "F1", "B0", "B1"])])
def test_first_arrived_first_served_backward_wins_ties(release, expected):
    # mb0: 0 -> 2; its backward reaches node 2 at 2 + 1 + 1 + 0.25 + 1 = 5.25.
    # mb1: 1 -> 2, released at r; its forward reaches node 2 at r + 2.
    mbs = [Microbatch(0, 0, [2]), Microbatch(1, 1, [2], release_s=release)]
    res = simulate(make_plan([[0, 1], [2]], line(3, 1.0), 1.0, mbs))
    assert res.processing_order()[2] == expected
    for o in res.ops:
        assert o.start >= o.ready - 1e-12


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("release, start", [(1.05, 3.13), (1.2, 3.2)])
def test_arrival_during_the_gap_waits_for_its_end(ordered, release, start):
    # node 1 runs F0 in [2, 3] with nothing else arrived; F1 reaches it at release + 2:
    # inside its 0.13 s op gap it starts when the gap ends, after it at once
    mbs = [Microbatch(0, 0, [1]), Microbatch(1, 2, [1], release_s=release)]
    order = {1: ["F0", "F1", "B0", "B1"]} if ordered else None
    res = simulate(make_plan([[0, 2], [1]], line(3, 1.0), 1.0, mbs, order=order))
    by = {(o.node, o.kind, o.mb): o for o in res.ops}
    assert by[(1, "F", 0)].end == pytest.approx(3.0)
    assert by[(1, "F", 1)].ready == pytest.approx(release + 2.0)
    assert by[(1, "F", 1)].start == pytest.approx(start)


def test_injection_yields_to_in_flight_work():
    # data node forward 3 s: F0 [0, 3], F1 [3.09, 6.09]; L0 arrives at 6, F2 was released at 5.
    # When the node frees, the in-flight loss goes first although the injection waited longer.
    mbs = [Microbatch(0, 0, [1]), Microbatch(1, 0, [1]), Microbatch(2, 0, [1], release_s=5.0)]
    res = simulate(make_plan([[0], [1]], line(2, 1.0), [3.0, 1.0], mbs))
    assert res.processing_order()[0][:4] == ["F0", "F1", "L0", "F2"]


def test_processing_order_is_followed_and_deadlock_reported():
    mbs = [Microbatch(0, 0, [1]), Microbatch(1, 0, [1])]
    plan = make_plan([[0], [1]], line(2, 0.5), 1.0, mbs, memory=[3, 1])
    order = {1: ["F1", "B1", "F0", "B0"]}
    res = simulate(plan, processing_order=order)
    assert res.finished and res.processing_order()[1] == order[1]
    bad = simulate(plan, processing_order={1: ["F0", "F1", "B0", "B1"]})  # F1 needs a slot that B0 frees later
    assert not bad.finished and bad.unfinished == [0, 1] and math.isinf(bad.makespan_s)
    with pytest.raises(PlanError, match="each of its"):
        simulate(plan, processing_order={1: ["F0", "B0"]})
    with pytest.raises(PlanError, match="does not perform"):
        simulate(plan, processing_order={1: ["F0", "B0", "F1", "L1"]})


def test_validation_of_processing_orders():
    """A plan's processing order must list each node's operations once, a backward after its
    forward; the violations name the node and the microbatch."""
    mbs = [Microbatch(0, 0, [1]), Microbatch(1, 0, [1])]
    good = {0: ["F0", "F1", "L0", "L1", "B0", "B1"], 1: ["F0", "F1", "B1", "B0"]}
    assert plan_violations(make_plan([[0], [1]], line(2, 0.5), 1.0, mbs, order=good)) == []
    bad = {**good, 1: ["F0", "B1", "F1", "B0"]}
    assert plan_violations(make_plan([[0], [1]], line(2, 0.5), 1.0, mbs, order=bad)) == [
        "processing_order[1]: B1 comes before F1"]
    short = {**good, 1: ["F0", "F1", "B1", "F9"]}
    problems = plan_violations(make_plan([[0], [1]], line(2, 0.5), 1.0, mbs, order=short))
    assert problems == ["processing_order[1] does not match its operations (missing ['B0'], extra ['F9'])"]
    odd = {**good, 1: ["F0", "F1", "B1", "X0"]}
    assert "processing_order[1]: operation 'X0'" in plan_violations(make_plan([[0], [1]], line(2, 0.5), 1.0, mbs,
                                                                               order=odd))[0]


def test_plan_processing_order_used_unless_overridden():
    mbs = [Microbatch(0, 0, [1]), Microbatch(1, 0, [1])]
    plan = make_plan([[0], [1]], line(2, 0.5), 1.0, mbs, order={1: ["F1", "B1", "F0", "B0"]}, memory=[3, 1])
    assert simulate(plan).processing_order()[1] == ["F1", "B1", "F0", "B0"]
    assert simulate(plan, processing_order={}).processing_order()[1][0] == "F0"


def test_cross_memory_deadlock_terminates():
    # mb0: 0 -> 2 -> 3, mb1: 1 -> 3 -> 2 (a swap), nodes 2 and 3 hold one activation each
    T = line(4, 1.0)
    mbs = [Microbatch(0, 0, [2, 3]), Microbatch(1, 1, [3, 2])]
    plan = make_plan([[0, 1], [2], [3]], T, 1.0, mbs, memory=[3, 3, 1, 1])
    res = simulate(plan)
    assert not res.finished and sorted(res.unfinished) == [0, 1]
    assert res.last_finish_s == 0.0


def test_compute_bound_and_memory_floor_by_hand():
    T = line(3, 1.0)
    mbs = [Microbatch(i, 0, [1]) for i in range(4)]
    plan = make_plan([[0], [1, 2]], T, 2.0, mbs, memory=2)
    # data node: 4 x (F + L + B) = 4 x 2 x 2.75 = 22 plus gaps (4 x 0.09 + 8 x 0.13 - 0.13)
    assert compute_bound(plan) == pytest.approx(22.0 + 4 * 0.09 + 7 * 0.13)
    # floor: ceil(4/2) = 2 round trips of data node F+L+B (5.5) + hops 4 x 1 + F+B on one node (5)
    floor = memory_floor(DataNodeLoad(plan.stages, plan.costs, 2, 4, 2, 1, 4))
    assert floor == pytest.approx(2 * (5.5 + 4 + 5) + 0.13)
    # data-node floor: R = 14.5, F = 2, B = 3; the last injection waits for 2 final backwards
    # (from R - B on) and one injection: (R - B) + 2 (B + 0.13) + (F + 0.09) + R
    dn = data_node_floor(DataNodeLoad(plan.stages, plan.costs, 2, 4, 2, 1, 4))
    assert dn == pytest.approx((14.5 - 3) + 2 * 3.13 + 2.09 + 14.5)
    assert lower_bound(plan) == pytest.approx(max(floor, dn, compute_bound(plan)))
    assert simulate(plan).makespan_s >= lower_bound(plan)


def test_memory_floor_respects_path_rules():
    # stage 2 is cheap to reach, stage 1 is far: a path of length 2 may jump straight to stage 2
    T = line(3, 1.0)
    T[0, 1] = T[1, 0] = 10.0
    stages = [[0], [1], [2]]
    costs = Costs(transfer_s=T, forward_s=np.ones(3))
    fast = memory_floor(DataNodeLoad(stages, costs, 1, 1, 2, 1, 4))
    assert fast == pytest.approx(2.75 + 4 * 1.0 + 2.5)  # four hops: out, back, out, back
    # with max_jump = 1 stage 2 cannot come first (0 -> 2 goes 2 stages past the frontier), the
    # path must go through node 1; with max_jump = 0 no stage above the frontier can be visited
    slow = memory_floor(DataNodeLoad(stages, costs, 1, 1, 2, 1, 1))
    assert memory_floor(DataNodeLoad(stages, costs, 1, 1, 2, 1, 0)) == float("inf")
    assert slow == pytest.approx(2.75 + 4 * 10.0 + 2.5)


# ---------------------------------------------------------------- property tests


def valid_sequences(S: int, L: int) -> list[tuple[int, ...]]:
    out = []
    for seq in itertools.permutations(range(1, S), L - 1):
        if path_rule_violation(list(seq), 1, 4) is None:
            out.append(seq)
    return out


@st.composite
def random_plans(draw):
    S = draw(st.integers(2, 4))
    sizes = [draw(st.integers(1, 2)) for _ in range(S)]
    n = sum(sizes)
    stages, i = [], 0
    for s in sizes:
        stages.append(list(range(i, i + s)))
        i += s
    L = draw(st.integers(1, S))
    seqs = valid_sequences(S, L)
    hops = np.array(draw(st.lists(st.sampled_from([0.0, 0.05, 0.3, 1.0, 2.5]), min_size=n * n, max_size=n * n))).reshape(n, n)
    np.fill_diagonal(hops, 0.0)
    forward = draw(st.lists(st.sampled_from([0.1, 0.5, 1.0, 1.7]), min_size=n, max_size=n))
    memory = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    mbs: list[Microbatch] = []
    for d in stages[0]:
        for _ in range(draw(st.integers(1, 4))):
            seq = draw(st.sampled_from(seqs))
            path = [draw(st.sampled_from(stages[s])) for s in seq]
            mine = [m.id for m in mbs if m.data_node == d]
            after = draw(st.sampled_from([None, *mine])) if mine else None
            rel = draw(st.sampled_from([0.0, 0.0, 0.4, 2.5]))
            mbs.append(Microbatch(len(mbs), d, path, release_s=rel, after=after))
    plan = make_plan(stages, hops, forward, mbs, memory=memory, path_length=L)
    assert plan_violations(plan) == []
    return plan


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_plans(), st.randoms(use_true_random=False))
def test_route_finish_times_equal_a_plan_simulation(plan, rnd):
    """The planner's scoring runs (cached route segments, no plan built) finish every microbatch
    exactly when ``simulate`` does, first come first served and under processing orders (a
    shuffled one may deadlock: -1 there, missing from ``finish_s`` here)."""
    plan = dataclasses.replace(plan, microbatches=[Microbatch(m.id, m.data_node, m.path) for m in plan.microbatches])
    route_ops = RouteOps(plan.costs)
    mbs = [(m.id, m.data_node, tuple(m.path)) for m in plan.microbatches]
    first = simulate(plan)
    orders: list[dict[int, list[str]] | None] = [None]
    if first.finished:  # a complete executed order, and the same operations shuffled
        order = first.processing_order()
        orders += [order, {x: rnd.sample(ops, len(ops)) for x, ops in order.items()}]
    # the same routes on a cluster of many more nodes (their state kept for the used ones alone)
    n, extra = plan.n_nodes, 5 * plan.n_nodes
    wide = RouteOps(Costs(transfer_s=np.pad(plan.costs.transfer_s, (0, extra), constant_values=1.0),
                          forward_s=np.pad(plan.costs.forward_s, (0, extra), constant_values=1.0),
                          backward_factor=plan.costs.backward_factor, loss_factor=plan.costs.loss_factor,
                          inject_gap_s=plan.costs.inject_gap_s, op_gap_s=plan.costs.op_gap_s))
    assert wide.n == n + extra
    for o in orders:
        res = simulate(plan, processing_order=o, record=False, bound=False)
        want = [res.finish_s.get(m.id, -1.0) for m in plan.microbatches]
        assert route_finish_times(route_ops, mbs, list(plan.memory), o) == want
        assert route_finish_times(wide, mbs, list(plan.memory) + [1] * extra, o) == want


def check_timeline(plan: Plan, res) -> None:
    c = plan.costs
    ops_by_node: dict[int, list] = {}
    for o in res.ops:
        ops_by_node.setdefault(o.node, []).append(o)
        assert o.start >= o.ready - 1e-9
    for node, ops in ops_by_node.items():
        ops.sort(key=lambda o: o.start)
        for a, b in zip(ops, ops[1:]):
            gap = c.inject_gap_s if (a.kind == "F" and node == plan.microbatch(a.mb).data_node) else c.op_gap_s
            assert b.start >= a.end + gap - 1e-9, (node, a, b)
        # memory: slots held from a forward's start to the backward's end on this node
        events = []
        for o in ops:
            if o.kind == "F":
                events.append((o.start, 1))
            elif o.kind == "B":
                events.append((o.end, -1))
        held = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
            held += delta
            assert held <= plan.memory[node]
    # each microbatch's chain: every operation at least a hop after the previous one
    for mb in plan.microbatches:
        mine = sorted((o for o in res.ops if o.mb == mb.id), key=lambda o: o.start)
        nodes = [o.node for o in mine]
        back = [*reversed(mb.path), mb.data_node]
        assert nodes == [mb.data_node, *mb.path, mb.data_node, *back]
        assert mine[0].start >= mb.release_s - 1e-9
        for a, b in zip(mine, mine[1:]):
            assert b.start >= a.end + c.transfer_s[a.node][b.node] - 1e-9


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_plans())
def test_random_plans_obey_the_rules(plan):
    res = simulate(plan)
    again = simulate(plan)
    assert [(o.node, o.mb, o.kind, o.start) for o in res.ops] == [(o.node, o.mb, o.kind, o.start) for o in again.ops]
    if not res.finished:
        assert math.isinf(res.makespan_s) and res.unfinished
        return
    check_timeline(plan, res)
    assert res.makespan_s >= res.lower_bound_s - 1e-9
    data_node_ends = [o.end for o in res.ops if o.kind == "B" and o.node == plan.microbatch(o.mb).data_node]
    assert res.makespan_s == pytest.approx(max(data_node_ends))
    # replaying the executed order reproduces the timeline exactly
    replay = simulate(plan, processing_order=res.processing_order())
    assert replay.finished
    assert sorted((o.node, o.mb, o.kind, round(o.start, 9)) for o in replay.ops) == sorted(
        (o.node, o.mb, o.kind, round(o.start, 9)) for o in res.ops
    )
    fast = simulate(plan, record=False)
    assert fast.ops == [] and fast.makespan_s == res.makespan_s and fast.processing_order() == res.processing_order()
