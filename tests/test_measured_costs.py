"""Measured costs for a re-plan: synthetic timeline records -> hop and operation medians -> cost matrices."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from skippipe.runtime.measured_costs import (
    NodeRecords,
    load_measurements,
    measure,
    measured_costs,
    usable_iterations,
    write_measurements,
)


def _hop(it: int, src: int, dst: int, sent: float, took: float) -> dict:
    return {"it": it, "type": "transfer", "src": src, "dst": dst, "mb": 0, "dir": "F", "start": sent, "end": sent + took}


def _op(it: int, node: int, kind: str, start: float, took: float) -> dict:
    return {"it": it, "type": "op", "node": node, "kind": kind, "mb": 0, "start": start, "end": start + took}


def _done(it: int, node: int) -> dict:
    return {"it": it, "type": "iteration", "node": node, "cpu_s": 0.0, "iter_s": 1.0, "makespan_s": 1.0}


def _three_nodes(scale: float, first: int = 0) -> list[NodeRecords]:
    """Node 0 -> 1 -> 2, iterations first..first+3; the link 0->1 takes 0.5 plan s, 1->2 0.2 plan s;
    node 1's forward 0.3 and backward 0.6 plan s."""
    recs: dict[int, list[dict]] = {0: [], 1: [], 2: []}
    for it in range(first, first + 4):
        for node in recs:
            recs[node].append(_done(it, node))
        recs[1].append(_hop(it, 0, 1, 1.0, 0.5 * scale))
        recs[2].append(_hop(it, 1, 2, 2.0, 0.2 * scale))
        recs[1].append(_op(it, 1, "F", 1.6, 0.3 * scale))
        recs[1].append(_op(it, 1, "B", 3.0, 0.6 * scale))
    return [NodeRecords(n, scale, first, r) for n, r in recs.items()]


def test_hop_and_operation_times_come_back_in_plan_seconds():
    m = measure(_three_nodes(scale=0.05), window=2)
    assert m.iterations == [2, 3]  # the round's first iteration (0) is left out; the last two kept
    assert m.hop_s == {(0, 1): pytest.approx(0.5), (1, 2): pytest.approx(0.2)}
    assert m.hop_count == {(0, 1): 2, (1, 2): 2}
    assert m.forward_s == {1: pytest.approx(0.3)} and m.backward_s == {1: pytest.approx(0.6)}


def test_cost_matrices_take_the_measured_links_and_nodes_and_keep_the_plans_elsewhere():
    m = measure(_three_nodes(scale=0.1), window=3)
    plan_t = np.full((3, 3), 0.1)
    np.fill_diagonal(plan_t, 0.0)
    plan_f = np.array([0.2, 0.2, 0.2])
    transfer, forward = measured_costs(plan_t, plan_f, 2.0, m)
    expected = plan_t.copy()
    expected[0, 1], expected[1, 2] = 0.5, 0.2  # the other direction (1->0) was not observed: the plan's
    np.testing.assert_allclose(transfer, expected)
    np.testing.assert_allclose(forward, [0.2, (0.3 + 0.6) / 3.0, 0.2])
    np.testing.assert_allclose(plan_t[0, 1], 0.1)  # the inputs are not changed


def test_only_iterations_every_node_finished_count():
    nodes = _three_nodes(scale=1.0)
    nodes[2].records[:] = [r for r in nodes[2].records if not (r["type"] == "iteration" and r["it"] == 3)]
    assert usable_iterations(nodes, 5) == [1, 2]
    assert measure([], 3).hop_s == {}


def test_a_drift_is_measured_on_its_own_iterations():
    nodes = _three_nodes(scale=1.0)  # iterations 1..3 usable
    assert usable_iterations(nodes, 3, since=2) == [2, 3]
    # drained before node 2 finished iteration 3: the drift's iterations every node finished ...
    nodes[2].records[:] = [r for r in nodes[2].records if not (r["type"] == "iteration" and r["it"] == 3)]
    assert usable_iterations(nodes, 2, since=2) == [2]  # not iteration 1, from before the drift
    # ... or, none of them finished by all, those some node finished
    nodes[1].records[:] = [r for r in nodes[1].records if not (r["type"] == "iteration" and r["it"] == 2)]
    assert usable_iterations(nodes, 2, since=2) == [2, 3]
    assert measure(nodes, 2, since=2).iterations == [2, 3]


def test_a_node_with_only_a_backward_or_only_a_forward():
    nodes = _three_nodes(scale=1.0)
    nodes[1].records[:] = [r for r in nodes[1].records if r.get("kind") != "F"]
    _, forward = measured_costs(np.zeros((3, 3)), np.ones(3), 2.0, measure(nodes, 3))
    np.testing.assert_allclose(forward, [1.0, 0.3, 1.0])


def test_written_and_read_back(tmp_path):
    for n in _three_nodes(scale=0.05, first=4):
        write_measurements(tmp_path, n.node, n.time_scale, n.first_iteration, n.records)
    (tmp_path / "measured" / "node-009.json").write_text("{torn")
    back = load_measurements(tmp_path)
    assert [n.node for n in back] == [0, 1, 2] and back[0].first_iteration == 4
    assert measure(back, 2).hop_s == {(0, 1): pytest.approx(0.5), (1, 2): pytest.approx(0.2)}


@given(hop=st.floats(0.01, 10.0), outlier=st.floats(0.0, 1e4), count=st.integers(2, 8), at=st.integers(0, 8),
       scale=st.sampled_from([0.05, 0.1, 1.0]))
def test_one_late_message_does_not_move_the_median(hop, outlier, count, at, scale):
    """``count`` messages of one link take ``hop`` plan seconds and one takes ``outlier``: the estimate is ``hop``."""
    spans = [hop] * count
    spans.insert(min(at, count), outlier)
    recs = [_done(k, 0) for k in range(1, len(spans) + 1)]
    recs += [_hop(k + 1, 1, 0, 5.0, s * scale) for k, s in enumerate(spans)]
    m = measure([NodeRecords(0, scale, 0, recs)], window=len(spans))
    assert m.hop_s[(1, 0)] == pytest.approx(hop, rel=1e-9)
