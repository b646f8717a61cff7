"""The emulated network kept apart from a plan whose costs were measured: lookups by original node
id, survives shrinking, folded events are not applied again, a rejoin keeps it right."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from runtime_fixtures import seven_node_plan
from skippipe.planner.shrink import shrink_plan
from skippipe.runtime.adapt import fold_due
from skippipe.runtime.config import LinkEvent
from skippipe.runtime.emulation import Emulation, network_costs, with_network


def _measured(plan, factor: float = 1.3):
    """The plan with other (estimated) costs and its true network in meta."""
    truth = plan.costs
    est = replace(plan.costs, transfer_s=np.asarray(truth.transfer_s) * factor, forward_s=np.asarray(truth.forward_s) * factor)
    out = replace(plan, costs=est, meta={**plan.meta})
    out.meta["emulation"] = with_network({"folded": []}, list(range(plan.n_nodes)), truth)
    return out, truth


def test_without_a_network_the_emulator_reproduces_the_plans_costs():
    plan = seven_node_plan()
    assert network_costs(plan) is plan.costs


def test_the_emulator_reproduces_the_network_not_the_estimates():
    plan, truth = _measured(seven_node_plan())
    np.testing.assert_allclose(network_costs(plan).transfer_s, truth.transfer_s)
    np.testing.assert_allclose(network_costs(plan).forward_s, truth.forward_s)
    emu = Emulation.from_plan(plan, True, 0.1)
    assert emu.link_delay_s(1, 4) == pytest.approx(0.1 * truth.transfer_s[1, 4])


def test_the_network_follows_original_ids_when_a_node_is_gone():
    plan, truth = _measured(seven_node_plan())
    shrunk, _ = shrink_plan(plan, {3})  # node 6 is now 5
    net = network_costs(shrunk)
    assert net.transfer_s[2, 5] == pytest.approx(truth.transfer_s[2, 6])
    assert net.forward_s[5] == pytest.approx(truth.forward_s[6])


def test_a_folded_event_is_in_the_network_and_not_applied_again():
    plan, truth = _measured(seven_node_plan())
    events = [LinkEvent(3, (2, 3), 0.5)]
    transfer, folded = fold_due(plan, events, 4)
    assert folded == [0] and transfer[2, 3] == pytest.approx(2 * truth.transfer_s[2, 3])  # from the network, not the estimate
    folded_plan = replace(plan, meta={**plan.meta})
    folded_plan.meta["emulation"] = with_network({**plan.meta["emulation"], "folded": [0]}, list(range(7)),
                                                 replace(truth, transfer_s=transfer))
    emu = Emulation.from_plan(folded_plan, True, 1.0, events=events).at_iteration(9)
    assert emu.link_delay_s(3, 2) == pytest.approx(2 * truth.transfer_s[3, 2])  # once, not twice


def test_with_network_keeps_the_figures_of_nodes_not_named():
    plan, truth = _measured(seven_node_plan())
    shrunk, _ = shrink_plan(plan, {0})
    other = replace(shrunk.costs, transfer_s=np.full((6, 6), 9.0), forward_s=np.full(6, 9.0))
    emu = with_network(plan.meta["emulation"], list(range(1, 7)), other)
    assert emu["network"]["nodes"] == list(range(7))
    assert emu["network"]["forward_s"][0] == pytest.approx(truth.forward_s[0])
    assert emu["network"]["transfer_s"][0][1] == pytest.approx(truth.transfer_s[0, 1])
    assert emu["network"]["transfer_s"][1][2] == 9.0
