"""Local multi-process launch: one ``skippipe worker`` process per plan node, supervised.

The launcher hosts the rendezvous store on a free port (so parallel runs never collide), starts
the workers with torchrun's environment variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``) — the very entry point ``torchrun`` starts on real machines —
and watches them:

- a worker that exits with an error, or dies (killed, out of memory), stops the run: the others
  are terminated and ``RunFailed`` names the node that failed first and why;
- no progress (no new metrics record, no exit) for ``stall_s`` seconds also stops the run.

Each worker's output goes to ``RUN/logs/node-NNN.log``.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from skippipe.errors import UserError
from skippipe.runtime.entry import EXIT_PEER, STATUS_PREFIX


class RunFailed(UserError):
    """A worker failed or the run stalled; the message names the node."""

    exit_code = 3


START_METHODS = ("forkserver", "exec")
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.optim", "skippipe.runtime.entry", "skippipe.runtime.worker", "skippipe.data.dataset", "skippipe.model.checkpoint"]


class _Forked:
    """A forkserver child with the small part of ``Popen``'s interface the launcher uses."""

    def __init__(self, proc) -> None:  # noqa: ANN001 - multiprocessing.Process
        self._p = proc

    @property
    def returncode(self) -> int | None:
        return self._p.exitcode

    def poll(self) -> int | None:
        return self._p.exitcode

    def terminate(self) -> None:
        self._p.terminate()

    def kill(self) -> None:
        self._p.kill()

    def wait(self, timeout: float | None = None) -> int | None:
        self._p.join(timeout)
        if self._p.exitcode is None:
            raise subprocess.TimeoutExpired("worker", timeout or 0)
        return self._p.exitcode


def _forked_worker(env: dict[str, str], log: str, args: list[str]) -> None:
    """Body of a forkserver child: the environment torchrun would give, output to the log, then
    exactly what ``skippipe worker ARGS`` runs."""
    _die_with_parent()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    from skippipe.cli import main

    code = main(["worker", *args])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@dataclass
class WorkerProc:
    rank: int
    proc: subprocess.Popen | _Forked
    log: Path


def _die_with_parent() -> None:  # runs in the child before exec: SIGTERM when the launcher dies
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _status(log: Path) -> dict | None:
    """The JSON status line a failing worker prints last, if any."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines[-50:]):
        if line.startswith(STATUS_PREFIX):
            try:
                return json.loads(line[len(STATUS_PREFIX):])
            except json.JSONDecodeError:
                return None
    return None


def _describe(w: WorkerProc) -> tuple[int, str]:
    """(severity, message) of a finished worker: lower severity = more likely the root cause."""
    code = w.proc.returncode
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return 0, f"node {w.rank} died (killed by {name}); see {w.log}"
    st = _status(w.log)
    text = st["message"] if st else f"exit code {code}"
    if code != EXIT_PEER:  # EXIT_CRASH, EXIT_USER or anything else: a failure of its own
        return 1, f"node {w.rank} failed: {text}"
    return 2, f"node {w.rank} stopped: {text}"


def _verdict(workers: list[WorkerProc]) -> str:
    """One line naming the node that caused the failure.

    A worker that was killed or failed on its own is the cause. When every failed worker only
    lost contact or timed out, the node they were waiting for (``... from node 4``) is named.
    """
    failed = [w for w in workers if w.proc.poll() is not None and w.proc.returncode != 0]
    described = sorted((_describe(w) + (w,) for w in failed), key=lambda x: (x[0], x[2].rank))
    severity, message, _ = described[0]
    if severity <= 1:
        return message
    alive = {w.rank for w in workers if w.proc.poll() is None}
    waits = []  # (suspect node, waiting node, message, from a timeout)
    for w in failed:
        st = _status(w.log)
        if st:
            timeout = "no message arrived" in st["message"] or "timed out" in st["message"].lower()
            waits += [(int(n), w.rank, st["message"], timeout) for n in re.findall(r"(?:from|to) node (\d+)", st["message"])]
    if any(t for *_, t in waits):  # timeouts point at the silent node; later errors are echoes
        waits = [x for x in waits if x[3]]
    if not waits:
        return message
    suspects = Counter(n for n, *_ in waits)
    node, _ = suspects.most_common(1)[0]
    waiting = sorted({r for n, r, *_ in waits if n == node})
    state = "still running" if node in alive else "exited"
    detail = next(m for n, _, m, _ in waits if n == node)
    return f"node {node} stopped answering ({state}); node(s) {', '.join(map(str, waiting))} waited for it: {detail}"


def _terminate(workers: list[WorkerProc], grace_s: float = 5.0) -> None:
    alive = [w for w in workers if w.proc.poll() is None]
    for w in alive:
        try:
            w.proc.terminate()
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for w in alive:
        try:
            w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()


def launch_local(
    world_size: int,
    worker_args: list[str],
    run_dir: Path,
    stall_s: float,
    rendezvous_timeout_s: float,
    on_poll: Callable[[], bool] | None = None,
    master_addr: str = "127.0.0.1",
    master_port: int = 0,
    threads_per_worker: int = 1,
    extra_env: dict[str, str] | None = None,
    start_method: str = "forkserver",
) -> None:
    """Run ``skippipe worker *worker_args`` in ``world_size`` processes until all finish.

    ``on_poll()`` is called about ten times a second and returns True when the run made
    progress (resets the stall timer). Raises ``RunFailed`` on any failure.

    ``start_method``: ``"forkserver"`` (default) forks every worker from a server process that
    has imported torch once — seconds instead of tens of seconds for 20 workers on a small
    machine; ``"exec"`` starts each as a fresh ``python -m skippipe.cli worker``, as torchrun does.
    """
    if start_method not in START_METHODS:
        raise UserError(f"start method must be one of {', '.join(START_METHODS)}, got {start_method!r}")
    import datetime

    import torch.distributed as dist

    try:
        store = dist.TCPStore(
            master_addr, master_port, world_size, is_master=True,
            timeout=datetime.timedelta(seconds=rendezvous_timeout_s), wait_for_workers=False,
        )
    except (RuntimeError, OSError) as exc:
        raise UserError(f"cannot host the rendezvous at {master_addr}:{master_port}: {str(exc).splitlines()[0]}") from None
    port = store.port
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    base_env = dict(os.environ)
    base_env.update({
        "WORLD_SIZE": str(world_size), "MASTER_ADDR": master_addr, "MASTER_PORT": str(port),
        "SKIPPIPE_STORE_HOSTED": "1", "OMP_NUM_THREADS": str(threads_per_worker),
        "MKL_NUM_THREADS": str(threads_per_worker), "PYTHONUNBUFFERED": "1",
    })
    base_env.update(extra_env or {})
    for key in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"):
        base_env.pop(key, None)
    workers: list[WorkerProc] = []
    ctx = None
    if start_method == "forkserver":
        import multiprocessing

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
    try:
        for rank in range(world_size):
            env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
            log = logs / f"node-{rank:03d}.log"
            if ctx is not None:
                p = ctx.Process(target=_forked_worker, args=(env, str(log), list(worker_args)), name=f"skippipe-node-{rank}", daemon=False)
                p.start()
                proc: subprocess.Popen | _Forked = _Forked(p)
            else:
                with open(log, "w") as fh:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "skippipe.cli", "worker", *worker_args],
                        stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env,
                        preexec_fn=_die_with_parent,
                    )
            workers.append(WorkerProc(rank, proc, log))
        last_progress = time.monotonic()
        while True:
            finished = [w for w in workers if w.proc.poll() is not None]
            failed = [w for w in finished if w.proc.returncode != 0]
            if failed:
                time.sleep(0.5)  # let near-simultaneous exits land, then pick the root cause
                failed = [w for w in workers if w.proc.poll() is not None and w.proc.returncode != 0]
                message = _verdict(workers)
                _terminate(workers)
                raise RunFailed(message)
            if len(finished) == len(workers):
                return
            if on_poll is not None and on_poll():
                last_progress = time.monotonic()
            if time.monotonic() - last_progress > stall_s:
                _terminate(workers)
                raise RunFailed(f"no progress for {stall_s:.0f} s; stopped all {world_size} workers (logs in {logs})")
            time.sleep(0.1)
    except BaseException:
        _terminate(workers)
        raise
    finally:
        del store
