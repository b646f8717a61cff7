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
            from skippipe.model.checkpoint import write_checkpoint_meta

            def meta(folder: Path) -> None:
                write_checkpoint_meta(folder, w.model_cfg, step, w.plan.layers, train=w.train_cfg.to_dict(), plan=w.plan,
                                      tokenizer=w.tokenizer)

            copy_frozen(w.run_dir, w.plan, folder)  # stages no node holds: their frozen weights
            ckpt.commit(w.run_dir, step, w.plan, losses, keep, write_meta=meta)
        dist.barrier(group=g.world)
