"""How a worker ended, as data: the status a worker reports and the launcher reads.

A worker that ends writes one JSON object (``WorkerStatus``) to the file named by
``SKIPPIPE_STATUS_FILE`` (the local launcher sets it; under torchrun it is unset and only the
one-line message on stderr remains)::

    {"node": 3, "kind": "message_timeout", "exit_code": 3, "peers": [4], "waited_s": 5.0,
     "iteration": 35, "message": "nothing arrived for 5 s: ..."}

``kind`` is a ``FaultKind``; ``peers`` the nodes the fault points at (the peer that was lost,
went silent or sent a bad message). The launcher decides from ``kind`` and ``peers`` only; the
message is for people. Torch-free.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

from skippipe.errors import (
    BadMessage,
    MessageTimeout,
    PeerLost,
    RunInterrupted,
    TrainingDiverged,
    UserError,
    signal_name,
)
from skippipe.fileio import atomic_write_text

STATUS_ENV = "SKIPPIPE_STATUS_FILE"

EXIT_OK, EXIT_CRASH, EXIT_USER, EXIT_RUN = 0, 1, 2, 3


class FaultKind(StrEnum):
    OK = "ok"
    BAD_INPUT = "bad_input"  # a UserError in the worker (exit 2)
    PEER_LOST = "peer_lost"  # a connection to a peer broke (exit 3)
    MESSAGE_TIMEOUT = "message_timeout"  # waited timeout_s for a peer (exit 3)
    BAD_MESSAGE = "bad_message"  # a peer sent what the plan does not allow (exit 3)
    DIVERGED = "diverged"  # non-finite loss / gradient norm / lr / weights (exit 3)
    INTERRUPTED = "interrupted"  # stopped by a signal (exit 128 + N)
    LAUNCHER_GONE = "launcher_gone"  # the local launcher died (exit 3)
    CRASH = "crash"  # anything else: a bug or a library error (exit 1, traceback in the log)


# a node's faults that elastic recovery continues after (the node is dropped from the plan)
RECOVERABLE = (FaultKind.CRASH, FaultKind.PEER_LOST, FaultKind.MESSAGE_TIMEOUT)

# elastic recovery: the launcher asks the survivors to stop and hand their state over
RECOVERY_SIGNAL = signal.SIGUSR1

# faults that point at another node: the peer, not the reporter, is the suspect
POINTS_AT_PEER = (FaultKind.PEER_LOST, FaultKind.MESSAGE_TIMEOUT, FaultKind.BAD_MESSAGE)


@dataclass(frozen=True)
class WorkerStatus:
    node: int
    kind: FaultKind
    exit_code: int
    message: str = ""
    peers: tuple[int, ...] = ()
    waited_s: float | None = None
    iteration: int | None = None
    signal: int | None = None
    checkpoint_step: int | None = field(default=None)  # a checkpoint written on the way out

    def to_json(self) -> str:
        d = asdict(self)
        d["kind"] = self.kind.value
        d["peers"] = list(self.peers)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> WorkerStatus:
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError("status is not a JSON object")
        return cls(
            node=int(d["node"]), kind=FaultKind(d["kind"]), exit_code=int(d["exit_code"]), message=str(d.get("message", "")),
            peers=tuple(int(p) for p in d.get("peers", [])),
            waited_s=None if d.get("waited_s") is None else float(d["waited_s"]),
            iteration=None if d.get("iteration") is None else int(d["iteration"]),
            signal=None if d.get("signal") is None else int(d["signal"]),
            checkpoint_step=None if d.get("checkpoint_step") is None else int(d["checkpoint_step"]),
        )


@dataclass
class StopRequest:
    """A request to stop the worker, set by its signal handler (``entry.py``) and read at the
    end of every iteration (``worker.py``)."""

    checkpoint: bool = False  # write a checkpoint at the iteration where the run stops
    signum: int | None = None  # the signal that asked to stop (None: not asked)
    deferred: bool = False  # the training loop runs and a checkpoint is wanted: stop at the iteration's end


def status_of(node: int, exc: BaseException | None) -> WorkerStatus:
    """The status of a worker that ended with ``exc`` (None: it finished)."""
    if exc is None:
        return WorkerStatus(node, FaultKind.OK, EXIT_OK)
    text = str(exc)
    if isinstance(exc, RunInterrupted):
        return WorkerStatus(node, FaultKind.INTERRUPTED, exc.exit_code, text, signal=exc.signum,
                            checkpoint_step=exc.checkpoint_step)
    if isinstance(exc, UserError):
        return WorkerStatus(node, FaultKind.BAD_INPUT, EXIT_USER, text)
    if isinstance(exc, MessageTimeout):
        return WorkerStatus(node, FaultKind.MESSAGE_TIMEOUT, EXIT_RUN, text, peers=exc.peers, waited_s=exc.waited_s)
    if isinstance(exc, PeerLost):
        return WorkerStatus(node, FaultKind.PEER_LOST, EXIT_RUN, text, peers=() if exc.peer is None else (exc.peer,))
    if isinstance(exc, BadMessage):
        return WorkerStatus(node, FaultKind.BAD_MESSAGE, EXIT_RUN, text, peers=() if exc.peer is None else (exc.peer,))
    if isinstance(exc, TrainingDiverged):
        return WorkerStatus(node, FaultKind.DIVERGED, EXIT_RUN, text, iteration=exc.iteration)
    if isinstance(exc, KeyboardInterrupt):
        return WorkerStatus(node, FaultKind.INTERRUPTED, 130, "interrupted", signal=2)
    return WorkerStatus(node, FaultKind.CRASH, EXIT_CRASH, f"{type(exc).__name__}: {first_line(exc)}")


def write_status(status: WorkerStatus, path: str | Path | None = None) -> None:
    """Write ``status`` to ``path`` (default: ``$SKIPPIPE_STATUS_FILE``; nothing when unset)."""
    target = path or os.environ.get(STATUS_ENV)
    if target:
        atomic_write_text(target, status.to_json() + "\n")


def read_status(path: str | Path) -> WorkerStatus | None:
    """The status in ``path``, or None when there is none (the worker died before writing it)."""
    try:
        return WorkerStatus.from_json(Path(path).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def first_line(exc: BaseException, limit: int = 300) -> str:
    """One line of a library error: gloo's ``[file:line]`` prefix and after-the-fact advice cut."""
    text = str(exc).strip()
    line = text.splitlines()[-1] if text else type(exc).__name__
    if line.startswith("[") and "]" in line:
        line = line.split("]", 1)[1].strip()
    return line.split(". This is typically caused", 1)[0][:limit]


# ---------------------------------------------------------------------- the launcher's verdict


@dataclass(frozen=True)
class Ended:
    """What the launcher knows of one worker: its exit code (negative: killed by that signal;
    None: still running) and the status it wrote (None: none)."""

    node: int
    returncode: int | None
    status: WorkerStatus | None
    log: str = ""


@dataclass(frozen=True)
class Verdict:
    """The launcher's one-line account of a failed run: ``node`` the node blamed (None: not one
    node's fault), ``kind`` the fault kind, ``exit_code`` the exit code of ``skippipe train``."""

    message: str
    node: int | None
    kind: FaultKind
    exit_code: int = EXIT_RUN


def verdict(workers: list[Ended]) -> Verdict:
    """The node that caused a failure, decided from exit codes and typed statuses only.

    1. A worker killed by a signal it did not handle (SIGKILL, out of memory) is the cause.
    2. A worker that failed on its own (a crash, bad input, or no status at all) is the cause.
    3. Diverged training is the run's fault, not a node's.
    4. Otherwise every failed worker lost, waited for or refused a peer: the peer most of them
       point at is named; timeouts count first (errors after a timeout are echoes of it). A node
       named that itself timed out or lost a peer was waiting too: the chain is followed to its end.
    5. Timeouts that name no peer (a barrier) while exactly one worker is still running: that
       worker went silent.
    """
    failed = sorted((w for w in workers if w.returncode not in (None, 0)), key=lambda w: w.node)
    if not failed:
        return Verdict("no worker failed", None, FaultKind.OK, EXIT_OK)
    for w in failed:
        if w.returncode is not None and w.returncode < 0:
            return Verdict(f"node {w.node} died (killed by {signal_name(-w.returncode)}); see {w.log}", w.node, FaultKind.CRASH)
    for w in failed:
        st = w.status
        if st is not None and st.kind == FaultKind.INTERRUPTED:  # someone else signalled a worker
            how = signal_name(st.signal) if st.signal is not None else "a signal"
            return Verdict(f"node {w.node} was stopped by {how} (not by the launcher); see {w.log}", w.node, st.kind)
        if st is None:
            return Verdict(f"node {w.node} failed (exit code {w.returncode}, no status written); see {w.log}", w.node,
                           FaultKind.CRASH)
        if st.kind in (FaultKind.CRASH, FaultKind.BAD_INPUT):
            code = EXIT_USER if st.kind == FaultKind.BAD_INPUT else EXIT_RUN
            return Verdict(f"node {w.node} failed: {st.message}", w.node, st.kind, code)
    for w in failed:
        st = w.status
        if st is not None and st.kind == FaultKind.DIVERGED:
            return Verdict(st.message, None, FaultKind.DIVERGED)
    pointing = [w for w in failed if w.status is not None and w.status.kind in POINTS_AT_PEER and w.status.peers]
    timeouts = [w for w in pointing if w.status is not None and w.status.kind == FaultKind.MESSAGE_TIMEOUT]
    voters = timeouts or pointing
    running = [w.node for w in workers if w.returncode is None]
    if voters:
        votes = Counter(p for w in voters for p in (w.status.peers if w.status is not None else ()))
        suspect = min(votes, key=lambda p: (-votes[p], p))
        suspect = _end_of_wait_chain(suspect, failed, running, votes)
        waiting = [w for w in voters if w.status is not None and suspect in w.status.peers]
        waiting = waiting or [w for w in pointing if w.status is not None and suspect in w.status.peers]
        waiting = waiting or [w for w in failed if w.status is not None and w.status.kind == FaultKind.MESSAGE_TIMEOUT]
    elif len(running) == 1 and all(w.status is not None and w.status.kind == FaultKind.MESSAGE_TIMEOUT for w in failed):
        # a collective (the iteration barrier) timed out everywhere but on one node that is
        # still running: that node is the one that went silent (frozen, not dead)
        suspect, waiting = running[0], failed
    else:
        first = failed[0]
        text = first.status.message if first.status is not None else f"exit code {first.returncode}"
        kind = first.status.kind if first.status is not None else FaultKind.CRASH
        return Verdict(f"node {first.node} stopped: {text}", first.node, kind)
    kind = waiting[0].status.kind if waiting[0].status is not None else FaultKind.CRASH
    state = {None: "still running", 0: "finished"}.get(_returncode(workers, suspect), "exited")
    detail = waiting[0].status.message if waiting[0].status is not None else ""
    nodes = ", ".join(str(w.node) for w in waiting)
    if kind == FaultKind.BAD_MESSAGE:
        return Verdict(f"node {suspect} sent messages the plan does not allow; node(s) {nodes} refused them: {detail}",
                       suspect, kind)
    return Verdict(f"node {suspect} stopped answering ({state}); node(s) {nodes} waited for it: {detail}", suspect, kind)


def _end_of_wait_chain(suspect: int, failed: list[Ended], running: list[int], votes: Counter[int]) -> int:
    """The node at the end of a chain: a suspect that itself failed pointing at a peer (timed out
    waiting, lost or refused it) was a waiter too (a frozen node 4 makes node 0 time out, and the
    nodes waiting for node 0 time out after it), so follow what it pointed at; a barrier timeout
    there leads to the one node still running."""
    waiters = {w.node: w.status for w in failed if w.status is not None and w.status.kind in POINTS_AT_PEER}
    seen: set[int] = set()
    while suspect in waiters and suspect not in seen:
        seen.add(suspect)
        peers = waiters[suspect].peers
        if peers:
            suspect = min(peers, key=lambda p: (-votes[p], p))
        elif len(running) == 1 and waiters[suspect].kind == FaultKind.MESSAGE_TIMEOUT:
            return running[0]
        else:
            break
    return suspect


def _returncode(workers: list[Ended], node: int) -> int | None:
    return next((w.returncode for w in workers if w.node == node), None)
