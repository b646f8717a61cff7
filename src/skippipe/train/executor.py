"""The reference executor: one training iteration of a Plan in a single process.

It uses exactly the pieces the distributed runtime uses, in the simplest possible order, and
is the oracle the runtime is tested against:

1. every node of the plan holds its own copy of its stage (``build_stage``) and its own AdamW;
2. for each microbatch (in id order): ``forward_op`` of stage 0 on its data node (embedding +
   stage-0 layers), then ``forward_op`` on each node of its path in path order, ``loss_op`` on
   the data node, then ``backward_op`` along the reverse path and finally on the data node;
   gradients accumulate in each node copy's ``.grad``;
3. per stage group: sum of the copies' gradients (in the group's node order) divided by
   ``grad_divisor`` (``TrainConfig.grad_divisor``), the same averaged gradient on every copy;
4. global-norm clipping across stages (``stage_sq_norm`` per stage, ``clip_coefficient``);
5. ``lr_at`` of the iteration, ``opt.step()`` on every copy: copies of a stage stay identical.

``TrainConfig.precision`` and ``activation_checkpointing`` apply here exactly as in the runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from skippipe.data.batches import microbatch_starts, windows
from skippipe.model.config import ModelConfig
from skippipe.model.llama import Llama, Stage, build_stage
from skippipe.planfile import Plan
from skippipe.train.config import TrainConfig
from skippipe.train.grads import average_group, clip_coefficient, grad_divisor, scale_grads, stage_sq_norm
from skippipe.train.ops import backward_op, forward_op, loss_op
from skippipe.train.optim import lr_at, make_optimizer, set_lr

BatchFn = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]  # (iteration, mb id) -> (x, y)


@dataclass
class StepResult:
    iteration: int
    loss: float  # mean over microbatches of their mean token loss
    grad_norm: float  # global norm before clipping
    lr: float
    microbatch_loss: dict[int, float]


def plan_batch_fn(plan: Plan, train_tokens: np.ndarray, cfg: TrainConfig, seq_len: int) -> BatchFn:
    """The samples of microbatch ``mb_id`` at ``iteration`` (``skippipe.data.batches``)."""

    def fn(iteration: int, mb_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = microbatch_starts(
            plan, mb_id, iteration, len(train_tokens), seq_len, cfg.samples_per_microbatch, cfg.seed, cfg.sharding,
            cfg.resolved_sampling(),
        )
        x, y = windows(train_tokens, starts, seq_len)
        return torch.from_numpy(x), torch.from_numpy(y)

    return fn


class ReferenceExecutor:
    def __init__(self, plan: Plan, model_cfg: ModelConfig, train_cfg: TrainConfig, batch_fn: BatchFn):
        if model_cfg.n_layers != sum(len(ls) for ls in plan.layers):
            raise ValueError(f"plan covers {sum(len(ls) for ls in plan.layers)} layers, the model has {model_cfg.n_layers}")
        self.plan = plan
        self.model_cfg = model_cfg
        self.cfg = train_cfg
        self.batch_fn = batch_fn
        self.stage_of = plan.stage_of()
        self.copies: dict[int, Stage] = {}
        for s, nodes in enumerate(plan.stages):
            for node in nodes:
                self.copies[node] = build_stage(model_cfg, plan.layers[s], s == 0, train_cfg.activation_checkpointing)
        self.optimizers = {node: make_optimizer(m, train_cfg) for node, m in self.copies.items()}
        self.divisors = [grad_divisor(plan, s, train_cfg.grad_divisor) for s in range(plan.num_stages)]
        self.iteration = 0

    # ------------------------------------------------------------------ one iteration
    def run_microbatch(self, mb_id: int, x: torch.Tensor, y: torch.Tensor) -> float:
        mb = self.plan.microbatch(mb_id)
        precision = self.cfg.precision
        saved = [forward_op(self.copies[mb.data_node], x, precision)]
        for node in mb.path:
            saved.append(forward_op(self.copies[node], saved[-1].output, precision))
        loss, grad = loss_op(self.copies[mb.data_node], saved[-1].output, y, precision)
        for s in reversed(saved):
            grad = backward_op(s, grad)  # type: ignore[arg-type]
        return loss

    def forward_backward(self) -> dict[int, float]:
        """Phase 1 of an iteration: every microbatch's F, L and B ops; gradients summed per copy."""
        for m in self.copies.values():
            m.zero_grad(set_to_none=True)
        losses = {}
        for mb in sorted(self.plan.microbatches, key=lambda m: m.id):
            x, y = self.batch_fn(self.iteration, mb.id)
            losses[mb.id] = self.run_microbatch(mb.id, x, y)
        return losses

    def average_and_clip(self) -> float:
        """Phase 2: per-stage group average, then global-norm clipping. Returns the norm before clipping."""
        sq = []
        for s, nodes in enumerate(self.plan.stages):
            average_group([self.copies[n] for n in nodes], self.divisors[s])
            sq.append(stage_sq_norm(self.copies[nodes[0]]))
        norm, factor = clip_coefficient(sq, self.cfg.grad_clip)
        for m in self.copies.values():
            scale_grads(m, factor)
        return norm

    def optimizer_step(self) -> float:
        """Phase 3: AdamW on every copy at this iteration's learning rate; returns the rate."""
        lr = lr_at(self.iteration, self.cfg)
        for opt in self.optimizers.values():
            set_lr(opt, lr)
            opt.step()
        self.iteration += 1
        return lr

    def step(self) -> StepResult:
        t = self.iteration
        losses = self.forward_backward()
        norm = self.average_and_clip()
        lr = self.optimizer_step()
        return StepResult(t, float(np.mean(list(losses.values()))), norm, lr, losses)

    # ------------------------------------------------------------------ views
    def stage_module(self, stage: int) -> Stage:
        """The copy held by the stage's first node (all copies are identical)."""
        return self.copies[self.plan.stages[stage][0]]

    def copies_identical(self) -> bool:
        for nodes in self.plan.stages:
            ref = self.copies[nodes[0]].state_dict()
            for n in nodes[1:]:
                other = self.copies[n].state_dict()
                if any(not torch.equal(ref[k], other[k]) for k in ref):
                    return False
        return True

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full model's weights (``Llama`` names), from each stage's first copy."""
        out: dict[str, torch.Tensor] = {}
        for s in range(self.plan.num_stages):
            out.update(self.stage_module(s).state_dict())
        return out

    def full_model(self) -> Llama:
        model = Llama(self.model_cfg)
        model.load_state_dict(self.state_dict())
        return model
