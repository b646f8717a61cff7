"""``skippipe worker CONFIG``: one worker process (one plan node).

``skippipe train`` starts these itself. On several machines start them with ``torchrun``, which
sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT::

    torchrun --nnodes 2 --nproc-per-node 10 --node-rank K --master-addr HOST0 --master-port 29500 \\
        -m skippipe.cli worker run/config.json --run-dir run

Global rank r runs plan node r.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="the run config (TOML, or the config.json that `skippipe train` writes)")
    parser.add_argument("--run-dir", help="run folder (default: [run] dir of the config)")
    parser.add_argument("--plan", help="plan file (default: [plan] file of the config, else RUN/plan.json)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in the run folder")
    parser.add_argument("--until", type=int, help="stop after this iteration (a checkpoint is written there)")
    parser.add_argument("--checkpoint-on-stop", action="store_true",
                        help="on SIGINT/SIGTERM all workers finish the iteration and write a checkpoint there")


def run(args: argparse.Namespace) -> int:
    from skippipe.runtime.entry import WorkerArgs, run_worker

    return run_worker(WorkerArgs(
        args.config, run_dir=args.run_dir, plan=args.plan, resume=args.resume, until=args.until,
        checkpoint_on_stop=args.checkpoint_on_stop,
    ))
