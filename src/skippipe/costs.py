"""The per-microbatch cost model of SkipPipe (DESIGN §2), every constant a parameter.

forward on a node     w = t_layer * layers_per_stage * samples / compute_speed
t_layer of a model    t_ref * layer_flops(d_model, ctx) / layer_flops(1024, 1024)   (no profile)
backward              backward_factor * w
head + loss           loss_factor * w            (on the data node)
transfer i -> j       latency/1000 + bytes / (1024**3 * bandwidth) + hop_overhead

The bytes of a hop follow the wire format of activations and gradients (``WIRE_FORMATS``):
fp32 (4 bytes a value), bf16 (2) or int8 (1, plus one fp32 scale per row of ``d_model`` values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

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
    t_layer_s: float = 0.055  # forward seconds per sample per layer (of its model) on a speed-1.0 node
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


# The layer the tables' compute constants (``compute_s_per_sample_per_layer``) were taken on: one
# block of the LLaMA-500M layout (width 1024, context 1024, SwiGLU hidden width 4 x 1024).
REFERENCE_D_MODEL = 1024
REFERENCE_CTX = 1024


def layer_flops(d_model: int, ctx: int, ffn_dim: int | None = None) -> float:
    """Forward FLOPs of one decoder block for one sample of ``ctx`` tokens.

    Matrix multiplications cost 2 FLOPs per weight per token: attention projections ``4 d^2``,
    SwiGLU ``3 d ffn`` (``ffn = 4 d`` unless given); attention scores and their weighted sum
    ``4 ctx d`` per token.
    """
    if d_model < 1 or ctx < 1 or (ffn_dim is not None and ffn_dim < 1):
        raise ValueError("layer_flops: d_model, ctx and ffn_dim must be >= 1")
    ffn = 4 * d_model if ffn_dim is None else ffn_dim
    weights = 4 * d_model * d_model + 3 * d_model * ffn
    return float(ctx) * (2.0 * weights + 4.0 * ctx * d_model)


def scaled_t_layer(t_reference_s: float, d_model: int, ctx: int, ffn_dim: int | None = None) -> float:
    """Seconds per sample of one layer of the given shape, from the constant measured on the
    reference layer: scaled by the ratio of their FLOPs."""
    return t_reference_s * layer_flops(d_model, ctx, ffn_dim) / layer_flops(REFERENCE_D_MODEL, REFERENCE_CTX)


# bytes per value on the wire, and bytes of scale per row (int8: one fp32 scale per row)
WireFormat = Literal["fp32", "bf16", "int8"]
WIRE_FORMATS: dict[str, tuple[int, int]] = dict(zip(get_args(WireFormat), [(4, 0), (2, 0), (1, 4)]))


def wire_bytes(rows: int, row_len: int, wire_format: str = "fp32") -> int:
    """Bytes on the wire of a ``rows x row_len`` float tensor sent in ``wire_format``."""
    if wire_format not in WIRE_FORMATS:
        raise ValueError(f"wire format must be one of {', '.join(WIRE_FORMATS)}, got {wire_format!r}")
    per_value, per_row = WIRE_FORMATS[wire_format]
    return int(rows * (row_len * per_value + per_row))


def activation_bytes(d_model: int, ctx: int, samples: int, wire_format: str = "fp32") -> int:
    """Bytes of one microbatch's activations (or their gradient) crossing a stage boundary."""
    return wire_bytes(ctx * samples, d_model, wire_format)


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
