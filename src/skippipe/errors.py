"""User-facing errors: one clear line, a non-zero exit code, never a traceback.

Every error the ``skippipe`` command prints is a ``SkipPipeError``; its ``exit_code`` says which
kind it is:

- 2: ``UserError``, bad input (a file, a flag, a config, a folder that is not a run);
- 3: ``RunError``, a run that failed (a worker died, a peer was lost or went silent, training
  diverged);
- 128 + N: ``RunInterrupted``, a run stopped by signal N (130: SIGINT, 143: SIGTERM).

The runtime's faults carry typed fields (``peer``, ``waited_s``, ...) so that whoever handles
them (the launcher naming the failed node) decides from the type and the fields, never from the
wording of the message. Torch-free.
"""

from __future__ import annotations

import signal


class SkipPipeError(Exception):
    """Any error the CLI prints as one line; ``exit_code`` is the process's exit status."""

    exit_code = 2


class UserError(SkipPipeError):
    """Bad input from the user (a file, a flag, a config). The CLI prints it as one line."""

    exit_code = 2


class PlanError(UserError):
    """A plan file that cannot be read or breaks a rule."""


class MissingPackage(UserError):
    """A command needs a package that is not installed. ``package``: the module that failed to
    import (``torch``); ``extra``: the pip extra of skippipe that brings it (``train``), None when it
    is one of skippipe's own dependencies (then skippipe was installed without them)."""

    def __init__(self, package: str, extra: str | None) -> None:
        self.package = package
        self.extra = extra
        how = (f"pip install 'skippipe[{extra}]'" if extra is not None
               else "reinstall skippipe with its dependencies (pip install skippipe, without --no-deps)")
        super().__init__(f"this command needs the package {package!r}, which is not installed: {how}")


class LoadCapsTooSmall(UserError):
    """The stages' per-node load caps (TC1) admit no routing of the microbatches: a planner
    may try another allocation; the user is told which stages need more nodes."""


class ConfigError(UserError):
    """A config file or value that cannot be used, as one line ``WHERE: PROBLEM``.

    ``where`` names the file and table (``small.toml [workload]``), or the kind of config
    (``workload``) for a value built in code; ``key`` is the offending key (``None``: the file or
    table as a whole); ``problem`` is the message without its place.
    """

    def __init__(self, problem: str, where: str = "", key: str | None = None) -> None:
        self.problem = " ".join(problem.splitlines())
        self.where = " ".join(where.splitlines())
        self.key = key
        super().__init__(f"{self.where}: {self.problem}" if self.where else self.problem)


class ClusterError(ConfigError):
    """A cluster description that cannot be used."""


class HostFileError(ConfigError):
    """A host file (``[runtime] hosts``) that does not place the plan's nodes on the machines started."""


# ---------------------------------------------------------------------- runs (exit 3)


class RunError(SkipPipeError):
    """A run that failed after it started (not bad input)."""

    exit_code = 3


class PeerLost(RunError):
    """The connection to another worker broke (it died, or exited). ``peer``: its node id, or
    None when the failed operation involved several peers (a collective)."""

    def __init__(self, peer: int | None, detail: str) -> None:
        self.peer = peer
        self.detail = detail
        who = f"node {peer}" if peer is not None else "the other workers"
        super().__init__(f"lost contact with {who}: {detail}")


class MessageTimeout(RunError):
    """Nothing arrived for ``waited_s`` seconds. ``peers``: the nodes this worker was waiting
    for (empty when it cannot tell, e.g. in a collective)."""

    def __init__(self, peers: tuple[int, ...], waited_s: float, detail: str) -> None:
        self.peers = tuple(peers)
        self.waited_s = waited_s
        self.detail = detail
        super().__init__(f"nothing arrived for {waited_s:g} s: {detail}")


class BadMessage(RunError):
    """A peer sent a message the plan does not allow (shape, dtype, microbatch, iteration)."""

    def __init__(self, peer: int | None, detail: str) -> None:
        self.peer = peer
        self.detail = detail
        who = f"node {peer}" if peer is not None else "a peer"
        super().__init__(f"refused a message from {who}: {detail}")


class TrainingDiverged(RunError):
    """A non-finite loss, gradient norm, learning rate or weights: the run stops before the
    optimizer steps on it, and no checkpoint with non-finite values is written. ``what``: e.g.
    ``"loss"``; ``value``: the value (None for weights, which are many)."""

    def __init__(self, iteration: int, what: str, value: float | None = None) -> None:
        self.iteration = iteration
        self.what = what
        self.value = value
        found = f"the {what} is {value}" if value is not None else f"the {what} are not finite"
        super().__init__(f"training diverged at iteration {iteration}: {found}; stopped without writing it to a checkpoint")


class WorkerCrash(RunError):
    """An unexpected error inside a worker (its log holds the traceback)."""


class RunFailed(RunError):
    """The launcher's verdict on a failed run: ``node`` is the node it blames (None when the
    failure is not one node's, e.g. diverged training), ``kind`` the fault kind."""

    def __init__(self, message: str, node: int | None = None, kind: str = "crash", exit_code: int = 3) -> None:
        self.node = node
        self.kind = kind
        self.exit_code = exit_code
        super().__init__(message)


class NodeLost(RunFailed):
    """A worker died or went silent and the run may go on without it (``[runtime] on_failure =
    "continue"``): the launcher stopped the others, which handed their state over. ``seen_at``,
    ``decided_at``, ``drained_at``: wall-clock times (failure first seen, node named, every other
    worker gone)."""

    def __init__(self, message: str, node: int, kind: str, seen_at: float, decided_at: float, drained_at: float) -> None:
        super().__init__(message, node=node, kind=kind)
        self.seen_at = seen_at
        self.decided_at = decided_at
        self.drained_at = drained_at


class DrainRequested(SkipPipeError):
    """The launcher is asked to stop every worker at the next chance, have them hand their state
    over and exit, so that the job goes on with a new plan (re-plan on drift, a node rejoining).
    Raised by the launcher's ``on_poll`` hook; once drained, ``drained_at`` is set."""

    def __init__(self, reason: str, payload: object = None) -> None:
        self.reason = reason
        self.payload = payload
        self.requested_at = 0.0
        self.drained_at = 0.0
        super().__init__(reason)


class StageLost(RunError):
    """Every node of a stage is gone: no survivor holds its state (recovery refuses)."""

    def __init__(self, stage: int, nodes: list[int], why: str) -> None:
        self.stage = stage
        self.nodes = nodes
        self.why = why
        super().__init__(f"stage {stage} has no node left (its nodes {nodes} failed) and cannot be frozen: {why}; stopped")


class RunInterrupted(SkipPipeError):
    """A run stopped by a signal (SIGINT, SIGTERM); exit code 128 + the signal's number."""

    def __init__(self, signum: int, message: str | None = None, checkpoint_step: int | None = None) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        self.checkpoint_step = checkpoint_step  # a checkpoint written on the way out
        super().__init__(message or f"stopped by {signal_name(signum)}")


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# ---------------------------------------------------------------------- run folders (exit 2)


class RunFolderError(UserError):
    """A run folder that this run may not use: not a skippipe run folder (nothing in it is
    deleted or overwritten), or in use by another run."""


class RunLocked(RunFolderError):
    """Another ``skippipe train`` (``pid``) is using the run folder."""

    def __init__(self, folder: str, pid: int | None) -> None:
        self.folder = folder
        self.pid = pid
        who = f" (pid {pid})" if pid else ""
        super().__init__(f"{folder} is in use by another skippipe run{who}; wait for it to end or stop it first")


class ResumeMismatch(UserError):
    """``--resume`` with a setting that differs from the run's: ``key`` names it (``[plan] method``)."""

    def __init__(self, key: str, now: object, was: object, where: str) -> None:
        self.key = key
        super().__init__(
            f"--resume: {key} is {now!r} now but {was!r} in {where}; resume with the run's setting or start over with --fresh"
        )


class PlanCannotFinish(UserError):
    """The simulator shows that the plan never finishes an iteration (a memory deadlock, or a
    processing order that waits on itself): launching it would only end in a timeout."""


class OutputError(UserError):
    """An output path that cannot be written (checked before any work is done)."""


class WorkloadError(ConfigError):
    """A workload (file, flags or ``[plan]`` pipeline shape) that cannot be used."""


class DataError(UserError):
    """Input text, a tokenizer or a prepared token dataset that cannot be used."""


# ---------------------------------------------------------------------- local checkpoints (exit 2)


class LocalCheckpointError(UserError):
    """Local checkpoint folders (``[run] checkpoint_storage = "local"``) that cannot be gathered or resumed from."""


class StageMissing(LocalCheckpointError):
    """No folder given holds stage ``stage`` of the iteration wanted."""

    def __init__(self, step: int, stage: int, nodes: list[int]) -> None:
        self.step, self.stage = step, stage
        super().__init__(f"step {step}: stage {stage} is in none of the folders given; copy the local checkpoint folder "
                         f"of its first node (node {min(nodes)}) too" if nodes else f"step {step}: stage {stage} is missing")


class MixedIterations(LocalCheckpointError):
    """The folders given hold different iterations, and none has every stage."""


class ChecksumMismatch(LocalCheckpointError):
    """A file whose sha256 differs from its local manifest (a broken or partial copy)."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"{path}: sha256 does not match its manifest (a broken or partial copy; copy it again)")
