"""Local multi-process launch: one worker process per plan node, supervised.

The launcher hosts the rendezvous store on ``master_addr`` only (a free port unless one is
given), starts the workers with torchrun's environment variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and the worker entry point ``torchrun``
starts on real machines, and watches them:

- a worker that exits with an error, or dies, stops the run: the others are stopped and
  ``RunFailed`` names the node that failed first and why. The launcher decides from exit codes
  and the typed status each worker writes to ``RUN/logs/node-NNN.status.json``
  (``faults.verdict``), never from log text;
- no progress (no new metrics record, no exit) for ``stall_s`` seconds also stops the run;
- SIGINT and SIGTERM stop the run cleanly: the signal goes on to every worker, they stop after
  the same iteration (writing a checkpoint there with ``checkpoint_on_stop``), and
  ``RunInterrupted`` ends the launcher with exit code 128 + N;
- the launcher holds the only write end of a pipe (the lifeline) whose read end every worker
  watches: when the launcher is gone however it ended (SIGKILL too), every worker exits. This
  holds for both start methods (a parent-death signal would follow the forkserver instead).

Each worker's output goes to ``RUN/logs/node-NNN.log``; ``RUN/logs/workers.json`` names the
launcher's and every worker's process id.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

from skippipe.errors import DrainRequested, NodeLost, RunFailed, RunInterrupted, UserError, signal_name
from skippipe.fileio import atomic_write_text
from skippipe.runtime.entry import LIFELINE_ENV, WorkerArgs
from skippipe.runtime.faults import RECOVERABLE, RECOVERY_SIGNAL, STATUS_ENV, Ended, Verdict, read_status, verdict

START_METHODS = ("forkserver", "exec")
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.optim", "skippipe.runtime.entry", "skippipe.runtime.worker",
           "skippipe.data.dataset", "skippipe.model.checkpoint"]
_KEEP: list[Connection] = []  # a forked worker's inherited descriptors, open for its lifetime


class _Forked:
    """A forkserver child with the small part of ``Popen``'s interface the launcher uses."""

    def __init__(self, proc: BaseProcess) -> None:
        self._p = proc

    @property
    def pid(self) -> int | None:
        return self._p.pid

    @property
    def returncode(self) -> int | None:
        return self._p.exitcode

    def poll(self) -> int | None:
        return self._p.exitcode

    def send_signal(self, signum: int) -> None:
        if self._p.pid is not None and self._p.exitcode is None:
            os.kill(self._p.pid, signum)

    def kill(self) -> None:
        self._p.kill()

    def wait(self, timeout: float | None = None) -> int | None:
        self._p.join(timeout)
        if self._p.exitcode is None:
            raise subprocess.TimeoutExpired("worker", timeout or 0)
        return self._p.exitcode


def redirect_output(log: str | Path) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to ``log``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _forked_worker(env: dict[str, str], log: str, args: WorkerArgs, lifeline: Connection, lock: Connection | None) -> None:
    """Body of a forkserver child: the environment torchrun would give, output to the log, the
    launcher's lifeline and run-folder lock kept open, then the worker entry point."""
    from skippipe.runtime.entry import run_worker

    _KEEP.append(lifeline)
    if lock is not None:
        _KEEP.append(lock)
    redirect_output(log)
    os.environ.clear()
    os.environ.update(env)
    os.environ[LIFELINE_ENV] = str(lifeline.fileno())
    code = run_worker(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@dataclass
class WorkerProc:
    rank: int
    proc: subprocess.Popen[bytes] | _Forked
    log: Path
    status_file: Path

    def ended(self) -> Ended:
        code = self.proc.poll()
        return Ended(self.rank, code, read_status(self.status_file) if code is not None else None, str(self.log))


class _Stop(Exception):
    """A signal to the launcher (SIGINT or SIGTERM)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal_name(signum))


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``_Stop`` in the launcher (main thread only)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise _Stop(signum)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _signal_all(workers: list[WorkerProc], signum: int) -> None:
    for w in workers:
        if w.proc.poll() is None:
            try:
                w.proc.send_signal(signum)
            except ProcessLookupError:
                pass


def _wait_all(workers: list[WorkerProc], grace_s: float) -> None:
    """Wait up to ``grace_s`` for every worker, then SIGKILL the rest."""
    deadline = time.monotonic() + grace_s
    for w in workers:
        try:
            w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()


def _terminate(workers: list[WorkerProc], grace_s: float = 5.0) -> None:
    _signal_all(workers, signal.SIGTERM)
    _wait_all(workers, grace_s)


def _interrupted(workers: list[WorkerProc], signum: int, grace_s: float) -> RunInterrupted:
    """Pass ``signum`` on to the workers, let them stop (and checkpoint), say where they stopped."""
    _signal_all(workers, signum)
    try:
        _wait_all(workers, grace_s)
    except _Stop:  # a second signal: no more waiting
        _wait_all(workers, 0.0)
    statuses = [w.ended().status for w in workers]
    steps = {s.checkpoint_step for s in statuses if s is not None and s.checkpoint_step is not None}
    step = steps.pop() if len(steps) == 1 else None
    where = f"; checkpoint of step {step} written" if step is not None else "; no checkpoint written on the way out"
    return RunInterrupted(signum, f"stopped by {signal_name(signum)}{where}", checkpoint_step=step)


class _Starter:
    """Starts workers with one start method, each holding the lifeline's read end (and the lock)."""

    def __init__(self, start_method: str, lock_fd: int | None) -> None:
        self.lock_fd = lock_fd
        self.ctx: BaseContext | None = None
        self.read_fd, self.write_fd = os.pipe()  # the launcher keeps write_fd until it ends
        self.reader: Connection | None = None
        self.lock_conn: Connection | None = None
        if start_method == "forkserver":
            self.ctx = multiprocessing.get_context("forkserver")
            self.ctx.set_forkserver_preload(PRELOAD)
            self.reader = Connection(self.read_fd, writable=False)  # passed to children as a descriptor
            self.lock_conn = Connection(os.dup(lock_fd), writable=False) if lock_fd is not None else None

    def start(self, rank: int, env: dict[str, str], log: Path, args: WorkerArgs) -> subprocess.Popen[bytes] | _Forked:
        if self.ctx is not None and self.reader is not None:
            p = self.ctx.Process(target=_forked_worker, args=(env, str(log), args, self.reader, self.lock_conn),
                                 name=f"skippipe-node-{rank}", daemon=False)
            p.start()
            return _Forked(p)
        fds = (self.read_fd,) if self.lock_fd is None else (self.read_fd, self.lock_fd)
        with open(log, "wb") as fh:
            return subprocess.Popen(
                [sys.executable, "-m", "skippipe.cli", "worker", *args.argv()], stdin=subprocess.DEVNULL, stdout=fh,
                stderr=subprocess.STDOUT, env={**env, LIFELINE_ENV: str(self.read_fd)}, pass_fds=fds,
            )

    def started_all(self) -> None:
        """Only the workers keep the read end (and the lock's copies)."""
        if self.read_fd < 0:
            return
        if self.reader is not None:
            self.reader.close()  # closes read_fd
        else:
            os.close(self.read_fd)
        if self.lock_conn is not None:
            self.lock_conn.close()
        self.reader = self.lock_conn = None
        self.read_fd = -1

    def close(self) -> None:
        """The launcher's end: every worker still running reads EOF on its lifeline and exits."""
        self.started_all()
        os.close(self.write_fd)


def launch_local(
    world_size: int,
    worker_args: WorkerArgs,
    run_dir: Path,
    stall_s: float,
    rendezvous_timeout_s: float,
    on_poll: Callable[[], bool] | None = None,
    master_addr: str = "127.0.0.1",
    master_port: int = 0,
    threads_per_worker: int = 1,
    extra_env: dict[str, str] | None = None,
    start_method: str = "forkserver",
    lock_fd: int | None = None,
    stop_grace_s: float = 10.0,
    drain_s: float | None = None,
) -> None:
    """Run the worker in ``world_size`` processes until all finish.

    ``on_poll()`` is called about ten times a second and returns True when the run made
    progress (resets the stall timer). Raises ``RunFailed`` on any failure, ``RunInterrupted``
    on SIGINT/SIGTERM (after the workers stopped, waiting up to ``stop_grace_s``). ``lock_fd``:
    the run folder's lock (``runfolder.RunLock``), shared with every worker. ``drain_s`` (elastic
    recovery): when one node died or went silent, it is killed, the others get up to ``drain_s``
    to hand their state over and exit, and ``NodeLost`` names the node; ``DrainRequested`` raised by
    ``on_poll`` drains every worker the same way and is raised on.

    ``start_method``: ``"forkserver"`` (default) forks every worker from a server process that
    has imported torch once — seconds instead of tens of seconds for 20 workers on a small
    machine; ``"exec"`` starts each as a fresh ``python -m skippipe.cli worker``, as torchrun does.
    """
    if start_method not in START_METHODS:
        raise UserError(f"start method must be one of {', '.join(START_METHODS)}, got {start_method!r}")
    from skippipe.runtime.process_group import host_store

    store = host_store(master_addr, master_port, world_size, rendezvous_timeout_s)
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    base_env = dict(os.environ)
    base_env.update({
        "WORLD_SIZE": str(world_size), "MASTER_ADDR": master_addr, "MASTER_PORT": str(store.port),
        "SKIPPIPE_STORE_HOSTED": "1", "OMP_NUM_THREADS": str(threads_per_worker),
        "MKL_NUM_THREADS": str(threads_per_worker), "PYTHONUNBUFFERED": "1",
    })
    base_env.update(extra_env or {})
    for key in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", LIFELINE_ENV):
        base_env.pop(key, None)
    workers: list[WorkerProc] = []
    starter = _Starter(start_method, lock_fd)
    try:
        with _stop_on_signals():
            try:
                for rank in range(world_size):
                    status_file = logs / f"node-{rank:03d}.status.json"
                    status_file.unlink(missing_ok=True)
                    env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
                               **{STATUS_ENV: str(status_file)})
                    log = logs / f"node-{rank:03d}.log"
                    workers.append(WorkerProc(rank, starter.start(rank, env, log, worker_args), log, status_file))
                starter.started_all()
                _write_pids(logs, workers)
                _supervise(workers, stall_s, on_poll, logs, drain_s)
            except _Stop as stop:
                raise _interrupted(workers, stop.signum, stop_grace_s) from None
            except BaseException:
                _terminate(workers)
                raise
    finally:
        starter.close()
        del store


def _write_pids(logs: Path, workers: list[WorkerProc]) -> None:
    data = {"launcher": os.getpid(), "workers": {str(w.rank): w.proc.pid for w in workers}}
    atomic_write_text(logs / "workers.json", json.dumps(data) + "\n")


def _drain(workers: list[WorkerProc], found: Verdict, seen_at: float, drain_s: float) -> NodeLost:
    """Elastic recovery: kill the failed node, ask the others (``RECOVERY_SIGNAL``) to stop, hand
    over their state and exit."""
    assert found.node is not None
    decided_at = time.time()
    failed = workers[found.node]
    if failed.proc.poll() is None:
        failed.proc.kill()
        failed.proc.wait()
    _signal_all(workers, RECOVERY_SIGNAL)
    _wait_all(workers, drain_s)
    return NodeLost(found.message, found.node, found.kind.value, seen_at, decided_at, time.time())


def _supervise(workers: list[WorkerProc], stall_s: float, on_poll: Callable[[], bool] | None, logs: Path,
               drain_s: float | None = None) -> None:
    last_progress = time.monotonic()
    while True:
        finished = [w for w in workers if w.proc.poll() is not None]
        if any(w.proc.returncode != 0 for w in finished):
            seen_at = time.time()
            time.sleep(0.5)  # let near-simultaneous exits land, then pick the root cause
            found = verdict([w.ended() for w in workers])
            if drain_s is not None and found.node is not None and found.kind in RECOVERABLE:
                raise _drain(workers, found, seen_at, drain_s)
            _terminate(workers)
            raise RunFailed(found.message, node=found.node, kind=found.kind.value, exit_code=found.exit_code)
        if len(finished) == len(workers):
            return
        try:
            if on_poll is not None and on_poll():
                last_progress = time.monotonic()
        except DrainRequested as request:
            if drain_s is None:
                raise
            request.requested_at = time.time()
            _signal_all(workers, RECOVERY_SIGNAL)
            _wait_all(workers, drain_s)
            request.drained_at = time.time()
            raise

        if time.monotonic() - last_progress > stall_s:
            _terminate(workers)
            raise RunFailed(f"no progress for {stall_s:.0f} s; stopped all {len(workers)} workers (logs in {logs})", kind="stall")
        time.sleep(0.1)
