"""A brand-new node joining, without processes: the grown plan, the stage choice, the watch."""

from __future__ import annotations

import numpy as np
import pytest

from runtime_fixtures import seven_node_plan
from skippipe.errors import UserError
from skippipe.planner.grow import add_node, choose_stage
from skippipe.planner.shrink import original_nodes, shrink_plan
from skippipe.runtime.adapt import RejoinWatch
from skippipe.runtime.config import JoinEvent
from skippipe.sim import simulate


def _visits(plan, mb):
    stage_of = plan.stage_of()
    return [stage_of[n] for n in mb.path]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_add_node_copies_its_model_node_and_takes_a_share_of_its_stage(stage):
    plan = seven_node_plan()
    grown = add_node(plan, like=4, stage=stage, new_id=7)  # check_plan runs inside
    assert grown.n_nodes == 8 and grown.stages[stage][-1] == 7 and original_nodes(grown) == list(range(8))
    t, g = np.asarray(plan.costs.transfer_s), np.asarray(grown.costs.transfer_s)
    assert np.array_equal(g[:7, :7], t) and np.array_equal(g[7, :7], t[4, :7]) and np.array_equal(g[:7, 7], t[:7, 4])
    assert grown.costs.forward_s[7] == plan.costs.forward_s[4] and grown.memory[7] == plan.memory[4]
    assert [_visits(grown, mb) for mb in grown.microbatches] == [_visits(plan, mb) for mb in plan.microbatches]
    load = grown.load_per_node()
    assert load[7] >= 1 and max(load[n] for n in grown.stages[stage]) - min(load[n] for n in grown.stages[stage]) <= 1


def test_a_new_node_never_joins_the_data_stage_or_a_frozen_one():
    plan = seven_node_plan()
    with pytest.raises(UserError):
        add_node(plan, like=0, stage=0, new_id=7)
    shrunk, _ = shrink_plan(plan, {4})  # stage 2 frozen
    with pytest.raises(UserError):
        add_node(shrunk, like=3, stage=2, new_id=7)
    grown, stage, figures = choose_stage(shrunk, 3, 7, None, lambda p: p)
    assert sorted(figures) == [1, 3] and stage in (1, 3)


def test_choose_stage_picks_the_shortest_simulated_makespan():
    plan = seven_node_plan()
    grown, stage, figures = choose_stage(plan, 4, 7, None, lambda p: p)
    for s, span in figures.items():
        assert span == pytest.approx(simulate(add_node(plan, 4, s, 7), bound=False).makespan_s)
    assert figures[stage] == min(figures.values()) and grown.stage_of()[7] == stage
    _, named, only = choose_stage(plan, 4, 7, 3, lambda p: p)
    assert named == 3 and list(only) == [3]


def test_a_join_is_due_at_its_boundary_once_its_model_node_runs():
    plan = seven_node_plan()
    shrunk, _ = shrink_plan(plan, {4})
    watch = RejoinWatch([], [JoinEvent(iteration=3, like=4), JoinEvent(iteration=5, like=2)])
    assert watch.waiting()
    assert watch.request(1, plan) is None  # not yet
    assert watch.request(4, shrunk).payload == JoinEvent(iteration=5, like=2)  # node 4 is gone: its join waits
    req = watch.request(4, plan)
    assert req is not None and req.payload == JoinEvent(iteration=3, like=4)
    assert not watch.waiting()
