"""Fault injection for tests: kill a worker at an exact moment of an iteration.

``$SKIPPIPE_FAULT = "NODE:POINT:STEP"`` makes worker NODE (this round's plan id) SIGKILL itself
when it reaches POINT in iteration (or checkpoint) STEP (1-based), in the run's first round only
(an elastic run's later rounds, ``RUN/elastic/round-K`` with K > 0, redo that iteration without
it). Points:

- ``grad_sync``: entering the gradient sum of its stage group (``worker._step``): the other
  nodes of the stage wait in the collective, the rest in the loss/norm all-reduce;
- ``checkpoint_write``: after writing its stage's files into the partial checkpoint folder,
  before the folder is committed (``saving.save_run_checkpoint``): a half-written checkpoint.

Torch-free. Unset (the normal case), ``hit`` does nothing.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

FAULT_ENV = "SKIPPIPE_FAULT"
POINTS = ("grad_sync", "checkpoint_write")


def parse(value: str) -> tuple[int, str, int] | None:
    parts = value.split(":")
    if len(parts) != 3 or parts[1] not in POINTS or not parts[0].isdigit() or not parts[2].isdigit():
        return None
    return int(parts[0]), parts[1], int(parts[2])


def hit(point: str, node: int, step: int) -> None:
    """SIGKILL this process if ``$SKIPPIPE_FAULT`` names this node, point and step."""
    spec = parse(os.environ.get(FAULT_ENV, ""))
    if spec is None or spec != (node, point, step):
        return
    handoff = os.environ.get("SKIPPIPE_HANDOFF_DIR")
    if handoff and Path(handoff).name != "round-0":
        return
    os.kill(os.getpid(), signal.SIGKILL)
