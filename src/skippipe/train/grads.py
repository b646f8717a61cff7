"""Gradient averaging inside stage groups, and global-norm clipping across stages.

After an iteration each node's copy of stage s holds the *sum* of the gradients of the
microbatches it processed (unscaled mean token loss per microbatch). The stage group then

1. sums the copies' gradients (distributed: ``all_reduce(SUM)`` over the group of
   ``flat_grads(stage)``, then ``set_flat_grads``),
2. divides by ``grad_divisor(plan, s, mode)``:

   - ``"visits"`` (default): the number of microbatches that ran stage s this iteration. Each
     stage's update is then the mean gradient over the samples that actually reached it, on
     the same scale as a full pipeline (where every stage is visited by all microbatches). With
     skipping, a divisor of all microbatches would shrink the gradients of non-data stages by
     about (L-1)/(S-1), which changes the global clipping norm and AdamW's eps balance.
   - ``"microbatches"``: the number of microbatches of the iteration (the plain sum over the
     batch divided by the batch, stages that were skipped simply contribute zero).
   - ``"reference"``: the authors' code: every data node divides its loss by its own m, and the
     group averages its nodes' gradients, i.e. divisor = m * (nodes in the group). (m is the
     largest number of microbatches any data node owns.)

   A stage that no microbatch visited gets a zero gradient (AdamW still steps it).
3. Clipping uses the global norm over all stages: ``sqrt(sum_s |g_s|^2)``. Every node of a
   group holds the same averaged ``g_s``, so the distributed runtime all-reduces a length-S
   vector holding ``stage_sq_norm`` at index s from the *first* node of each stage and zero
   from every other node, then calls ``clip_coefficient`` on that vector (summed in stage
   order, float64) and ``scale_grads``. That reproduces the reference executor exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from skippipe.planfile import Plan
from skippipe.train.config import GRAD_DIVISORS

GradDivisor = Literal["visits", "microbatches", "reference"]


def stage_visits(plan: Plan) -> list[int]:
    """Microbatches that run each stage in one iteration (stage 0: all of them)."""
    stage_of = plan.stage_of()
    visits = [0] * plan.num_stages
    for mb in plan.microbatches:
        visits[0] += 1
        for node in mb.path:
            visits[stage_of[node]] += 1
    return visits


def grad_divisor(plan: Plan, stage: int, mode: str = "visits") -> int:
    """What the summed gradient of ``stage`` is divided by (0 means: not visited, zero grad)."""
    if mode == "visits":
        return stage_visits(plan)[stage]
    if mode == "microbatches":
        return len(plan.microbatches)
    if mode == "reference":
        per_node: dict[int, int] = {}
        for mb in plan.microbatches:
            per_node[mb.data_node] = per_node.get(mb.data_node, 0) + 1
        return max(per_node.values()) * len(plan.stages[stage])
    raise ValueError(f"unknown gradient divisor {mode!r} (known: {', '.join(GRAD_DIVISORS)})")


def flat_grads(module: nn.Module) -> torch.Tensor:
    """All parameter gradients in registration order as one fp32 vector (missing -> zeros)."""
    parts = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
        for p in module.parameters()
    ]
    return torch.cat(parts)


def set_flat_grads(module: nn.Module, flat: torch.Tensor) -> None:
    """Inverse of ``flat_grads``: every parameter gets a ``.grad`` (zeros where it had none)."""
    offset = 0
    for p in module.parameters():
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n
    if offset != flat.numel():
        raise ValueError(f"flat gradient has {flat.numel()} values, the module {offset}")


def average_group(copies: Sequence[nn.Module], divisor: int) -> torch.Tensor:
    """Single-process version of the group all-reduce: sum the copies' gradients in the given
    (node) order, divide by ``divisor``, give every copy the result. Returns the averaged vector."""
    total = flat_grads(copies[0]).clone()
    for c in copies[1:]:
        total += flat_grads(c)
    if divisor > 0:
        total /= divisor
    else:
        total.zero_()
    for c in copies:
        set_flat_grads(c, total)
    return total


def stage_sq_norm(module: nn.Module) -> float:
    """Squared L2 norm of a stage's gradients, accumulated in float64 (on the gradients' device)."""
    params = list(module.parameters())
    total = torch.zeros((), dtype=torch.float64, device=params[0].device if params else None)
    for p in params:
        if p.grad is not None:
            total += p.grad.detach().double().pow(2).sum()
    return float(total)


def clip_coefficient(stage_sq_norms: Sequence[float], max_norm: float) -> tuple[float, float]:
    """(global norm, factor to multiply every gradient by); the factor is 1 when no clipping is
    needed or ``max_norm`` <= 0. Same rule as ``torch.nn.utils.clip_grad_norm_``."""
    norm = math.sqrt(sum(float(x) for x in stage_sq_norms))
    if max_norm <= 0:
        return norm, 1.0
    return norm, min(1.0, max_norm / (norm + 1e-6))


@torch.no_grad()
def scale_grads(module: nn.Module, factor: float) -> None:
    if factor == 1.0:
        return
    for p in module.parameters():
        if p.grad is not None:
            p.grad.mul_(factor)
