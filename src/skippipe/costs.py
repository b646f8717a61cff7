"""The per-microbatch cost model of SkipPipe (DESIGN §2), every constant a parameter.

forward on a node     w = t_layer * layers_per_stage * samples / compute_speed
backward              backward_factor * w
head + loss           loss_factor * w            (on the data node)
transfer i -> j       latency/1000 + bytes / (1024**3 * bandwidth) + hop_overhead
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CostModel:
    t_layer_s: float = 0.055  # forward seconds per sample per layer on a speed-1.0 node
    bytes_per_value: int = 4  # fp32 activations
    hop_overhead_s: float = 0.35  # fixed cost of every inter-node send
    backward_factor: float = 1.5
    loss_factor: float = 0.25
    # The reference simulator idles a node for a moment after each operation.
    inject_gap_s: float = 0.09
    op_gap_s: float = 0.13

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
