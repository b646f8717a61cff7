"""A fast single-process executor for experiments: the reference executor's math with one copy
of the model and the microbatches that take the same stage sequence run as one batch.

Why it is the same training: in the reference executor (``executor.py``) every copy of a stage
sums the gradients of the microbatches it ran, the stage group sums its copies and divides by
the stage's divisor, and identical AdamW steps keep the copies identical. Summing over the
copies of a stage is summing over every microbatch that ran the stage, which is what one
shared copy accumulates; AdamW works element by element, so one optimizer over the whole model
equals one per copy. A microbatch's loss is the mean over its tokens, and microbatches of one
stage sequence have equal shapes, so their summed losses are the batch's per-microbatch means
added up. Only the order of floating-point sums differs (checked against the reference
executor in ``tests/test_grouped_executor.py``).

Paths come from the plan, or, with ``keep_stage``, are drawn afresh every iteration as in
``layerdrop.py`` (random stage dropout at an expected depth).
"""

from __future__ import annotations

import copy
from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F

from skippipe.model.config import ModelConfig
from skippipe.model.llama import Llama
from skippipe.planfile import Plan
from skippipe.train.config import TrainConfig
from skippipe.train.executor import BatchFn, StepResult
from skippipe.train.grads import clip_coefficient, grad_divisor
from skippipe.train.layerdrop import drawn_paths
from skippipe.train.ops import autocast
from skippipe.train.optim import lr_at, make_optimizer, set_lr


def param_stages(model: Llama, layers: list[list[int]]) -> dict[str, int]:
    """The stage of every parameter: a layer's stage, or stage 0 for embedding, norm and head."""
    stage_of_layer = {i: s for s, ids in enumerate(layers) for i in ids}
    out = {}
    for name, _ in model.named_parameters():
        parts = name.split(".")
        out[name] = stage_of_layer[int(parts[1])] if parts[0] == "layers" else 0
    return out


class GroupedExecutor:
    def __init__(self, plan: Plan, model_cfg: ModelConfig, train_cfg: TrainConfig, batch_fn: BatchFn,
                 keep_stage: float | None = None, device: str | torch.device = "cpu"):
        if model_cfg.n_layers != sum(len(ls) for ls in plan.layers):
            raise ValueError(f"plan covers {sum(len(ls) for ls in plan.layers)} layers, the model has {model_cfg.n_layers}")
        if keep_stage is not None and train_cfg.grad_divisor != "visits":
            raise ValueError("stage dropout averages over the microbatches that ran a stage: use grad_divisor 'visits'")
        self.plan = plan
        self.model_cfg = model_cfg
        self.cfg = train_cfg
        self.batch_fn = batch_fn
        self.keep_stage = keep_stage
        self.device = torch.device(device)
        self.model = Llama(model_cfg).to(self.device)  # before the optimizer: it picks its kernel by device
        self.optimizer = make_optimizer(self.model, train_cfg)
        self.stage_of = plan.stage_of()
        self.param_stage = param_stages(self.model, plan.layers)
        self.paths: dict[int, list[int]] = {mb.id: list(mb.path) for mb in plan.microbatches}
        self.divisors = [grad_divisor(plan, s, train_cfg.grad_divisor) for s in range(plan.num_stages)]
        self.iteration = 0

    def _draw(self) -> None:
        if self.keep_stage is None:
            return
        self.paths = drawn_paths(self.plan, self.keep_stage, self.cfg.seed, self.iteration)
        visits = [len(self.plan.microbatches)] + [0] * (self.plan.num_stages - 1)
        for path in self.paths.values():
            for node in path:
                visits[self.stage_of[node]] += 1
        self.divisors = visits

    def forward_backward(self) -> dict[int, float]:
        self.optimizer.zero_grad(set_to_none=True)
        self._draw()
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for mb in sorted(self.plan.microbatches, key=lambda m: m.id):
            groups[tuple(self.stage_of[n] for n in self.paths[mb.id])].append(mb.id)
        losses: dict[int, float] = {}
        self.model.train()
        for seq, ids in sorted(groups.items()):
            batches = [self.batch_fn(self.iteration, i) for i in ids]
            x = torch.cat([b[0] for b in batches]).to(self.device)
            y = torch.cat([b[1] for b in batches]).to(self.device)
            order = [layer for s in (0, *seq) for layer in self.plan.layers[s]]
            with autocast(x.device, self.cfg.precision):
                logits = self.model(x, order)
            per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), reduction="none")
            per_mb = per_token.view(len(ids), -1).mean(dim=1)
            per_mb.sum().backward()
            losses.update(zip(ids, per_mb.detach().tolist(), strict=True))
        return losses

    @torch.no_grad()
    def average_and_clip(self) -> float:
        sq = [0.0] * self.plan.num_stages
        for name, p in self.model.named_parameters():
            s = self.param_stage[name]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if self.divisors[s] > 0:
                p.grad /= self.divisors[s]
            else:
                p.grad.zero_()
            sq[s] += float(p.grad.double().pow(2).sum())
        norm, factor = clip_coefficient(sq, self.cfg.grad_clip)
        if factor != 1.0:
            for p in self.model.parameters():
                p.grad.mul_(factor)
        return norm

    def step(self) -> StepResult:
        t = self.iteration
        losses = self.forward_backward()
        norm = self.average_and_clip()
        lr = lr_at(t, self.cfg)
        set_lr(self.optimizer, lr)
        self.optimizer.step()
        self.iteration += 1
        return StepResult(t, float(np.mean(list(losses.values()))), norm, lr, losses)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the weights."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def full_model(self) -> Llama:
        """A copy of the model, on the executor's device."""
        return copy.deepcopy(self.model)
