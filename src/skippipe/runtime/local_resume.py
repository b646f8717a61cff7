"""``--resume`` with ``[run] checkpoint_storage = "local"``: every writer reads back its own folder.

1. ``resume_position`` (all ranks): each writer (the first node of each stage, and node 0) lists
   the steps its own folder holds for this plan; the ranks exchange the lists
   (``all_gather_object``) and take the newest step that every writer holds. Each stage's first
   node checks its files' sha256 against its stage manifest; node 0 gives the losses so far.
   Anything wrong is the same one-line ``LocalCheckpointError`` on every rank.
2. The first node of each stage loads its stage from its folder (``Worker.load_checkpoint``);
3. ``share_from_owner``: the other nodes of the stage get the weights and optimizer state from it
   over the stage's process group (``rejoin.share_stage_state``, pickled tensors: bit for bit).
   Replicas never read a disk, so their machines need no copy of the files, and a folder
   that happens to be shared changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from skippipe.errors import LocalCheckpointError, UserError
from skippipe.planfile import Plan
from skippipe.runtime import local_checkpoint as L
from skippipe.runtime.checkpoint import plan_digest
from skippipe.runtime.process_group import Groups, communicating
from skippipe.runtime.rejoin import share_stage_state


@dataclass
class LocalResume:
    start: int
    losses: list[float]
    folder: Path | None  # this node's step folder when it owns its stage (it loads from there), else None


def _mine(root: Path, node: int, stage: int, owner: bool, digest: str) -> dict[int, list[float] | None]:
    """The steps this writer's folder holds for the plan (node 0: with the losses of each)."""
    found: dict[int, list[float] | None] = {}
    for step, folder in L.step_folders(L.node_checkpoints(root, node)):
        ok, losses = True, None
        if owner:
            f = folder / L.stage_manifest_name(stage)
            ok = f.is_file() and L.read_manifest(f, step).get("plan_sha256") == digest
        if ok and node == 0:
            f = folder / L.RUN_MANIFEST
            m = L.read_manifest(f, step) if f.is_file() else {}
            ok, losses = m.get("plan_sha256") == digest, [float(x) for x in m.get("losses", [])]
        if ok:
            found[step] = losses
    return found


def resume_position(root: Path, plan: Plan, node: int, groups: Groups, timeout_s: float) -> LocalResume:
    """All ranks: the step every writer holds, its losses, and this node's folder if it owns its stage."""
    stage = plan.stage_of()[node]
    owner = groups.stage_ranks[0] == node  # the stage's lowest node, as when writing
    writer = owner or node == 0
    problem: str | None = None
    try:
        mine = _mine(root, node, stage, owner, plan_digest(plan)) if writer else None
    except UserError as exc:
        mine, problem = {}, str(exc)
    box: list[Any] = [None] * dist.get_world_size()
    with communicating("agreeing on the local checkpoint to resume from", timeout_s):
        dist.all_gather_object(box, (mine, problem), group=groups.header)  # gloo, also under NCCL
    held = {rank: m for rank, (m, _) in enumerate(box) if m is not None}
    first_problem = next((p for _, p in box if p), None)
    if first_problem:
        raise LocalCheckpointError(f"--resume: {first_problem}")
    common = set.intersection(*(set(m) for m in held.values()))
    if not common:
        lists = "; ".join(f"node {r}: {sorted(m) or 'none'}" for r, m in sorted(held.items()))
        raise LocalCheckpointError(f"--resume: no step of this plan is in the local folders of every writer ({lists}) "
                                   f"under {root}")
    step = max(common)
    losses = held[0][step] or []
    folder = L.node_checkpoints(root, node) / L.step_name(step) if owner else None
    if folder is not None:
        try:
            L.check_files(folder, L.read_manifest(folder / L.stage_manifest_name(stage), step))
        except UserError as exc:
            problem = str(exc)
    with communicating("checking the local checkpoint to resume from", timeout_s):
        dist.all_gather_object(box, problem, group=groups.header)
    first_problem = next((p for p in box if p), None)
    if first_problem:
        raise LocalCheckpointError(f"--resume: {first_problem}")
    return LocalResume(step, list(losses), folder)


def share_from_owner(stage: torch.nn.Module, optimizer: torch.optim.Optimizer, groups: Groups) -> str | None:
    """The stage's first node sends its state to the other nodes of the stage (all ranks call it)."""
    return share_stage_state(stage, optimizer, groups.stage, groups.stage_ranks, set(groups.stage_ranks[1:]))
