"""NCCL safety: payloads between each ordered pair of nodes travel on that direction's own group
(``process_group.link_pairs`` / ``make_groups``), so two nodes sending to each other at once
cannot wait on each other; tested with gloo on CPU (NCCL where two GPUs exist). The gradient
sum's default mode and its memory cost."""

from __future__ import annotations

import datetime
import os
import socket

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime_fixtures import seven_node_plan
from skippipe.runtime.config import DETERMINISTIC_MAX_PARAMS, RuntimeSection, all_gather_bytes
from skippipe.runtime.process_group import link_pairs
from skippipe.runtime.schedule import hops


def test_link_pairs_cover_every_hop_of_a_plan_in_both_directions():
    plan = seven_node_plan()
    pairs = link_pairs([[mb.data_node, *mb.path] for mb in plan.microbatches])
    used = set()
    for mb in plan.microbatches:
        for node in [mb.data_node, *mb.path]:
            hop = hops(mb, node)
            for peer in (hop.next, hop.prev):
                if peer is not None:
                    used.add((node, peer))  # node sends activations to next, gradients to prev
    assert set(pairs) == used
    assert pairs == sorted(pairs) and len(set(pairs)) == len(pairs)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=5, unique=True), max_size=8))
def test_link_pairs_are_both_directions_of_each_route_edge(routes):
    pairs = set(link_pairs(routes))
    assert all((b, a) in pairs and a != b for a, b in pairs)
    for route in routes:
        if len(route) > 1:
            ring = route + [route[0]]
            assert all((a, b) in pairs for a, b in zip(ring, ring[1:]))
    assert {x for p in pairs for x in p} <= {x for r in routes if len(r) > 1 for x in r}


def test_deterministic_default_follows_model_size_and_states_its_memory():
    rt = RuntimeSection()
    assert rt.deterministic is None
    assert rt.deterministic_for(DETERMINISTIC_MAX_PARAMS) and not rt.deterministic_for(DETERMINISTIC_MAX_PARAMS + 1)
    assert RuntimeSection(deterministic=True).deterministic_for(10**9)
    assert not RuntimeSection(deterministic=False).deterministic_for(10)
    assert all_gather_bytes(1000, 3) == 12_000 and all_gather_bytes(1000, 1) == 0


def _both_send(rank: int, port: int, backend: str, q) -> None:  # type: ignore[no-untyped-def]
    from skippipe.runtime.process_group import gather_gpu_keys, make_groups
    from skippipe.runtime.transport import FORWARD, Message, Transport

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    device = torch.device("cpu")
    if backend.startswith("nccl"):  # "nccl-shared": both ranks on cuda:0
        device = torch.device(f"cuda:{rank if backend == 'nccl' else 0}")
        torch.cuda.set_device(device)
    keys = gather_gpu_keys(device, 60.0) if backend.startswith("nccl") else None
    groups = make_groups([[0], [1]], rank, backend.split("-")[0], link_pairs([[0, 1]]), directed=True, gpu_keys=keys)
    assert set(groups.links) == {(0, 1), (1, 0)} and groups.payload_for(0, 1) is not groups.payload_for(1, 0)
    assert groups.gloo_instead == (2 if backend == "nccl-shared" else 0)
    tr = Transport(rank, groups.header, groups.payload, device, 60.0, links=groups.links)
    big = [torch.full((4, 256, 1024), float(10 * rank + i), device=device) for i in range(4)]  # 4 MiB each
    tr.expect(len(big))
    for i, t in enumerate(big):  # both nodes send all of theirs before receiving anything
        tr.send(1 - rank, Message(0, i, FORWARD, t))
    got = [tr.get(None) for _ in big]
    tr.flush()
    tr.close()
    torch.distributed.barrier()
    q.put((rank, [(m.mb, float(m.tensor.min()), float(m.tensor.max())) for m in got]))
    q.close()
    q.join_thread()
    os._exit(0)


@pytest.mark.parametrize("backend", [
    "gloo",
    pytest.param("nccl", marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")),
    pytest.param("nccl-shared", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
])
def test_two_nodes_sending_large_tensors_to_each_other_at_once(backend):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_both_send, args=(r, port, backend, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for r in (0, 1):
        assert results[r] == [(i, float(10 * (1 - r) + i), float(10 * (1 - r) + i)) for i in range(4)]  # in order, intact


def test_an_nccl_group_whose_workers_share_a_gpu_uses_gloo():
    from skippipe.runtime.process_group import group_backend

    keys = [7, 8, 7, -1]  # ranks 0 and 2 share a GPU
    assert group_backend("nccl", [0, 1], keys) == "nccl"
    assert group_backend("nccl", [0, 2], keys) == "gloo" and group_backend("nccl", [0, 1, 2], keys) == "gloo"
    assert group_backend("nccl", [0, 2], None) == "nccl"  # nothing known: as asked
    assert group_backend("gloo", [0, 1], keys) == "gloo"
