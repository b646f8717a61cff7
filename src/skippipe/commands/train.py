"""``skippipe train [CONFIG.toml]``: plan (or load a plan), start one worker per plan node here,
train with a progress bar, write metrics, checkpoints and a timeline, print a summary."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from skippipe.errors import UserError

if TYPE_CHECKING:
    from skippipe.runtime.config import RunConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", nargs="?", help="run config (TOML); default: the embedded tiny run (examples/train-tiny.toml)"
    )
    parser.add_argument("--run-dir", help="run folder (default: [run] dir of the config)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in the run folder")
    parser.add_argument("--fresh", action="store_true", help="delete an earlier run in the run folder first")
    parser.add_argument("--until", type=int, help="stop after this iteration (a checkpoint is written there)")
    parser.add_argument("--data", metavar="DIR", help="train on a dataset made by `skippipe prepare` (overrides [train] data)")
    parser.add_argument("--steps", type=int, help="override [train] steps")
    parser.add_argument("--plan", help="use this plan file (overrides [plan])")
    parser.add_argument("--time-scale", type=float, help="override [runtime] time_scale (real seconds per plan second)")
    parser.add_argument("--no-emulation", action="store_true", help="no WAN emulation: messages as fast as the machine allows")
    parser.add_argument("--plan-only", action="store_true", help="write RUN/plan.json and RUN/config.json, then stop")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--checkpoint-on-stop", action="store_true",
        help="on SIGINT/SIGTERM finish the current iteration and write a checkpoint there before stopping",
    )


def run(args: argparse.Namespace) -> int:
    from skippipe.runtime.config import load_default_run_config, load_run_config
    from skippipe.runtime.runfolder import lock_run_folder

    cfg = load_run_config(args.config) if args.config else load_default_run_config()
    overrides: dict[str, dict] = {}
    train_over: dict[str, object] = {}
    if args.steps is not None:
        train_over["steps"] = args.steps
    if args.data:
        train_over["data"] = str(Path(args.data).resolve())
    if train_over:
        overrides["train"] = train_over
    if args.plan:
        overrides["plan"] = {"file": str(Path(args.plan).resolve())}
    runtime = {}
    if args.time_scale is not None:
        runtime["time_scale"] = args.time_scale
    if args.no_emulation:
        runtime["emulate"] = False
    if runtime:
        overrides["runtime"] = runtime
    if args.run_dir:
        overrides["run"] = {"dir": args.run_dir}
    if overrides:
        cfg = cfg.with_overrides(**overrides)
    if args.until is not None and args.until < 1:
        raise UserError("--until must be at least 1")
    run_dir = Path(cfg.run.dir)
    with lock_run_folder(run_dir) as lock:  # one run per folder; a crashed run leaves no stale lock
        return _run_locked(args, cfg, run_dir, lock.fd)


def _run_locked(args: argparse.Namespace, cfg: RunConfig, run_dir: Path, lock_fd: int | None) -> int:
    from skippipe.runtime.job import format_summary, prepare, train

    prep = prepare(cfg, run_dir, resume=args.resume, fresh=args.fresh)
    plan = prep.plan
    rt = cfg.runtime
    if prep.vocab_note:
        print(prep.vocab_note)
    mode = f"emulated WAN, time scale {rt.time_scale:g}" if rt.emulate else "no emulation"
    pred = f", simulated makespan {prep.predicted_makespan_s:.2f} s" if prep.predicted_makespan_s else ""
    print(
        f"plan: {plan.method}, {plan.n_nodes} nodes in {plan.num_stages} stages {[len(s) for s in plan.stages]}, "
        f"{len(plan.microbatches)} microbatches, path length {plan.constraints.path_length}{pred}"
    )
    if args.plan_only:
        print(f"wrote {run_dir / 'plan.json'} and {prep.config_file}")
        return 0
    start = f"from step {prep.start_step} " if prep.start_step else ""
    tc = prep.cfg.train_config()
    compute = tc.precision + (", activation checkpointing" if tc.activation_checkpointing else "")
    how = f"{rt.backend}, {rt.device}, {compute}, {rt.wire} on the wire, {mode}"
    print(f"train: {plan.n_nodes} workers ({how}) {start}to step {args.until or prep.steps}")
    summary = train(prep, until=args.until, progress=not args.no_progress, lock_fd=lock_fd,
                    checkpoint_on_stop=args.checkpoint_on_stop)
    print(format_summary(summary, rt.emulate, rt.time_scale))
    return 0
