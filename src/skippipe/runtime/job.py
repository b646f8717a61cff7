"""The ``skippipe train`` job: config -> plan -> workers -> metrics, checkpoints, timeline.

``prepare`` resolves everything the workers need into the run folder (the effective config as
``config.json``, the plan as ``plan.json``, a warm token cache); ``train`` launches the
workers locally with a progress bar and returns a ``Summary``. Both raise one-line
``UserError``s for bad input.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skippipe.errors import UserError
from skippipe.fileio import atomic_write_text
from skippipe.planfile import Plan, load_plan, save_plan
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime.config import RunConfig
from skippipe.runtime.metrics import METRICS_FILE, read_metrics

RUN_OUTPUTS = ("checkpoints", "timeline", "tensorboard", "logs", METRICS_FILE, "timeline.png", "plan.json", "config.json")


@dataclass
class Prepared:
    cfg: RunConfig
    run_dir: Path
    plan: Plan
    config_file: Path  # the effective config the workers read
    start_step: int
    steps: int
    predicted_makespan_s: float | None  # simulator, plan seconds
    predicted_ops: list[Any] | None = None


@dataclass
class Summary:
    run_dir: Path
    iterations: int
    first_loss: float
    last_loss: float
    mean_iter_s: float
    mean_makespan_plan_s: float
    predicted_makespan_s: float | None
    wall_s: float
    checkpoint: Path | None
    timeline_png: Path | None
    records: list[dict[str, Any]] = field(default_factory=list)


def build_plan(cfg: RunConfig, model_cfg: Any, seq_len: int) -> Plan:
    """The plan of a config: its plan file, or the planner on its cluster and pipeline shape."""
    if cfg.plan.file:
        return load_plan(cfg.plan.file)
    from skippipe.cluster import load_cluster
    from skippipe.planner.problem import build_problem

    try:
        from skippipe.planner.methods import make_plan
    except ImportError:
        raise UserError("planning needs skippipe.planner.methods, which this installation lacks; give [plan] file") from None
    train = cfg.train_config()
    cluster = load_cluster(cfg.plan.cluster)
    workload = cfg.plan.workload(model_cfg.n_layers, model_cfg.d_model, seq_len, train.samples_per_microbatch)
    problem = build_problem(cluster, workload)
    return make_plan(cfg.plan.method, problem, seed=cfg.plan.seed, time_limit_s=cfg.plan.time_limit_s)


def prepare(cfg: RunConfig, run_dir: Path, resume: bool = False, fresh: bool = False) -> Prepared:
    from skippipe.data.dataset import token_data_for

    train = cfg.train_config()
    existing = [name for name in ("checkpoints", METRICS_FILE) if (run_dir / name).exists()]
    if resume and fresh:
        raise UserError("--resume and --fresh exclude each other")
    if existing and not resume and not fresh:
        raise UserError(f"{run_dir} already holds a run ({', '.join(existing)}); continue it with --resume, or start over with --fresh")
    if fresh:
        for name in RUN_OUTPUTS:
            p = run_dir / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    data = token_data_for(train)  # warms the tokenizer/token cache once for all workers
    model_cfg = train.model_config(data.vocab_size)
    seq_len = train.tokens_per_sample(model_cfg)
    start = 0
    if resume:
        latest = ckpt.latest(run_dir)
        if latest is None:
            raise UserError(f"--resume: {run_dir} holds no checkpoint")
        plan_file = latest / "plan.json"
        if not plan_file.is_file():
            raise ckpt.CheckpointError(f"checkpoint {latest}: plan.json is missing")
        plan = load_plan(plan_file)
        info = ckpt.verify(latest, plan)
        start = info.step
        if start >= train.steps:
            raise UserError(f"--resume: the checkpoint in {latest} is at step {start}; [train] steps = {train.steps} are done")
    else:
        plan = build_plan(cfg, model_cfg, seq_len)
    layers = sum(len(ls) for ls in plan.layers)
    if layers != model_cfg.n_layers:
        raise UserError(f"the plan's stages hold {layers} layers but the model has {model_cfg.n_layers}")
    save_plan(plan, run_dir / "plan.json")
    config_file = run_dir / "config.json"
    atomic_write_text(config_file, json.dumps(cfg.to_dict(), indent=1) + "\n")
    predicted, ops = None, None
    try:
        from skippipe.sim import simulate

        res = simulate(plan, bound=False)
        predicted, ops = (res.makespan_s if res.finished else None), res.ops
    except ImportError:
        pass
    return Prepared(cfg, run_dir, plan, config_file, start, train.steps, predicted, ops)


def train(prep: Prepared, until: int | None = None, progress: bool = True) -> Summary:
    """Launch one worker per plan node here, show progress, summarise."""
    from tqdm import tqdm

    from skippipe.runtime.launch import launch_local

    cfg, run_dir = prep.cfg, prep.run_dir
    rt = cfg.runtime
    end = prep.steps if until is None else min(prep.steps, until)
    if end <= prep.start_step:
        raise UserError(f"--until {until} is not after the checkpoint's step {prep.start_step}")
    args = [str(prep.config_file), "--run-dir", str(run_dir)]
    if prep.start_step > 0:
        args.append("--resume")
    if until is not None:
        args += ["--until", str(until)]
    bar = tqdm(total=end - prep.start_step, desc="train", unit="it", disable=not progress, dynamic_ncols=True)
    seen = {"n": 0}
    path = run_dir / METRICS_FILE

    def poll() -> bool:
        if not path.is_file():
            return False
        recs = [r for r in read_metrics(run_dir) if int(r.get("iteration", 0)) > prep.start_step]
        new = recs[seen["n"]:]
        if not new:
            return False
        seen["n"] = len(recs)
        last = new[-1]
        bar.set_postfix(it=last["iteration"], loss=f"{last['loss']:.4f}", iter_s=f"{last['iter_s']:.2f}", refresh=False)
        bar.update(len(new))
        return True

    t0 = time.monotonic()
    stall = rt.timeout_s + rt.rendezvous_timeout_s + 120.0
    try:
        launch_local(
            prep.plan.n_nodes, args, run_dir, stall_s=stall, rendezvous_timeout_s=rt.rendezvous_timeout_s,
            on_poll=poll, master_addr=rt.master_addr, master_port=rt.master_port,
            threads_per_worker=rt.threads_per_worker, start_method=rt.start_method,
        )
        poll()
    finally:
        bar.close()
    wall = time.monotonic() - t0
    return summarize(prep, wall, end)


def summarize(prep: Prepared, wall_s: float, end: int) -> Summary:
    from skippipe.runtime import timeline

    run_dir = prep.run_dir
    recs = [r for r in read_metrics(run_dir) if prep.start_step < int(r["iteration"]) <= end]
    if not recs:
        raise UserError(f"the workers finished but {run_dir / METRICS_FILE} holds no record of this run")
    steady = recs[1:] if len(recs) > 1 else recs  # the first iteration pays for warm-up
    png = None
    records, scale = timeline.load_timeline(run_dir)
    its = timeline.iterations(records)
    if its:
        wanted = prep.cfg.run.timeline_iteration - 1  # records count iterations from 0
        it = wanted if wanted in its else its[-1]
        png = timeline.draw(
            run_dir / "timeline.png", records, it, prep.plan.n_nodes, scale,
            predicted=prep.predicted_ops, predicted_makespan=prep.predicted_makespan_s,
            title=f"{prep.plan.method} plan, {prep.plan.n_nodes} nodes: real run vs simulator",
        )
    return Summary(
        run_dir=run_dir, iterations=len(recs), first_loss=recs[0]["loss"], last_loss=recs[-1]["loss"],
        mean_iter_s=sum(r["iter_s"] for r in steady) / len(steady),
        mean_makespan_plan_s=sum(r["makespan_plan_s"] for r in steady) / len(steady),
        predicted_makespan_s=prep.predicted_makespan_s, wall_s=wall_s, checkpoint=ckpt.latest(run_dir),
        timeline_png=png, records=recs,
    )


def format_summary(s: Summary, emulated: bool, time_scale: float) -> str:
    lines = [
        f"iterations      {s.iterations} (loss {s.first_loss:.4f} -> {s.last_loss:.4f})",
        f"iteration time  {s.mean_iter_s:.3f} s real (mean over iterations after the first)",
    ]
    if emulated:
        pred = s.predicted_makespan_s
        cmp = ""
        if pred and math.isfinite(pred):
            cmp = f", simulator {pred:.2f} s ({100 * (s.mean_makespan_plan_s / pred - 1):+.1f} %)"
        lines.append(f"makespan        {s.mean_makespan_plan_s:.2f} plan s measured (time scale {time_scale:g}){cmp}")
    lines += [
        f"wall time       {s.wall_s:.1f} s",
        f"metrics         {s.run_dir / METRICS_FILE} (TensorBoard: {s.run_dir / 'tensorboard'})",
        f"checkpoint      {s.checkpoint}",
    ]
    if s.timeline_png:
        lines.append(f"timeline        {s.timeline_png}")
    return "\n".join(lines)
