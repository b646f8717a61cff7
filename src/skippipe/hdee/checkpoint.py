"""Checkpoints of one training job (an expert, a seed model or a probe). Atomic, with a manifest.

Layout of ``RUN/<kind>s/<name>/``::

    checkpoints/step-000100/   model.safetensors, optim.pt (AdamW state), manifest.json
    final/                     model.safetensors, config.json (+ tokenizer.json), manifest.json

``final/`` is also a plain skippipe model checkpoint (``config.json`` of
``skippipe.model.checkpoint``), so ``skippipe eval`` and ``skippipe export`` read it as is.

Every file is written through a temporary file and a rename, inside a ``.<name>.partial``
folder; ``manifest.json`` (job digest, step, losses so far, sha256 of every file) is written
last and the folder is then renamed into place: a checkpoint folder is complete or absent.
Reading checks the manifest, every file's sha256 and that the job's digest is the same.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from skippipe import fileio
from skippipe.errors import UserError
from skippipe.fileio import atomic_write, atomic_write_text, file_sha256, read_json
from skippipe.model.checkpoint import save_safetensors, write_checkpoint_meta
from skippipe.model.config import ModelConfig

FORMAT = "skippipe-hdee-checkpoint"
VERSION = 1


class JobCheckpointError(UserError):
    """A job checkpoint that is incomplete, corrupt or from other settings."""


@dataclass
class Saved:
    path: Path
    step: int
    losses: list[float]
    extra: dict[str, Any]


def _commit(folder: Path, digest: str, step: int, losses: list[float], extra: dict[str, Any]) -> None:
    """Write the manifest into the partial folder ``.<folder.name>.partial`` and rename it."""
    tmp = folder.parent / f".{folder.name}.partial"
    names = sorted(p.name for p in tmp.iterdir() if p.is_file() and not p.name.startswith("."))
    manifest = {
        "format": FORMAT, "version": VERSION, "digest": digest, "step": step,
        "losses": [float(x) for x in losses], "files": {n: file_sha256(tmp / n) for n in names}, **extra,
    }
    atomic_write_text(tmp / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)


def _fresh_partial(folder: Path) -> Path:
    tmp = folder.parent / f".{folder.name}.partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def save_step(job_dir: Path, digest: str, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
              losses: list[float], keep: int) -> Path:
    """A resumable checkpoint after ``step`` steps; only the newest ``keep`` are kept."""
    folder = job_dir / "checkpoints" / fileio.step_folder_name(step)
    tmp = _fresh_partial(folder)
    save_safetensors(tmp / "model.safetensors", model.state_dict())
    atomic_write(tmp / "optim.pt", lambda path: torch.save(opt.state_dict(), path))
    _commit(folder, digest, step, losses, {})
    for old in step_folders(job_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def save_final(job_dir: Path, digest: str, cfg: ModelConfig, model: torch.nn.Module, losses: list[float],
               train: dict[str, Any], tokenizer: Any, extra: dict[str, Any]) -> Path:
    """The finished job: a skippipe model checkpoint plus the manifest; step checkpoints are removed."""
    folder = job_dir / "final"
    tmp = _fresh_partial(folder)
    save_safetensors(tmp / "model.safetensors", model.state_dict())
    write_checkpoint_meta(tmp, cfg, len(losses), [list(range(cfg.n_layers))], train=train, tokenizer=tokenizer)
    _commit(folder, digest, len(losses), losses, extra)
    shutil.rmtree(job_dir / "checkpoints", ignore_errors=True)
    return folder


def step_folders(job_dir: Path) -> list[Path]:
    """The job's checkpoint folders, oldest first."""
    return [p for _, p in fileio.step_folders(job_dir / "checkpoints")]


def verify(folder: Path, digest: str | None) -> Saved:
    """Check a checkpoint folder (manifest, files, sha256, job digest); one-line errors."""
    where = f"checkpoint {folder}"
    mf = folder / "manifest.json"
    if not mf.is_file():
        raise JobCheckpointError(f"{where}: manifest.json is missing")
    m = read_json(mf, JobCheckpointError, "manifest", label=f"{where}: manifest.json is corrupt")
    if not isinstance(m, dict) or m.get("format") != FORMAT or m.get("version") != VERSION:
        raise JobCheckpointError(f"{where}: not a {FORMAT} version {VERSION} manifest")
    if digest is not None and m.get("digest") != digest:
        raise JobCheckpointError(
            f"{where}: written with other settings (data, model or training changed); use --fresh or another run folder"
        )
    for name, sha in m.get("files", {}).items():
        f = folder / name
        if not f.is_file() or file_sha256(f) != sha:
            raise JobCheckpointError(f"{where}: {name} is missing or corrupt")
    extra = {k: v for k, v in m.items() if k not in ("format", "version", "digest", "step", "losses", "files")}
    return Saved(folder, int(m["step"]), [float(x) for x in m.get("losses", [])], extra)


def latest_step(job_dir: Path, digest: str) -> Saved | None:
    """The newest complete step checkpoint of this job, or None."""
    found = step_folders(job_dir)
    return verify(found[-1], digest) if found else None


def final_of(job_dir: Path, digest: str | None) -> Saved | None:
    folder = job_dir / "final"
    return verify(folder, digest) if (folder / "manifest.json").is_file() else None


def load_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def load_optimizer(folder: Path, opt: torch.optim.Optimizer) -> None:
    try:
        opt.load_state_dict(torch.load(folder / "optim.pt", weights_only=True))
    except (RuntimeError, ValueError, KeyError) as exc:
        raise JobCheckpointError(f"checkpoint {folder}: optimizer state does not fit ({exc})") from None
