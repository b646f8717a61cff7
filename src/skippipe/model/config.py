"""Model shapes: the ``ModelConfig`` dataclass and named presets.

``tiny`` is for CPU tests and experiments (a few million parameters); ``llama-500m``,
``llama-1.5b`` and ``llama-8b`` are the shapes of the paper for real hardware.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from skippipe.config_fields import check_fields, invalid, read_dataclass, show
from skippipe.errors import ConfigError
from skippipe.limits import MAX_CTX, MAX_LAYERS, MAX_PARAMS, MAX_VOCAB, MAX_WIDTH, at_most

ABOVE_ZERO = {"gt": 0}


@dataclass(frozen=True)
class ModelConfig:
    config_label: ClassVar[str] = "model"

    vocab_size: int = field(default=4096, metadata=at_most(MAX_VOCAB, min=1))
    d_model: int = field(default=128, metadata=at_most(MAX_WIDTH, min=1))
    n_layers: int = field(default=12, metadata=at_most(MAX_LAYERS, min=1))
    n_heads: int = field(default=4, metadata=at_most(MAX_WIDTH, min=1))
    # grouped-query attention: n_heads must be a multiple of it
    n_kv_heads: int = field(default=2, metadata=at_most(MAX_WIDTH, min=1))
    ffn_dim: int = field(default=352, metadata=at_most(MAX_WIDTH, min=1))  # SwiGLU hidden width
    ctx: int = field(default=128, metadata=at_most(MAX_CTX, min=1))  # maximum sequence length
    rope_theta: float = field(default=10000.0, metadata=ABOVE_ZERO)
    norm_eps: float = field(default=1e-5, metadata=ABOVE_ZERO)
    init_std: float = field(default=0.02, metadata=ABOVE_ZERO)
    seed: int = field(default=0, metadata={"min": 0})  # weights of layer i come from a generator seeded by (seed, i)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.d_model % self.n_heads:
            raise invalid(self, "d_model", f"d_model={self.d_model} is not a multiple of n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise invalid(self, "n_heads", f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise invalid(self, "n_heads", f"head size {self.d_model // self.n_heads} must be even for rotary embeddings")
        if self.num_params() > MAX_PARAMS:
            raise invalid(self, None, f"{self.num_params():.3g} parameters, more than the limit of {MAX_PARAMS:.0e}")

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
    base = _preset(name, "model")
    return read_dataclass(ModelConfig, overrides, f"model preset {name!r}", base=base) if overrides else base


def model_config_from_dict(data: dict[str, Any], base: ModelConfig | None = None, where: str = "model") -> ModelConfig:
    """Fields from a JSON/TOML table; a ``preset`` key picks the base. Unknown keys are errors."""
    if not isinstance(data, dict):
        raise ConfigError(f"must be a table such as {{preset = \"tiny\"}}, got {show(data)}", where=where)
    if "preset" in data:
        base = _preset(data["preset"], where)
    fields_only = {key: value for key, value in data.items() if key != "preset"}
    return read_dataclass(ModelConfig, fields_only, where, base=base or ModelConfig(), other_keys=["preset"])


def _preset(name: Any, where: str) -> ModelConfig:
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError(f"unknown model preset {show(name)} (known: {', '.join(PRESETS)})", where=where, key="preset")
    return PRESETS[name]
