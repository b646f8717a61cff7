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

Unknown keys and wrong types are one-line ``ConfigError``s naming the file, table and key. Torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from skippipe.config_fields import check_fields, invalid, read_config_file, read_dataclass, show
from skippipe.errors import ConfigError
from skippipe.limits import MAX_CTX, MAX_SAMPLES, MAX_VOCAB, at_most
from skippipe.model.config import ModelConfig, model_config_from_dict

Corpus = Literal["shakespeare", "bible"]
GradDivisor = Literal["visits", "microbatches", "reference"]  # see skippipe.train.grads
Precision = Literal["fp32", "bf16"]  # see skippipe.train.ops
CORPORA: tuple[str, ...] = get_args(Corpus)
GRAD_DIVISORS: tuple[str, ...] = get_args(GradDivisor)

POSITIVE = {"min": 1}
NON_NEGATIVE = {"min": 0}
BELOW_ONE = {"min": 0, "lt": 1}


@dataclass(frozen=True)
class TrainConfig:
    config_label: ClassVar[str] = "train"

    # model: a preset plus overrides; vocab_size is always taken from the tokenizer
    model: dict[str, Any] = field(default_factory=lambda: {"preset": "tiny"})
    # data
    data: str | None = None  # a folder made by `skippipe prepare` (then corpus, tokenizer, vocab_size are unused)
    corpus: tuple[Corpus, ...] = field(default=CORPORA, metadata={"min_len": 1})
    tokenizer: str = "bpe"  # "bpe" (trained on the corpus, cached), "bytes", "gpt2" or a tokenizer.json path
    vocab_size: int = field(default=0, metadata=at_most(MAX_VOCAB, min=0))  # BPE vocabulary size; 0: the model preset's
    val_fraction: float = field(default=0.05, metadata={"gt": 0, "lt": 0.5})  # the tail of every document goes to validation
    sharding: Literal["stream", "node"] = "stream"  # "stream": one global sample stream; "node": each data node its shard
    sampling: Literal["auto", "random", "epoch"] = "auto"  # "epoch": each window once per epoch; auto: epoch with `data`
    samples_per_microbatch: int = field(default=4, metadata=at_most(MAX_SAMPLES, min=1))
    seq_len: int = field(default=0, metadata=at_most(MAX_CTX, min=0))  # tokens per sample; 0 = the model's context
    # optimisation
    steps: int = field(default=200, metadata=POSITIVE)
    lr: float = field(default=6e-4, metadata={"gt": 0})
    min_lr: float = field(default=6e-5, metadata=NON_NEGATIVE)
    warmup_steps: int = field(default=20, metadata=NON_NEGATIVE)
    weight_decay: float = field(default=0.1, metadata=NON_NEGATIVE)
    beta1: float = field(default=0.9, metadata=BELOW_ONE)
    beta2: float = field(default=0.95, metadata=BELOW_ONE)
    eps: float = field(default=1e-8, metadata={"gt": 0})
    grad_clip: float = 1.0
    grad_divisor: GradDivisor = "visits"
    seed: int = field(default=0, metadata=NON_NEGATIVE)  # data order
    # "bf16": forward and loss under torch.autocast(bfloat16); weights, gradients and AdamW stay fp32
    precision: Precision = "fp32"
    activation_checkpointing: bool = False  # recompute each layer's activations in the backward (less memory)
    # evaluation
    eval_every: int = field(default=0, metadata=NON_NEGATIVE)  # iterations between validation runs (0: only at the end)
    eval_batches: int = field(default=8, metadata=POSITIVE)
    eval_batch_size: int = field(default=8, metadata=at_most(MAX_SAMPLES, min=1))
    cache_dir: str | None = None  # tokenizer/token cache (default: $SKIPPIPE_CACHE or ~/.cache/skippipe)

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.min_lr <= self.lr:
            raise invalid(self, "min_lr", f"need 0 < lr and 0 <= min_lr <= lr (lr={self.lr}, min_lr={self.min_lr})")
        if self.tokenizer not in ("bpe", "bytes", "gpt2") and not self.tokenizer.endswith(".json"):
            raise invalid(self, "tokenizer", f"must be 'bpe', 'bytes', 'gpt2' or a tokenizer.json path, got {self.tokenizer!r}")
        if self.tokenizer == "bpe" and 0 < self.vocab_size <= 256:
            raise invalid(self, "vocab_size", f"a BPE vocabulary needs more than 256 entries, got {self.vocab_size}")
        model_config_from_dict(self.model, where="train: model")  # validate early

    def model_config(self, vocab_size: int) -> ModelConfig:
        """The model this run trains: its vocabulary follows the tokenizer (``vocab_size``), or a
        ``[model] vocab_size`` at least that large (e.g. padded to a multiple of 64)."""
        asked = self.model.get("vocab_size")
        if asked is not None and asked < vocab_size:
            raise ConfigError(f"[model] vocab_size = {asked} is smaller than the tokenizer's {vocab_size} tokens", where="train")
        return model_config_from_dict({**self.model, "vocab_size": asked or vocab_size}, where="train: model")

    def vocab_note(self, vocab_size: int) -> str | None:
        """One line when the tokenizer changes the model preset's vocabulary size, else None."""
        base = model_config_from_dict(self.model, where="train: model")
        model = self.model_config(vocab_size)
        if base.vocab_size == model.vocab_size:
            return None
        return (
            f"model: preset {self.model.get('preset', 'tiny')!r} has a vocabulary of {base.vocab_size:,}; it follows the "
            f"tokenizer's {model.vocab_size:,} ({base.num_params() / 1e6:,.1f} M -> {model.num_params() / 1e6:,.1f} M parameters)"
        )

    def bpe_vocab_size(self) -> int:
        """Entries of the BPE trained on the corpus: ``vocab_size``, else the model preset's."""
        return self.vocab_size or model_config_from_dict(self.model, where="train: model").vocab_size

    def resolved_sampling(self) -> str:
        return self.sampling if self.sampling != "auto" else ("epoch" if self.data else "random")

    def tokens_per_sample(self, model: ModelConfig) -> int:
        return self.seq_len or model.ctx

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["corpus"] = list(self.corpus)
        return d


def train_config_from_dict(data: dict[str, Any], where: str = "train") -> TrainConfig:
    """Fields at the top level, or a ``[train]`` table beside an optional ``[model]`` table."""
    if not isinstance(data, dict):
        raise ConfigError(f"must be a table, got {show(data)}", where=where)
    data = dict(data)
    table_where, model_where = where, f"{where}: model"
    if "train" in data:
        extra = sorted(str(key) for key in data if key not in ("train", "model"))
        if extra:
            raise ConfigError(
                f"unknown top-level key(s) {', '.join(extra)} beside [train] (allowed: train, model)",
                where=where, key=extra[0],
            )
        model = data.get("model")
        data = data["train"]
        table_where, model_where = f"{where} [train]", f"{where} [model]"
        if not isinstance(data, dict):
            raise ConfigError(f"must be a table, got {show(data)}", where=table_where)
        if model is not None:
            if "model" in data:
                raise ConfigError("the model goes in the [model] table, not in [train]", where=table_where, key="model")
            data = {**data, "model": model}
    if "corpus" in data and isinstance(data["corpus"], str):
        data = {**data, "corpus": [data["corpus"]]}  # one corpus may be named without a list
    if "model" in data:
        model_config_from_dict(data["model"], where=model_where)  # its own errors name [model]
    return read_dataclass(TrainConfig, data, table_where)


def load_train_config(path: str | Path) -> TrainConfig:
    p = Path(path)
    data = read_config_file(p, default_format="json", what="config file")
    return train_config_from_dict(data, where=str(p))
