"""The three per-microbatch operations of a plan (``F``, ``L``, ``B``), one stage at a time.

These are the pieces both executors use: the single-process reference executor calls them in
sequence, the distributed runtime calls them on each node between a receive and a send. A
stage boundary is always cut: the input of a stage is a fresh leaf tensor, so a node's backward
only touches its own copy of the stage and hands ``grad_in`` back to the previous node.

- ``forward_op(stage, x)`` -> ``Saved``: run the stage (stage 0: ``x`` = token ids). Send
  ``saved.output`` (detached) to the next node; keep ``saved`` until the backward.
- ``loss_op(stage0, h, targets)`` -> ``(loss, grad_h)``: head + loss on the data node for the
  hidden states ``h`` that came back; ``grad_h`` goes to the last node of the path.
- ``backward_op(saved, grad_out)`` -> ``grad_in``: accumulate the stage's parameter gradients
  (``+=`` into ``.grad``) and return the gradient for the previous node (``None`` on stage 0,
  whose input is token ids).

Precision (``TrainConfig.precision``): with ``"bf16"`` the forward and the loss run under
``torch.autocast(bfloat16)`` on the tensor's device (CUDA, or CPU: the same code path), the
backward follows the dtypes autocast chose; parameters, their ``.grad`` and AdamW's state stay
fp32 (the master weights). The residual stream between layers stays fp32 (a bf16 branch added
to an fp32 input is fp32), so what travels between stages is fp32 before its wire encoding.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from skippipe.model.llama import Stage


@dataclass
class Saved:
    """What a node keeps between the forward and the backward of one microbatch."""

    input: torch.Tensor | None  # the leaf that received the activations (None for token ids)
    output: torch.Tensor  # the stage output, attached to its graph

    def release(self) -> None:
        self.input = None
        self.output = None  # type: ignore[assignment]


def autocast(device: torch.device, precision: str) -> AbstractContextManager[None]:
    """``torch.autocast`` to bfloat16 on ``device`` for ``"bf16"``; a no-op context for ``"fp32"``."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"unknown precision {precision!r} (known: fp32, bf16)")
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def forward_op(stage: Stage, x: torch.Tensor, precision: str = "fp32") -> Saved:
    leaf = None if x.dtype in (torch.int32, torch.int64) else x.detach().requires_grad_(True)
    with autocast(x.device, precision):
        out = stage(x if leaf is None else leaf)
    return Saved(input=leaf, output=out.float())


def loss_op(stage0: Stage, h: torch.Tensor, targets: torch.Tensor, precision: str = "fp32") -> tuple[float, torch.Tensor]:
    """Final norm + head + mean cross-entropy over the microbatch's tokens, and its backward.

    The loss is not scaled: each stage divides its summed gradient by its divisor after the
    iteration (``skippipe.train.grads``)."""
    leaf = h.detach().requires_grad_(True)
    with autocast(h.device, precision):
        loss = stage0.loss(leaf, targets)
    loss.backward()
    assert leaf.grad is not None
    return float(loss.detach()), leaf.grad


def backward_op(saved: Saved, grad_out: torch.Tensor) -> torch.Tensor | None:
    saved.output.backward(grad_out)
    grad_in = None if saved.input is None else saved.input.grad
    saved.release()
    return grad_in
