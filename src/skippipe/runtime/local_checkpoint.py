"""Checkpoints without a shared filesystem (``[run] checkpoint_storage = "local"``). Torch-free.

Every node that writes a part of a checkpoint writes it into its own folder on its own disk,
``ROOT/node-NNN/checkpoints/step-NNNNNN/`` (``ROOT``: ``[run] local_checkpoint_dir``, default
``RUN/local``)::

    stage-S.safetensors, stage-S.optim.safetensors   the first node of stage S (as in "shared")
    stage-S.manifest.json                             step, stage, plan sha256, sha256 of the two files
    config.json, plan.json, tokenizer.json, run.json  node 0: the run's metadata; run.json holds the
                                                      step, the losses so far and their sha256

A node's step folder is filled in a scratch folder and renamed (``fileio.atomic_dir``): it is
complete or absent. A checkpoint is *finished* when ``run.json`` and every stage's manifest exist
for its step. ``gather.py`` joins copies of these folders into the "shared" format.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skippipe import fileio
from skippipe.errors import ChecksumMismatch, LocalCheckpointError, MixedIterations, UserError
from skippipe.fileio import atomic_write_text, file_sha256, name_inside, read_json
from skippipe.runtime.checkpoint import stage_files

LOCAL_FORMAT = "skippipe-local-checkpoint"
VERSION = 1
RUN_MANIFEST = "run.json"
RUN_FILES = ("config.json", "plan.json", "tokenizer.json")  # tokenizer.json only for a BPE tokenizer
_STAGE_MANIFEST = re.compile(r"^stage-(\d+)\.manifest\.json$")


def root_of(run_dir: str | Path, local_dir: str | None) -> Path:
    """The local root of a run: ``[run] local_checkpoint_dir``, else ``RUN/local``."""
    return Path(local_dir) if local_dir else Path(run_dir) / "local"


def node_checkpoints(root: Path, node: int) -> Path:
    return root / f"node-{node:03d}" / "checkpoints"


def step_name(step: int) -> str:
    return fileio.step_folder_name(step)


def stage_manifest_name(stage: int) -> str:
    return f"stage-{stage}.manifest.json"


# ---------------------------------------------------------------------- writing (into a scratch folder)


def write_stage_manifest(folder: Path, step: int, stage: int, node: int, plan_sha256: str) -> None:
    """After the stage's two files: their sha256, the step, the stage and the plan."""
    manifest = {"format": LOCAL_FORMAT, "version": VERSION, "kind": "stage", "step": step, "stage": stage, "node": node,
                "plan_sha256": plan_sha256, "files": {n: file_sha256(folder / n) for n in stage_files(stage)}}
    atomic_write_text(folder / stage_manifest_name(stage), json.dumps(manifest, indent=1) + "\n")


def write_run_manifest(folder: Path, step: int, num_stages: int, plan_sha256: str, losses: list[float]) -> None:
    """Node 0, after config.json/plan.json/tokenizer.json: the run-level record of the step."""
    files = {n: file_sha256(folder / n) for n in RUN_FILES if (folder / n).is_file()}
    manifest = {"format": LOCAL_FORMAT, "version": VERSION, "kind": "run", "step": step, "num_stages": num_stages,
                "plan_sha256": plan_sha256, "losses": [float(x) for x in losses], "files": files}
    atomic_write_text(folder / RUN_MANIFEST, json.dumps(manifest, indent=1) + "\n")


def prune_node(checkpoints: Path, keep: int, written: int) -> None:
    """After writing step ``written`` into one node's folder: keep its newest ``keep`` step folders
    up to ``written`` and drop stale scratch folders (``.step-*.partial-*``) of this node."""
    if not checkpoints.is_dir():
        return
    for p in checkpoints.iterdir():
        if p.is_dir() and not p.is_symlink() and p.name.startswith(".step-") and ".partial-" in p.name:
            shutil.rmtree(p, ignore_errors=True)
    steps = [s for s, _ in step_folders(checkpoints) if s <= written]
    for s in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(checkpoints / step_name(s), ignore_errors=True)


def clear_from(checkpoints: Path, step: int) -> None:
    """Before writing step ``step`` into one node's folder: remove this node's folders of that step
    and later ones (an earlier run's, or an unfinished checkpoint's) so a resume never mixes them in."""
    for s, p in step_folders(checkpoints):
        if s >= step:
            shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------------- finding and checking


def step_folders(checkpoints: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of the complete step folders in one node's ``checkpoints``, oldest first."""
    return fileio.step_folders(checkpoints)


def read_manifest(path: Path, step: int | None = None) -> dict[str, Any]:
    """A local manifest (stage or run), checked for its format and, when given, its step."""
    m = read_json(path, LocalCheckpointError, "manifest")
    if not isinstance(m, dict) or m.get("format") != LOCAL_FORMAT or not isinstance(m.get("files"), dict):
        raise LocalCheckpointError(f"{path}: not a skippipe local checkpoint manifest")
    if m.get("version") != VERSION:
        raise LocalCheckpointError(f"{path}: local checkpoint version {m.get('version')} is not supported (expected {VERSION})")
    if step is not None and m.get("step") != step:
        raise MixedIterations(f"{path}: says step {m.get('step')} but lies in the folder of step {step} (mixed iterations)")
    return m


def check_files(folder: Path, manifest: dict[str, Any]) -> None:
    """Every file a local manifest lists is there with its sha256 (``ChecksumMismatch`` otherwise)."""
    for name, digest in manifest["files"].items():
        f = name_inside(folder, name, "manifest entry")
        if not f.is_file():
            raise LocalCheckpointError(f"{f}: is missing (its manifest lists it)")
        if file_sha256(f) != digest:
            raise ChecksumMismatch(str(f))


@dataclass
class StepParts:
    """What a set of folders holds of one step: the folder of each stage and of the run metadata."""

    step: int
    stages: dict[int, Path] = field(default_factory=dict)
    runs: list[Path] = field(default_factory=list)


def node_step_dirs(root: Path) -> list[Path]:
    """The step folders under a local root (``node-NNN/checkpoints/step-*``), under one node's
    folder (``checkpoints/step-*``) or in a ``checkpoints`` folder (``step-*``)."""
    found = [p for node in sorted(root.glob("node-*")) for _, p in step_folders(node / "checkpoints")]
    return found or [p for _, p in step_folders(root / "checkpoints")] or [p for _, p in step_folders(root)]


def scan(roots: list[Path]) -> dict[int, StepParts]:
    """Every step found under ``roots``, with the folder holding each stage and the run metadata."""
    steps: dict[int, StepParts] = {}
    for root in roots:
        if not root.is_dir():
            raise LocalCheckpointError(f"{root}: no such folder")
        dirs = node_step_dirs(root)
        if not dirs:
            raise LocalCheckpointError(f"{root}: holds no local checkpoint (no node-NNN/checkpoints/step-NNNNNN folder)")
        for folder in dirs:
            step = int(folder.name.split("-")[1])
            parts = steps.setdefault(step, StepParts(step))
            for f in sorted(folder.iterdir()):
                m = _STAGE_MANIFEST.match(f.name)
                if m:
                    stage, files = int(m.group(1)), read_manifest(f, step)["files"]
                    other = parts.stages.setdefault(stage, folder)
                    if other != folder and files != read_manifest(other / f.name)["files"]:
                        raise LocalCheckpointError(f"step {step}: stage {stage} is in {other} and in {folder} with different "
                                                   "contents; give only one copy")
            if (folder / RUN_MANIFEST).is_file():
                parts.runs.append(folder)
    return steps


def finished_steps(steps: dict[int, StepParts], num_stages: int) -> list[int]:
    """The steps with the run metadata and every stage, oldest first."""
    return sorted(s for s, p in steps.items() if p.runs and all(i in p.stages for i in range(num_stages)))


def latest_finished(root: Path, plan_sha256: str | None = None) -> StepParts | None:
    """The newest finished checkpoint (of ``plan_sha256`` when given) under one local root (all
    node folders on this machine: the local launcher), or None."""
    if not root.is_dir():
        return None
    steps = scan([root]) if node_step_dirs(root) else {}
    for parts in reversed([steps[s] for s in sorted(steps)]):
        if not parts.runs:
            continue
        m = read_manifest(parts.runs[0] / RUN_MANIFEST, parts.step)
        if plan_sha256 in (None, m.get("plan_sha256")) and all(i in parts.stages for i in range(int(m["num_stages"]))):
            return parts
    return None


# ---------------------------------------------------------------------- the launcher's view


def resume_point(run_dir: Path, storage: str, local_dir: str | None) -> tuple[Path, int]:
    """``--resume`` in the launcher: the plan file of the newest checkpoint and its step. "shared":
    the newest ``RUN/checkpoints/step-*`` (verified completely); "local": the newest finished one
    under the local root (manifests and plans checked; each stage's first node checks its files)."""
    from skippipe.planfile import load_plan
    from skippipe.runtime import checkpoint as ckpt

    if storage == "local":
        root = root_of(run_dir, local_dir)
        parts = latest_finished(root)
        if parts is None:
            raise LocalCheckpointError(f"--resume: {root} holds no finished local checkpoint (run metadata and every stage)")
        folder = parts.runs[0]
        run = read_manifest(folder / RUN_MANIFEST, parts.step)
        check_files(folder, run)
        plan_file = folder / "plan.json"
        digest = ckpt.plan_digest(load_plan(plan_file))
        for stage, where in sorted(parts.stages.items()):
            if run.get("plan_sha256") != digest or read_manifest(where / stage_manifest_name(stage)).get("plan_sha256") != digest:
                raise LocalCheckpointError(f"{where}: stage {stage} was written for a different plan than {plan_file}")
        return plan_file, parts.step
    latest = ckpt.latest(run_dir)
    if latest is None:
        raise UserError(f"--resume: {run_dir} holds no checkpoint")
    plan_file = latest / "plan.json"
    if not plan_file.is_file():
        raise ckpt.CheckpointError(f"checkpoint {latest}: plan.json is missing")
    return plan_file, ckpt.verify(latest, load_plan(plan_file)).step


def newest(run_dir: Path, storage: str, local_dir: str | None) -> Path | None:
    """The newest checkpoint folder for a summary: the shared one, or node 0's local step folder."""
    from skippipe.runtime import checkpoint as ckpt

    if storage != "local":
        return ckpt.latest(run_dir)
    parts = latest_finished(root_of(run_dir, local_dir))
    return parts.runs[0] if parts else None
