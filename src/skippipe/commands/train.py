"""``skippipe train [CONFIG.toml]``: plan (or load a plan), start one worker per plan node here,
train with a progress bar, write metrics, checkpoints and a timeline, print a summary."""

from __future__ import annotations

import argparse

from skippipe.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", nargs="?", help="run config (TOML); default: the embedded tiny run (examples/train-tiny.toml)"
    )
    parser.add_argument("--run-dir", help="run folder (default: [run] dir of the config)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in the run folder")
    parser.add_argument("--fresh", action="store_true", help="delete an earlier run in the run folder first")
    parser.add_argument("--until", type=int, help="stop after this iteration (a checkpoint is written there)")
    parser.add_argument("--steps", type=int, help="override [train] steps")
    parser.add_argument("--plan", help="use this plan file (overrides [plan])")
    parser.add_argument("--time-scale", type=float, help="override [runtime] time_scale (real seconds per plan second)")
    parser.add_argument("--no-emulation", action="store_true", help="no WAN emulation: messages as fast as the machine allows")
    parser.add_argument("--plan-only", action="store_true", help="write RUN/plan.json and RUN/config.json, then stop")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from skippipe.runtime.config import load_default_run_config, load_run_config
    from skippipe.runtime.job import format_summary, prepare, train

    cfg = load_run_config(args.config) if args.config else load_default_run_config()
    overrides: dict[str, dict] = {}
    if args.steps is not None:
        overrides["train"] = {"steps": args.steps}
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
    prep = prepare(cfg, run_dir, resume=args.resume, fresh=args.fresh)
    plan = prep.plan
    rt = cfg.runtime
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
    print(f"train: {plan.n_nodes} workers ({rt.backend}, {rt.device}, {mode}) {start}to step {args.until or prep.steps}")
    summary = train(prep, until=args.until, progress=not args.no_progress)
    print(format_summary(summary, rt.emulate, rt.time_scale))
    return 0
