"""The measurements of one worker: ping-pong with a peer, and one stage's forward/backward time,
activation size and usable memory.

Ping-pong: the lower rank sends ``size`` bytes, the peer sends them back; a one-way time is half
the fastest of ``reps`` round trips (queueing on a busy machine only ever adds time), after one
warm-up round trip. Under emulation each send is held for the emulated link's time first.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from skippipe.model.config import ModelConfig
from skippipe.model.llama import build_stage

Delay = Callable[[int, int, int], float]  # (src, dst, bytes) -> seconds to hold the message


def pair_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Every pair (i < j) once, in rounds of disjoint pairs (the circle method): n - 1 rounds for
    even n, n for odd n."""
    ids: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(ids)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for k in range(m // 2):
            a, b = ids[k], ids[m - 1 - k]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        ids = [ids[0], ids[-1], *ids[1:-1]]
    return rounds


def _hold(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


def ping_pong(rank: int, peer: int, sizes: list[int], reps: int, delay: Delay | None) -> np.ndarray:
    """One-way seconds per size between ``rank`` and ``peer`` (measured by the lower rank; the
    higher one only answers and returns zeros)."""
    lead = rank < peer
    out = np.zeros(len(sizes))
    hold = delay or (lambda src, dst, nbytes: 0.0)
    for k, size in enumerate(sizes):
        buf = torch.zeros(size, dtype=torch.uint8)
        best = float("inf")
        for rep in range(reps + 1):  # the first round trip warms the connection up
            if lead:
                t0 = time.perf_counter()
                _hold(hold(rank, peer, size))
                dist.send(buf, peer)
                dist.recv(buf, peer)
                if rep:
                    best = min(best, time.perf_counter() - t0)
            else:
                dist.recv(buf, peer)
                _hold(hold(rank, peer, size))
                dist.send(buf, peer)
        out[k] = best / 2.0 if lead else 0.0
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stage_compute(cfg: ModelConfig, layers: int, samples: int, reps: int, device: torch.device) -> tuple[float, float, int, int]:
    """(forward s, backward s, activation bytes, state bytes) of one stage of ``layers`` layers on
    one microbatch of ``samples`` x ``cfg.ctx`` tokens: the fastest of ``reps`` passes after a
    warm-up (other work on the machine only ever adds time). Activation bytes are what autograd
    keeps for the backward (distinct storages); state bytes are fp32 weights, gradients and two
    Adam moments of the stage plus embedding and head (a data node holds those)."""
    stage = build_stage(cfg, range(layers), first=False).to(device)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    fwd, bwd = [], []
    for rep in range(reps + 1):
        x = torch.randn(samples, cfg.ctx, cfg.d_model, device=device, requires_grad=True)
        grad = torch.randn_like(x)
        _sync(device)
        t0 = time.perf_counter()
        if rep == 0:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y = stage(x)
        else:
            y = stage(x)
        _sync(device)
        t1 = time.perf_counter()
        y.backward(grad)
        _sync(device)
        t2 = time.perf_counter()
        if rep:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
        stage.zero_grad(set_to_none=True)
    params = sum(p.numel() for p in stage.parameters()) + 2 * cfg.vocab_size * cfg.d_model
    return min(fwd), min(bwd), int(sum(saved.values())), int(params * 16)


def usable_bytes(device: torch.device, fraction: float) -> int:
    """Memory this worker may fill: a share of the GPU's free memory, or of the host's available
    memory split between the workers of this host (``LOCAL_WORLD_SIZE``)."""
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        sharers = max(1, -(-local // torch.cuda.device_count()))
        return int(free * fraction / sharers)
    return int(_host_available() * fraction / local)


def _host_available() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
