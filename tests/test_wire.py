"""Wire formats of activations and gradients: error bounds, error feedback, the bytes the planner
counts, and two real processes exchanging tensors in each format."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from skippipe.cluster import preset_cluster
from skippipe.costs import activation_bytes, wire_bytes
from skippipe.errors import UserError
from skippipe.planner.problem import build_problem
from skippipe.runtime.config import run_config_from_dict
from skippipe.runtime.wire import ErrorFeedback, decode, encode, payload_shape, round_trip
from skippipe.workload import Workload

FLOATS = st.floats(-1e4, 1e4, allow_nan=False, allow_subnormal=False, width=32)  # activations, not denormals


@settings(max_examples=80, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 40)), elements=FLOATS))
def test_error_bounds(x):
    t = torch.from_numpy(x)
    bf = round_trip(t, "bf16")
    assert torch.all((bf - t).abs() <= t.abs() * 2.0**-8)  # round to nearest: half of bf16's 2**-7 step
    q = round_trip(t, "int8")
    step = t.abs().amax(dim=-1, keepdim=True) / 127
    assert torch.all((q - t).abs() <= step / 2 * (1 + 1e-5) + 1e-30)  # half a step of its row
    assert torch.equal(round_trip(t, "fp32"), t)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 7), min_size=1, max_size=4), st.sampled_from(["fp32", "bf16", "int8"]))
def test_payload_bytes_are_what_the_planner_counts(shape, wire):
    t = torch.randn(shape)
    p = encode(t, wire)
    assert list(p.shape) == payload_shape(wire, shape)
    rows = t.numel() // shape[-1]
    assert p.numel() * p.element_size() == wire_bytes(rows, shape[-1], wire)
    assert decode(p, wire, shape).shape == t.shape


def test_bytes_per_hop_in_the_cost_model():
    assert activation_bytes(1024, 1024, 8, "bf16") * 2 == activation_bytes(1024, 1024, 8, "fp32")
    assert activation_bytes(1024, 1024, 8, "int8") == 1024 * 8 * (1024 + 4)
    cluster = preset_cluster("gcp-2025", "geo-distributed", 20)
    t = {w: build_problem(cluster, Workload(wire_format=w)).transfer_s for w in ("fp32", "bf16", "int8")}
    off = ~np.eye(20, dtype=bool)
    assert np.all(t["int8"][off] < t["bf16"][off]) and np.all(t["bf16"][off] < t["fp32"][off])
    with pytest.raises(UserError, match="wire_format"):
        Workload(wire_format="fp8")
    with pytest.raises(UserError, match="wire must be one of"):
        run_config_from_dict({"runtime": {"wire": "fp16"}})
    assert run_config_from_dict({}).runtime.wire == "bf16"  # the default for WAN runs


def test_error_feedback_keeps_the_running_sum_on_track():
    torch.manual_seed(0)
    xs = [torch.randn(16, 64) * 0.01 + 1.0 for _ in range(200)]  # a small signal under a large offset
    ef = ErrorFeedback("int8")
    sent_ef = [decode(ef.encode("link", x), "int8", [16, 64]) for x in xs]
    sent_plain = [round_trip(x, "int8") for x in xs]
    true = torch.stack(xs).sum(0)
    err_ef = (torch.stack(sent_ef).sum(0) - true).abs().max().item()
    err_plain = (torch.stack(sent_plain).sum(0) - true).abs().max().item()
    step = 1.01 / 127
    assert err_ef <= step  # the accumulated error stays within one step, however many messages
    assert err_plain > 5 * err_ef
    assert ErrorFeedback("fp32").encode("k", xs[0]) is xs[0]


def _exchange(rank, world, port, wire, feedback, q):
    import datetime
    import os

    import torch.distributed as dist

    from skippipe.runtime.transport import FORWARD, Message, Transport

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    tr = Transport(rank, dist.group.WORLD, dist.new_group(backend="gloo"), torch.device("cpu"), 30.0,
                   wire=wire, error_feedback=feedback)
    torch.manual_seed(rank)
    mine = [torch.randn(2, 3, 32) * (i + 1) for i in range(3)] + [torch.arange(5)]
    tr.expect(len(mine))
    for i, t in enumerate(mine):
        tr.send(1 - rank, Message(0, i, FORWARD, t))
    got = sorted((tr.get(None) for _ in mine), key=lambda m: m.mb)
    tr.flush()
    tr.close()
    dist.barrier()
    q.put((rank, [m.tensor.numpy() for m in got], [t.numpy() for t in mine]))  # by value
    q.close()
    q.join_thread()
    os._exit(0)  # as the runtime's workers end (launch.py): no teardown of gloo's threads


@pytest.mark.parametrize("wire, feedback", [("fp32", False), ("bf16", False), ("int8", True)])
def test_two_processes_exchange_tensors_in_each_wire_format(wire, feedback):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_exchange, args=(r, 2, port, wire, feedback, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict((r, (got, mine)) for r, got, mine in (q.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for r in (0, 1):
        got = [torch.from_numpy(a) for a in results[r][0]]
        sent = [torch.from_numpy(a) for a in results[1 - r][1]]
        assert torch.equal(got[-1], sent[-1])  # integer tensors always travel as they are
        for g, t in zip(got[:-1], sent[:-1]):
            assert g.dtype == torch.float32 and g.shape == t.shape
            assert torch.equal(g, round_trip(t, wire))  # first message of each stream: no residual yet
