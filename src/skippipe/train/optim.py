"""AdamW for one stage copy, and the learning-rate schedule (linear warmup, cosine decay).

Every node builds its optimizer with ``make_optimizer`` and sets the rate of iteration t with
``set_lr(opt, lr_at(t, cfg))`` before ``opt.step()``: identical gradients then give identical
copies on every node.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from skippipe.train.config import TrainConfig


def adamw_kernel(device: torch.device) -> dict[str, bool]:
    """The AdamW implementation for parameters on ``device``, chosen here only: the fused kernel
    on CUDA, the multi-tensor (foreach) one elsewhere. Every copy of a stage lives on the same
    kind of device as its peers in the reference, so copies stay identical."""
    if device.type == "cuda":
        return {"fused": True}
    return {"foreach": True}


def make_optimizer(module: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW on the module's (fp32) parameters; weight decay on matrices (ndim >= 2: linear
    weights, embedding), none on norms; the kernel from ``adamw_kernel``."""
    params = list(module.parameters())
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    device = params[0].device if params else torch.device("cpu")
    return torch.optim.AdamW(
        [g for g in groups if g["params"]], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, **adamw_kernel(device)
    )


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of iteration ``step`` (0-based): linear warmup over ``warmup_steps`` to
    ``lr``, then cosine down to ``min_lr`` at ``steps``; ``min_lr`` afterwards."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr
