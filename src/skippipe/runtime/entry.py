"""The worker entry point, the same under ``skippipe train`` (local launch) and ``torchrun``.

``run_worker(WorkerArgs)`` reads rank, world size and rendezvous address from the environment,
the config and the plan from files, joins the job, trains, and returns an exit code:

- 0: done;
- 2: bad input (``UserError``: plan vs world size, rendezvous unreachable, corrupt checkpoint);
- 3: a failed run: a peer lost or silent, a message the plan does not allow, training diverged;
- 128 + N: stopped by signal N (SIGTERM: 143, SIGINT: 130);
- 1: an unexpected error (traceback in the worker's log).

The message is one line on stderr (``node 3: error: ...``). Under the local launcher the worker
also writes its ``WorkerStatus`` (``faults.py``: a ``kind`` and typed fields such as ``peers``)
to ``$SKIPPIPE_STATUS_FILE``; the launcher decides from that, never from the message.

Signals: SIGTERM and SIGINT stop the worker (``RunInterrupted``). With ``checkpoint_on_stop``
the workers first agree on the iteration to stop after and write a checkpoint there.

Launcher watch: under the local launcher ``$SKIPPIPE_LIFELINE_FD`` is the read end of a pipe
whose only write end the launcher holds. It reads EOF when the launcher is gone however it
ended (even SIGKILL), and the worker then exits at once: a run never outlives its launcher.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from skippipe.errors import BadMessage, MessageTimeout, PeerLost, RunInterrupted, UserError, signal_name
from skippipe.planfile import Plan

if TYPE_CHECKING:
    from skippipe.runtime.process_group import Env
from skippipe.runtime.faults import (
    EXIT_OK,
    EXIT_RUN,
    RECOVERY_SIGNAL,
    FaultKind,
    StopRequest,
    WorkerStatus,
    status_of,
    write_status,
)

LIFELINE_ENV = "SKIPPIPE_LIFELINE_FD"


@dataclass(frozen=True)
class WorkerArgs:
    """What one worker is told: the arguments of ``skippipe worker``."""

    config: str
    run_dir: str | None = None
    plan: str | None = None
    resume: bool = False
    until: int | None = None
    checkpoint_on_stop: bool = False

    def argv(self) -> list[str]:
        """The same as ``skippipe worker`` arguments."""
        out = [self.config]
        if self.run_dir is not None:
            out += ["--run-dir", self.run_dir]
        if self.plan is not None:
            out += ["--plan", self.plan]
        if self.resume:
            out.append("--resume")
        if self.until is not None:
            out += ["--until", str(self.until)]
        if self.checkpoint_on_stop:
            out.append("--checkpoint-on-stop")
        return out


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "-1"))
    except ValueError:
        return -1


def run_worker(args: WorkerArgs) -> int:
    """Run one worker; returns its exit code (never raises)."""
    rank = _rank()
    _watch_lifeline()
    stop = StopRequest(checkpoint=args.checkpoint_on_stop)
    _install_stop_handlers(stop)
    if os.environ.get("SKIPPIPE_HANDOFF_DIR"):
        _install_recovery_handler()
    try:
        _run(args, stop)
        exc: BaseException | None = None
    except BaseException as caught:  # every failure becomes one line, a status and an exit code
        exc = caught
    finally:
        from skippipe.runtime.process_group import shutdown

        shutdown()
    status = status_of(rank, exc)
    if status.kind == FaultKind.CRASH:
        traceback.print_exception(exc)
    if status.kind == FaultKind.INTERRUPTED:
        print(f"node {rank}: {status.message}", file=sys.stderr, flush=True)
    elif status.kind != FaultKind.OK:
        print(f"node {rank}: error: {status.message}", file=sys.stderr, flush=True)
    write_status(status)
    return status.exit_code


def _install_stop_handlers(stop: StopRequest) -> None:
    """SIGTERM and SIGINT: raise ``RunInterrupted`` now, or, while the training loop runs with a
    checkpoint wanted, note the signal for the end-of-iteration agreement."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.signum is None:
            stop.signum = signum
        if not (stop.checkpoint and stop.deferred):
            raise RunInterrupted(signum, f"stopped by {signal_name(signum)}")

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def _install_recovery_handler() -> None:
    """Elastic recovery: the launcher's ``RECOVERY_SIGNAL`` (another node failed) raises
    ``PeerLost`` once, wherever the worker waits, except from its iteration's last collective
    until its optimizer step is applied (``handoff.LATCH``: raised then); the worker then hands its state over
    (``handoff.py``: a step it cuts short is never handed over)."""
    from skippipe.runtime.handoff import LATCH

    if threading.current_thread() is not threading.main_thread():
        return
    fired = {"done": False}

    def handler(signum: int, frame: FrameType | None) -> None:
        if not fired["done"]:
            fired["done"] = True
            LATCH.hold_or_raise(
                PeerLost(None, "the launcher stopped this worker to go on with a new plan (a node failed, or a re-plan)"))

    signal.signal(RECOVERY_SIGNAL, handler)


def _watch_lifeline() -> None:
    """Exit at once when the launcher is gone (EOF on the lifeline pipe)."""
    value = os.environ.get(LIFELINE_ENV)
    if not value:
        return
    try:
        fd = int(value)
        os.fstat(fd)
    except (ValueError, OSError):
        return

    def watch() -> None:
        try:
            while os.read(fd, 64):
                pass
        except OSError:
            pass
        message = "the launcher is gone; stopping"
        print(f"node {_rank()}: error: {message}", file=sys.stderr, flush=True)
        try:
            write_status(WorkerStatus(_rank(), FaultKind.LAUNCHER_GONE, EXIT_RUN, message))
        finally:
            os._exit(EXIT_RUN)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


def _log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] node {os.environ.get('RANK', '?')}: {text}", file=sys.stderr, flush=True)


def _run(args: WorkerArgs, stop: StopRequest) -> int:
    t0 = time.monotonic()
    import torch

    from skippipe.data.dataset import token_data_for
    from skippipe.planfile import load_plan
    from skippipe.runtime import checkpoint as ckpt
    from skippipe.runtime import process_group as pg
    from skippipe.runtime import rejoin
    from skippipe.runtime.config import load_run_config
    from skippipe.runtime.emulation import Emulation
    from skippipe.runtime.handoff import LATCH, hand_off, handoff_dir
    from skippipe.runtime.local_checkpoint import root_of
    from skippipe.runtime.local_resume import resume_position, share_from_owner
    from skippipe.runtime.measured_costs import write_measurements
    from skippipe.runtime.metrics import MetricsWriter, truncate_metrics
    from skippipe.runtime.torchrun_restart import restart_count, resume_on_restart
    from skippipe.runtime.worker import Worker, WorkerSetup

    cfg = load_run_config(args.config)
    rt = cfg.runtime
    torch.set_num_threads(rt.threads_per_worker)
    env = pg.read_env()
    run_dir = Path(args.run_dir or cfg.run.dir)
    plan_file = Path(args.plan) if args.plan else (Path(cfg.plan.file) if cfg.plan.file else run_dir / "plan.json")
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
    gpu = None if rt.hosts is None else place_on_host(rt.hosts, plan.n_nodes, env, device.type == "cuda")
    if gpu is not None and rt.device == "cuda":
        device = torch.device(f"cuda:{gpu}")
    if device.type == "cuda":
        torch.cuda.set_device(device)

    t1 = time.monotonic()
    hosted_store = pg.init(env, rt.timeout_s, rt.rendezvous_timeout_s)
    t2 = time.monotonic()
    routes = [[mb.data_node, *mb.path] for mb in plan.microbatches]
    gpu_keys = pg.gather_gpu_keys(device, rt.timeout_s) if rt.backend == "nccl" else None
    groups = pg.make_groups(plan.stages, env.rank, rt.backend, pg.link_pairs(routes), gpu_keys=gpu_keys)
    if groups.gloo_instead and env.rank == 0:
        _log(f"NCCL: {groups.gloo_instead} group(s) use gloo instead: their workers share a GPU (NCCL allows one rank "
             "per GPU in a group); their payloads travel through host memory")
    pg.agree(json.dumps(plan.to_dict(), sort_keys=True), "plan", rt.timeout_s)
    pg.agree(json.dumps(cfg.to_dict(), sort_keys=True), "config", rt.timeout_s)
    _log(f"pid {os.getpid()}, set up in {t1 - t0:.1f} s, joined {env.world_size} workers in {t2 - t1:.1f} s, "
         f"groups in {time.monotonic() - t2:.1f} s")

    start, losses = 0, []
    found = None
    node = env.rank
    shared = cfg.run.checkpoint_storage != "local"
    if resume_on_restart(args.resume, os.environ, shared and ckpt.latest(run_dir) is not None, shared) != args.resume:
        args = replace(args, resume=True)  # torchrun started the group again (torchrun_restart.py)
        _log(f"torchrun restart {restart_count(os.environ)}: resuming from the last checkpoint")
    joining = rejoin.joiners()
    local = root_of(run_dir, cfg.run.local_checkpoint_dir) if cfg.run.checkpoint_storage == "local" else None
    # local storage: each stage's first node reads its own folder, its replicas get the state from it (local_resume.py)
    back = resume_position(local, plan, node, groups, rt.timeout_s) if args.resume and local is not None else None
    # a joiner reads nothing from disk: its state comes from a peer; one that rejoins a frozen
    # stage has no peer holding it and restores it from the recovery checkpoint (``frozen.py``)
    from_disk = node in joining and all(n in joining for n in plan.stages[plan.stage_of()[node]])
    if back is not None:
        start, losses = back.start, back.losses
    elif args.resume and (node not in joining or from_disk):
        found = ckpt.latest(run_dir)
        if found is None:
            raise UserError(f"--resume: {run_dir} holds no checkpoint")
        info = ckpt.verify(found, plan)
        start, losses = info.step, list(info.losses)
    if joining:
        start, losses = rejoin.share_position(start, losses, joining)
    is_data = node in plan.stages[0]
    metrics = None
    if node == 0:
        truncate_metrics(run_dir, start)
        metrics = MetricsWriter(run_dir)
    setup = WorkerSetup(
        plan=plan, node=node, groups=groups, train_cfg=train_cfg, model_cfg=model_cfg, device=device,
        emulation=Emulation.from_plan(plan, rt.emulate, rt.time_scale, rt.pad_compute, rt.emulate_events), policy=rt.policy,
        timeout_s=rt.timeout_s, deterministic=rt.deterministic_for(model_cfg.num_params()), run_dir=run_dir,
        tokens=data.train if is_data else None,
        tokenizer=data.tokenizer if node == 0 else None,
        checkpoint_every=cfg.run.checkpoint_every, keep_checkpoints=cfg.run.keep_checkpoints,
        metrics=metrics, log_every=cfg.run.log_every, timeline_iteration=cfg.run.timeline_iteration, stop=stop,
        wire=rt.wire, wire_error_feedback=rt.wire_error_feedback,
        elastic=handoff_dir() is not None, local_checkpoints=local,
    )
    worker = Worker(setup)
    if found is not None:
        worker.load_checkpoint(found)
    if back is not None:
        if back.folder is not None:
            worker.load_checkpoint(back.folder)
        line = share_from_owner(worker.stage, worker.optimizer, groups)
        _log(f"resumed from local step {start}" + (f" ({line})" if line else f", stage {worker.stage_index} from {back.folder}"))
    worker.losses_so_far = losses
    if from_disk and found is not None:
        _log(f"joined: stage {worker.stage_index} was frozen (no node held it); restored its weights and optimizer state "
             f"from {found} (digest {rejoin.state_digest(worker.stage, worker.optimizer)})")
    if joining:
        by_peer = joining - {n for n in joining if all(m in joining for m in plan.stages[plan.stage_of()[n]])}
        line = rejoin.share_stage_state(worker.stage, worker.optimizer, groups.stage, groups.stage_ranks, by_peer)
        if line:
            _log(line)
    try:
        stop.deferred = True
        try:
            stats = worker.run(start, train_cfg.steps, args.until)
        except (PeerLost, MessageTimeout, BadMessage):
            LATCH.handing_over = True  # first: the launcher's recovery signal must not cut the handoff short
            folder = handoff_dir()
            if folder is not None and worker.snapshot is not None:  # elastic: hand this stage's state over
                steps = hand_off(folder, node, worker.stage_index, worker.stage, worker.optimizer, worker.steps,
                                 worker.snapshot, worker.losses_so_far)
                _log(f"handed over stage {worker.stage_index} at step(s) {steps} to {folder}")
                write_measurements(folder, node, worker.scale, start, worker.s.timeline)  # for a re-plan on drift
            raise
        finally:
            stop.deferred = False
        worker.write_timeline()
        if stats:
            _log(f"done: iterations {stats[0].iteration}..{stats[-1].iteration}, last loss {stats[-1].loss:.4f}")
    finally:
        if metrics is not None:
            metrics.close()
        del hosted_store  # a store this rank hosted lives until the end
    return EXIT_OK


def place_on_host(path: str, n_nodes: int, env: Env, cuda: bool) -> int | None:
    """Check the host file; under torchrun, join as the plan node it gives this worker (``RANK``).
    Returns the worker's GPU index on its machine (None: not under torchrun, or no GPU)."""
    from skippipe.runtime.hosts import check_hosts, load_hosts, torchrun_placement

    hosts = load_hosts(path)
    check_hosts(hosts, n_nodes, path, cuda=cuda)
    if not env.torchrun:
        return None
    placement = torchrun_placement(hosts, path, dict(os.environ))
    env.rank = placement.node
    os.environ["RANK"] = str(placement.node)  # torch's env:// rendezvous reads it
    _log(f"host {placement.host!r}: plan node {placement.node}" + ("" if placement.gpu is None else f", GPU {placement.gpu}"))
    return placement.gpu


def check_plan_fits(plan: Plan, world_size: int, n_layers: int) -> None:
    """The plan must have one node per worker and cover exactly the model's layers."""
    if plan.n_nodes != world_size:
        raise UserError(f"the plan has {plan.n_nodes} nodes but {world_size} workers were started (one worker per plan node)")
    covered = sum(len(ls) for ls in plan.layers)
    if covered != n_layers:
        raise UserError(f"the plan's stages hold {covered} layers but the model has {n_layers}")
