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
from skippipe.planfile import Plan, check_plan
from skippipe.planner.shrink import original_nodes, shrink_plan
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime.elastic import Failure, Handoff, ended_in_drain, format_failures, read_handoffs, recovery_step, sources
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
    removable = [n for s, nodes in enumerate(plan.stages) for n in nodes if s > 0 or len(nodes) > 1]
    lost = set(data.draw(st.lists(st.sampled_from(removable), min_size=1, max_size=2, unique=True)))
    if all(n in lost for n in plan.stages[0]):
        with pytest.raises(StageLost, match="stage 0 has no node left"):
            shrink_plan(plan, lost)
        return
    frozen = [s for s, nodes in enumerate(plan.stages) if all(n in lost for n in nodes)]
    try:
        new, kept = shrink_plan(plan, lost)  # check_plan runs inside
    except StageLost as exc:  # no path fits around the frozen stages: only with a stage frozen
        assert frozen and "avoids the frozen stages" in str(exc)
        return
    assert new.frozen_stages == frozen
    assert new.constraints.path_length == min(plan.constraints.path_length, plan.num_stages - len(frozen))
    assert kept == [n for n in range(plan.n_nodes) if n not in lost]
    assert new.n_nodes == plan.n_nodes - len(lost)
    assert original_nodes(new) == kept
    assert new.layers == plan.layers
    old_by_id = {mb.id: mb for mb in plan.microbatches}
    assert sorted(old_by_id) == sorted(mb.id for mb in new.microbatches)  # the same total and ids: the same data
    for mb in new.microbatches:
        old = old_by_id[mb.id]
        assert not set(_stage_visits(new, mb)) & set(frozen)  # no path visits a frozen stage
        if old.data_node not in lost:
            assert kept[mb.data_node] == old.data_node
        if set(_stage_visits(plan, old)) & set(frozen) or new.constraints.path_length != plan.constraints.path_length:
            continue  # rerouted around a frozen stage
        assert _stage_visits(new, mb) == _stage_visits(plan, old)  # visits move within their stage
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


def test_the_last_node_of_a_stage_leaves_it_frozen_and_skipped_by_every_path():
    plan = seven_node_plan()  # stages [[0, 1], [2, 3], [4], [5, 6]], L = 3
    new, kept = shrink_plan(plan, {4})
    assert new.stages == [[0, 1], [2, 3], [], [4, 5]] and new.frozen_stages == [2]
    assert [_stage_visits(new, mb) for mb in new.microbatches] == [[1, 3], [3, 1], [1, 3], [3, 1], [1, 3], [1, 3]]
    assert new.meta["elastic"]["lost"] == [4]
    # microbatch 2 and 4 did not visit stage 2: their nodes stay
    assert [kept[n] for n in new.microbatches[2].path] == [3, 5] and [kept[n] for n in new.microbatches[4].path] == [2, 6]
    reloaded = Plan.from_dict(new.to_dict())
    assert reloaded.frozen_stages == [2]
    check_plan(reloaded)


def test_losing_every_data_node_stops():
    with pytest.raises(StageLost, match=r"stage 0 has no node left \(its nodes \[0, 1\] failed\)"):
        shrink_plan(seven_node_plan(), {0, 1})


def test_a_plan_with_fewer_live_stages_than_the_path_length_gets_shorter_paths():
    plan = skip_plan([2, 1, 1], path_length=3, m=2, n_layers=6, seed=0)  # every path visits stages 1 and 2
    new, _ = shrink_plan(plan, {3})  # stage 2's only node
    assert new.frozen_stages == [2] and new.constraints.path_length == 2
    assert all(_stage_visits(new, mb) == [1] for mb in new.microbatches)


def _handoff(tmp_path, node, stage, steps):
    return Handoff(node, stage, steps, [1.0] * max(steps), tmp_path / f"node-{node:03d}")


def test_recovery_step_is_the_smallest_newest_step_and_every_stage_needs_a_holder(tmp_path):
    plan = seven_node_plan()  # stages [[0, 1], [2, 3], [4], [5, 6]]
    hs = {0: _handoff(tmp_path, 0, 0, [5, 4]), 1: _handoff(tmp_path, 1, 0, [4, 3]), 2: _handoff(tmp_path, 2, 1, [5, 4]),
          4: _handoff(tmp_path, 4, 2, [5, 4]), 6: _handoff(tmp_path, 6, 3, [4, 3])}
    step = recovery_step(hs)
    assert step == 4
    src = sources(plan, hs, step, set())
    assert {s: h.node for s, h in src.items()} == {0: 0, 1: 2, 2: 4, 3: 6}
    del hs[4]
    with pytest.raises(StageLost):
        sources(plan, hs, step, set())
    assert {s: h.node for s, h in sources(plan, hs, step, {2}).items()} == {0: 0, 1: 2, 3: 6}  # a frozen stage needs none


def test_nodes_without_a_handoff_besides_the_failed_one_are_named_by_their_original_ids(tmp_path):
    once, _ = shrink_plan(seven_node_plan(), {3})  # round ids 0-5 are original nodes 0, 1, 2, 4, 5, 6
    hs = {n: _handoff(tmp_path, n, 0, [4]) for n in (0, 2, 5)}  # round nodes 1, 3, 4 handed nothing over
    assert ended_in_drain(once, hs, failed=3) == [1, 5]  # round node 3 (original 4) is the failure itself
    assert ended_in_drain(once, hs) == [1, 4, 5]
    assert ended_in_drain(once, {n: _handoff(tmp_path, n, 0, [4]) for n in range(6) if n != 3}, failed=3) == []


def test_the_failure_summary_names_the_nodes_also_lost_in_its_drain():
    fail = Failure(node=4, node_in_round=3, kind="crash", message="x", round=0, iteration=5, recovery_step=4, nodes_left=4,
                   seen_at=0.0, decided_at=1.0, drained_at=2.0, replanned_at=3.0, detect_s=1.0, drain_s=1.0, replan_s=1.0)
    assert len(format_failures([fail])) == 1
    fail.also_lost = [1, 5]
    lines = format_failures([fail])
    assert len(lines) == 2 and lines[1].startswith("also lost") and "[1, 5]" in lines[1]


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


def test_the_recovery_signal_waits_out_the_local_optimizer_step():
    """A drain that arrives after the last collective of an iteration is raised only once the
    step is applied, so the worker hands over the step its peers reach too (a planned join
    after iteration 3 goes on from step 3, not 2)."""
    import os
    import signal

    from skippipe.errors import PeerLost
    from skippipe.runtime import entry
    from skippipe.runtime.faults import RECOVERY_SIGNAL
    from skippipe.runtime.handoff import LATCH

    old = signal.getsignal(RECOVERY_SIGNAL)
    try:
        entry._install_recovery_handler()
        stage = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(stage.parameters(), lr=0.1)
        stage(torch.ones(1, 2)).sum().backward()
        before = stage.weight.detach().clone()
        applied = []
        with pytest.raises(PeerLost):
            with LATCH.local_step():
                os.kill(os.getpid(), RECOVERY_SIGNAL)  # delivered here, held until the section ends
                snap = StepSnapshot()
                guarded_step(stage, opt, snap, 3)
                applied.append(not torch.equal(stage.weight, before))
        assert applied == [True] and not snap.stepping and LATCH.pending is None
        with pytest.raises(PeerLost):  # outside the section it is raised at once (once per worker)
            LATCH.hold_or_raise(PeerLost(None, "x"))
    finally:
        signal.signal(RECOVERY_SIGNAL, old)


def test_an_error_inside_the_local_step_goes_on_and_drops_the_held_signal():
    from skippipe.errors import PeerLost
    from skippipe.runtime.handoff import RecoveryLatch

    latch = RecoveryLatch()
    with pytest.raises(ValueError):
        with latch.local_step():
            latch.hold_or_raise(PeerLost(None, "held"))
            raise ValueError("diverged")
    assert latch.pending is None and not latch.holding


def test_a_recovery_signal_during_the_handoff_does_not_cut_it_short(tmp_path, monkeypatch):
    """A worker that lost a peer on its own hands over at once; the launcher's signal lands while
    it writes (seen in CI: the surviving data node left an empty step folder, no handoff.json,
    and the run stopped with its stage counted as lost). Once ``handing_over`` is set the signal
    is dropped; without it the same signal cuts the handoff short."""
    import os
    import signal

    from skippipe.errors import PeerLost
    from skippipe.runtime import entry
    from skippipe.runtime.faults import RECOVERY_SIGNAL
    from skippipe.runtime.handoff import LATCH

    real_save = ckpt.save_stage

    def save_then_signal(*args, **kwargs):
        os.kill(os.getpid(), RECOVERY_SIGNAL)  # handled at the next Python call below
        real_save(*args, **kwargs)

    monkeypatch.setattr(ckpt, "save_stage", save_then_signal)
    old = signal.getsignal(RECOVERY_SIGNAL)
    try:
        for handing_over, folder in ((False, tmp_path / "plain"), (True, tmp_path / "latched")):
            entry._install_recovery_handler()  # a fresh handler: it fires once
            module, opt = _tiny()
            snap = StepSnapshot()
            _train_step(module, opt, snap, 0)
            LATCH.handing_over = handing_over
            if handing_over:
                assert hand_off(folder, 0, 0, module, opt, 1, snap, [1.0]) == [1, 0]
                assert read_handoffs(folder)[0].steps == [1, 0]
            else:
                with pytest.raises(PeerLost):
                    hand_off(folder, 0, 0, module, opt, 1, snap, [1.0])
                assert read_handoffs(folder) == {}
    finally:
        LATCH.handing_over = False
        signal.signal(RECOVERY_SIGNAL, old)
