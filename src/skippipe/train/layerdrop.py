"""Random stage dropout (LayerDrop-style) on a full-pipeline plan: the baseline that path
scheduling's skipping is compared against for robustness.

Every iteration, every microbatch keeps each non-data stage of its path independently with
probability ``keep``, drawn afresh (seeded by the run's seed, the iteration and the microbatch,
so a run is reproducible). The kept nodes run in pipeline order; the data node always runs.
With ``keep = (L - 1) / (S - 1)`` the expected depth equals a SkipPipe path of length L, but
the depth varies from microbatch to microbatch and nothing plans which stages are skipped.

Gradients are averaged per stage over the microbatches that actually ran the stage this
iteration (the ``"visits"`` divisor, recomputed from the drawn paths); a stage that no
microbatch ran gets a zero gradient, as in the reference executor.
"""

from __future__ import annotations

import numpy as np
import torch

from skippipe.model.config import ModelConfig
from skippipe.planfile import Plan
from skippipe.train.config import TrainConfig
from skippipe.train.executor import BatchFn, ReferenceExecutor
from skippipe.train.ops import backward_op, forward_op, loss_op


def keep_probability(num_stages: int, path_length: int) -> float:
    """The chance to keep a non-data stage so that the expected depth is ``path_length`` stages."""
    if not 1 <= path_length <= num_stages or num_stages < 2:
        raise ValueError(f"path length {path_length} does not fit {num_stages} stages")
    return (path_length - 1) / (num_stages - 1)


def drawn_paths(plan: Plan, keep: float, seed: int, iteration: int) -> dict[int, list[int]]:
    """Each microbatch's path with every node kept with probability ``keep`` (same draw for the
    same seed and iteration)."""
    out = {}
    for mb in plan.microbatches:
        rng = np.random.default_rng([seed, iteration, mb.id, 0x1D])
        kept = rng.random(len(mb.path)) < keep
        out[mb.id] = [node for node, k in zip(mb.path, kept, strict=True) if k]
    return out


class LayerDropExecutor(ReferenceExecutor):
    """``ReferenceExecutor`` on a full-pipeline plan with random stage dropout while training."""

    def __init__(self, plan: Plan, model_cfg: ModelConfig, train_cfg: TrainConfig, batch_fn: BatchFn, keep: float):
        super().__init__(plan, model_cfg, train_cfg, batch_fn)
        if not 0.0 < keep <= 1.0:
            raise ValueError(f"keep probability must be in (0, 1], got {keep}")
        if train_cfg.grad_divisor != "visits":
            raise ValueError("stage dropout averages over the microbatches that ran a stage: use grad_divisor 'visits'")
        self.keep = keep
        self.paths: dict[int, list[int]] = {}

    def run_microbatch(self, mb_id: int, x: torch.Tensor, y: torch.Tensor) -> float:
        data_node = self.plan.microbatch(mb_id).data_node
        precision = self.cfg.precision
        saved = [forward_op(self.copies[data_node], x, precision)]
        for node in self.paths[mb_id]:
            saved.append(forward_op(self.copies[node], saved[-1].output, precision))
        loss, grad = loss_op(self.copies[data_node], saved[-1].output, y, precision)
        for s in reversed(saved):
            grad = backward_op(s, grad)  # type: ignore[arg-type]
        return loss

    def forward_backward(self) -> dict[int, float]:
        self.paths = drawn_paths(self.plan, self.keep, self.cfg.seed, self.iteration)
        visits = [0] * self.plan.num_stages
        visits[0] = len(self.plan.microbatches)
        for path in self.paths.values():
            for node in path:
                visits[self.stage_of[node]] += 1
        self.divisors = visits
        return super().forward_backward()
