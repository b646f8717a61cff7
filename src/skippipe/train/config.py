"""Training settings: the ``TrainConfig`` dataclass, read from TOML or JSON.

A file holds the fields at the top level or under a ``[train]`` table, and optionally a
``[model]`` table (``preset = "tiny"`` plus any ``ModelConfig`` field to override)::

    [train]
    steps = 200
    lr = 1e-3
    samples_per_microbatch = 4

    [model]
    preset = "tiny"
    n_layers = 12

Unknown keys and wrong types are one-line ``UserError``s. Torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from skippipe.config_fields import read_config_file, reject_unknown_keys, value_like
from skippipe.errors import UserError
from skippipe.model.config import ModelConfig, model_config_from_dict

CORPORA = ("shakespeare", "bible")
GRAD_DIVISORS: tuple[str, ...] = ("visits", "microbatches", "reference")  # see skippipe.train.grads


@dataclass(frozen=True)
class TrainConfig:
    # model: a preset plus overrides; vocab_size is always taken from the tokenizer
    model: dict[str, Any] = field(default_factory=lambda: {"preset": "tiny"})
    # data
    corpus: tuple[str, ...] = CORPORA
    tokenizer: str = "bpe"  # "bpe" (trained on the corpus, cached) or "bytes"
    vocab_size: int = 4096  # BPE vocabulary size
    val_fraction: float = 0.05  # the tail of every document goes to validation
    sharding: str = "stream"  # "stream": one global sample stream; "node": each data node its shard
    samples_per_microbatch: int = 4
    seq_len: int = 0  # tokens per sample; 0 = the model's context
    # optimisation
    steps: int = 200
    lr: float = 6e-4
    min_lr: float = 6e-5
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    grad_divisor: str = "visits"
    seed: int = 0  # data order
    # evaluation
    eval_every: int = 0  # iterations between validation runs (0: only at the end)
    eval_batches: int = 8
    eval_batch_size: int = 8
    cache_dir: str | None = None  # tokenizer/token cache (default: $SKIPPIPE_CACHE or ~/.cache/skippipe)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "samples_per_microbatch", "steps", "eval_batches", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise UserError(f"train: {name} must be at least 1, got {getattr(self, name)}")
        for name in ("seq_len", "warmup_steps", "eval_every", "seed"):
            if getattr(self, name) < 0:
                raise UserError(f"train: {name} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.lr or not 0 <= self.min_lr <= self.lr:
            raise UserError(f"train: need 0 < lr and 0 <= min_lr <= lr (lr={self.lr}, min_lr={self.min_lr})")
        if not 0 <= self.beta1 < 1 or not 0 <= self.beta2 < 1 or not self.eps > 0 or self.weight_decay < 0:
            raise UserError("train: need 0 <= beta1, beta2 < 1, eps > 0 and weight_decay >= 0")
        if not 0 < self.val_fraction < 0.5:
            raise UserError(f"train: val_fraction must be in (0, 0.5), got {self.val_fraction}")
        if self.grad_divisor not in GRAD_DIVISORS:
            raise UserError(f"train: grad_divisor must be one of {', '.join(GRAD_DIVISORS)}, got {self.grad_divisor!r}")
        if self.tokenizer not in ("bpe", "bytes"):
            raise UserError(f"train: tokenizer must be 'bpe' or 'bytes', got {self.tokenizer!r}")
        if self.sharding not in ("stream", "node"):
            raise UserError(f"train: sharding must be 'stream' or 'node', got {self.sharding!r}")
        if not self.corpus or any(c not in CORPORA for c in self.corpus):
            raise UserError(f"train: corpus must list some of {', '.join(CORPORA)}, got {list(self.corpus)}")
        if self.tokenizer == "bpe" and self.vocab_size <= 256:
            raise UserError(f"train: a BPE vocabulary needs more than 256 entries, got {self.vocab_size}")
        model_config_from_dict(self.model, where="train: model")  # validate early

    def model_config(self, vocab_size: int) -> ModelConfig:
        """The model this run trains, with the tokenizer's vocabulary size."""
        return model_config_from_dict({**self.model, "vocab_size": vocab_size}, where="train: model")

    def tokens_per_sample(self, model: ModelConfig) -> int:
        return self.seq_len or model.ctx

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["corpus"] = list(self.corpus)
        return d


def train_config_from_dict(data: dict[str, Any], where: str = "train") -> TrainConfig:
    data = dict(data)
    if "train" in data and isinstance(data["train"], dict):
        model = data.pop("model", None)
        extra = sorted(set(data) - {"train"})
        if extra:
            raise UserError(f"{where}: unknown top-level key(s) {', '.join(extra)} beside [train] (allowed: train, model)")
        data = dict(data["train"])
        if model is not None:
            data["model"] = model
    reject_unknown_keys(data, (f.name for f in fields(TrainConfig)), where)
    defaults = TrainConfig()
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "model":
            if not isinstance(value, dict):
                raise UserError(f"{where}: model must be a table such as {{preset = \"tiny\"}}")
            kwargs[key] = dict(value)
        elif key == "corpus":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise UserError(f"{where}: corpus must be a list of names")
            kwargs[key] = tuple(value)
        else:  # cache_dir (default None) must be a string too
            kwargs[key] = value_like(getattr(defaults, key), value, key, where)
    return TrainConfig(**kwargs)


def load_train_config(path: str | Path) -> TrainConfig:
    p = Path(path)
    data = read_config_file(p, default_format="json", what="config file")
    return train_config_from_dict(data, where=str(p))
