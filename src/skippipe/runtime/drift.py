"""Drift of the real run from the plan: measured iteration time against the simulator's prediction.

The launcher feeds each metrics record (iteration, ``makespan_plan_s``: the measured makespan in
plan seconds) to a ``DriftMonitor``. When ``window`` iterations in a row differ from the predicted
makespan by more than ``threshold`` (relative, the same direction), it reports a ``DriftEvent``
and calls its ``on_drift`` hook; the hook runs at an iteration boundary (a record arrives after
its iteration ended), the point where a new plan could be adopted. A drift is reported once,
when it starts: while it lasts no further event is raised; it ends after ``window`` iterations
in a row that are not beyond the threshold in its direction, or when the monitor is rebased on
a new plan (``rebase``), after which a drift that is still there is reported again once.
Torch-free.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DriftEvent:
    iteration: int  # the iteration boundary it was seen at
    measured_s: float  # median measured makespan of the window (plan seconds)
    predicted_s: float
    ratio: float  # measured / predicted

    def describe(self) -> str:
        way = "slower" if self.ratio > 1 else "faster"
        return (f"iteration {self.iteration}: measured makespan {self.measured_s:.2f} s is {abs(self.ratio - 1):.0%} {way} "
                f"than the plan's {self.predicted_s:.2f} s; re-plan with measured links (skippipe profile)")


@dataclass
class DriftMonitor:
    predicted_s: float
    threshold: float = 0.25
    window: int = 3
    skip: int = 1  # the first iterations pay for warm-up and are not judged
    on_drift: Callable[[DriftEvent], None] | None = None
    events: list[DriftEvent] = field(default_factory=list)
    _recent: deque[tuple[int, float]] = field(default_factory=deque)
    _last: int = 0
    _drifting: int = 0  # the direction of the drift under way (+1 slower, -1 faster), 0: none
    _calm: int = 0  # iterations in a row not beyond the threshold in that direction

    def __post_init__(self) -> None:
        if not (self.predicted_s > 0 and math.isfinite(self.predicted_s)):
            raise ValueError(f"drift: predicted makespan must be a positive number, got {self.predicted_s}")
        if not self.threshold > 0 or self.window < 1 or self.skip < 0:
            raise ValueError("drift: threshold must be > 0, window >= 1, skip >= 0")

    def observe(self, iteration: int, measured_s: float) -> DriftEvent | None:
        """One iteration's measured makespan (plan seconds); a ``DriftEvent`` when a drift starts.
        After an event the window starts over (the hook may have changed the plan)."""
        if iteration <= self._last:
            return None
        self._last = iteration
        if iteration <= self.skip or not math.isfinite(measured_s):
            return None
        if self._drifting:
            ratio = measured_s / self.predicted_s
            beyond = ratio > 1 + self.threshold if self._drifting > 0 else ratio < 1 - self.threshold
            self._calm = 0 if beyond else self._calm + 1
            if self._calm < self.window:
                return None  # the drift already reported goes on
            self._drifting, self._calm = 0, 0
            self._recent.clear()
            return None
        self._recent.append((iteration, measured_s))
        while len(self._recent) > self.window:
            self._recent.popleft()
        ratios = [m / self.predicted_s for _, m in self._recent]
        if len(ratios) < self.window:
            return None
        if not (all(r > 1 + self.threshold for r in ratios) or all(r < 1 - self.threshold for r in ratios)):
            return None
        measured = sorted(m for _, m in self._recent)[len(ratios) // 2]
        event = DriftEvent(iteration, measured, self.predicted_s, measured / self.predicted_s)
        self.events.append(event)
        self._recent.clear()
        self._drifting, self._calm = (1 if event.ratio > 1 else -1), 0
        if self.on_drift is not None:
            self.on_drift(event)
        return event

    def rebase(self, predicted_s: float, after_iteration: int) -> None:
        """Judge against a new plan's prediction from now on (after a recovery or a re-plan that
        went on from step ``after_iteration``); the redone first iteration pays for the restart."""
        if not (predicted_s > 0 and math.isfinite(predicted_s)):
            raise ValueError(f"drift: predicted makespan must be a positive number, got {predicted_s}")
        self.predicted_s = predicted_s
        self._recent.clear()
        self._drifting, self._calm = 0, 0
        self._last = after_iteration
        self.skip = after_iteration + 1

    def observe_records(self, records: Iterable[dict[str, Any]]) -> list[DriftEvent]:
        """Metrics records (``iteration``, ``makespan_plan_s``) in order; the events they raise."""
        found = []
        for r in records:
            if "makespan_plan_s" in r:
                event = self.observe(int(r["iteration"]), float(r["makespan_plan_s"]))
                if event is not None:
                    found.append(event)
        return found
