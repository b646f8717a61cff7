"""Fast unit tests of the runtime's parts: scheduling (same decisions as the simulator), message
headers, emulation, ordered gradient accumulation, config and checkpoint checks."""

from __future__ import annotations

import heapq
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime_fixtures import seven_node_plan
from skippipe.cluster import load_cluster
from skippipe.errors import UserError
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime.accumulate import OrderedGradAccumulator
from skippipe.runtime.config import load_run_config, run_config_from_dict
from skippipe.runtime.emulation import Emulation
from skippipe.runtime.schedule import NodeSchedule, expected_messages, hops
from skippipe.runtime.transport import BACKWARD, Message, decode_header, encode_header
from skippipe.sim import simulate
from skippipe.workload import Workload


def test_runtime_config_modules_import_without_torch():
    code = (
        "import sys, skippipe.runtime.config, skippipe.runtime.schedule, skippipe.runtime.emulation; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------- scheduling


def replay(plan, policy: str = "fifo") -> dict[int, list[str]]:
    """Drive one NodeSchedule per node through the plan's costs with the simulator's event rules
    (arrivals before node wake-ups at equal times; a node idles its gap after each operation)."""
    c = plan.costs
    T = np.asarray(c.transfer_s)
    scheds = {n: NodeSchedule(plan, n, policy) for n in range(plan.n_nodes)}
    own = {mb.id: mb for mb in plan.microbatches}
    events: list[tuple] = []
    seq = iter(range(10**9))
    free_at = [0.0] * plan.n_nodes
    order: dict[int, list[str]] = {n: [] for n in range(plan.n_nodes)}
    for n in range(plan.n_nodes):
        heapq.heappush(events, (0.0, 1, next(seq), n))
    for mb in plan.microbatches:
        heapq.heappush(events, (mb.release_s, 1, next(seq), mb.data_node))
    while events:
        t, typ, _, x = heapq.heappop(events)
        if typ == 0:  # an arrival (node, kind, mb)
            node, kind, mb = x
            scheds[node].arrived(kind, mb, t)
            heapq.heappush(events, (t, 1, next(seq), node))
            continue
        if typ == 2:  # an operation finished
            node, kind, mb = x
            scheds[node].finished(kind, mb, t)
            for m in plan.microbatches:  # an 'after' dependency may release an injection now
                if m.after == mb and kind == "B" and node == m.data_node:
                    heapq.heappush(events, (max(t, m.release_s), 1, next(seq), node))
            continue
        node = x
        if free_at[node] > t:
            continue
        op = scheds[node].next_op(t)
        if op is None:
            continue
        kind, mb = op
        scheds[node].started(kind, mb)
        order[node].append(f"{kind}{mb}")
        end = t + c.op_s(node, kind)
        injection = kind == "F" and own[mb].data_node == node
        free_at[node] = end + (c.inject_gap_s if injection else c.op_gap_s)
        heapq.heappush(events, (end, 2, next(seq), (node, kind, mb)))
        heapq.heappush(events, (free_at[node], 1, next(seq), node))
        h = hops(own[mb], node)
        if kind == "F":
            nxt = h.next if h.next is not None else node
            k = "L" if nxt == own[mb].data_node else "F"
            heapq.heappush(events, (end + T[node, nxt], 0, next(seq), (nxt, k, mb)))
        elif kind == "L":
            prv = h.prev if h.prev is not None else node
            heapq.heappush(events, (end + T[node, prv], 0, next(seq), (prv, "B", mb)))
        elif h.prev is not None and node != own[mb].data_node:
            heapq.heappush(events, (end + T[node, h.prev], 0, next(seq), (h.prev, "B", mb)))
    assert all(s.done for s in scheds.values())
    return {n: ops for n, ops in order.items() if ops}


@pytest.mark.parametrize("method", ["full", "random", "skippipe"])
@pytest.mark.parametrize("seed", [0, 1])
def test_node_schedules_make_the_simulators_decisions(method, seed):
    workload = Workload(num_stages=4, path_length=3, microbatches_per_data_node=4, memory=2, n_layers=8)
    problem = build_problem(load_cluster("gcp-2025/geo-distributed/10"), workload)
    plan = make_plan(method, problem, seed=seed, time_limit_s=5)
    assert replay(plan) == simulate(plan).processing_order()


def test_schedule_on_a_plan_with_swaps_releases_and_after():
    plan = seven_node_plan()
    assert replay(plan) == simulate(plan).processing_order()
    order = replay(plan, "backward-first")  # a different policy still runs every operation once
    assert sorted(sum(order.values(), [])) == sorted(sum(simulate(plan).processing_order().values(), []))


def test_processing_order_is_followed_exactly():
    plan = seven_node_plan()
    order = simulate(plan).processing_order()
    assert order[4][:2] == ["F0", "F1"]
    order[4][:2] = ["F1", "F0"]  # not what first-come-first-served does
    plan.processing_order = order
    assert replay(plan) == order == simulate(plan).processing_order()


def test_memory_cap_holds_back_forwards():
    plan = seven_node_plan()
    s = NodeSchedule(plan, 4)  # node 4 (stage 2) sees microbatches 0, 1, 3, 5 with memory 2
    for mb in (0, 1, 3):
        s.arrived("F", mb, 0.0)
    assert s.next_op(0.0) == ("F", 0)
    s.started("F", 0)
    s.finished("F", 0)
    s.started("F", 1)
    s.finished("F", 1)
    assert s.next_op(1.0) is None  # two activations held: F3 must wait
    s.arrived("B", 0, 1.0)
    assert s.next_op(1.0) == ("B", 0)
    s.started("B", 0)
    s.finished("B", 0)
    assert s.next_op(2.0) == ("F", 3)
    assert expected_messages(plan, 4) == 8 and expected_messages(plan, 0) == 6


# ---------------------------------------------------------------------- messages, emulation


@given(st.lists(st.integers(1, 5), min_size=0, max_size=6), st.sampled_from([torch.float32, torch.bfloat16, torch.int64]),
       st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from(["fp32", "bf16", "int8"]))
@settings(max_examples=50, deadline=None)
def test_header_round_trip(shape, dtype, iteration, mb, wire):
    msg = Message(iteration, mb, BACKWARD, torch.zeros(shape, dtype=dtype), sent_at=1234.5, wire=wire)
    it, m, direction, dt, sent, got_shape, got_wire = decode_header(encode_header(msg))
    assert (it, m, direction, dt, got_shape) == (iteration, mb, BACKWARD, dtype, list(shape))
    assert got_wire == (wire if dtype.is_floating_point else "fp32")
    assert sent == pytest.approx(1234.5)


def test_emulation_delays_and_padding_follow_the_plan():
    plan = seven_node_plan()
    em = Emulation.from_plan(plan, enabled=True, time_scale=0.1)
    assert em.link_delay_s(0, 2) == pytest.approx(plan.costs.transfer_s[0, 2] * 0.1)
    assert em.link_delay_s(3, 3) == 0.0
    assert em.costs.op_s(2, "B") == pytest.approx(plan.costs.forward_s[2] * plan.costs.backward_factor)
    assert Emulation.from_plan(plan, enabled=False, time_scale=0.1).link_delay_s(0, 2) == 0.0


# ---------------------------------------------------------------------- gradients


@given(st.permutations(list(range(5))))
@settings(max_examples=20, deadline=None)
def test_ordered_accumulation_is_independent_of_arrival_order(perm):
    torch.manual_seed(0)
    layer = torch.nn.Linear(7, 3)
    xs = [torch.randn(4, 7) * (10.0 ** i) for i in range(5)]  # wide range: float sums depend on order

    def grads(order):
        layer.zero_grad(set_to_none=True)
        acc = OrderedGradAccumulator(layer, list(range(5)))
        for i in order:
            acc.capture(i, lambda i=i: layer(xs[i]).pow(2).sum().backward(), last=True)
        assert acc.done
        return [p.grad.clone() for p in layer.parameters()]

    layer.zero_grad(set_to_none=True)
    for i in range(5):  # the reference executor: plain accumulation in id order
        layer(xs[i]).pow(2).sum().backward()
    expected = [p.grad.clone() for p in layer.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(grads(perm), expected))


# ---------------------------------------------------------------------- config, checkpoints


def test_config_errors_are_one_line(tmp_path):
    with pytest.raises(UserError, match=r"\[runtime\]: unknown key\(s\) time_scal "):
        run_config_from_dict({"runtime": {"time_scal": 1}})
    with pytest.raises(UserError, match="policy must be"):
        run_config_from_dict({"runtime": {"policy": "lifo"}})
    with pytest.raises(UserError, match="unknown table"):
        run_config_from_dict({"trian": {}})
    with pytest.raises(UserError, match="method must be one of"):
        run_config_from_dict({"plan": {"method": "best"}})
    bad = tmp_path / "c.toml"
    bad.write_text("[run\n")
    with pytest.raises(UserError, match="not valid TOML"):
        load_run_config(bad)


def test_shipped_example_config_loads():
    from pathlib import Path

    cfg = load_run_config(Path(__file__).parent.parent / "examples" / "train-tiny.toml")
    assert cfg.plan.cluster.endswith("/12") and cfg.runtime.emulate


def test_checkpoint_verify_and_prune(tmp_path):
    plan = seven_node_plan()
    for step in (1, 2, 3):
        folder = ckpt.begin(tmp_path, step)
        for s in range(plan.num_stages):
            for name in ckpt.stage_files(s):
                (folder / name).write_bytes(b"x" * (s + step))
        ckpt.commit(tmp_path, step, plan, [1.0] * step, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-000002", "step-000003"]
    info = ckpt.verify(ckpt.latest(tmp_path), plan)
    assert info.step == 3 and info.losses == [1.0, 1.0, 1.0]
    other = seven_node_plan()
    other.microbatches[0].release_s = 0.25
    with pytest.raises(ckpt.CheckpointError, match="different plan"):
        ckpt.verify(ckpt.latest(tmp_path), other)
    (ckpt.latest(tmp_path) / "manifest.json").write_text("{")
    with pytest.raises(ckpt.CheckpointError, match="manifest.json is corrupt"):
        ckpt.verify(ckpt.latest(tmp_path))
    # a partial folder (a crash mid-write) is never listed
    ckpt.begin(tmp_path, 4)
    assert ckpt.latest(tmp_path).name == "step-000003"
    assert json.loads((tmp_path / "checkpoints" / "step-000002" / "manifest.json").read_text())["step"] == 2
