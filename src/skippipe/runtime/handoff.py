"""A worker's side of elastic recovery: keep the pre-step state, hand it over when a peer is lost.

Consistency rule (``docs/runtime.md``, elastic recovery): the replicas of a stage hold the same weights
after every step (they apply the same summed gradient), and every worker keeps, beside its
current state (``steps`` optimizer steps applied), a copy of its state before the last step
(``StepSnapshot``). All workers meet at the barrier that starts every iteration, so at any
moment the survivors' step counts differ by at most one: the recovery step R (the smallest
count among the survivors) is held by every survivor, as its current state or as its snapshot.
An update is never half-applied: a worker interrupted inside its optimizer step hands over only
its snapshot.

Memory: one more copy of the stage's weights and AdamW moments (three tensors per parameter),
only with ``[runtime] on_failure = "continue"``.

``hand_off`` writes, under the folder the launcher names in ``$SKIPPIPE_HANDOFF_DIR``::

    node-NNN/step-S/stage-X.safetensors, stage-X.optim.safetensors   (current state)
    node-NNN/step-(S-1)/...                                           (the snapshot, if any)
    node-NNN/handoff.json   {"node", "stage", "steps": [S, S-1], "losses": [...]}  written last
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from skippipe.fileio import atomic_write_text, step_folder_name
from skippipe.runtime import checkpoint as ckpt

HANDOFF_ENV = "SKIPPIPE_HANDOFF_DIR"


def handoff_dir() -> Path | None:
    value = os.environ.get(HANDOFF_ENV)
    return Path(value) if value else None


@dataclass
class StepSnapshot:
    """The stage's weights and optimizer state before the last step, and whether a step is under way."""

    step: int | None = None  # the step count the snapshot holds
    params: list[torch.Tensor] = field(default_factory=list)
    optim: dict[str, Any] | None = None
    stepping: bool = False  # inside optimizer.step: the current state is not whole

    def take(self, stage: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
        self.step = None  # invalid while copying
        self.params = [p.detach().clone() for p in stage.parameters()]
        self.optim = copy.deepcopy(optimizer.state_dict())
        self.step = step

    def restore(self, stage: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        assert self.optim is not None
        with torch.no_grad():
            for p, saved in zip(stage.parameters(), self.params):
                p.copy_(saved)
        optimizer.load_state_dict(self.optim)


@dataclass
class RecoveryLatch:
    """Holds the recovery signal's ``PeerLost`` from an iteration's last collective (the loss and
    norm sum over all workers) until the optimizer step is applied.

    Once that collective is through, every worker applies the same step with no peer involved: a
    drain that arrives then (a planned join, or a failure noticed late) waits until the step is
    applied, so the worker hands over the step all its peers reach too. A signal cannot cut a
    collective short anyway (it is handled when the call returns); if the collective fails, its
    error goes on and the held signal is dropped: every survivor then hands over the step before.

    A worker that lost a peer on its own (a broken connection, a timeout) hands over at once;
    the launcher's signal arrives while it writes, and raised there it would cut the handoff
    short and lose the stage (a node with no ``handoff.json`` counts as failed). So the worker
    sets ``handing_over`` first (a plain attribute store: no signal is handled between catching
    the error and it), and from then on the signal is dropped.

    The worker also holds the signal while its transport starts a thread: ``Thread.start`` cut
    by the handler's exception leaves the thread running and raises ``KeyError`` from
    ``threading`` instead (seen in CI on a rejoin: the worker crashed without a handoff and the
    re-plan left it out)."""

    holding: bool = False
    pending: BaseException | None = None
    handing_over: bool = False

    def hold_or_raise(self, exc: BaseException) -> None:
        if self.handing_over:
            return
        if not self.holding:
            raise exc
        self.pending = exc

    @contextmanager
    def local_step(self) -> Iterator[None]:
        """The section the signal waits out; a held ``PeerLost`` is raised as it ends."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
            held, self.pending = self.pending, None  # an error inside goes on; the held signal with it
        if held is not None:
            raise held


LATCH = RecoveryLatch()  # one per worker process: the recovery handler (``entry.py``) and the loop share it


def guarded_step(stage: torch.nn.Module, optimizer: torch.optim.Optimizer, snapshot: StepSnapshot | None, step: int) -> None:
    """``optimizer.step()``; with a snapshot, the state of step ``step`` is copied first and the
    step is marked as under way while it runs."""
    if snapshot is not None:
        snapshot.take(stage, optimizer, step)
        snapshot.stepping = True
    optimizer.step()
    if snapshot is not None:
        snapshot.stepping = False


def hand_off(folder: Path, node: int, stage_index: int, stage: torch.nn.Module, optimizer: torch.optim.Optimizer,
             steps: int, snapshot: StepSnapshot, losses: list[float]) -> list[int]:
    """Write this worker's current state (unless a step was cut short) and its snapshot; returns
    the step counts written."""
    mine = folder / f"node-{node:03d}"
    written: list[int] = []
    if not snapshot.stepping:
        ckpt.save_stage(mine / step_folder_name(steps), stage_index, stage, optimizer)
        written.append(steps)
    if snapshot.step is not None and snapshot.step not in written:
        snapshot.restore(stage, optimizer)
        ckpt.save_stage(mine / step_folder_name(snapshot.step), stage_index, stage, optimizer)
        written.append(snapshot.step)
    top = max(written) if written else 0
    doc = {"node": node, "stage": stage_index, "steps": written, "losses": [float(x) for x in losses[:top]]}
    atomic_write_text(mine / "handoff.json", json.dumps(doc) + "\n")
    return written
