"""Checkpoints: a directory that eval, export and a resumed run can read.

::

    CKPT/
      config.json            {"format": "skippipe-checkpoint", "version": 1, "step": 200,
                              "model": {ModelConfig fields}, "stage_layers": [[0, 1], [2, 3], ...],
                              "train": {TrainConfig fields} | null, "tokenizer": "tokenizer.json" | "bytes" | null}
      model.safetensors      the full model (``Llama`` names: embed_tokens.weight, layers.<i>.*, norm.weight, lm_head.weight)
        or stage-<s>.safetensors, one per stage (what a distributed run writes: the first node of
        each stage group writes its stage's ``state_dict()``); together they hold the full model
      plan.json              the plan it was trained with (optional)
      tokenizer.json         the tokenizer (optional; ``"bytes"`` in config.json means the byte fallback)

Every file is written atomically (temp file + rename); ``config.json`` is written last.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from skippipe.errors import UserError
from skippipe.fileio import atomic_write, atomic_write_text, name_inside, read_json
from skippipe.model.config import ModelConfig, model_config_from_dict
from skippipe.planfile import Plan

CHECKPOINT_FORMAT = "skippipe-checkpoint"
CHECKPOINT_VERSION = 1


@dataclass
class Checkpoint:
    path: Path
    model: ModelConfig
    state_dict: dict[str, torch.Tensor]
    step: int
    stage_layers: list[list[int]]
    train: dict[str, Any] | None
    tokenizer_file: Path | None  # a tokenizers JSON file; None when absent
    tokenizer_kind: str | None  # "bpe", "bytes" or None
    plan_file: Path | None


def save_safetensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    from safetensors.torch import save_file

    cpu = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    atomic_write(path, lambda tmp: save_file(cpu, tmp, metadata=metadata))


def save_stage_shard(directory: str | Path, stage: int, module: torch.nn.Module) -> Path:
    """The runtime's part: the first node of stage ``stage`` writes its copy."""
    path = Path(directory) / f"stage-{stage}.safetensors"
    save_safetensors(path, module.state_dict(), {"stage": str(stage)})
    return path


def write_checkpoint_meta(
    directory: str | Path,
    model: ModelConfig,
    step: int,
    stage_layers: list[list[int]],
    train: dict[str, Any] | None = None,
    plan: Plan | None = None,
    tokenizer: Any | None = None,
) -> None:
    """config.json (+ plan.json, tokenizer.json). Call after the weights are written."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tok_entry: str | None = None
    if tokenizer is not None:
        if getattr(tokenizer, "kind", None) == "bytes":
            tok_entry = "bytes"
        else:
            tokenizer.save(d / "tokenizer.json")
            tok_entry = "tokenizer.json"
    if plan is not None:
        atomic_write_text(d / "plan.json", json.dumps(plan.to_dict(), indent=1) + "\n")
    meta = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "step": int(step),
        "model": model.to_dict(),
        "stage_layers": [[int(i) for i in ls] for ls in stage_layers],
        "train": train,
        "tokenizer": tok_entry,
    }
    atomic_write_text(d / "config.json", json.dumps(meta, indent=1) + "\n")


def save_checkpoint(
    directory: str | Path,
    model: ModelConfig,
    state_dict: dict[str, torch.Tensor],
    step: int,
    stage_layers: list[list[int]],
    train: dict[str, Any] | None = None,
    plan: Plan | None = None,
    tokenizer: Any | None = None,
) -> Path:
    """A single-file checkpoint (model.safetensors), as the reference executor writes it."""
    d = Path(directory)
    save_safetensors(d / "model.safetensors", state_dict, {"format": CHECKPOINT_FORMAT})
    for old in d.glob("stage-*.safetensors"):
        old.unlink()
    write_checkpoint_meta(d, model, step, stage_layers, train, plan, tokenizer)
    return d


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        raise UserError(f"{path}: cannot read safetensors ({exc})") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_checkpoint(directory: str | Path) -> Checkpoint:
    d = Path(directory)
    cfg_path = d / "config.json"
    if not d.is_dir() or not cfg_path.is_file():
        raise UserError(f"{d}: not a checkpoint directory (no config.json)")
    meta = read_json(cfg_path, UserError, "checkpoint config")
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise UserError(f"{d}: config.json is not a skippipe checkpoint (for a Hugging Face directory use --hf)")
    version, step = meta.get("version", 0), meta.get("step", 0)
    if not _is_int(version) or not _is_int(step) or step < 0:
        raise UserError(f"{cfg_path}: version and step must be non-negative integers")
    if version > CHECKPOINT_VERSION:
        raise UserError(f"{d}: checkpoint version {version} is newer than this skippipe reads")
    if not isinstance(meta.get("model") or {}, dict):
        raise UserError(f"{cfg_path}: model must be an object of model settings")
    model = model_config_from_dict(dict(meta.get("model") or {}), where=f"{cfg_path}: model")
    raw_layers = meta.get("stage_layers") or [list(range(model.n_layers))]
    if not isinstance(raw_layers, list) or not all(isinstance(ls, list) and all(_is_int(x) for x in ls) for ls in raw_layers):
        raise UserError(f"{cfg_path}: stage_layers must be a list of lists of layer ids")
    stage_layers = [list(ls) for ls in raw_layers]
    full = d / "model.safetensors"
    if full.is_file():
        state = _load_tensors(full)
    else:
        shards = [d / f"stage-{s}.safetensors" for s in range(len(stage_layers))]
        missing = [p.name for p in shards if not p.is_file()]
        if missing:
            raise UserError(f"{d}: no model.safetensors and missing stage shard(s) {', '.join(missing)}")
        state = {}
        for p in shards:
            state.update(_load_tensors(p))
    tok = meta.get("tokenizer")
    tok_file = name_inside(d, tok, "tokenizer") if tok is not None and tok != "bytes" else None
    if tok_file is not None and not tok_file.is_file():
        raise UserError(f"{d}: config.json names tokenizer {tok!r}, which is missing")
    plan_file = d / "plan.json"
    return Checkpoint(
        path=d, model=model, state_dict=state, step=step, stage_layers=stage_layers,
        train=meta.get("train"), tokenizer_file=tok_file,
        tokenizer_kind="bytes" if tok == "bytes" else ("bpe" if tok_file else None),
        plan_file=plan_file if plan_file.is_file() else None,
    )


def model_with_weights(cfg: ModelConfig, state: dict[str, torch.Tensor], where: str) -> Any:
    """A ``Llama`` of ``cfg`` holding ``state``, in eval mode; one ``UserError`` line when a name
    is missing or extra or a shape differs from what the config makes."""
    from skippipe.model.llama import Llama

    model = Llama(cfg)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise UserError(f"{where}: weights do not match the model config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise UserError(
                f"{where}: weight {name} has shape {list(state[name].shape)} but the model config makes {list(shape)}"
            )
    model.load_state_dict(state)
    model.eval()
    return model


def load_model(ckpt: Checkpoint) -> Any:
    """The checkpoint's weights in a ``Llama``; a clear error when they do not fit the config."""
    return model_with_weights(ckpt.model, ckpt.state_dict, str(ckpt.path))


