"""Re-plan on drift, the parts without processes: link events, folding, the planner's re-plan,
the drift monitor's rebase, the config's checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime_fixtures import seven_node_plan
from skippipe.config_fields import ConfigError
from skippipe.planner.replan import replan, with_transfer
from skippipe.planner.shrink import shrink_plan
from skippipe.runtime.adapt import Replan, announce, fold_due, format_replans
from skippipe.runtime.config import LinkEvent, run_config_from_dict
from skippipe.runtime.drift import DriftMonitor
from skippipe.runtime.emulation import Emulation, changed_transfer, link_changes
from skippipe.sim import simulate


def test_events_are_in_the_plans_node_ids_and_dropped_when_folded_or_gone():
    plan = seven_node_plan()
    events = [LinkEvent(3, (2, 3), 0.5), LinkEvent(5, (1, 6), 0.25)]
    assert [(c.a, c.b) for c in link_changes(plan, events)] == [(2, 3), (1, 6)]
    shrunk, kept = shrink_plan(plan, {3})  # original node 3 gone: its event goes, node 6 is now 5
    assert [(c.index, c.a, c.b) for c in link_changes(shrunk, events)] == [(1, 1, 5)]
    plan.meta["emulation"] = {"folded": [0]}
    assert [c.index for c in link_changes(plan, events)] == [1]


def test_a_change_applies_both_ways_from_its_iteration_on():
    plan = seven_node_plan()
    t = np.asarray(plan.costs.transfer_s)
    changes = link_changes(plan, [LinkEvent(3, (2, 3), 0.5)])
    assert np.array_equal(changed_transfer(t, changes, 2), t)
    after = changed_transfer(t, changes, 3)
    assert after[2, 3] == pytest.approx(2 * t[2, 3]) and after[3, 2] == pytest.approx(2 * t[3, 2])
    mask = np.ones_like(t, dtype=bool)
    mask[2, 3] = mask[3, 2] = False
    assert np.array_equal(after[mask], t[mask])


def test_emulation_switches_costs_at_the_events_iteration():
    plan = seven_node_plan()
    emu = Emulation.from_plan(plan, True, 0.1, events=[LinkEvent(4, (0, 5), 0.25)])
    before = emu.at_iteration(3)
    assert before.link_delay_s(0, 5) == pytest.approx(0.1 * plan.costs.transfer_s[0, 5])
    later = emu.at_iteration(4)
    assert later.link_delay_s(5, 0) == pytest.approx(0.4 * plan.costs.transfer_s[5, 0])
    assert later.at_iteration(9) is later  # nothing new due: the same object
    off = Emulation.from_plan(plan, False, 0.1, events=[LinkEvent(1, (0, 5), 0.25)])
    assert off.at_iteration(5).link_delay_s(0, 5) == 0.0


def test_fold_due_takes_only_events_due_by_the_iteration():
    plan = seven_node_plan()
    events = [LinkEvent(3, (2, 3), 0.5), LinkEvent(9, (1, 6), 0.5)]
    transfer, folded = fold_due(plan, events, 4)
    assert folded == [0]
    assert transfer[2, 3] == pytest.approx(2 * plan.costs.transfer_s[2, 3])
    assert transfer[1, 6] == pytest.approx(plan.costs.transfer_s[1, 6])


@settings(max_examples=12, deadline=None)
@given(a=st.integers(0, 6), b=st.integers(0, 6), factor=st.sampled_from([0.1, 0.25, 0.5, 2.0]))
def test_replan_is_never_slower_than_the_old_paths_on_the_new_costs_and_keeps_the_layers(a, b, factor):
    plan = seven_node_plan()
    if a == b:
        return
    t = np.array(plan.costs.transfer_s)
    t[a, b] /= factor
    t[b, a] /= factor
    new = replan(plan, t)
    assert new.layers == plan.layers
    assert np.array_equal(new.costs.transfer_s, t)
    old_sim, new_sim = simulate(with_transfer(plan, t), bound=False), simulate(new, bound=False)
    assert new_sim.finished
    assert new_sim.makespan_s <= old_sim.makespan_s + 1e-9


def test_replan_keeps_the_elastic_node_ids():
    shrunk, kept = shrink_plan(seven_node_plan(), {3})
    new = replan(shrunk, np.asarray(shrunk.costs.transfer_s) * 2)
    assert new.meta["elastic"] == shrunk.meta["elastic"]


def test_rebase_judges_against_the_new_prediction_after_the_restart():
    events = []
    m = DriftMonitor(10.0, threshold=0.25, window=2, on_drift=events.append)
    for it in (1, 2, 3):
        m.observe(it, 20.0)
    assert len(events) == 1
    m.rebase(20.0, after_iteration=3)
    assert m.observe(4, 40.0) is None  # the redone iteration pays for the restart: not judged
    assert m.observe(5, 21.0) is None and m.observe(6, 21.0) is None  # close to the new prediction
    assert m.observe(7, 30.0) is None and m.observe(8, 30.0) is not None
    with pytest.raises(ValueError):
        m.rebase(float("nan"), 3)


@pytest.mark.parametrize("event, word", [
    ({"iteration": 0, "link": [0, 1]}, "iteration"),
    ({"link": [0, 0]}, "two different nodes"),
    ({"link": [0, 1, 2]}, "link"),
    ({"link": [0, 1], "bandwidth_factor": 0}, "bandwidth_factor"),
])
def test_bad_link_events_are_one_line_config_errors(event, word):
    with pytest.raises(ConfigError) as info:
        run_config_from_dict({"runtime": {"emulate_events": [event]}})
    assert word in str(info.value) and "\n" not in str(info.value)


def test_rejoin_is_due_at_its_boundary_only_for_a_node_that_is_gone():
    from skippipe.runtime.adapt import RejoinWatch
    from skippipe.runtime.config import RejoinEvent

    plan = seven_node_plan()
    shrunk, _ = shrink_plan(plan, {3})
    watch = RejoinWatch([RejoinEvent(6, 3), RejoinEvent(2, 5)])
    assert watch.due(4, shrunk) is None  # node 3's boundary is after iteration 5; node 5 never left
    assert watch.due(5, shrunk) == 3
    assert watch.due(6, shrunk) is None and watch.left == [(2, 5)]


def test_grow_plan_puts_the_node_back_in_its_first_stage_with_every_node_id():
    from skippipe.runtime.adapt import grow_plan

    first = seven_node_plan()
    shrunk, _ = shrink_plan(first, {3})
    grown = grow_plan(first, shrunk, 3, [LinkEvent(1, (2, 3), 0.5)], 4, "skippipe", 0)
    assert grown.meta["elastic"]["original_nodes"] == list(range(7))
    assert grown.stages == first.stages and grown.layers == first.layers
    assert grown.meta["emulation"]["folded"] == [0]
    assert grown.costs.transfer_s[2, 3] == pytest.approx(2 * first.costs.transfer_s[2, 3])
    assert simulate(grown, bound=False).finished


def test_a_replan_names_the_nodes_lost_in_its_drain_in_its_line_and_summary():
    r = Replan(reason="drift", round=0, iteration=5, recovery_step=4, requested_at=0.0, drained_at=1.0, replanned_at=2.0,
               drain_s=1.0, replan_s=1.0, folded_events=[], makespan_sim_old_s=10.0, makespan_sim_new_s=9.0, new_paths=True,
               stages_before=[[0], [1, 2]], stages_after=[[0], [1]])
    assert "lost" not in announce(r) and len(format_replans([r])) == 1
    r.lost = [2]
    assert "left out: [2]" in announce(r)
    lines = format_replans([r])
    assert len(lines) == 2 and lines[1].startswith("also lost") and "[2]" in lines[1]
