"""The weights of frozen stages: a stage with no node left keeps training frozen.

When the last node of a non-data stage fails (``planner.shrink`` marks the stage frozen), no
survivor holds its state. Its weights and optimizer state are taken from the newest checkpoint
that verifies (``freeze``) and kept in ``RUN/elastic/frozen/`` with ``frozen.json``
(``{"stage": step}``: the step each frozen stage's weights are from). Every checkpoint written
while the stage is frozen gets those files (``copy_into``), so it stays a whole model that
``skippipe eval`` / ``export`` read, and a node that later rejoins the stage restores it from the
recovery checkpoint: from disk, since no peer holds it (``entry.py``). Torch-free.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from skippipe.errors import StageLost
from skippipe.fileio import atomic_write_text
from skippipe.planfile import Plan
from skippipe.runtime import checkpoint as ckpt

FOLDER = ("elastic", "frozen")
INDEX = "frozen.json"


def store(run_dir: Path) -> Path:
    return run_dir.joinpath(*FOLDER)


def frozen_steps(run_dir: Path) -> dict[int, int]:
    """Stage -> the step its frozen weights are from (empty when none is frozen)."""
    try:
        doc = json.loads((store(run_dir) / INDEX).read_text())
    except (OSError, ValueError):
        return {}
    return {int(k): int(v) for k, v in doc.items()} if isinstance(doc, dict) else {}


def newest_valid_checkpoint(run_dir: Path) -> ckpt.CheckpointInfo | None:
    for folder in reversed(ckpt.list_checkpoints(run_dir)):
        try:
            return ckpt.verify(folder)
        except ckpt.CheckpointError:
            continue
    return None


def freeze(run_dir: Path, stages: list[int], before: list[int], nodes: dict[int, list[int]]) -> dict[int, int]:
    """Copy the newest valid checkpoint's files of ``stages`` not frozen ``before`` (the old
    plan's frozen stages, whose files the store already holds; anything else in it is stale, e.g.
    from an earlier run in this folder) into the frozen store; returns stage -> step.
    ``StageLost`` when no checkpoint holds them (``nodes``: each stage's lost nodes, original
    ids, for the message)."""
    have = {s: v for s, v in frozen_steps(run_dir).items() if s in before}
    todo = [s for s in stages if s not in have]
    if not todo:
        return have
    info = newest_valid_checkpoint(run_dir)
    if info is None:
        raise StageLost(todo[0], nodes.get(todo[0], []), "no checkpoint holds its weights (set [run] checkpoint_every)")
    dest = store(run_dir)
    dest.mkdir(parents=True, exist_ok=True)
    for s in todo:
        for name in ckpt.stage_files(s):
            shutil.copyfile(info.path / name, dest / name)
        have[s] = info.step
    atomic_write_text(dest / INDEX, json.dumps({str(k): v for k, v in sorted(have.items())}) + "\n")
    return have


def copy_into(run_dir: Path, plan: Plan, folder: Path) -> None:
    """The frozen stages' files into a checkpoint folder being written for ``plan``."""
    for s in plan.frozen_stages:
        for name in ckpt.stage_files(s):
            shutil.copyfile(store(run_dir) / name, folder / name)


def thaw(run_dir: Path, plan: Plan) -> None:
    """Forget the stages ``plan`` no longer freezes (a node rejoined them)."""
    have = frozen_steps(run_dir)
    keep = {s: v for s, v in have.items() if s in plan.frozen_stages}
    if keep != have:
        atomic_write_text(store(run_dir) / INDEX, json.dumps({str(k): v for k, v in sorted(keep.items())}) + "\n")
