"""The ``skippipe hdee`` config: one TOML file, typed sections, validated here and nowhere else.

```toml
[run]            # run folder, seed, parallel jobs, checkpoints
[data]           # tokenizer, split fractions
[model]          # the medium expert M: a preset plus ModelConfig overrides
[sizes]          # S and L as overrides of M, e.g. S = {ffn_dim = 192}
[train]          # expert training (steps = the homogeneous step count)
[seed_model]     # optional seed model on the mixture (BTM branching, seed-loss difficulty)
[difficulty]     # how measured difficulty is taken
[ensemble]       # configurations, difficulty sources, evaluation windows
[[domains]]      # name, source, role ("train" or "eval"), difficulty (easy/moderate/hard)
```

Every key has a default except a domain's ``name`` and ``source``; unknown keys, wrong types and
inconsistent settings are one-line ``HDEEConfigError``s. Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar

from skippipe.config_fields import read_config_file, read_value
from skippipe.errors import ConfigError, UserError
from skippipe.model.config import ModelConfig, model_config_from_dict

SOURCES = ("shakespeare", "bible", "licenses", "python", "pydoc", "folder")
ROLES = ("train", "eval")
LEVELS = ("easy", "moderate", "hard")
SIZES = ("S", "M", "L")  # the size ladder: easy -> S, moderate -> M, hard -> L
CONFIGURATIONS = ("homogeneous", "steps", "size", "both")
DIFFICULTY_SOURCES = ("manual", "seed-loss", "probe")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


class HDEEConfigError(ConfigError):
    """An ``skippipe hdee`` config that cannot be used."""


def _reject_unknown(data: dict[str, Any], known: list[str], where: str) -> None:
    unknown = [str(k) for k in data if k not in known]
    if unknown:
        raise HDEEConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")


@dataclass(frozen=True)
class RunSection:
    dir: str = "runs/hdee"  # data, seed models, experts, plan and evaluation go here
    seed: int = 0  # model initialisation and data order (splits do not depend on it)
    jobs: int = 1  # training processes at once
    checkpoint_every: int = 100  # steps between resumable checkpoints of an expert (0: only the final one)
    keep_checkpoints: int = 2
    log_every: int = 50  # steps between progress lines

    def __post_init__(self) -> None:
        _at_least(self, "run", ("seed", "checkpoint_every", "log_every"), 0)
        _at_least(self, "run", ("jobs", "keep_checkpoints"), 1)


@dataclass(frozen=True)
class DataSection:
    tokenizer: str = "bpe"  # "bpe" (trained on the training domains' training split) or "bytes"
    vocab_size: int = 1024
    val_fraction: float = 0.1  # share of each domain's characters, in whole documents
    test_fraction: float = 0.1
    split_salt: str = "hdee"  # the document order the split follows is a hash of salt + document name
    cache_dir: str = ""  # tokenizer cache ("" = $SKIPPIPE_CACHE or ~/.cache/skippipe)

    def __post_init__(self) -> None:
        if self.tokenizer not in ("bpe", "bytes"):
            raise HDEEConfigError(f"data: tokenizer must be 'bpe' or 'bytes', got {self.tokenizer!r}")
        if self.tokenizer == "bpe" and self.vocab_size <= 256:
            raise HDEEConfigError(f"data: a BPE vocabulary needs more than 256 entries, got {self.vocab_size}")
        if not (0 < self.val_fraction < 0.5 and 0 < self.test_fraction < 0.5):
            raise HDEEConfigError("data: val_fraction and test_fraction must each be in (0, 0.5)")


@dataclass(frozen=True)
class TrainSection:
    where: ClassVar[str] = "train"
    steps: int = 400  # steps of every expert in the homogeneous configuration
    batch_size: int = 16  # windows of ctx tokens per step
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 20
    weight_decay: float = 0.1
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        where = self.where
        _at_least(self, where, ("steps", "warmup_steps"), 0)
        _at_least(self, where, ("batch_size",), 1)
        if not 0 < self.lr or not 0 <= self.min_lr <= self.lr:
            raise HDEEConfigError(f"{where}: need 0 < lr and 0 <= min_lr <= lr (lr={self.lr}, min_lr={self.min_lr})")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise HDEEConfigError(f"{where}: weight_decay and grad_clip must be >= 0")


@dataclass(frozen=True)
class SeedModelSection(TrainSection):
    where: ClassVar[str] = "seed_model"
    steps: int = 0  # 0: no seed model (experts start from scratch)
    lr: float = 3e-3
    min_lr: float = 3e-4
    branch: bool = True  # experts start from the seed model of their size (BTM)


@dataclass(frozen=True)
class DifficultySection:
    eval_windows: int = 64  # validation windows per domain for the seed-loss score
    probe_steps: int = 60  # steps of each probe run (difficulty source "probe")

    def __post_init__(self) -> None:
        _at_least(self, "difficulty", ("eval_windows", "probe_steps"), 1)


@dataclass(frozen=True)
class EnsembleSection:
    configurations: tuple[str, ...] = CONFIGURATIONS
    difficulty: tuple[str, ...] = ("manual",)  # difficulty sources the heterogeneous configurations use
    spread: float = 0.25  # steps of an easy / hard expert: (1 -/+ spread) x the homogeneous steps
    budget_tolerance: float = 0.01  # largest relative FLOPs difference from the homogeneous budget
    eval_windows: int = 256  # test windows per domain
    prior_windows: int = 64  # validation windows per domain for the estimated prior
    batch_size: int = 16

    def __post_init__(self) -> None:
        _choices(self.configurations, CONFIGURATIONS, "ensemble: configurations")
        _choices(self.difficulty, DIFFICULTY_SOURCES, "ensemble: difficulty", allow_empty=True)
        if not 0 <= self.spread < 1:
            raise HDEEConfigError(f"ensemble: spread must be in [0, 1), got {self.spread}")
        if not 0 < self.budget_tolerance < 1:
            raise HDEEConfigError(f"ensemble: budget_tolerance must be in (0, 1), got {self.budget_tolerance}")
        _at_least(self, "ensemble", ("eval_windows", "prior_windows", "batch_size"), 1)


@dataclass(frozen=True)
class DomainSpec:
    name: str = ""
    source: str = ""  # one of SOURCES
    role: str = "train"  # "train": has an expert; "eval": held out, evaluation only
    difficulty: str = ""  # easy / moderate / hard: the manual guess ("" when not given)
    path: str = ""  # folder of text files (source "folder"), relative to the config file
    glob: str = "**/*"  # which files of the folder are documents

    def __post_init__(self) -> None:
        where = f"domains: {self.name or '(unnamed)'}"
        if not _NAME.match(self.name):
            raise HDEEConfigError(f"{where}: name must be lower-case letters, digits, '-' or '_', got {self.name!r}")
        if self.source not in SOURCES:
            raise HDEEConfigError(f"{where}: source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if self.role not in ROLES:
            raise HDEEConfigError(f"{where}: role must be 'train' or 'eval', got {self.role!r}")
        if self.difficulty and self.difficulty not in LEVELS:
            raise HDEEConfigError(f"{where}: difficulty must be one of {', '.join(LEVELS)}, got {self.difficulty!r}")
        if (self.source == "folder") != bool(self.path):
            raise HDEEConfigError(f"{where}: a 'path' is needed by, and only by, source = \"folder\"")


@dataclass(frozen=True)
class HDEEConfig:
    domains: tuple[DomainSpec, ...]
    run: RunSection = field(default_factory=RunSection)
    data: DataSection = field(default_factory=DataSection)
    model: dict[str, Any] = field(default_factory=lambda: {"preset": "tiny", "n_layers": 3, "d_model": 96, "ffn_dim": 256})
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)
    train: TrainSection = field(default_factory=TrainSection)
    seed_model: SeedModelSection = field(default_factory=SeedModelSection)
    difficulty: DifficultySection = field(default_factory=DifficultySection)
    ensemble: EnsembleSection = field(default_factory=EnsembleSection)

    def __post_init__(self) -> None:
        names = [d.name for d in self.domains]
        if len(set(names)) != len(names):
            raise HDEEConfigError(f"domains: names must be unique, got {names}")
        if len(self.train_domains) < 2:
            raise HDEEConfigError("domains: an ensemble needs at least two domains with role = \"train\"")
        if self.train.steps < 1:
            raise HDEEConfigError("train: steps must be at least 1")
        base = model_config_from_dict(dict(self.model), where="model")
        unknown = sorted(set(self.sizes) - set(SIZES))
        if unknown:
            raise HDEEConfigError(f"sizes: unknown size(s) {', '.join(unknown)} (known: {', '.join(SIZES)})")
        for size in SIZES:
            table = self.sizes.get(size, {})
            if not isinstance(table, dict) or "preset" in table:
                raise HDEEConfigError(f"sizes: {size} must be a table of model fields (no preset), e.g. {{ffn_dim = 192}}")
            sized = model_config_from_dict(dict(table), base=base, where=f"sizes: {size}")
            if sized.ctx != base.ctx or sized.vocab_size != base.vocab_size:
                raise HDEEConfigError(f"sizes: {size} may not change ctx or vocab_size (the experts share windows and tokens)")
        sources = self.ensemble.difficulty
        if any(c != "homogeneous" for c in self.ensemble.configurations) and not sources:
            raise HDEEConfigError("ensemble: heterogeneous configurations need at least one difficulty source")
        if "manual" in sources:
            missing = [d.name for d in self.train_domains if not d.difficulty]
            if missing:
                raise HDEEConfigError(f"domains: difficulty 'manual' needs a difficulty for {', '.join(missing)}")
        if "seed-loss" in sources and self.seed_model.steps < 1:
            raise HDEEConfigError("ensemble: difficulty 'seed-loss' needs a seed model ([seed_model] steps >= 1)")

    @property
    def train_domains(self) -> list[DomainSpec]:
        return [d for d in self.domains if d.role == "train"]

    @property
    def eval_domains(self) -> list[DomainSpec]:
        return [d for d in self.domains if d.role == "eval"]

    def size_table(self, size: str) -> dict[str, Any]:
        """ModelConfig overrides of ``size``; S and L default to 0.75 / 1.25 x M's MLP width."""
        if size in self.sizes:
            return dict(self.sizes[size])
        if size == "M":
            return {}
        ffn = model_config_from_dict(dict(self.model), where="model").ffn_dim
        small = max(1, round(0.75 * ffn))
        return {"ffn_dim": small if size == "S" else 2 * ffn - small}

    def model_config(self, size: str, vocab_size: int) -> ModelConfig:
        """The model of one size, with the tokenizer's vocabulary and the run's seed."""
        base = model_config_from_dict({**self.model, "vocab_size": vocab_size}, where="model")
        return replace(model_config_from_dict(self.size_table(size), base=base, where=f"sizes: {size}"), seed=self.run.seed)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["domains"] = [asdict(x) for x in self.domains]
        d["ensemble"]["configurations"] = list(self.ensemble.configurations)
        d["ensemble"]["difficulty"] = list(self.ensemble.difficulty)
        return d

    def with_run(self, **changes: Any) -> HDEEConfig:
        """A copy with some [run] keys replaced (command-line overrides)."""
        return replace(self, run=_section(RunSection, {**asdict(self.run), **changes}, "run"))


def _at_least(obj: object, where: str, names: tuple[str, ...], low: int) -> None:
    for name in names:
        if getattr(obj, name) < low:
            raise HDEEConfigError(f"{where}: {name} must be at least {low}, got {getattr(obj, name)}")


def _choices(values: tuple[str, ...], known: tuple[str, ...], where: str, allow_empty: bool = False) -> None:
    if not values and not allow_empty:
        raise HDEEConfigError(f"{where}: give at least one of {', '.join(known)}")
    bad = [v for v in values if v not in known]
    if bad or len(set(values)) != len(values):
        raise HDEEConfigError(f"{where}: must list distinct values from {', '.join(known)}, got {list(values)}")


def _section(cls: type, data: Any, where: str) -> Any:
    """A section dataclass from a TOML table: unknown keys and values unlike their defaults are errors."""
    if not isinstance(data, dict):
        raise HDEEConfigError(f"{where} must be a table")
    _reject_unknown(data, [f.name for f in fields(cls)], where)
    defaults = {f.name: f.default for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        default = defaults[key]
        if isinstance(default, tuple):
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise HDEEConfigError(f"{where}: {key} must be a list of strings, got {value!r}")
            kwargs[key] = tuple(value)
        else:
            try:
                kwargs[key] = read_value(type(default), value, key, {}, where, HDEEConfigError)
            except UserError as exc:
                raise HDEEConfigError(str(exc)) from None
    return cls(**kwargs)


_SECTIONS: dict[str, type] = {
    "run": RunSection, "data": DataSection, "train": TrainSection, "seed_model": SeedModelSection,
    "difficulty": DifficultySection, "ensemble": EnsembleSection,
}


def hdee_config_from_dict(data: dict[str, Any], base_dir: Path | None = None, where: str = "config") -> HDEEConfig:
    """The config from a parsed TOML/JSON table; folder paths are made relative to ``base_dir``."""
    _reject_unknown(data, [*_SECTIONS, "model", "sizes", "domains"], where)
    kwargs: dict[str, Any] = {name: _section(cls, data[name], name) for name, cls in _SECTIONS.items() if name in data}
    for name in ("model", "sizes"):
        if name in data:
            if not isinstance(data[name], dict):
                raise HDEEConfigError(f"{name} must be a table")
            kwargs[name] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data[name].items()}
    raw = data.get("domains")
    if not isinstance(raw, list) or not raw or not all(isinstance(d, dict) for d in raw):
        raise HDEEConfigError(f"{where}: needs [[domains]] tables (name, source, role, difficulty)")
    domains = []
    for i, table in enumerate(raw):
        for key in ("name", "source"):
            if key not in table:
                raise HDEEConfigError(f"domains: entry {i + 1} has no {key!r}")
        spec = _section(DomainSpec, table, f"domains: {table.get('name', i + 1)}")
        if spec.path and base_dir is not None and not Path(spec.path).is_absolute():
            spec = replace(spec, path=str((base_dir / spec.path).resolve()))
        domains.append(spec)
    try:
        return HDEEConfig(domains=tuple(domains), **kwargs)
    except UserError as exc:
        raise HDEEConfigError(str(exc)) from None


def load_hdee_config(path: str | Path) -> HDEEConfig:
    p = Path(path)
    data = read_config_file(p, default_format="toml", error=HDEEConfigError, what="config file")
    try:
        return hdee_config_from_dict(data, base_dir=p.resolve().parent, where=str(p))
    except HDEEConfigError as exc:
        raise HDEEConfigError(f"{p}: {exc}") from None
