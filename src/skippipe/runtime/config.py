"""The ``skippipe train`` config: one TOML file, four tables, every key with an embedded default.

```toml
[run]                     # where results go, how often to checkpoint
dir = "runs/train-tiny"

[plan]                    # the cluster and how to plan it (or a ready plan file)
cluster = "gcp-2025/geo-distributed/12"
method = "skippipe"

[train]                   # model, data and optimiser: skippipe.train.config.TrainConfig
steps = 40

[model]                   # a model preset plus overrides: skippipe.model.config.ModelConfig
preset = "tiny"

[runtime]                 # processes, transport, WAN emulation, timeouts
time_scale = 0.02
```

Every table and key is optional; unknown keys and wrong types are one-line ``UserError``s.
A plan or cluster file named in the config is found relative to the config's folder; the run
folder ``[run] dir`` is relative to the current directory. Torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from skippipe.config_fields import read_config_file, reject_unknown_keys, value_like
from skippipe.errors import UserError
from skippipe.workload import Workload

PLAN_METHODS = ("full", "random", "naive", "skippipe-no-tc2", "skippipe")


@dataclass(frozen=True)
class RunSection:
    dir: str = "runs/train-tiny"  # metrics, checkpoints, plan, timeline, logs
    checkpoint_every: int = 0  # iterations between checkpoints (0: only at the end; -1: never)
    keep_checkpoints: int = 2  # newest checkpoints kept (older ones are deleted)
    timeline_iteration: int = -1  # the iteration (1-based) whose timeline is drawn (-1: the last one)
    log_every: int = 1  # iterations between metric records

    def __post_init__(self) -> None:
        _at_least(self, "checkpoint_every", -1)
        _at_least(self, "keep_checkpoints", 1)
        _at_least(self, "log_every", 1)
        if self.timeline_iteration != -1 and self.timeline_iteration < 1:
            raise UserError(f"run: timeline_iteration must be -1 (the last) or an iteration >= 1, got {self.timeline_iteration}")


@dataclass(frozen=True)
class PlanSection:
    file: str | None = None  # a plan file to use as is (then cluster/method/workload are ignored)
    cluster: str = "gcp-2025/geo-distributed/12"  # TABLE/SETTING/N, a shipped example, or a file
    method: str = "skippipe"
    seed: int = 0
    time_limit_s: float = 10.0
    num_stages: int = 4
    path_length: int = 3  # stages each microbatch visits, stage 0 included (skip 1 - L/S)
    microbatches_per_data_node: int = 4
    memory: int = 2  # activation slots per node (M)
    max_swaps: int = 1
    max_jump: int = 4  # a visit goes at most this many stages past the highest one reached
    stage_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.file is None and self.method not in PLAN_METHODS:
            raise UserError(f"plan: method must be one of {', '.join(PLAN_METHODS)}, got {self.method!r}")
        if not self.time_limit_s > 0:
            raise UserError("plan: time_limit_s must be > 0")

    def workload(self, n_layers: int, d_model: int, ctx: int, samples: int) -> Workload:
        """The planning workload: this table's pipeline shape with the model's dimensions."""
        return Workload(
            num_stages=self.num_stages,
            path_length=self.path_length,
            microbatches_per_data_node=self.microbatches_per_data_node,
            samples_per_microbatch=samples,
            memory=self.memory,
            d_model=d_model,
            ctx=ctx,
            n_layers=n_layers,
            max_swaps=self.max_swaps,
            max_jump=self.max_jump,
            stage_sizes=self.stage_sizes,
        )


@dataclass(frozen=True)
class RuntimeSection:
    backend: str = "gloo"  # payload transport: "gloo" (CPU tensors) or "nccl" (CUDA tensors)
    device: str = "cpu"  # "cpu", "cuda" (cuda:LOCAL_RANK) or "cuda:N"
    emulate: bool = True  # WAN emulation: delay messages by the plan's transfer times
    time_scale: float = 0.02  # real seconds per plan second under emulation
    pad_compute: bool = True  # under emulation, stretch operations to their modelled time
    policy: str = "fifo"  # "fifo" (the simulator's rule) or "backward-first"; a plan's processing_order wins
    deterministic: bool = True  # add gradients in microbatch order: bit-for-bit reproducible runs
    timeout_s: float = 120.0  # longest wait for any message or collective before giving up
    rendezvous_timeout_s: float = 60.0  # longest wait for all workers to join
    threads_per_worker: int = 1  # torch intra-op threads per worker
    master_addr: str = "127.0.0.1"  # local launch only; torchrun sets its own
    master_port: int = 0  # 0: pick a free port
    start_method: str = "forkserver"  # local launch: "forkserver" (fast start) or "exec" (as torchrun)

    def __post_init__(self) -> None:
        if self.backend not in ("gloo", "nccl"):
            raise UserError(f"runtime: backend must be 'gloo' or 'nccl', got {self.backend!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise UserError(f"runtime: device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.backend == "nccl" and not self.device.startswith("cuda"):
            raise UserError("runtime: backend 'nccl' needs device 'cuda'")
        if self.policy not in ("backward-first", "fifo"):
            raise UserError(f"runtime: policy must be 'backward-first' or 'fifo', got {self.policy!r}")
        if not self.time_scale > 0:
            raise UserError(f"runtime: time_scale must be > 0, got {self.time_scale}")
        for name in ("timeout_s", "rendezvous_timeout_s"):
            if not getattr(self, name) > 0:
                raise UserError(f"runtime: {name} must be > 0")
        _at_least(self, "threads_per_worker", 1)
        if self.start_method not in ("forkserver", "exec"):
            raise UserError(f"runtime: start_method must be 'forkserver' or 'exec', got {self.start_method!r}")
        if not 0 <= self.master_port < 65536:
            raise UserError(f"runtime: master_port must be 0..65535, got {self.master_port}")


@dataclass(frozen=True)
class RunConfig:
    run: RunSection = field(default_factory=RunSection)
    plan: PlanSection = field(default_factory=PlanSection)
    train: dict[str, Any] = field(default_factory=dict)  # [train] table, read by TrainConfig
    model: dict[str, Any] = field(default_factory=lambda: {"preset": "tiny"})
    runtime: RuntimeSection = field(default_factory=RuntimeSection)

    def train_config(self):  # -> skippipe.train.config.TrainConfig (imported lazily: torch-free here)
        from skippipe.train.config import train_config_from_dict

        return train_config_from_dict({"train": dict(self.train), "model": dict(self.model)}, where="config [train]")

    def to_dict(self) -> dict[str, Any]:
        d = {
            "run": asdict(self.run),
            "plan": asdict(self.plan),
            "train": dict(self.train),
            "model": dict(self.model),
            "runtime": asdict(self.runtime),
        }
        if d["plan"]["stage_sizes"] is not None:
            d["plan"]["stage_sizes"] = list(d["plan"]["stage_sizes"])
        return {k: {kk: vv for kk, vv in v.items() if vv is not None} for k, v in d.items()}

    def with_overrides(self, **sections: dict[str, Any]) -> RunConfig:
        """A copy with some keys of some tables replaced, e.g. ``runtime={"time_scale": 0.1}``."""
        data = self.to_dict()
        for name, values in sections.items():
            data.setdefault(name, {}).update(values)
        return run_config_from_dict(data)


def _at_least(obj: Any, name: str, low: int) -> None:
    if getattr(obj, name) < low:
        raise UserError(f"{type(obj).__name__.replace('Section', '').lower()}: {name} must be >= {low}, got {getattr(obj, name)}")


def _section(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise UserError(f"{where} must be a table")
    reject_unknown_keys(data, (f.name for f in fields(cls)), where)
    defaults = cls()
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "stage_sizes":
            if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise UserError(f"{where}: stage_sizes must be a list of integers")
            value = tuple(value)
        else:
            value = value_like(getattr(defaults, key), value, key, where)
        kwargs[key] = value
    return cls(**kwargs)


def run_config_from_dict(data: dict[str, Any], base_dir: Path | None = None, where: str = "config") -> RunConfig:
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected tables at the top level")
    tables = {"run", "plan", "train", "model", "runtime"}
    unknown = sorted(set(data) - tables)
    if unknown:
        raise UserError(f"{where}: unknown table(s) {', '.join(unknown)} (known: {', '.join(sorted(tables))})")
    for name in ("train", "model"):
        if name in data and not isinstance(data[name], dict):
            raise UserError(f"{where}: [{name}] must be a table")
    cfg = RunConfig(
        run=_section(RunSection, data.get("run", {}), f"{where} [run]"),
        plan=_section(PlanSection, data.get("plan", {}), f"{where} [plan]"),
        train=dict(data.get("train", {})),
        model=dict(data.get("model", {"preset": "tiny"})),
        runtime=_section(RuntimeSection, data.get("runtime", {}), f"{where} [runtime]"),
    )
    if base_dir is not None:
        cfg = _resolve_paths(cfg, base_dir)
    cfg.train_config()  # validate [train] and [model] now, with their own messages
    return cfg


def _resolve_paths(cfg: RunConfig, base: Path) -> RunConfig:
    def fix(p: str | None) -> str | None:
        if p is None or Path(p).is_absolute():
            return p
        return str((base / p).resolve())

    plan = cfg.plan
    cluster = plan.cluster
    if Path(cluster).suffix.lower() in (".json", ".toml"):
        cluster = fix(cluster) or cluster
    return replace(cfg, plan=replace(plan, file=fix(plan.file), cluster=cluster))


DEFAULT_RUN_CONFIG = "train-tiny.toml"  # in skippipe/resources/examples, also examples/train-tiny.toml


def load_default_run_config() -> RunConfig:
    """The embedded default run: a tiny LLaMA trained by 12 workers over an emulated WAN."""
    with resources.as_file(resources.files("skippipe.resources") / "examples" / DEFAULT_RUN_CONFIG) as path:
        return load_run_config(path)


def load_run_config(path: str | Path) -> RunConfig:
    """Read a TOML config (``.json``: the same tables as JSON, as ``skippipe train`` saves them)."""
    p = Path(path)
    data = read_config_file(p, default_format="toml", what="config file")
    return run_config_from_dict(data, base_dir=p.parent, where=str(p))
