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
