"""Optional WAN emulation on one machine, so that a laptop reproduces a cluster's timeline.

- Links: a message from i to j is delivered ``transfer_s[i][j] * time_scale`` seconds after it
  was sent (the plan's latency + size/bandwidth + hop overhead for that link).
- Compute padding: each operation lasts at least its modelled time (forward ``forward_s[node]``,
  backward ``backward_factor`` x that, loss ``loss_factor`` x that) times ``time_scale``, and the
  node then idles the plan's ``inject_gap_s`` after an injection or ``op_gap_s`` after any other
  operation, as the simulator assumes.

Off (``enabled = False``) on real clusters: no delays, no padding. Torch-free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from skippipe.planfile import Costs, Plan


@dataclass(frozen=True)
class Emulation:
    enabled: bool
    time_scale: float
    pad_compute: bool
    costs: Costs

    @classmethod
    def from_plan(cls, plan: Plan, enabled: bool, time_scale: float, pad_compute: bool = True) -> Emulation:
        return cls(enabled=enabled, time_scale=time_scale, pad_compute=pad_compute, costs=plan.costs)

    def link_delay_s(self, src: int, dst: int) -> float:
        """Real seconds a message from ``src`` to ``dst`` is held before delivery."""
        if not self.enabled or src == dst:
            return 0.0
        return float(self.costs.transfer_s[src, dst]) * self.time_scale

    def pad_op(self, node: int, kind: str, started: float) -> None:
        """Sleep until the operation that began at ``started`` (monotonic) has lasted its modelled
        time. Does nothing when emulation or padding is off."""
        if self.enabled and self.pad_compute:
            _sleep_until(started + self.costs.op_s(node, kind) * self.time_scale)

    def pad_gap(self, injection: bool) -> None:
        """Idle for the modelled gap after an operation (when emulation and padding are on)."""
        if self.enabled and self.pad_compute:
            _sleep_until(time.monotonic() + self.costs.gap_s(injection) * self.time_scale)


def _sleep_until(deadline: float) -> None:
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(left)
