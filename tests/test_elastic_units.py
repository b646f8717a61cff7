"""Elastic recovery without processes: the plan for the survivors, the recovery step, the
pre-step snapshot and the handoff files."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from runtime_fixtures import seven_node_plan
from skippipe.errors import PlanError, StageLost
from skippipe.planner.shrink import original_nodes, shrink_plan
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime.elastic import Handoff, read_handoffs, recovery_step, sources
from skippipe.runtime.handoff import StepSnapshot, guarded_step, hand_off
from toy_plans import skip_plan


def _stage_visits(plan, mb):
    stage_of = plan.stage_of()
    return [stage_of[n] for n in mb.path]


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 3), min_size=3, max_size=4), m=st.integers(1, 3), seed=st.integers(0, 50),
       data=st.data())
def test_shrunk_plan_keeps_microbatches_stage_sequences_and_balance(sizes, m, seed, data):
    try:
        plan = skip_plan(sizes, path_length=min(3, len(sizes)), m=m, n_layers=len(sizes) * 2, seed=seed)
    except PlanError:  # the toy generator cannot balance every shape
        assume(False)
        return
    removable = [n for nodes in plan.stages if len(nodes) > 1 for n in nodes]
    if not removable:
        return
    lost = set(data.draw(st.lists(st.sampled_from(removable), min_size=1, max_size=2, unique=True)))
    if any(all(n in lost for n in nodes) for nodes in plan.stages):
        with pytest.raises(StageLost):
            shrink_plan(plan, lost)
        return
    new, kept = shrink_plan(plan, lost)  # check_plan runs inside
    assert kept == [n for n in range(plan.n_nodes) if n not in lost]
    assert new.n_nodes == plan.n_nodes - len(lost)
    assert original_nodes(new) == kept
    assert new.layers == plan.layers
    old_by_id = {mb.id: mb for mb in plan.microbatches}
    assert sorted(old_by_id) == sorted(mb.id for mb in new.microbatches)  # the same total and ids: the same data
    for mb in new.microbatches:
        old = old_by_id[mb.id]
        assert _stage_visits(new, mb) == _stage_visits(plan, old)  # visits move within their stage
        if old.data_node not in lost:
            assert kept[mb.data_node] == old.data_node
        for n_new, n_old in zip(mb.path, old.path):
            if n_old not in lost:
                assert kept[n_new] == n_old  # only the lost node's visits move
    # the survivors' costs are the old ones
    for i, a in enumerate(kept):
        assert new.costs.forward_s[i] == plan.costs.forward_s[a]
        for j, b in enumerate(kept):
            assert new.costs.transfer_s[i][j] == plan.costs.transfer_s[a][b]


def test_shrinking_twice_keeps_the_original_ids_and_the_lost_list():
    plan = seven_node_plan()
    once, _ = shrink_plan(plan, {3})
    twice, kept = shrink_plan(once, {once.n_nodes - 1})  # old node 6
    assert original_nodes(twice) == [0, 1, 2, 4, 5]
    assert twice.meta["elastic"]["lost"] == [3, 6]
    assert twice.stages == [[0, 1], [2], [3], [4]]


def test_a_lost_data_node_gives_its_microbatches_to_the_other_data_node():
    plan = seven_node_plan()
    new, kept = shrink_plan(plan, {1})
    assert new.stages[0] == [0]
    assert len(new.microbatches) == len(plan.microbatches)
    assert all(mb.data_node == 0 for mb in new.microbatches)


def test_the_last_node_of_a_stage_cannot_be_dropped():
    with pytest.raises(StageLost, match=r"stage 2 has no node left \(its nodes \[4\] failed\)"):
        shrink_plan(seven_node_plan(), {4})


def _handoff(tmp_path, node, stage, steps):
    return Handoff(node, stage, steps, [1.0] * max(steps), tmp_path / f"node-{node:03d}")


def test_recovery_step_is_the_smallest_newest_step_and_every_stage_needs_a_holder(tmp_path):
    plan = seven_node_plan()  # stages [[0, 1], [2, 3], [4], [5, 6]]
    hs = {0: _handoff(tmp_path, 0, 0, [5, 4]), 1: _handoff(tmp_path, 1, 0, [4, 3]), 2: _handoff(tmp_path, 2, 1, [5, 4]),
          4: _handoff(tmp_path, 4, 2, [5, 4]), 6: _handoff(tmp_path, 6, 3, [4, 3])}
    step = recovery_step(hs)
    assert step == 4
    src = sources(plan, hs, step)
    assert {s: h.node for s, h in src.items()} == {0: 0, 1: 2, 2: 4, 3: 6}
    del hs[4]
    with pytest.raises(StageLost):
        sources(plan, hs, step)


def _tiny():
    torch.manual_seed(0)
    module = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(module.parameters(), lr=0.1)
    return module, opt


def _train_step(module, opt, snapshot, step):
    module(torch.ones(2, 4)).sum().backward()
    guarded_step(module, opt, snapshot, step)
    opt.zero_grad()


def test_snapshot_holds_the_state_before_the_last_step(tmp_path):
    module, opt = _tiny()
    snap = StepSnapshot()
    _train_step(module, opt, snap, 0)
    after_one = [p.detach().clone() for p in module.parameters()]
    _train_step(module, opt, snap, 1)
    assert snap.step == 1 and not snap.stepping
    written = hand_off(tmp_path, 3, 1, module, opt, 2, snap, [9.0, 8.0])
    assert written == [2, 1]
    doc = json.loads((tmp_path / "node-003" / "handoff.json").read_text())
    assert doc == {"node": 3, "stage": 1, "steps": [2, 1], "losses": [9.0, 8.0]}
    fresh, fresh_opt = _tiny()
    ckpt.load_stage(tmp_path / "node-003" / "step-000001", 1, fresh, fresh_opt)
    for p, q in zip(fresh.parameters(), after_one):
        assert torch.equal(p, q)
    assert read_handoffs(tmp_path)[3].steps == [2, 1]


def test_a_step_cut_short_hands_over_only_the_snapshot(tmp_path):
    module, opt = _tiny()
    snap = StepSnapshot()
    _train_step(module, opt, snap, 0)
    snap.take(module, opt, 1)
    snap.stepping = True  # as if the worker was stopped inside optimizer.step
    assert hand_off(tmp_path, 0, 0, module, opt, 1, snap, [1.0, 2.0]) == [1]
    assert not (tmp_path / "node-000" / "step-000002").exists()
