"""One worker of ``skippipe profile``: join the launch, measure, gather on rank 0, write the file.

Order: every pair of workers ping-pongs, in rounds of disjoint pairs (a barrier between rounds);
then each worker in turn times its stage (one at a time, so workers sharing a machine do not slow
each other down); then everything is summed onto rank 0, which writes the cluster file.
Started by ``skippipe profile`` (locally) or by ``torchrun ... -m skippipe.cli profile --worker``.
"""

from __future__ import annotations

import datetime
import json
import os
import socket

import numpy as np
import torch
import torch.distributed as dist

from skippipe.errors import UserError
from skippipe.fileio import atomic_write_text
from skippipe.model.config import get_preset
from skippipe.runtime import process_group as pg
from skippipe.runtime.profile.emulated import EmulatedLinks
from skippipe.runtime.profile.fit import Measured, cluster_document
from skippipe.runtime.profile.measure import pair_rounds, ping_pong, stage_compute, usable_bytes
from skippipe.runtime.profile.spec import ProfileSpec
from skippipe.workload import Workload

PROGRESS_KEY = "skippipe/profile/progress"  # rounds done, counted in the launcher's store
PROGRESS_ENV = "SKIPPIPE_PROFILE_PROGRESS"


class _Progress:
    """Counts finished rounds in the local launcher's store (rank 0 only; no-op under torchrun)."""

    def __init__(self, env: pg.Env, timeout_s: float) -> None:
        self.store = None
        if env.rank == 0 and os.environ.get(PROGRESS_ENV) == "1":
            self.store = dist.TCPStore(env.master_addr, env.master_port, is_master=False,
                                       timeout=datetime.timedelta(seconds=timeout_s))

    def step(self) -> None:
        if self.store is not None:
            self.store.add(PROGRESS_KEY, 1)


def total_rounds(nodes: int) -> int:
    """Progress steps of a profile of ``nodes`` workers: its pair rounds and one per node's compute."""
    return len(pair_rounds(nodes)) + nodes


def run_profile_worker(spec: ProfileSpec) -> int:
    env = pg.read_env()
    n = env.world_size
    if n < 2:
        raise UserError("profile: needs at least 2 workers (WORLD_SIZE >= 2)")
    cfg = get_preset(spec.model)
    if cfg.n_layers < spec.stages:
        raise UserError(f"profile: model {spec.model!r} has {cfg.n_layers} layers, fewer than {spec.stages} stages")
    stages = max(2, spec.stages)
    layers = max(Workload(num_stages=stages, path_length=stages, n_layers=cfg.n_layers).layers_per_stage())
    links = EmulatedLinks.load(spec.emulate, n, spec.time_scale) if spec.emulate else None
    sizes = spec.message_sizes(cfg.d_model, cfg.ctx)
    device = pg.device_for(spec.device, env.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    pg.init(env, spec.timeout_s, spec.rendezvous_timeout_s)
    try:
        progress = _Progress(env, spec.rendezvous_timeout_s)
        one_way = np.zeros((n, n, len(sizes)))
        for pairs in pair_rounds(n):
            for a, b in pairs:
                if env.rank in (a, b):
                    peer = b if env.rank == a else a
                    one_way[a, b] += ping_pong(env.rank, peer, sizes, spec.reps, links.delay_s if links else None)
            dist.barrier()
            progress.step()
        node = np.zeros((n, 5))
        for r in range(n):
            if r == env.rank:
                fwd, bwd, act, state = stage_compute(cfg, layers, spec.samples, spec.compute_reps, device)
                node[r] = [fwd, bwd, act, state, usable_bytes(device, spec.memory_fraction)]
            dist.barrier()
            progress.step()
        gathered = torch.from_numpy(np.concatenate([one_way.ravel(), node.ravel()]))
        dist.all_reduce(gathered)
        if env.rank == 0:
            flat = gathered.numpy()
            one_way = flat[: one_way.size].reshape(one_way.shape)
            node = flat[one_way.size:].reshape(n, 5)
            measured = Measured(sizes, one_way, node[:, 0], node[:, 1], node[:, 4], node[:, 2], node[:, 3])
            info = {"nodes": n, "model_preset": spec.model, "reps": spec.reps, "device": spec.device,
                    "emulate": spec.emulate, "host_of_rank0": socket.gethostname()}
            doc = cluster_document(
                measured, name=f"profile-{n}", d_model=cfg.d_model, ctx=cfg.ctx, samples=spec.samples, layers=layers,
                time_scale=spec.time_scale if links else 1.0, links=spec.links, max_slots=spec.max_slots, info=info,
            )
            atomic_write_text(spec.out, json.dumps(doc, indent=1) + "\n")
        dist.barrier()
    finally:
        pg.shutdown()
    return 0
