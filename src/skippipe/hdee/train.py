"""One training job: a seed model on the mixture, a probe, or an expert on its domain. Resumable.

A job is a ``JobSpec`` (everything that decides its result) and a folder ``RUN/<kind>s/<name>``.
``run_job`` skips a job whose ``final/`` checkpoint exists, continues one from its newest step
checkpoint, or starts it (from scratch, or from a seed model's weights: BTM branching).
Batches are a pure function of (job seed, step), the learning rate of the step number, and the
AdamW state is checkpointed, so an interrupted job continues to the same weights it would have
reached without the interruption. Each job has its own warmup + cosine schedule of its own
length (not a truncated shared one).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from skippipe.errors import UserError
from skippipe.hdee import checkpoint as ckpt
from skippipe.hdee.data import RunData, eval_windows, load_run_data, sample_windows
from skippipe.hdee.flops import train_flops
from skippipe.model.config import ModelConfig
from skippipe.model.llama import Llama
from skippipe.train.config import TrainConfig
from skippipe.train.optim import lr_at, make_optimizer, set_lr

KINDS = ("seed", "probe", "expert")


@dataclass(frozen=True)
class JobSpec:
    kind: str  # "seed" (mixture of the training domains), "probe" or "expert" (one domain)
    name: str  # unique within its kind, e.g. "bible-M-400"
    domains: tuple[str, ...]  # training text: one domain, or all training domains for a seed model
    size: str
    model: dict[str, Any]  # ModelConfig fields
    steps: int
    batch_size: int
    lr: float
    min_lr: float
    warmup_steps: int
    weight_decay: float
    grad_clip: float
    seed: int
    data_digest: str
    init: str = ""  # final/ folder of the seed model to branch from ("" = from scratch)
    init_digest: str = ""
    eval_domains: tuple[str, ...] = ()  # validation loss measured on these at the end
    eval_windows: int = 32
    # how the job runs, not what it computes (left out of the digest):
    checkpoint_every: int = field(default=100, compare=False)
    keep_checkpoints: int = field(default=2, compare=False)
    log_every: int = field(default=50, compare=False)

    @property
    def folder(self) -> str:
        return f"{self.kind}s/{self.name}"

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"

    def model_config(self) -> ModelConfig:
        return ModelConfig(**self.model)

    def flops(self) -> int:
        cfg = self.model_config()
        return train_flops(cfg, self.steps, self.batch_size, cfg.ctx)

    def digest(self) -> str:
        d = asdict(self)
        for key in ("init", "checkpoint_every", "keep_checkpoints", "log_every"):
            d.pop(key)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    def data_seed(self) -> int:
        """Batches depend on the run seed and the job's domains only: experts of one domain
        with different sizes or steps see the same sequence of batches."""
        text = f"{self.seed}/{self.kind}/{','.join(self.domains)}"
        return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


@dataclass
class JobResult:
    label: str
    steps_done: int
    steps: int
    seconds: float
    train_loss: float  # mean of the last 10 steps
    val_loss: dict[str, float]  # per evaluation domain (finished jobs)
    skipped: bool  # already finished before this call
    losses: list[float]


def _train_config(spec: JobSpec) -> TrainConfig:
    return TrainConfig(
        steps=max(1, spec.steps), lr=spec.lr, min_lr=spec.min_lr, warmup_steps=spec.warmup_steps,
        weight_decay=spec.weight_decay, grad_clip=spec.grad_clip, seed=spec.seed,
    )


@torch.no_grad()
def validation_losses(
    model: Llama, data: RunData, domains: tuple[str, ...], windows: int, batch_size: int = 16
) -> dict[str, float]:
    """Mean next-token loss (nats per token) on evenly spread validation windows of each domain."""
    model.eval()
    out = {}
    for name in domains:
        w = eval_windows(data.domains[name].splits["val"], model.cfg.ctx, windows)
        total = 0.0
        for i in range(0, len(w), batch_size):
            x = torch.from_numpy(w[i : i + batch_size])
            total += float(model.loss(x[:, :-1], x[:, 1:])) * len(x)
        out[name] = total / len(w)
    model.train()
    return out


def _start_model(spec: JobSpec) -> Llama:
    model = Llama(spec.model_config())
    if spec.init:
        init = Path(spec.init)
        saved = ckpt.verify(init, spec.init_digest or None)
        try:
            model.load_state_dict(ckpt.load_weights(saved.path), strict=True)
        except RuntimeError:
            raise UserError(f"{spec.label}: the seed model in {init} has another shape; a branch needs the same size") from None
    return model


def run_job(
    spec: JobSpec, run_dir: str | Path, data: RunData | None = None, until: int | None = None,
    report: Callable[[str], None] = print,
) -> JobResult:
    """Train ``spec`` to its last step (or to step ``until``, then checkpoint and stop)."""
    job_dir = Path(run_dir) / spec.folder
    digest = spec.digest()
    done = ckpt.final_of(job_dir, digest)
    if done is not None:
        val = done.extra.get("val_loss", {})
        return JobResult(spec.label, done.step, spec.steps, 0.0, _tail(done.losses), val, True, done.losses)
    model = _start_model(spec)
    tcfg = _train_config(spec)
    opt = make_optimizer(model, tcfg)
    step, losses = 0, []
    saved = ckpt.latest_step(job_dir, digest)
    if saved is not None:
        model.load_state_dict(ckpt.load_weights(saved.path), strict=True)
        ckpt.load_optimizer(saved.path, opt)
        step, losses = saved.step, list(saved.losses)
        report(f"[{spec.label}] resuming at step {step}/{spec.steps}")
    data = data or load_run_data(run_dir)
    sources = [data.domains[d].splits["train"] for d in spec.domains]
    seq_len, seed = model.cfg.ctx, spec.data_seed()
    stop = spec.steps if until is None else min(spec.steps, until)
    model.train()
    start = time.perf_counter()
    while step < stop:
        set_lr(opt, lr_at(step, tcfg))
        x, y = sample_windows(sources, spec.batch_size, seq_len, seed, step)
        loss = model.loss(torch.from_numpy(x), torch.from_numpy(y))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if spec.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        opt.step()
        losses.append(loss.item())
        step += 1
        if not math.isfinite(losses[-1]):
            raise UserError(f"{spec.label}: the loss is {losses[-1]} at step {step}; lower the learning rate")
        if spec.log_every and step % spec.log_every == 0:
            report(f"[{spec.label}] step {step}/{spec.steps} loss {_tail(losses):.3f} ({time.perf_counter() - start:.0f} s)")
        if step < spec.steps and (step == stop or (spec.checkpoint_every and step % spec.checkpoint_every == 0)):
            ckpt.save_step(job_dir, digest, step, model, opt, losses, spec.keep_checkpoints)
    seconds = time.perf_counter() - start
    if step < spec.steps:
        report(f"[{spec.label}] stopped at step {step}/{spec.steps} (checkpoint written)")
        return JobResult(spec.label, step, spec.steps, seconds, _tail(losses), {}, False, losses)
    val = validation_losses(model, data, spec.eval_domains, spec.eval_windows) if spec.eval_domains else {}
    extra = {"job": spec.label, "flops": spec.flops(), "val_loss": val, "seconds": seconds}
    ckpt.save_final(job_dir, digest, model.cfg, model, losses, {"job": asdict(spec)}, data.tokenizer, extra)
    shown = ", ".join(f"{k} {v:.3f}" for k, v in val.items())
    shown = f", val {shown}" if shown else ""
    report(f"[{spec.label}] done: {spec.steps} steps, loss {_tail(losses):.3f}{shown} ({seconds:.0f} s)")
    return JobResult(spec.label, step, spec.steps, seconds, _tail(losses), val, False, losses)


def _tail(losses: list[float], n: int = 10) -> float:
    return float(np.mean(losses[-n:])) if losses else float("nan")


def load_expert(run_dir: str | Path, folder: str) -> Llama:
    """The final weights of a finished job (``folder`` as in ``JobSpec.folder``)."""
    from skippipe.model.checkpoint import load_checkpoint, load_model

    final = Path(run_dir) / folder / "final"
    if not (final / "manifest.json").is_file():
        raise UserError(f"{final}: this job has not finished; run `skippipe hdee train` first")
    ckpt.verify(final, None)
    return load_model(load_checkpoint(final))
