"""The per-microbatch cost model of SkipPipe (DESIGN §2), every constant a parameter.

forward on a node     w = t_layer * layers_per_stage * samples / compute_speed
backward              backward_factor * w
head + loss           loss_factor * w            (on the data node)
transfer i -> j       latency/1000 + bytes / (1024**3 * bandwidth) + hop_overhead
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The operation-cost rule: an operation's seconds are the node's forward seconds times its factor.
BACKWARD_FACTOR = 1.5
LOSS_FACTOR = 0.25
# The reference simulator idles a node for a moment after each operation.
INJECT_GAP_S = 0.09
OP_GAP_S = 0.13


class OpCostRule:
    """The one place the F/L/B cost rule lives: ``F`` costs the forward seconds ``w``, ``L`` (head +
    loss on the data node) ``loss_factor * w``, ``B`` ``backward_factor * w``. Mixed into the
    planner's :class:`CostModel` and the plan file's ``Costs``."""

    backward_factor: float
    loss_factor: float

    def op_factor(self, kind: str) -> float:
        """Multiple of the forward seconds that an operation ``F``, ``L`` or ``B`` takes."""
        return {"F": 1.0, "L": self.loss_factor, "B": self.backward_factor}[kind]

    @property
    def visit_factor(self) -> float:
        """A visit to a non-data stage: its forward and its backward."""
        return 1.0 + self.backward_factor

    @property
    def own_factor(self) -> float:
        """A data node's own work on each of its microbatches: injection, head + loss, backward."""
        return 1.0 + self.loss_factor + self.backward_factor


@dataclass(frozen=True)
class CostModel(OpCostRule):
    t_layer_s: float = 0.055  # forward seconds per sample per layer on a speed-1.0 node
    bytes_per_value: int = 4  # fp32 activations
    hop_overhead_s: float = 0.35  # fixed cost of every inter-node send
    backward_factor: float = BACKWARD_FACTOR
    loss_factor: float = LOSS_FACTOR
    inject_gap_s: float = INJECT_GAP_S
    op_gap_s: float = OP_GAP_S

    def __post_init__(self) -> None:
        for name in ("t_layer_s", "backward_factor", "loss_factor"):
            if getattr(self, name) <= 0:
                raise ValueError(f"cost model: {name} must be > 0")
        for name in ("hop_overhead_s", "inject_gap_s", "op_gap_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"cost model: {name} must be >= 0")
        if self.bytes_per_value <= 0:
            raise ValueError("cost model: bytes_per_value must be > 0")


def activation_bytes(d_model: int, ctx: int, samples: int, bytes_per_value: int = 4) -> int:
    """Bytes of one microbatch's activations crossing a stage boundary."""
    return int(bytes_per_value * d_model * ctx * samples)


def transfer_seconds(
    latency_ms: np.ndarray, bandwidth_GBps: np.ndarray, nbytes: int, hop_overhead_s: float
) -> np.ndarray:
    """Seconds to send one microbatch over each link; zero on the diagonal (no send)."""
    lat = np.asarray(latency_ms, dtype=float)
    bw = np.asarray(bandwidth_GBps, dtype=float)
    with np.errstate(divide="ignore"):
        t = lat / 1000.0 + nbytes / (1024.0**3 * bw) + hop_overhead_s
    np.fill_diagonal(t, 0.0)
    return t


def forward_seconds(
    t_layer_s: float, layers_per_stage: int, samples: int, compute_speed: np.ndarray
) -> np.ndarray:
    """Forward seconds of one stage for one microbatch on each node."""
    speed = np.asarray(compute_speed, dtype=float)
    return t_layer_s * layers_per_stage * samples / speed
