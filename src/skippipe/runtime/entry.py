"""The worker entry point, the same under ``skippipe train`` (local launch) and ``torchrun``.

``run_worker`` reads rank, world size and rendezvous address from the environment, the config
and the plan from files, joins the job, trains, and returns an exit code:

- 0: done;
- 2: bad input (``UserError``: plan vs world size, rendezvous unreachable, corrupt checkpoint);
- 3: lost contact with a peer, or a timeout (another node died or hangs);
- 1: an unexpected error (traceback in the worker's log).

Errors are one line on stderr: ``node 3: error: ...``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

EXIT_OK, EXIT_CRASH, EXIT_USER, EXIT_PEER = 0, 1, 2, 3
STATUS_PREFIX = "skippipe-worker-status "  # last stderr line of a worker that failed: JSON status


def run_worker(config_path: str, run_dir: str | None = None, plan_path: str | None = None, resume: bool = False, until: int | None = None) -> int:
    rank = os.environ.get("RANK", "?")
    try:
        return _run(config_path, run_dir, plan_path, resume, until)
    except BaseException as exc:  # every failure becomes one line + an exit code
        from skippipe.errors import UserError
        from skippipe.runtime.transport import TransportError

        if isinstance(exc, UserError):
            code, text = EXIT_USER, str(exc)
        elif isinstance(exc, TransportError) or _is_peer_failure(exc):
            code, text = EXIT_PEER, f"lost contact with the other workers: {_first_line(exc)}"
        elif isinstance(exc, KeyboardInterrupt):
            code, text = 130, "interrupted"
        else:
            traceback.print_exc()
            code, text = EXIT_CRASH, f"{type(exc).__name__}: {_first_line(exc)}"
        print(f"node {rank}: error: {text}", file=sys.stderr, flush=True)
        print(STATUS_PREFIX + json.dumps({"node": rank, "code": code, "message": text}), file=sys.stderr, flush=True)
        return code
    finally:
        from skippipe.runtime.process_group import shutdown

        shutdown()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[-1] if text else type(exc).__name__
    if line.startswith("[") and "]" in line:  # gloo's "[file:line] message"
        line = line.split("]", 1)[1].strip()
    line = line.split(". This is typically caused", 1)[0]  # gloo's advice after the fact
    return line[:300]


def _is_peer_failure(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        k in text for k in ("connection closed", "connection reset", "timed out", "broken pipe", "peer", "socket")
    )


def _log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] node {os.environ.get('RANK', '?')}: {text}", file=sys.stderr, flush=True)


def _run(config_path: str, run_dir_arg: str | None, plan_path: str | None, resume: bool, until: int | None) -> int:
    t0 = time.monotonic()
    import torch

    from skippipe.data.dataset import token_data_for
    from skippipe.errors import UserError
    from skippipe.planfile import load_plan
    from skippipe.runtime import checkpoint as ckpt
    from skippipe.runtime import process_group as pg
    from skippipe.runtime.config import load_run_config
    from skippipe.runtime.emulation import Emulation
    from skippipe.runtime.metrics import MetricsWriter, truncate_metrics
    from skippipe.runtime.worker import Worker, WorkerSetup, check_plan_fits

    cfg = load_run_config(config_path)
    rt = cfg.runtime
    torch.set_num_threads(rt.threads_per_worker)
    env = pg.read_env()
    run_dir = Path(run_dir_arg or cfg.run.dir)
    plan_file = Path(plan_path) if plan_path else (Path(cfg.plan.file) if cfg.plan.file else run_dir / "plan.json")
    if not plan_file.is_file():
        raise UserError(f"no plan file {plan_file} (make one with `skippipe train CONFIG --plan-only` or give --plan)")
    plan = load_plan(plan_file)
    train_cfg = cfg.train_config()
    if plan.n_nodes != env.world_size:
        raise UserError(f"the plan has {plan.n_nodes} nodes but WORLD_SIZE is {env.world_size} (one worker per plan node)")
    data = token_data_for(train_cfg)
    model_cfg = train_cfg.model_config(data.vocab_size)
    check_plan_fits(plan, env.world_size, model_cfg.n_layers)
    device = pg.device_for(rt.device, env.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)

    t1 = time.monotonic()
    pg.init(env, rt.timeout_s, rt.rendezvous_timeout_s)
    t2 = time.monotonic()
    groups = pg.make_groups(plan.stages, env.rank, rt.backend)
    pg.agree(json.dumps(plan.to_dict(), sort_keys=True), "plan")
    pg.agree(json.dumps(cfg.to_dict(), sort_keys=True), "config")
    _log(f"pid {os.getpid()}, set up in {t1 - t0:.1f} s, joined {env.world_size} workers in {t2 - t1:.1f} s, groups in {time.monotonic() - t2:.1f} s")

    start, losses = 0, []
    found = None
    if resume:
        found = ckpt.latest(run_dir)
        if found is None:
            raise UserError(f"--resume: {run_dir} holds no checkpoint")
        info = ckpt.verify(found, plan)
        start, losses = info.step, list(info.losses)
    node = env.rank
    is_data = node in plan.stages[0]
    metrics = None
    if node == 0:
        truncate_metrics(run_dir, start)
        metrics = MetricsWriter(run_dir)
    setup = WorkerSetup(
        plan=plan, node=node, groups=groups, train_cfg=train_cfg, model_cfg=model_cfg, device=device,
        emulation=Emulation.from_plan(plan, rt.emulate, rt.time_scale, rt.pad_compute), policy=rt.policy,
        timeout_s=rt.timeout_s, deterministic=rt.deterministic, run_dir=run_dir, tokens=data.train if is_data else None,
        tokenizer=data.tokenizer if node == 0 else None,
        checkpoint_every=cfg.run.checkpoint_every, keep_checkpoints=cfg.run.keep_checkpoints,
        metrics=metrics, log_every=cfg.run.log_every, timeline_iteration=cfg.run.timeline_iteration,
    )
    worker = Worker(setup)
    if found is not None:
        worker.load_checkpoint(found)
        worker.losses_so_far = losses
    try:
        stats = worker.run(start, train_cfg.steps, until)
        worker.write_timeline()
        if stats:
            _log(f"done: iterations {stats[0].iteration}..{stats[-1].iteration}, last loss {stats[-1].loss:.4f}")
    finally:
        if metrics is not None:
            metrics.close()
    return EXIT_OK
