"""A training run with the reference executor: ``cfg.steps`` iterations of one plan, the
validation loss of the full model every ``cfg.eval_every`` iterations, a tqdm progress bar.
Used by the experiments in ``benchmarks/`` and for small single-process runs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tqdm import tqdm

from skippipe.data.dataset import TokenData
from skippipe.eval import validation_loss
from skippipe.model.config import ModelConfig
from skippipe.planfile import Plan
from skippipe.train.config import TrainConfig
from skippipe.train.executor import ReferenceExecutor, plan_batch_fn
from skippipe.train.grouped import GroupedExecutor
from skippipe.train.layerdrop import LayerDropExecutor


@dataclass
class History:
    train: list[tuple[int, float]] = field(default_factory=list)  # (iteration, mean microbatch loss)
    val: list[tuple[int, float]] = field(default_factory=list)  # (iterations done, validation loss)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"train": self.train, "val": self.val, "seconds": self.seconds}


def train_plan(
    plan: Plan, cfg: TrainConfig, data: TokenData, model_cfg: ModelConfig | None = None,
    progress: bool = True, desc: str = "train", keep_stage: float | None = None, grouped: bool = False,
    device: str = "cpu",
) -> tuple[ReferenceExecutor | GroupedExecutor, History]:
    """Train ``plan`` for ``cfg.steps`` iterations; with ``keep_stage`` (a probability), every
    microbatch also drops each stage of its path at random (``train.layerdrop``); ``grouped``:
    the same math with one model copy and batched stage sequences (``train.grouped``, faster);
    ``device`` (e.g. ``"cuda"``) is the grouped executor's only (the others keep a model copy per node)."""
    if device != "cpu" and not grouped:
        raise ValueError(f"device {device!r} needs the grouped executor (grouped=True)")
    model_cfg = model_cfg or cfg.model_config(data.vocab_size)
    seq_len = cfg.tokens_per_sample(model_cfg)
    batches = plan_batch_fn(plan, data.train, cfg, seq_len)
    ex: ReferenceExecutor | GroupedExecutor
    if grouped:
        ex = GroupedExecutor(plan, model_cfg, cfg, batches, keep_stage, device)
    elif keep_stage is None:
        ex = ReferenceExecutor(plan, model_cfg, cfg, batches)
    else:
        ex = LayerDropExecutor(plan, model_cfg, cfg, batches, keep_stage)
    hist = History()
    samples = cfg.eval_batches * cfg.eval_batch_size

    def evaluate() -> float:
        loss = validation_loss(ex.full_model(), data.val, seq_len, samples, cfg.eval_batch_size)
        hist.val.append((ex.iteration, loss))
        return loss

    start = time.perf_counter()
    evaluate()
    bar = tqdm(range(cfg.steps), desc=desc, disable=not progress, dynamic_ncols=True)
    for _ in bar:
        r = ex.step()
        hist.train.append((r.iteration, r.loss))
        postfix = {"loss": f"{r.loss:.3f}"}
        if cfg.eval_every and ex.iteration % cfg.eval_every == 0 and ex.iteration < cfg.steps:
            postfix["val"] = f"{evaluate():.3f}"
        bar.set_postfix(postfix)
    evaluate()
    hist.seconds = time.perf_counter() - start
    return ex, hist
