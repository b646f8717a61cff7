"""Checkpoints: per stage safetensors weights + optimizer state, the plan, the step. Atomic.

Layout of ``RUN/checkpoints/step-000040/``::

    stage-0.safetensors         weights of stage 0 (identical on every node of the stage)
    stage-0.optim.safetensors   AdamW state of stage 0 (exp_avg, exp_avg_sq, step; groups in metadata)
    stage-1.safetensors ...
    config.json, tokenizer.json the model checkpoint metadata (``skippipe.model.checkpoint``), so
                                that ``skippipe eval`` and ``skippipe export`` read the folder as is
    plan.json                   the plan the run follows
    manifest.json               step, losses so far, sha256 of every file; written last

Writing: rank 0 makes ``.step-000040.partial/``, the first node of each stage writes its two
files there (each one through a temporary file and a rename), rank 0 writes the manifest and
renames the folder to ``step-000040`` — a checkpoint folder either is complete or does not
exist under that name. Older checkpoints beyond ``keep`` are deleted afterwards.

Reading checks the manifest, the presence and sha256 of every file, and that the plan is the
same; anything wrong is one ``CheckpointError`` line. The checks are torch-free; loading the
tensors uses ``safetensors.torch``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skippipe.errors import UserError
from skippipe.fileio import (
    atomic_write,
    atomic_write_text,
    file_sha256,
    name_inside,
    read_json,
    step_folder_name,
    step_folders,
)
from skippipe.planfile import Plan

FORMAT = "skippipe-checkpoint"
VERSION = 1


class CheckpointError(UserError):
    """A checkpoint that is missing, incomplete, corrupt or belongs to another plan."""


@dataclass
class CheckpointInfo:
    path: Path
    step: int  # iterations completed
    losses: list[float]
    plan_sha256: str
    files: dict[str, str]


def plan_digest(plan: Plan) -> str:
    """sha256 of the plan's canonical JSON: two runs follow the same plan iff digests agree."""
    text = json.dumps(plan.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def checkpoints_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir(run_dir: str | Path, step: int) -> Path:
    return checkpoints_root(run_dir) / step_folder_name(step)


def partial_dir(run_dir: str | Path, step: int) -> Path:
    return checkpoints_root(run_dir) / f".{step_folder_name(step)}.partial"


def stage_files(stage: int) -> tuple[str, str]:
    return f"stage-{stage}.safetensors", f"stage-{stage}.optim.safetensors"


# ---------------------------------------------------------------------- writing (rank 0 parts)


def begin(run_dir: str | Path, step: int) -> Path:
    """Rank 0: a fresh, empty partial folder for ``step`` (a stale one is removed)."""
    tmp = partial_dir(run_dir, step)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def commit(
    run_dir: str | Path, step: int, plan: Plan, losses: list[float], keep: int,
    write_meta: Callable[[Path], None] | None = None, extra: dict[str, Any] | None = None,
) -> Path:
    """Rank 0, after every stage wrote its files: ``write_meta(folder)`` (the model's
    ``config.json``, tokenizer), the plan, the manifest, then the atomic rename."""
    tmp = partial_dir(run_dir, step)
    if write_meta is not None:
        write_meta(tmp)
    atomic_write_text(tmp / "plan.json", json.dumps(plan.to_dict(), indent=1) + "\n")
    write_manifest(tmp, step, plan.num_stages, plan_digest(plan), losses, extra=extra)
    final = step_dir(run_dir, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    prune(run_dir, keep)
    return final


def write_manifest(
    folder: Path, step: int, num_stages: int, plan_sha256: str, losses: list[float], known: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """``manifest.json`` over every file of a filled checkpoint folder (written last). ``known``: sha256
    already computed for some files (``skippipe checkpoint gather`` hashes while it copies)."""
    needed = ["plan.json"] + [f for s in range(num_stages) for f in stage_files(s)]
    missing = [n for n in needed if not (folder / n).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint of step {step}: {', '.join(missing)} were not written")
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and p.name != "manifest.json")
    known = known or {}
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "step": step,
        "num_stages": num_stages,
        "plan_sha256": plan_sha256,
        "losses": [float(x) for x in losses],
        "files": {n: known[n] if n in known else file_sha256(folder / n) for n in names},
        **(extra or {}),
    }
    atomic_write_text(folder / "manifest.json", json.dumps(manifest, indent=1) + "\n")


def prune(run_dir: str | Path, keep: int) -> None:
    for info in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(info, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- finding and checking


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete-looking checkpoint folders, oldest first (partial folders are never listed)."""
    return [p for _, p in step_folders(checkpoints_root(run_dir))]


def latest(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def verify(path: str | Path, plan: Plan | None = None) -> CheckpointInfo:
    """Check a checkpoint folder completely (manifest, files, sha256, plan); one-line errors."""
    p = Path(path)
    where = f"checkpoint {p}"
    mf = p / "manifest.json"
    if not p.is_dir():
        raise CheckpointError(f"{where}: no such folder")
    if not mf.is_file():
        raise CheckpointError(f"{where}: manifest.json is missing (an incomplete checkpoint)")
    m = read_json(mf, CheckpointError, "manifest", label=f"{where}: manifest.json is corrupt")
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise CheckpointError(f"{where}: manifest.json is not a skippipe checkpoint manifest")
    if m.get("version") != VERSION:
        raise CheckpointError(f"{where}: checkpoint version {m.get('version')} is not supported (expected {VERSION})")
    files = m.get("files")
    step = m.get("step")
    if not isinstance(files, dict) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"{where}: manifest.json lacks its file list or step")
    for name, digest in files.items():
        f = name_inside(p, name, "manifest entry")
        if not f.is_file():
            raise CheckpointError(f"{where}: {name} is missing")
        if file_sha256(f) != digest:
            raise CheckpointError(f"{where}: {name} is corrupt (sha256 does not match the manifest)")
    info = CheckpointInfo(path=p, step=step, losses=list(m.get("losses", [])), plan_sha256=str(m.get("plan_sha256")), files=files)
    if plan is not None and info.plan_sha256 != plan_digest(plan):
        raise CheckpointError(f"{where}: it was written for a different plan; resume with the plan in {p / 'plan.json'}")
    return info


# ---------------------------------------------------------------------- stage files (torch)


def save_stage(folder: Path, stage_index: int, module: Any, optimizer: Any) -> None:
    """The first node of a stage: weights and optimizer state, each written atomically."""
    from safetensors.torch import save_file

    from skippipe.model.checkpoint import save_stage_shard

    _, optim_name = stage_files(stage_index)
    folder.mkdir(parents=True, exist_ok=True)
    save_stage_shard(folder, stage_index, module)  # the layout `skippipe eval` / `export` read
    state = optimizer.state_dict()
    tensors = {}
    for idx, st in state["state"].items():
        for key, value in st.items():
            tensors[f"state.{idx}.{key}"] = value.detach().contiguous().cpu().reshape(value.shape)
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in state["param_groups"]]
    metadata = {"param_groups": json.dumps(groups), "stage": str(stage_index)}
    atomic_write(folder / optim_name, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def load_stage(folder: Path, stage_index: int, module: Any, optimizer: Any) -> None:
    """Restore a node's copy of a stage and its optimizer from a verified checkpoint."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    weights_name, optim_name = stage_files(stage_index)
    where = f"checkpoint {folder}"
    try:
        weights = load_file(folder / weights_name)
        tensors = load_file(folder / optim_name)
        with safe_open(folder / optim_name, framework="pt") as fh:
            meta = fh.metadata() or {}
    except Exception as exc:  # a file that passed the checksum but does not parse
        raise CheckpointError(f"{where}: stage {stage_index} files cannot be read ({exc})") from None
    try:
        module.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise CheckpointError(f"{where}: stage {stage_index} weights do not fit the model ({first})") from None
    groups = json.loads(meta.get("param_groups", "[]"))
    for g in groups:
        if "betas" in g and isinstance(g["betas"], list):
            g["betas"] = tuple(g["betas"])
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = value
    try:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{where}: stage {stage_index} optimizer state does not fit ({exc})") from None
