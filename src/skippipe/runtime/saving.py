"""Writing a run checkpoint from all workers together (the protocol is in ``checkpoint.py``).

Every rank first checks that its weights and optimizer state are finite; the ranks agree on it
(a MIN all-reduce), and when any is not, all raise ``TrainingDiverged`` before anything is
written: a checkpoint never holds NaN or inf.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from skippipe.data.tokenizer import Tokenizer
from skippipe.errors import TrainingDiverged
from skippipe.fileio import atomic_dir
from skippipe.model.config import ModelConfig
from skippipe.planfile import Plan
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime import faultpoint
from skippipe.runtime.frozen import copy_into as copy_frozen
from skippipe.runtime.process_group import Groups, communicating
from skippipe.train.config import TrainConfig


@dataclass(frozen=True)
class CheckpointWriter:
    """What a worker needs to take part in writing a checkpoint."""

    run_dir: Path
    plan: Plan
    node: int
    groups: Groups
    timeout_s: float
    model_cfg: ModelConfig
    train_cfg: TrainConfig
    tokenizer: Tokenizer | None  # rank 0 writes it into the checkpoint
    local_root: Path | None = None  # [run] checkpoint_storage = "local": the writers' own root (local_checkpoint.py)


def all_finite(stage: torch.nn.Module, optimizer: torch.optim.Optimizer, groups: Groups, timeout_s: float) -> bool:
    """True when the weights and optimizer state of every stage are finite (all ranks call it)."""
    ok = all(bool(torch.isfinite(p).all()) for p in stage.parameters())
    for st in optimizer.state.values():
        ok = ok and all(bool(torch.isfinite(v).all()) for v in st.values() if isinstance(v, torch.Tensor))
    flag = torch.tensor([1.0 if ok else 0.0])
    with communicating("the check before a checkpoint", timeout_s):
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=groups.world)
    return float(flag[0]) > 0


def save_run_checkpoint(
    w: CheckpointWriter, stage_index: int, stage: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int,
    losses: list[float], keep: int,
) -> None:
    """All ranks call this: rank 0 opens the partial folder, the first node of each stage writes
    its stage, rank 0 writes the metadata and commits (renames) the folder."""
    g = w.groups
    if not all_finite(stage, optimizer, g, w.timeout_s):
        raise TrainingDiverged(step, "weights")
    if w.local_root is not None:
        save_local(w, stage_index, stage, optimizer, step, losses, keep)
        return
    with communicating(f"writing the checkpoint of step {step}", w.timeout_s):
        if w.node == 0:
            ckpt.begin(w.run_dir, step)
        dist.barrier(group=g.world)
        folder = ckpt.partial_dir(w.run_dir, step)
        if g.stage_ranks[0] == w.node:
            ckpt.save_stage(folder, stage_index, stage, optimizer)
        faultpoint.hit("checkpoint_write", w.node, step)  # tests only: a half-written checkpoint
        dist.barrier(group=g.world)
        if w.node == 0:
            copy_frozen(w.run_dir, w.plan, folder)  # stages no node holds: their frozen weights
            ckpt.commit(w.run_dir, step, w.plan, losses, keep, write_meta=lambda folder: _write_meta(w, folder, step))
        dist.barrier(group=g.world)


def _write_meta(w: CheckpointWriter, folder: Path, step: int) -> None:
    from skippipe.model.checkpoint import write_checkpoint_meta

    write_checkpoint_meta(folder, w.model_cfg, step, w.plan.layers, train=w.train_cfg.to_dict(), plan=w.plan,
                          tokenizer=w.tokenizer)


def save_local(
    w: CheckpointWriter, stage_index: int, stage: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int,
    losses: list[float], keep: int,
) -> None:
    """``checkpoint_storage = "local"`` (all ranks call it): the first node of each stage writes only
    its stage, node 0 also the run's metadata, each into its own node folder (one atomic rename);
    nothing is shared but a barrier at the end."""
    from skippipe.runtime import local_checkpoint as L

    assert w.local_root is not None
    owner, digest = w.groups.stage_ranks[0] == w.node, ckpt.plan_digest(w.plan)
    with communicating(f"writing the local checkpoint of step {step}", w.timeout_s):
        if owner or w.node == 0:
            mine = L.node_checkpoints(w.local_root, w.node)
            L.clear_from(mine, step)
            with atomic_dir(mine / L.step_name(step)) as tmp:
                if owner:
                    ckpt.save_stage(tmp, stage_index, stage, optimizer)
                    L.write_stage_manifest(tmp, step, stage_index, w.node, digest)
                if w.node == 0:
                    _write_meta(w, tmp, step)
                    L.write_run_manifest(tmp, step, w.plan.num_stages, digest, losses)
            L.prune_node(mine, keep, step)
        dist.barrier(group=w.groups.world)
