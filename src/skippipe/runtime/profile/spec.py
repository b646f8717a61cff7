"""What ``skippipe profile`` measures, in one value that travels to every worker as CLI flags."""

from __future__ import annotations

from dataclasses import dataclass

from skippipe.costs import activation_bytes
from skippipe.errors import UserError

LINK_FORMATS = ("transfer", "latency")
MIN_LARGEST_MESSAGE = 1 << 20  # the largest probe is at least 1 MiB, so bandwidth shows over latency


@dataclass(frozen=True)
class ProfileSpec:
    out: str  # the cluster file (JSON) rank 0 writes
    model: str = "tiny"  # a model preset (skippipe.model.config.PRESETS)
    stages: int = 4  # pipeline stages: a stage holds ceil(n_layers / stages) layers
    samples: int = 8  # samples per microbatch
    sizes: tuple[int, ...] = ()  # message sizes in bytes (empty: derived from the activation size)
    reps: int = 5  # timed round trips per pair and size (after one warm-up)
    compute_reps: int = 5  # timed forward + backward passes per node (after one warm-up)
    links: str = "transfer"  # write transfer_s (for this model's activations) or latency_ms + bandwidth_GBps
    emulate: str | None = None  # a cluster whose links are emulated on this machine (preset, example or file)
    time_scale: float = 1.0  # real seconds per cluster second under emulation
    memory_fraction: float = 0.9  # share of the free memory a node may fill
    max_slots: int = 64  # activation slots written at most per node
    device: str = "cpu"
    timeout_s: float = 120.0
    rendezvous_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.stages < 1 or self.samples < 1 or self.reps < 1 or self.compute_reps < 1 or self.max_slots < 1:
            raise UserError("profile: stages, samples, reps, compute reps and max slots must be >= 1")
        if any(s < 1 for s in self.sizes):
            raise UserError(f"profile: message sizes must be >= 1 byte, got {list(self.sizes)}")
        if self.sizes and len(set(self.sizes)) < 2:
            raise UserError("profile: give at least two different message sizes (latency and bandwidth are fitted)")
        if self.links not in LINK_FORMATS:
            raise UserError(f"profile: links must be one of {', '.join(LINK_FORMATS)}, got {self.links!r}")
        if not self.time_scale > 0:
            raise UserError(f"profile: time scale must be > 0, got {self.time_scale}")
        if not 0 < self.memory_fraction <= 1:
            raise UserError(f"profile: memory fraction must be in (0, 1], got {self.memory_fraction}")
        if not self.timeout_s > 0 or not self.rendezvous_timeout_s > 0:
            raise UserError("profile: timeouts must be > 0")

    def message_sizes(self, d_model: int, ctx: int) -> list[int]:
        """The probe sizes: the given ones, else 1 KiB and 1/16, 1/4 and all of one microbatch's
        activations (at least 1 MiB)."""
        if self.sizes:
            return sorted(set(self.sizes))
        top = max(activation_bytes(d_model, ctx, self.samples), MIN_LARGEST_MESSAGE)
        return sorted({1024, top // 16, top // 4, top})

    def to_argv(self) -> list[str]:
        """The ``skippipe profile`` flags that rebuild this spec (what a worker is started with)."""
        argv = [
            "--out", self.out, "--model", self.model, "--stages", str(self.stages), "--samples", str(self.samples),
            "--reps", str(self.reps), "--compute-reps", str(self.compute_reps), "--links", self.links,
            "--time-scale", repr(self.time_scale), "--memory-fraction", repr(self.memory_fraction),
            "--max-slots", str(self.max_slots), "--device", self.device, "--timeout", repr(self.timeout_s),
            "--rendezvous-timeout", repr(self.rendezvous_timeout_s),
        ]
        if self.sizes:
            argv += ["--sizes", ",".join(map(str, self.sizes))]
        if self.emulate is not None:
            argv += ["--emulate", self.emulate]
        return argv
