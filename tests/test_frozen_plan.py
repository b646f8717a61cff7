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


def _checkpoint(run_dir, step, plan, tag: bytes):
    from skippipe.runtime import checkpoint as ckpt

    tmp = ckpt.begin(run_dir, step)
    for s in range(plan.num_stages):
        for name in ckpt.stage_files(s):
            (tmp / name).write_bytes(tag + name.encode())
    ckpt.commit(run_dir, step, plan, [1.0] * step, keep=5)


def test_freeze_takes_the_newest_valid_checkpoint_and_ignores_a_stale_store(tmp_path):
    from skippipe.errors import StageLost
    from skippipe.runtime import checkpoint as ckpt
    from skippipe.runtime import frozen as F

    plan = seven_node_plan()
    with pytest.raises(StageLost, match="no checkpoint holds its weights"):
        F.freeze(tmp_path, [2], [], {2: [4]})
    _checkpoint(tmp_path, 2, plan, b"two:")
    _checkpoint(tmp_path, 4, plan, b"four:")
    (ckpt.step_dir(tmp_path, 4) / "stage-0.safetensors").write_bytes(b"corrupt")  # step 4 no longer verifies
    store = F.store(tmp_path)
    store.mkdir(parents=True)
    (store / F.INDEX).write_text('{"2": 99}')  # left by an earlier run in this folder
    assert F.freeze(tmp_path, [2], [], {2: [4]}) == {2: 2}
    assert (store / "stage-2.safetensors").read_bytes() == b"two:stage-2.safetensors"
    shrunk, _ = shrink_plan(plan, {4})
    out = tmp_path / "out"
    out.mkdir()
    F.copy_into(tmp_path, shrunk, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(ckpt.stage_files(2))
    F.thaw(tmp_path, plan)  # a node rejoined: nothing frozen any more
    assert F.frozen_steps(tmp_path) == {}
