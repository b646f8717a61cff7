"""Model shapes: the ``ModelConfig`` dataclass and named presets.

``tiny`` is for CPU tests and experiments (a few million parameters); ``llama-500m``,
``llama-1.5b`` and ``llama-8b`` are the shapes of the paper for real hardware.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from skippipe.config_fields import reject_unknown_keys, value_like
from skippipe.errors import UserError


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 4096
    d_model: int = 128
    n_layers: int = 12
    n_heads: int = 4
    n_kv_heads: int = 2  # grouped-query attention: n_heads must be a multiple of it
    ffn_dim: int = 352  # SwiGLU hidden width
    ctx: int = 128  # maximum sequence length
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    seed: int = 0  # weights of layer i come from a generator seeded by (seed, i)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "ctx"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"model: {name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise UserError(f"model: d_model={self.d_model} is not a multiple of n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise UserError(f"model: n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise UserError(f"model: head size {self.d_model // self.n_heads} must be even for rotary embeddings")
        if not self.rope_theta > 0 or not self.norm_eps > 0 or not self.init_std > 0:
            raise UserError("model: rope_theta, norm_eps and init_std must be > 0")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def layer_params(self) -> int:
        d, kv = self.d_model, self.n_kv_heads * self.head_dim
        return 2 * d * d + 2 * d * kv + 3 * d * self.ffn_dim + 2 * d

    def num_params(self) -> int:
        """Parameters of the whole model (untied embedding and head)."""
        return self.n_layers * self.layer_params() + 2 * self.vocab_size * self.d_model + self.d_model

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    "llama-500m": ModelConfig(
        vocab_size=32000, d_model=1024, n_layers=24, n_heads=16, n_kv_heads=16, ffn_dim=4096, ctx=1024
    ),
    "llama-1.5b": ModelConfig(
        vocab_size=32000, d_model=2048, n_layers=24, n_heads=16, n_kv_heads=16, ffn_dim=6144, ctx=1024
    ),
    "llama-8b": ModelConfig(
        vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, ctx=1024,
        rope_theta=500000.0,
    ),
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """A named preset, optionally with some fields replaced (e.g. ``vocab_size`` from the tokenizer)."""
    if name not in PRESETS:
        raise UserError(f"unknown model preset {name!r} (known: {', '.join(PRESETS)})")
    return model_config_from_dict(overrides, base=PRESETS[name], where=f"model preset {name!r}") if overrides else PRESETS[name]


def model_config_from_dict(data: dict[str, Any], base: ModelConfig | None = None, where: str = "model") -> ModelConfig:
    """Fields from a JSON/TOML table; a ``preset`` key picks the base. Unknown keys are errors."""
    data = dict(data)
    if "preset" in data:
        base = get_preset(str(data.pop("preset")))
    base = base or ModelConfig()
    reject_unknown_keys(data, ["preset", *(f.name for f in fields(ModelConfig))], where)
    for key, value in data.items():
        data[key] = value_like(getattr(base, key), value, key, where)
    return replace(base, **data)
