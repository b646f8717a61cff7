"""Baseline plans (full pipeline, random skipping) and the method registry."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skippipe.cluster import cluster_from_dict, load_cluster
from skippipe.errors import UserError
from skippipe.planfile import Constraints, Costs, Microbatch, Plan, plan_violations
from skippipe.planner import methods
from skippipe.planner.allocation import allocate, bottleneck_matching
from skippipe.planner.baselines import full_chains, full_plan, random_plan
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.sim import simulate
from skippipe.workload import Workload


def _problem(spec: str = "gcp20-current", **kw):
    return build_problem(load_cluster(spec), Workload(**kw))


def test_full_plan_shape():
    p = _problem()
    plan = full_plan(p)
    assert plan_violations(plan) == []
    assert plan.method == "full"
    assert plan.constraints.path_length == 6 and plan.constraints.max_swaps == 0
    assert len(plan.microbatches) == 5 * 6  # the samples of all 5 data nodes
    injecting = {mb.data_node for mb in plan.microbatches}
    assert len(injecting) == 3  # |P1| chains
    counts = [sum(mb.data_node == d for mb in plan.microbatches) for d in injecting]
    assert sorted(counts) == [10, 10, 10]
    assert plan.constraints.max_load == plan.load_per_node()
    # every path runs the stages in order, one node per stage
    stage_of = plan.stage_of()
    for mb in plan.microbatches:
        assert [stage_of[x] for x in mb.path] == [1, 2, 3, 4, 5]


def test_full_chains_use_a_correct_bottleneck_matching():
    """On the reference allocation the reference's chains (columns) have a 3.28 s hop where a
    matching needs no more than 0.78 s; ours reach the bottleneck of every stage pair."""
    p = _problem()
    stages = p.cluster.stages
    t = np.maximum(p.transfer_s, p.transfer_s.T)
    chains = full_chains(p, stages)
    for s in range(1, len(stages) - 1):
        hops = [t[c[s], c[s + 1]] for c in chains]
        _, _, b = bottleneck_matching(t[np.ix_(stages[s], stages[s + 1])])
        assert max(hops) == pytest.approx(b)
    # stages 2 -> 3: the reference's columns hop 3.28 s, a bottleneck matching 0.78 s
    ref_hop = max(t[stages[2][j], stages[3][j]] for j in range(3))
    our_hop = max(t[c[2], c[3]] for c in chains)
    assert ref_hop == pytest.approx(3.2814, abs=1e-3) and our_hop == pytest.approx(0.7769, abs=1e-3)


def test_full_plan_is_fairer_than_the_reference_baseline():
    plan = make_plan("full", _problem())
    assert plan.predicted_makespan_s < 165.39  # the reference's full pipeline on this instance
    assert plan.lower_bound_s <= plan.predicted_makespan_s


def test_random_plan_obeys_rules_and_caps():
    p = _problem()
    plan = random_plan(p, seed=3)
    assert plan_violations(plan) == []
    assert plan.constraints.max_load == p.load_caps(plan.stages)
    assert random_plan(p, seed=3).to_dict() == plan.to_dict()
    assert random_plan(p, seed=4).to_dict() != plan.to_dict()
    stage_of = plan.stage_of()
    orders = [[stage_of[x] for x in mb.path] for mb in plan.microbatches]
    assert any(o != sorted(o) for o in orders)  # swaps do occur (max_swaps = 1)
    assert all(len(mb.path) == 3 for mb in plan.microbatches)


def test_random_plan_with_tight_jumps():
    p = _problem("gcp20-current-free", max_jump=2, max_swaps=2)  # at most one stage skipped at once
    plan = random_plan(p, seed=0)
    assert plan_violations(plan) == []


def test_impossible_caps_are_a_user_error():
    # L = S: every path visits every stage, but a one-node stage of a slow node has a small cap
    n = 6
    forward = [1.0, 1.0, 1.0, 1.0, 1.0, 5.0]
    c = cluster_from_dict({"transfer_s": np.ones((n, n)).tolist(), "forward_s": forward,
                           "stages": [[0, 1], [2, 3], [4, 5]]})
    p = build_problem(c, Workload(num_stages=3, path_length=3, n_layers=3, microbatches_per_data_node=4))
    with pytest.raises(UserError, match="TC1"):
        random_plan(p)


@st.composite
def problems(draw):
    s = draw(st.integers(2, 6))
    path_length = draw(st.integers(2, s))
    n = draw(st.integers(s, s + 10))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    t = rng.uniform(0.3, 4.0, size=(n, n))
    if draw(st.booleans()):
        t = (t + t.T) / 2
    forward = rng.choice([0.5, 1.0, 1.0, 2.0], size=n) if draw(st.booleans()) else np.ones(n)
    memory = draw(st.integers(1, 4))
    wl = Workload(
        num_stages=s, path_length=path_length, n_layers=s * draw(st.integers(1, 3)),
        microbatches_per_data_node=draw(st.integers(1, 6)), memory=memory,
        max_swaps=draw(st.integers(0, 2)), max_jump=draw(st.integers(s - path_length + 1, max(4, s - path_length + 1))),
    )
    c = cluster_from_dict({"transfer_s": t.tolist(), "forward_s": forward.tolist()})
    return build_problem(c, wl), seed


def _stage_capacity_suffices(problem, stages) -> bool:
    caps = problem.load_caps(stages)
    w = problem.workload
    paths = len(stages[0]) * w.microbatches_per_data_node
    per_stage = [sum(caps[x] for x in s) for s in stages[1:]]
    return sum(min(c, paths) for c in per_stage) >= paths * (w.path_length - 1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_every_generated_plan_is_valid(case):
    problem, seed = case
    stages = allocate(problem, seed=seed)
    assert sorted(x for s in stages for x in s) == list(range(problem.n))
    assert [len(s) for s in stages] == problem.stage_sizes
    full = full_plan(problem, stages=stages, seed=seed)
    assert plan_violations(full) == []
    assert len(full.microbatches) == len(stages[0]) * problem.workload.microbatches_per_data_node
    assert simulate(full, record=False).finished  # a full pipeline never deadlocks
    if _stage_capacity_suffices(problem, stages):
        plan = random_plan(problem, stages=stages, seed=seed)
        assert plan_violations(plan) == []
        assert plan.constraints.max_load == problem.load_caps(stages)  # checked by the validator
    else:
        with pytest.raises(UserError):
            random_plan(problem, stages=stages, seed=seed)


def test_make_plan_records_the_simulation():
    p = _problem()
    plan = make_plan("random", p, seed=1)
    res = simulate(plan, record=False)
    assert plan.predicted_makespan_s == pytest.approx(res.makespan_s)
    assert plan.lower_bound_s == pytest.approx(res.lower_bound_s)
    assert plan.meta["planning_s"] >= 0


def test_make_plan_refuses_a_plan_that_deadlocks(monkeypatch):
    def deadlocking(problem, seed, time_limit_s):
        t = np.ones((4, 4)) - np.eye(4)
        return Plan(
            stages=[[0, 1], [2], [3]], layers=[[0], [1], [2]], memory=[3, 3, 1, 1],
            constraints=Constraints(path_length=3, max_swaps=1, max_jump=4),
            costs=Costs(transfer_s=t, forward_s=np.ones(4)),
            microbatches=[Microbatch(0, 0, [2, 3]), Microbatch(1, 1, [3, 2])],
        )

    monkeypatch.setitem(methods.METHODS, "deadlock", deadlocking)
    with pytest.raises(UserError, match="memory too small"):
        make_plan("deadlock", _problem())


def test_unknown_method():
    with pytest.raises(UserError, match="unknown method"):
        make_plan("magic", _problem())
