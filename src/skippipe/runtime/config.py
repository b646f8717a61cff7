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

Every table and key is optional; unknown keys and wrong types are one-line ``ConfigError``s
(``skippipe.config_fields.read_dataclass``).
A plan or cluster file named in the config is found relative to the config's folder; the run
folder ``[run] dir`` is relative to the current directory. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Literal

from skippipe.config_fields import check_fields, invalid, read_config_file, read_dataclass, to_table
from skippipe.costs import WireFormat
from skippipe.errors import ConfigError
from skippipe.workload import TRAINING_SHAPE, PipelineShape, Workload

POSITIVE = {"min": 1}
ABOVE_ZERO = {"gt": 0}


@dataclass(frozen=True)
class RunSection:
    config_label: ClassVar[str] = "run"

    dir: str = "runs/train-tiny"  # metrics, checkpoints, plan, timeline, logs
    # iterations between checkpoints (0: only at the end; -1: never)
    checkpoint_every: int = field(default=0, metadata={"min": -1})
    keep_checkpoints: int = field(default=2, metadata=POSITIVE)  # newest checkpoints kept (older ones are deleted)
    # the iteration (1-based) whose timeline is drawn (-1: the last one)
    timeline_iteration: int = field(default=-1, metadata={"min": -1})
    log_every: int = field(default=1, metadata=POSITIVE)  # iterations between metric records
    # "shared": every worker writes into RUN/checkpoints (one filesystem); "local": each stage's first node
    # writes only its stage into its own folder under local_checkpoint_dir (``skippipe checkpoint gather`` joins them)
    checkpoint_storage: Literal["shared", "local"] = "shared"
    local_checkpoint_dir: str | None = None  # "local": the root on every machine (None: RUN/local); node-NNN/ inside

    def __post_init__(self) -> None:
        check_fields(self)
        if self.local_checkpoint_dir is not None and self.checkpoint_storage != "local":
            raise invalid(self, "local_checkpoint_dir", 'local_checkpoint_dir needs checkpoint_storage = "local"')
        if self.local_checkpoint_dir == "":
            raise invalid(self, "local_checkpoint_dir", "local_checkpoint_dir must name a folder, got an empty string")
        if self.timeline_iteration == 0:
            raise invalid(self, "timeline_iteration", "timeline_iteration must be -1 (the last) or an iteration >= 1, got 0")


@dataclass(frozen=True)
class PlanSection:
    """How ``skippipe train`` gets its plan. The pipeline shape (``num_stages``, ``path_length``,
    ``microbatches_per_data_node``, ``memory``, ``max_swaps``, ``max_jump``, ``stage_sizes``) is
    read from the same table; the model's size comes from ``[model]`` and ``[train]``."""

    config_label: ClassVar[str] = "plan"

    file: str | None = None  # a plan file to use as is (then cluster/method/workload are ignored)
    cluster: str = "gcp-2025/geo-distributed/12"  # TABLE/SETTING/N, a shipped example, or a file
    method: str = "skippipe"  # a name of skippipe.planner.methods.METHODS
    seed: int = field(default=0, metadata={"min": 0})
    time_limit_s: float | None = field(default=None, metadata=ABOVE_ZERO)  # None: the deterministic budget
    # forward seconds per sample per layer on a speed-1.0 node, for planning and emulation;
    # None: the reference layer's 0.055 s scaled by this model's FLOPs (skippipe.costs.scaled_t_layer)
    t_layer_s: float | None = field(default=None, metadata=ABOVE_ZERO)
    shape: PipelineShape = field(default=TRAINING_SHAPE, metadata={"inline": True})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.file is None:
            from skippipe.planner.methods import method_names  # torch-free; the planner is below runtime

            if self.method not in method_names():
                raise invalid(self, "method", f"method must be one of {', '.join(method_names())}, got {self.method!r}")

    def workload(self, n_layers: int, d_model: int, ctx: int, samples: int, wire_format: WireFormat = "fp32") -> Workload:
        """The planning workload: this table's pipeline shape with the model's dimensions and the
        runtime's wire format (bytes per value of every hop)."""
        return self.shape.with_model(
            n_layers=n_layers, d_model=d_model, ctx=ctx, samples_per_microbatch=samples, wire_format=wire_format
        )


DETERMINISTIC_MAX_PARAMS = 100_000_000  # larger models sum gradients with all-reduce unless `deterministic = true`


def all_gather_bytes(stage_params: int, replicas: int) -> int:
    """Extra device memory of the deterministic gradient sum on one node: the all-gather receives
    every replica's fp32 gradient vector of the stage (the all-reduce sums in place: none)."""
    return 4 * stage_params * replicas if replicas > 1 else 0


@dataclass(frozen=True)
class LinkEvent:
    """An emulated change of one link mid-run: from iteration ``iteration`` (1-based) on, the hop
    between original nodes ``link[0]`` and ``link[1]`` (both ways) takes ``1 / bandwidth_factor``
    times as long (the plan keeps one time per hop; for activations over a WAN the bandwidth term
    dominates it)."""

    config_label: ClassVar[str] = "runtime.emulate_events"

    iteration: int = field(default=1, metadata=POSITIVE)
    link: tuple[int, ...] = field(default=(0, 1), metadata={"min": 0, "min_len": 2, "max_len": 2})
    bandwidth_factor: float = field(default=0.5, metadata=ABOVE_ZERO)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.link[0] == self.link[1]:
            raise invalid(self, "link", f"link must join two different nodes, got {list(self.link)}")


@dataclass(frozen=True)
class RejoinEvent:
    """A node that failed starts again: it joins at the boundary before iteration ``iteration``
    (1-based; or at the first boundary after, if it failed later), with ``node`` its id in the
    run's first plan. It gets its stage's state from a peer, not from disk."""

    config_label: ClassVar[str] = "runtime.rejoin"

    iteration: int = field(default=1, metadata=POSITIVE)
    node: int = field(default=0, metadata={"min": 0})

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class JoinEvent:
    """A brand-new node joins at the boundary before iteration ``iteration`` (1-based). Its costs
    (forward time, memory, hop times) are those of node ``like`` (first-plan id, running then: the
    stand-in for a node that announces itself); ``stage``: the stage it joins (unset: the one
    whose extra replica shortens the simulated makespan most). It gets its stage's state from a
    peer, not from disk."""

    config_label: ClassVar[str] = "runtime.join"

    iteration: int = field(default=1, metadata=POSITIVE)
    like: int = field(default=0, metadata={"min": 0})
    stage: int | None = field(default=None, metadata={"min": 1})

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class RuntimeSection:
    config_label: ClassVar[str] = "runtime"

    backend: Literal["gloo", "nccl"] = "gloo"  # payload transport: "gloo" (CPU tensors) or "nccl" (CUDA tensors)
    device: str = "cpu"  # "cpu", "cuda" (cuda:LOCAL_RANK) or "cuda:N"
    emulate: bool = True  # WAN emulation: delay messages by the plan's transfer times
    time_scale: float = field(default=0.02, metadata=ABOVE_ZERO)  # real seconds per plan second under emulation
    pad_compute: bool = True  # under emulation, stretch operations to their modelled time
    # "fifo" (the simulator's rule) or "backward-first"; a plan's processing_order wins
    policy: Literal["fifo", "backward-first"] = "fifo"
    # add gradients in microbatch order: bit-for-bit reproducible runs; its all-gather holds one fp32
    # copy of the stage's gradients per stage replica. Unset: on up to DETERMINISTIC_MAX_PARAMS, else all-reduce
    deterministic: bool | None = None
    timeout_s: float = field(default=120.0, metadata=ABOVE_ZERO)  # longest wait for any message or collective
    rendezvous_timeout_s: float = field(default=60.0, metadata=ABOVE_ZERO)  # longest wait for all workers to join
    wire: WireFormat = "bf16"  # activations/gradients on the wire: "fp32", "bf16" (1/2 the bytes), "int8" (~1/4, row scales)
    hosts: str | None = None  # torchrun on several machines: a host file placing plan nodes (runtime/hosts.py)
    wire_error_feedback: bool = False  # int8: carry each link's rounding error into its next message
    threads_per_worker: int = field(default=1, metadata=POSITIVE)  # torch intra-op threads per worker
    master_addr: str = "127.0.0.1"  # local launch only; torchrun sets its own
    master_port: int = field(default=0, metadata={"min": 0, "max": 65535})  # 0: pick a free port
    # local launch: "forkserver" (fast start) or "exec" (as torchrun)
    start_method: Literal["forkserver", "exec"] = "forkserver"
    on_failure: Literal["stop", "continue"] = "stop"  # a worker dies or goes silent: stop, or go on with the survivors
    max_failures: int = field(default=1, metadata={"min": 0})  # with on_failure = "continue": failures survived
    # under emulation: links that change mid-run, e.g. [{iteration = 6, link = [1, 4], bandwidth_factor = 0.5}]
    emulate_events: list[LinkEvent] = field(default_factory=list)
    # with on_failure = "continue": when the measured makespan drifts from the plan's, plan again on the
    # changed costs and restart the workers with the new plan at an iteration boundary
    replan_on_drift: bool = False
    drift_threshold: float = field(default=0.25, metadata=ABOVE_ZERO)  # relative drift that counts
    drift_window: int = field(default=3, metadata=POSITIVE)  # iterations in a row beyond the threshold
    max_replans: int = field(default=2, metadata={"min": 0})  # re-plans on drift in one run
    # with on_failure = "continue": failed nodes that start again, e.g. [{iteration = 8, node = 3}]
    rejoin: list[RejoinEvent] = field(default_factory=list)
    # with on_failure = "continue": brand-new nodes that join, e.g. [{iteration = 6, like = 4}]
    join: list[JoinEvent] = field(default_factory=list)

    def deterministic_for(self, model_params: int) -> bool:
        """``deterministic`` as set, else on for models of at most ``DETERMINISTIC_MAX_PARAMS``."""
        return self.deterministic if self.deterministic is not None else model_params <= DETERMINISTIC_MAX_PARAMS

    def __post_init__(self) -> None:
        check_fields(self)
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise invalid(self, "device", f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.backend == "nccl" and not self.device.startswith("cuda"):
            raise invalid(self, "backend", "backend 'nccl' needs device 'cuda'")


@dataclass(frozen=True)
class RunConfig:
    run: RunSection = field(default_factory=RunSection)
    plan: PlanSection = field(default_factory=PlanSection)
    train: dict[str, Any] = field(default_factory=dict)  # [train] table, read by TrainConfig
    model: dict[str, Any] = field(default_factory=lambda: {"preset": "tiny"})
    runtime: RuntimeSection = field(default_factory=RuntimeSection)

    def train_config(self, where: str = "config"):  # -> TrainConfig (imported lazily: torch-free here)
        from skippipe.train.config import train_config_from_dict

        return train_config_from_dict({"train": dict(self.train), "model": dict(self.model)}, where=where)

    def to_dict(self) -> dict[str, Any]:
        """The tables as ``run_config_from_dict`` reads them (no ``None`` values: TOML has none)."""
        return to_table(self)

    def with_overrides(self, **sections: dict[str, Any]) -> RunConfig:
        """A copy with some keys of some tables replaced, e.g. ``runtime={"time_scale": 0.1}``."""
        data = self.to_dict()
        for name, values in sections.items():
            data.setdefault(name, {}).update(values)
        return run_config_from_dict(data)


def run_config_from_dict(data: dict[str, Any], base_dir: Path | None = None, where: str = "config") -> RunConfig:
    cfg = read_dataclass(RunConfig, data, where)
    if cfg.run.checkpoint_storage == "local" and cfg.runtime.on_failure != "stop":
        raise ConfigError('checkpoint_storage = "local" needs [runtime] on_failure = "stop" (recovery reads a shared folder)',
                          where=f"{where} [run]", key="checkpoint_storage")
    if base_dir is not None:
        cfg = _resolve_paths(cfg, base_dir)
    cfg.train_config(where)  # validate [train] and [model] now, with their own messages
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
    train = dict(cfg.train)
    for key in ("data", "tokenizer"):  # a prepared dataset folder, a tokenizer.json file
        value = train.get(key)
        if isinstance(value, str) and (key == "data" or value.endswith(".json")):
            train[key] = fix(value)
    runtime = replace(cfg.runtime, hosts=fix(cfg.runtime.hosts))
    return replace(cfg, plan=replace(plan, file=fix(plan.file), cluster=cluster), train=train, runtime=runtime)


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
