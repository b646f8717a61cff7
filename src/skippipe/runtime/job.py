"""The ``skippipe train`` job: config -> plan -> workers -> metrics, checkpoints, timeline.

``prepare`` resolves everything the workers need into the run folder (the effective config as
``config.json``, the plan as ``plan.json``, a warm token cache); ``train`` launches the
workers locally with a progress bar and returns a ``Summary``. Both raise one-line
``UserError``s for bad input.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from skippipe.errors import DrainRequested, NodeLost, PlanCannotFinish, ResumeMismatch, RunFailed, StageLost, UserError
from skippipe.fileio import atomic_write_text
from skippipe.planfile import Plan, load_plan, save_plan
from skippipe.runtime import local_checkpoint, runfolder
from skippipe.runtime.config import RunConfig
from skippipe.runtime.metrics import METRICS_FILE, read_metrics
from skippipe.runtime.throughput import Throughput, iteration_flops, measure

# what a resumed run may change: how long, how often to record, how to run; never what is trained
RESUMABLE = {"train": ("steps",), "run": None, "runtime": None}


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
    vocab_note: str | None = None  # one line when the tokenizer changes the model preset's vocabulary
    tokens_per_iteration: int = 0
    flops_per_iteration: float = 0.0  # model FLOPs of one iteration (throughput.iteration_flops)


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
    drift: list[Any] = field(default_factory=list)  # DriftEvents: measured makespan away from the prediction
    failures: list[Any] = field(default_factory=list)  # elastic.Failure, one per failure survived
    replans: list[Any] = field(default_factory=list)  # adapt.Replan, one per re-plan on drift
    throughput: Throughput | None = None  # tokens/s, and utilisation on GPUs
    peak_memory_bytes: int = 0  # the most any one worker's CUDA allocator held (0 on CPU)


def build_plan(cfg: RunConfig, model_cfg: Any, seq_len: int) -> Plan:
    """The plan of a config: its plan file, or the planner on its cluster and pipeline shape."""
    if cfg.plan.file:
        return load_plan(cfg.plan.file)
    from skippipe.cluster import load_cluster
    from skippipe.planner.methods import make_plan
    from skippipe.planner.problem import build_problem

    train = cfg.train_config()
    cluster = load_cluster(cfg.plan.cluster)
    workload = cfg.plan.workload(model_cfg.n_layers, model_cfg.d_model, seq_len, train.samples_per_microbatch, cfg.runtime.wire)
    from skippipe.costs import CostModel

    cost_model = None if cfg.plan.t_layer_s is None else CostModel(t_layer_s=cfg.plan.t_layer_s)
    problem = build_problem(cluster, workload, cost_model=cost_model)
    return make_plan(cfg.plan.method, problem, seed=cfg.plan.seed, time_limit_s=cfg.plan.time_limit_s)


def prepare(cfg: RunConfig, run_dir: Path, resume: bool = False, fresh: bool = False) -> Prepared:
    from skippipe.data.dataset import token_data_for

    train = cfg.train_config()
    existing = [name for name in ("checkpoints", METRICS_FILE) if (run_dir / name).exists()]
    if resume and fresh:
        raise UserError("--resume and --fresh exclude each other")
    if existing and not resume and not fresh:
        held = ", ".join(existing)
        raise UserError(f"{run_dir} already holds a run ({held}); continue it with --resume, or start over with --fresh")
    runfolder.claim(run_dir)  # refuses a folder that is not ours before anything is written
    if fresh:
        runfolder.delete_outputs(run_dir)
    runfolder.clean_partials(run_dir)
    data = token_data_for(train)  # warms the tokenizer/token cache once for all workers
    model_cfg = train.model_config(data.vocab_size)
    seq_len = train.tokens_per_sample(model_cfg)
    start = 0
    if resume:
        plan_file, start = local_checkpoint.resume_point(run_dir, cfg.run.checkpoint_storage, cfg.run.local_checkpoint_dir)
        plan = load_plan(plan_file)
        check_resume_config(cfg, run_dir / "config.json")
        if start >= train.steps:
            raise UserError(f"--resume: the checkpoint in {plan_file.parent} is at step {start}; "
                            f"[train] steps = {train.steps} are done")
    else:
        plan = build_plan(cfg, model_cfg, seq_len)
    layers = sum(len(ls) for ls in plan.layers)
    if layers != model_cfg.n_layers:
        raise UserError(f"the plan's stages hold {layers} layers but the model has {model_cfg.n_layers}")
    from skippipe.sim import simulate

    res = simulate(plan, bound=False)
    if not res.finished:  # launching it would only end in a timeout that blames a healthy node
        stuck = ", ".join(str(i) for i in res.unfinished[:5])
        raise PlanCannotFinish(
            f"the plan cannot finish an iteration: the simulator shows microbatches {stuck} never finish "
            "(a memory deadlock or a processing order that waits on itself); give nodes more memory or plan again"
        )
    save_plan(plan, run_dir / "plan.json")
    config_file = run_dir / "config.json"
    atomic_write_text(config_file, json.dumps(cfg.to_dict(), indent=1) + "\n")
    predicted, ops = res.makespan_s, res.ops
    samples = len(plan.microbatches) * train.samples_per_microbatch
    return Prepared(cfg, run_dir, plan, config_file, start, train.steps, predicted, ops, train.vocab_note(data.vocab_size),
                    samples * seq_len, iteration_flops(plan, model_cfg, train.samples_per_microbatch, seq_len))


def check_resume_config(cfg: RunConfig, previous: Path) -> None:
    """``--resume`` must train what the run trained: every key of ``[plan]``, ``[model]`` and
    ``[train]`` (but ``steps``) as in the run's ``config.json``; else ``ResumeMismatch`` naming it."""
    try:
        was = json.loads(previous.read_text())
    except (OSError, ValueError):
        return  # no earlier config to compare with: the checkpoint's own checks still apply
    if not isinstance(was, dict):
        return
    now = cfg.to_dict()
    for table in ("plan", "model", "train"):
        free = RESUMABLE.get(table) or ()
        old, new = was.get(table) or {}, now.get(table) or {}
        for key in sorted(set(old) | set(new)):
            if key not in free and old.get(key) != new.get(key):
                raise ResumeMismatch(f"[{table}] {key}", new.get(key), old.get(key), str(previous))


def train(prep: Prepared, until: int | None = None, progress: bool = True, drift: Any = None, lock_fd: int | None = None,
          checkpoint_on_stop: bool = False) -> Summary:
    """Launch one worker per plan node here, show progress, summarise. ``drift``: a
    ``DriftMonitor`` fed every metrics record (default: one on the plan's predicted makespan
    that prints each drift it finds). ``lock_fd``: the run folder's lock, shared with the
    workers; ``checkpoint_on_stop``: SIGINT/SIGTERM write a checkpoint before the run stops."""
    from tqdm import tqdm

    from skippipe.runtime.drift import DriftMonitor
    from skippipe.runtime.entry import WorkerArgs
    from skippipe.runtime.launch import launch_local

    cfg, run_dir = prep.cfg, prep.run_dir
    rt = cfg.runtime
    end = prep.steps if until is None else min(prep.steps, until)
    if end <= prep.start_step:
        raise UserError(f"--until {until} is not after the checkpoint's step {prep.start_step}")
    args = WorkerArgs(str(prep.config_file), run_dir=str(run_dir), resume=prep.start_step > 0, until=until,
                      checkpoint_on_stop=checkpoint_on_stop)
    bar = tqdm(total=end - prep.start_step, desc="train", unit="it", disable=not progress, dynamic_ncols=True)
    seen: dict[str, Any] = {}
    path = run_dir / METRICS_FILE
    pending: list[Any] = []  # a drift the launcher should re-plan for
    replan = rt.replan_on_drift and rt.on_failure == "continue"

    def on_drift(event: Any) -> None:
        tqdm.write(f"drift: {event.describe()}", file=sys.stderr)
        if replan and seen.get("active") and len(replans) < rt.max_replans:
            pending.append(event)

    from skippipe.runtime.adapt import RejoinWatch

    watch = RejoinWatch(rt.rejoin, rt.join) if rt.on_failure == "continue" and (rt.rejoin or rt.join) else None
    if drift is None and prep.predicted_makespan_s:
        drift = DriftMonitor(prep.predicted_makespan_s, threshold=rt.drift_threshold, window=rt.drift_window, on_drift=on_drift)

    def poll() -> bool:
        if not path.is_file():
            return False
        recs = read_metrics(run_dir)
        prev = seen.get("last")
        if not recs or recs[-1] == prev:
            return False
        new = recs[recs.index(prev) + 1:] if prev in recs else [r for r in recs if int(r["iteration"]) > prep.start_step]
        seen["last"] = last = recs[-1]
        bar.set_postfix(it=last["iteration"], loss=f"{last['loss']:.4f}", iter_s=f"{last['iter_s']:.2f}", refresh=False)
        bar.update(max(0, int(last["iteration"]) - prep.start_step) - bar.n)  # goes back after a recovery
        if drift is not None:
            drift.observe_records(new)
        if watch is not None and seen.get("active") and watch.waiting():
            due = watch.request(int(last["iteration"]), load_plan(run_dir / "plan.json"))
            if due is not None:
                raise due
        if pending:
            event = pending.pop()
            pending.clear()
            raise DrainRequested(f"drift at iteration {event.iteration} (measured/plan {event.ratio:.2f})", event)
        return True

    t0 = time.monotonic()
    stall = rt.timeout_s + rt.rendezvous_timeout_s + 120.0
    failures: list[Any] = []
    replans: list[Any] = []

    def launch(n_nodes: int, worker_args: WorkerArgs, **extra: Any) -> None:
        launch_local(
            n_nodes, worker_args, run_dir, stall_s=stall, rendezvous_timeout_s=rt.rendezvous_timeout_s,
            on_poll=poll, master_addr=rt.master_addr, master_port=rt.master_port,
            threads_per_worker=rt.threads_per_worker, start_method=rt.start_method, lock_fd=lock_fd,
            stop_grace_s=rt.timeout_s + 30.0 if checkpoint_on_stop else 10.0, **extra,
        )

    try:
        seen["active"] = True
        if rt.on_failure == "continue":
            prep, failures = _train_elastic(prep, args, launch, drift, replans)
        else:
            launch(prep.plan.n_nodes, args)
        seen["active"] = False
        poll()
    finally:
        bar.close()
    wall = time.monotonic() - t0
    summary = summarize(prep, wall, end)
    summary.drift = list(drift.events) if drift is not None else []
    summary.failures = failures
    summary.replans = replans
    return summary


def _train_elastic(prep: Prepared, args: Any, launch: Callable[..., None], drift: Any,
                   replans: list[Any]) -> tuple[Prepared, list[Any]]:
    """Rounds of ``launch`` (``elastic.py``): after each node failure, the survivors' state, a
    plan for them and a new round, up to ``[runtime] max_failures`` times; after a drift the
    launcher asked to drain (``DrainRequested``), a new plan on the changed costs
    (``adapt.py``), appended to ``replans``. Returns ``prep`` for the final plan and the failures."""
    from skippipe.planner.shrink import original_nodes
    from skippipe.runtime import adapt as A
    from skippipe.runtime import elastic as E
    from skippipe.runtime.handoff import HANDOFF_ENV
    from skippipe.sim import simulate

    rt, run_dir = prep.cfg.runtime, prep.run_dir
    plan, failures = prep.plan, []
    keep, meta = prep.cfg.run.keep_checkpoints, _checkpoint_meta(prep.cfg)
    first = run_dir / "elastic" / A.FIRST_PLAN
    if not first.is_file():
        save_plan(plan, first)
    joiners: dict[str, str] = {}
    while True:
        round_index = len(failures) + len(replans)
        folder = E.fresh_round_dir(run_dir, round_index)
        try:
            launch(plan.n_nodes, args, drain_s=rt.timeout_s + 30.0, extra_env={HANDOFF_ENV: str(folder), **joiners})
            break
        except NodeLost as lost:
            if len(failures) >= rt.max_failures:
                E.write_report(run_dir, failures, finished=False)
                raise RunFailed(f"{lost} ([runtime] max_failures = {rt.max_failures} reached)", lost.node, lost.kind) from None
            try:
                plan, fail = E.recover(run_dir, plan, lost, round_index, keep, meta)
            except StageLost as exc:
                E.write_report(run_dir, failures, finished=False)
                raise RunFailed(f"{lost}; {exc}", lost.node, "stage_lost") from None
            failures.append(fail)
            E.write_report(run_dir, failures, finished=False)
            step, restarted = fail.recovery_step, fail
        except DrainRequested as request:
            plan, record = A.replan_after_drain(run_dir, plan, request, round_index, keep, meta, rt.emulate_events,
                                                prep.cfg.plan.method, prep.cfg.plan.seed, rt.drift_window)
            replans.append(record)
            A.write_report(run_dir, replans)
            step, restarted = record.recovery_step, record
        joiners = {}
        if isinstance(restarted, A.Replan) and restarted.joined is not None:  # it takes its state from a peer
            joiners = {A.JOINERS_ENV: str(original_nodes(plan).index(restarted.joined))}
        args = replace(args, resume=True, plan=str(run_dir / "plan.json"))
        res = simulate(plan, bound=False)
        if drift is not None and res.finished:  # judge the new plan by its own prediction
            drift.rebase(res.makespan_s, step)
        restarted.restarted_at = time.time()
    E.measure(run_dir, failures, prep.start_step, [r.recovery_step for r in replans])
    E.write_report(run_dir, failures, finished=True)
    if replans:
        A.measure(run_dir, replans)
        A.write_report(run_dir, replans)
    if failures or replans:
        res = simulate(plan, bound=False)
        prep = replace(prep, plan=plan, predicted_makespan_s=res.makespan_s if res.finished else None, predicted_ops=res.ops)
    return prep, failures


def _checkpoint_meta(cfg: RunConfig) -> Callable[[Path, Plan, int], None]:
    """Writes a checkpoint's model metadata (config, tokenizer) from the launcher."""

    def write(folder: Path, plan: Plan, step: int) -> None:
        from skippipe.data.dataset import token_data_for
        from skippipe.model.checkpoint import write_checkpoint_meta

        train = cfg.train_config()
        data = token_data_for(train)
        write_checkpoint_meta(folder, train.model_config(data.vocab_size), step, plan.layers, train=train.to_dict(), plan=plan,
                              tokenizer=data.tokenizer)

    return write


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
    mean_iter_s = sum(r["iter_s"] for r in steady) / len(steady)
    return Summary(
        run_dir=run_dir, iterations=len(recs), first_loss=recs[0]["loss"], last_loss=recs[-1]["loss"],
        mean_iter_s=mean_iter_s,
        mean_makespan_plan_s=sum(r["makespan_plan_s"] for r in steady) / len(steady),
        predicted_makespan_s=prep.predicted_makespan_s, wall_s=wall_s,
        checkpoint=local_checkpoint.newest(run_dir, prep.cfg.run.checkpoint_storage, prep.cfg.run.local_checkpoint_dir),
        timeline_png=png, records=recs,
        throughput=measure(prep.tokens_per_iteration, prep.flops_per_iteration, mean_iter_s, *_gpus(prep)),
        peak_memory_bytes=max(int(r.get("peak_memory_bytes", 0)) for r in recs),
    )


def _gpus(prep: Prepared) -> tuple[str | None, int]:
    """The GPU a local run's workers use and how many of them (workers share GPUs round-robin)."""
    spec = prep.cfg.runtime.device
    if not spec.startswith("cuda"):
        return None, 0
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return None, 0
    index = int(spec.split(":")[1]) if ":" in spec else 0
    return torch.cuda.get_device_name(index), 1 if ":" in spec else min(count, prep.plan.n_nodes)


def format_summary(s: Summary, emulated: bool, time_scale: float) -> str:
    lines = [
        f"iterations      {s.iterations} (loss {s.first_loss:.4f} -> {s.last_loss:.4f})",
        f"iteration time  {s.mean_iter_s:.3f} s real (mean over iterations after the first)",
    ]
    if s.throughput is not None:
        lines.append(f"throughput      {s.throughput.format()}")
    if s.peak_memory_bytes:
        lines.append(f"peak memory     {s.peak_memory_bytes / 2**30:.2f} GiB on one GPU worker (the most of any; CUDA allocator)")
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
    if s.failures:
        from skippipe.runtime.elastic import REPORT, format_failures

        lines += format_failures(s.failures)
        lines.append(f"failures        {s.run_dir / REPORT}")
    if s.replans:
        from skippipe.runtime import adapt

        lines += adapt.format_replans(s.replans)
        lines.append(f"re-plans        {s.run_dir / adapt.REPORT}")
    return "\n".join(lines)
