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
"""

from __future__ import annotations

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


def forward_op(stage: Stage, x: torch.Tensor) -> Saved:
    if x.dtype in (torch.int32, torch.int64):
        return Saved(input=None, output=stage(x))
    leaf = x.detach().requires_grad_(True)
    return Saved(input=leaf, output=stage(leaf))


def loss_op(stage0: Stage, h: torch.Tensor, targets: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Final norm + head + mean cross-entropy over the microbatch's tokens, and its backward.

    The loss is not scaled: each stage divides its summed gradient by its divisor after the
    iteration (``skippipe.train.grads``)."""
    leaf = h.detach().requires_grad_(True)
    loss = stage0.loss(leaf, targets)
    loss.backward()
    assert leaf.grad is not None
    return float(loss.detach()), leaf.grad


def backward_op(saved: Saved, grad_out: torch.Tensor) -> torch.Tensor | None:
    saved.output.backward(grad_out)
    grad_in = None if saved.input is None else saved.input.grad
    saved.release()
    return grad_in
