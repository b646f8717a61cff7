"""Wire formats of activations and gradients between stages: fewer bytes on slow links.

- ``fp32``: sent as is (4 bytes a value).
- ``bf16``: rounded to bfloat16 (2 bytes); relative error per value at most 2**-8.
- ``int8``: every row (the last dimension, ``d_model`` values) scaled by its largest magnitude
  ``s = max|x| / 127`` and rounded to an int8; one fp32 scale per row rides along, packed in
  front of the int8 values in one uint8 payload (``1 + 4 / row_len`` bytes a value). The error
  of every value is at most ``s / 2`` (half a step of its row).

``ErrorFeedback`` keeps, for each stream (destination, direction, microbatch), the rounding
error of the last message and adds it to the next one before encoding, so the errors do not
pile up over iterations (the sum of what arrived tracks the sum of what was meant to be sent).

The receiver decodes back to float32. The byte counts match ``skippipe.costs.wire_bytes``, which
the planner and simulator use.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from skippipe.costs import WIRE_FORMATS

INT8_STEPS = 127.0


def encode(t: torch.Tensor, wire: str) -> torch.Tensor:
    """The payload of float tensor ``t`` in ``wire`` format (a tensor of the same device)."""
    if wire == "fp32" or not t.is_floating_point():
        return t
    if wire == "bf16":
        return t.to(torch.bfloat16)
    if wire != "int8":
        raise ValueError(f"wire format must be one of {', '.join(WIRE_FORMATS)}, got {wire!r}")
    rows = t.detach().float().reshape(-1, t.shape[-1] if t.dim() else 1)
    scale = rows.abs().amax(dim=1, keepdim=True) / INT8_STEPS
    q = torch.round(rows / torch.where(scale > 0, scale, torch.ones_like(scale))).clamp_(-INT8_STEPS, INT8_STEPS)
    return torch.cat([scale.reshape(-1).view(torch.uint8), q.to(torch.int8).reshape(-1).view(torch.uint8)])


def decode(payload: torch.Tensor, wire: str, shape: list[int]) -> torch.Tensor:
    """The float32 tensor of ``shape`` that ``payload`` (from ``encode``) carries."""
    if wire == "fp32" or not (payload.is_floating_point() or wire == "int8"):
        return payload
    if wire == "bf16":
        return payload.float()
    numel = 1
    for d in shape:
        numel *= d
    row_len = shape[-1] if shape else 1
    n_rows = numel // row_len if row_len else 0
    scale = payload[: 4 * n_rows].view(torch.float32).reshape(n_rows, 1)
    q = payload[4 * n_rows :].view(torch.int8).reshape(n_rows, row_len).float()
    return (q * scale).reshape(shape)


def payload_shape(wire: str, shape: list[int]) -> list[int]:
    """Shape of the payload of a float tensor of ``shape`` in ``wire`` format."""
    if wire != "int8":
        return list(shape)
    numel = 1
    for d in shape:
        numel *= d
    row_len = shape[-1] if shape else 1
    return [numel + 4 * (numel // row_len if row_len else 0)]


def round_trip(t: torch.Tensor, wire: str) -> torch.Tensor:
    """What the receiver gets for ``t`` (float32)."""
    return decode(encode(t, wire), wire, list(t.shape)).to(t.dtype)


class ErrorFeedback:
    """Carries each stream's rounding error into its next message (a residual per stream key)."""

    def __init__(self, wire: str) -> None:
        self.wire = wire
        self.residual: dict[Hashable, torch.Tensor] = {}

    def encode(self, key: Hashable, t: torch.Tensor) -> torch.Tensor:
        if self.wire == "fp32" or not t.is_floating_point():
            return encode(t, self.wire)
        want = t.detach().float()
        old = self.residual.get(key)
        if old is not None and old.shape == want.shape:
            want = want + old
        payload = encode(want, self.wire)
        self.residual[key] = want - decode(payload, self.wire, list(want.shape))
        return payload
