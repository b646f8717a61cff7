"""Frozen stages in the plan file: typed, validated, and the one rule they relax (CC3 distances
counted over the stages that are not frozen)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime_fixtures import seven_node_plan
from skippipe.errors import PlanError
from skippipe.planfile import Plan, check_plan, plan_violations
from skippipe.planfile.validate import live_index, path_rule_violation
from skippipe.planner.frozen import reroute
from skippipe.planner.shrink import shrink_plan


def test_an_empty_stage_must_be_declared_frozen():
    new, _ = shrink_plan(seven_node_plan(), {4})
    undeclared = replace(new, frozen_stages=[])
    assert "stage 2 has no nodes" in plan_violations(undeclared)
    with pytest.raises(PlanError):
        check_plan(undeclared)


def test_a_frozen_stage_may_not_hold_nodes_nor_be_the_data_stage():
    plan = seven_node_plan()
    assert any("frozen stage 1 still names nodes [2, 3]" in p for p in plan_violations(replace(plan, frozen_stages=[1])))
    assert any("frozen stage 0 is not a stage" in p for p in plan_violations(replace(plan, frozen_stages=[0])))
    assert any("frozen stage 7 is not a stage" in p for p in plan_violations(replace(plan, frozen_stages=[7])))


def test_a_jump_across_a_frozen_stage_counts_only_live_stages():
    new, _ = shrink_plan(seven_node_plan(), {4})  # stages [[0, 1], [2, 3], [], [4, 5]]
    ascending = [replace(mb, path=[2 + mb.id % 2, 4 + mb.id % 2]) for mb in new.microbatches]  # stages 1, 3
    strict = replace(new, microbatches=ascending, constraints=replace(new.constraints, max_jump=1, max_swaps=0))
    check_plan(strict)  # 0 -> 1 -> 3 moves one live stage at a time
    unfrozen = replace(strict, frozen_stages=[], stages=[[0, 1], [2, 3], [6], [4, 5]], memory=[2] * 7,
                       costs=seven_node_plan().costs, constraints=replace(strict.constraints, max_load=None))
    assert any("jumps from stage 1 to 3" in p for p in plan_violations(unfrozen))  # with stage 2 alive it is a jump of 2
    assert path_rule_violation([1, 3], max_swaps=0, max_jump=1) is not None  # the plain rule refuses it
    live = live_index(4, [2])
    assert path_rule_violation([live[1], live[3]], max_swaps=0, max_jump=1) is None


def test_frozen_stages_survive_a_round_trip_and_plans_without_them_are_unchanged():
    plan = seven_node_plan()
    assert "frozen_stages" not in plan.to_dict()
    new, _ = shrink_plan(plan, {4})
    again = Plan.from_dict(new.to_dict())
    assert again.frozen_stages == [2] and again.to_dict() == new.to_dict()
    with pytest.raises(PlanError, match="frozen_stages must be a list"):
        Plan.from_dict({**new.to_dict(), "frozen_stages": 2})


@settings(max_examples=200, deadline=None)
@given(S=st.integers(3, 7), data=st.data())
def test_reroute_never_visits_a_frozen_stage_and_obeys_the_live_rule(S, data):
    frozen = set(data.draw(st.lists(st.integers(1, S - 1), min_size=1, max_size=S - 2, unique=True)))
    L = data.draw(st.integers(2, S))
    visits = data.draw(st.permutations(list(range(1, S))))[: L - 1]
    max_swaps, max_jump = data.draw(st.integers(0, 2)), data.draw(st.integers(1, 4))
    cost = {s: data.draw(st.integers(0, 5)) for s in range(S) if s not in frozen}
    seq = reroute(list(visits), frozen, S, L, max_swaps, max_jump, cost)
    if seq is None:
        return
    live = live_index(S, sorted(frozen))
    assert not set(seq) & frozen and 0 not in seq and len(set(seq)) == len(seq)
    assert len(seq) == min(L, S - len(frozen)) - 1
    assert path_rule_violation([live[s] for s in seq], max_swaps, max_jump) is None
    kept = [s for s in visits if s not in frozen][: len(seq)]
    assert [s for s in seq if s in kept] == kept  # the live visits keep their order
