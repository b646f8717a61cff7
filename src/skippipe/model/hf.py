"""Hugging Face interop: export to / import from a ``LlamaForCausalLM`` directory.

The export writes ``config.json`` (``model_type: llama``) and ``model.safetensors`` with
Hugging Face's parameter names (ours with a ``model.`` prefix, ``lm_head.weight`` as is) and,
when known, the tokenizer as ``tokenizer.json``. ``transformers`` is not needed to export or
import; it is only needed to load the result with ``LlamaForCausalLM.from_pretrained``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from skippipe.errors import UserError
from skippipe.fileio import atomic_dir, atomic_write_text, read_json
from skippipe.model.checkpoint import _load_tensors, model_with_weights, save_safetensors
from skippipe.model.config import ModelConfig


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.ctx,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": cfg.init_std,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": None,
        "skippipe_seed": cfg.seed,
    }


def to_hf_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {(k if k == "lm_head.weight" else f"model.{k}"): v for k, v in state.items()}


def from_hf_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in state.items():
        if k.endswith("rotary_emb.inv_freq"):
            continue
        out[k[len("model.") :] if k.startswith("model.") else k] = v
    return out


def export_hf(
    directory: str | Path, cfg: ModelConfig, state: dict[str, torch.Tensor], tokenizer_file: Path | None = None
) -> Path:
    """Write a Hugging Face LLaMA folder; all of it or, on any error, nothing (``fileio.atomic_dir``)."""
    config = hf_config(cfg)
    files: dict[str, str] = {}
    if tokenizer_file is not None:  # checked before anything is written
        from skippipe.data.tokenizers_hf import load_tokenizer_json

        tok = load_tokenizer_json(tokenizer_file)  # generate() stops at its end-of-text token
        config.update(eos_token_id=tok.eot_id, pad_token_id=tok.eot_id)
        special = {"eos_token": tok.eot_token, "pad_token": tok.eot_token}
        tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.ctx, **special}
        files["tokenizer.json"] = Path(tokenizer_file).read_text(encoding="utf-8")
        files["tokenizer_config.json"] = json.dumps(tok_config, indent=1) + "\n"
        files["special_tokens_map.json"] = json.dumps(special, indent=1) + "\n"
    files["config.json"] = json.dumps(config, indent=1) + "\n"
    d = Path(directory)
    with atomic_dir(d) as tmp:
        save_safetensors(tmp / "model.safetensors", to_hf_names(state), {"format": "pt"})
        for name, text in files.items():
            atomic_write_text(tmp / name, text)
    return d


def config_from_hf(data: dict[str, Any], where: str) -> ModelConfig:
    if data.get("model_type") != "llama":
        raise UserError(f"{where}: model_type is {data.get('model_type')!r}, only 'llama' can be imported")
    if data.get("tie_word_embeddings"):
        raise UserError(f"{where}: tied embeddings are not supported")
    if data.get("attention_bias") or data.get("mlp_bias"):
        raise UserError(f"{where}: attention/MLP biases are not supported")
    rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise UserError(f"{where}: rope scaling {rope.get('rope_type')!r} is not supported")
    try:
        n_heads = int(data["num_attention_heads"])
        cfg = ModelConfig(
            vocab_size=int(data["vocab_size"]),
            d_model=int(data["hidden_size"]),
            n_layers=int(data["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(data.get("num_key_value_heads") or n_heads),
            ffn_dim=int(data["intermediate_size"]),
            ctx=int(data.get("max_position_embeddings", 2048)),
            rope_theta=float(rope.get("rope_theta", data.get("rope_theta", 10000.0))),
            norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            init_std=float(data.get("initializer_range", 0.02)),
            seed=int(data.get("skippipe_seed", 0)),
        )
    except KeyError as exc:
        raise UserError(f"{where}: config.json lacks {exc.args[0]!r}") from None
    if data.get("head_dim") not in (None, cfg.head_dim):
        raise UserError(f"{where}: head_dim {data['head_dim']} != hidden_size / heads ({cfg.head_dim})")
    return cfg


def import_hf(directory: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, state dict with our names) from a Hugging Face LLaMA directory."""
    d = Path(directory)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise UserError(f"{d}: no config.json, not a Hugging Face model directory")
    data = read_json(cfg_path, UserError, "config.json")
    if not isinstance(data, dict):
        raise UserError(f"{cfg_path}: expected a JSON object")
    cfg = config_from_hf(data, str(cfg_path))
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise UserError(f"{d}: no .safetensors weights (PyTorch .bin files are not read)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(_load_tensors(f))
    return cfg, {k: v.float() for k, v in from_hf_names(state).items()}


def load_hf_model(directory: str | Path) -> Any:
    cfg, state = import_hf(directory)
    return model_with_weights(cfg, state, str(directory))
