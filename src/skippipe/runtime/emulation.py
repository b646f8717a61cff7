"""Optional WAN emulation on one machine, so that a laptop reproduces a cluster's timeline.

- Links: a message from i to j is delivered ``transfer_s[i][j] * time_scale`` seconds after it
  was sent (the plan's latency + size/bandwidth + hop overhead for that link).
- Compute padding: each operation lasts at least its modelled time (forward ``forward_s[node]``,
  backward ``backward_factor`` x that, loss ``loss_factor`` x that) times ``time_scale``, and the
  node then idles the plan's ``inject_gap_s`` after an injection or ``op_gap_s`` after any other
  operation, as the simulator assumes.
- Link events (``[runtime] emulate_events``): from a given iteration on, one link's hop takes
  ``1 / bandwidth_factor`` times as long. Events name the run's original node ids; those already
  folded into the emulated network by a re-plan (``plan.meta["emulation"]["folded"]``) are not
  applied again, and those naming a node that is gone are dropped.
- The emulated network is the plan's costs, except after a re-plan on *measured* costs
  (``adapt.py``, ``measured_costs.py``): the plan's costs are then the planner's estimates and the
  ground truth the emulator keeps reproducing is ``plan.meta["emulation"]["network"]`` (hop and
  forward times by original node id, the folded events applied; ``network_costs``).

Off (``enabled = False``) on real clusters: no delays, no padding. Torch-free.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from skippipe.planfile import Costs, Plan
from skippipe.planner.shrink import original_nodes


@dataclass(frozen=True)
class LinkChange:
    """A link event in the plan's node ids: from ``iteration`` (1-based) on, ``a`` <-> ``b`` hops
    take ``1 / factor`` times as long. ``index``: its place in ``[runtime] emulate_events``."""

    index: int
    iteration: int
    a: int
    b: int
    factor: float


def folded_events(plan: Plan) -> list[int]:
    """Indices of the link events whose change the plan's costs already hold (a re-plan folded them in)."""
    emu = plan.meta.get("emulation")
    return [int(i) for i in emu.get("folded", [])] if isinstance(emu, dict) else []


def link_changes(plan: Plan, events: Sequence[object]) -> list[LinkChange]:
    """The events (``config.LinkEvent``s) not yet in the plan's costs, in the plan's node ids."""
    local = {orig: new for new, orig in enumerate(original_nodes(plan))}
    done = set(folded_events(plan))
    out = []
    for i, e in enumerate(events):
        a, b = (int(x) for x in e.link)
        if i not in done and a in local and b in local:
            out.append(LinkChange(i, int(e.iteration), local[a], local[b], float(e.bandwidth_factor)))
    return out


def network_costs(plan: Plan) -> Costs:
    """The costs the emulator reproduces for ``plan``'s nodes: the plan's own, with the figures of
    ``plan.meta["emulation"]["network"]`` (original node ids) where it has them."""
    emu = plan.meta.get("emulation")
    net = emu.get("network") if isinstance(emu, dict) else None
    if not isinstance(net, dict):
        return plan.costs
    index = {int(o): k for k, o in enumerate(net["nodes"])}
    big_t, big_f = np.asarray(net["transfer_s"], dtype=float), np.asarray(net["forward_s"], dtype=float)
    transfer, forward = np.array(plan.costs.transfer_s, dtype=float), np.array(plan.costs.forward_s, dtype=float)
    known = [(i, index[o]) for i, o in enumerate(original_nodes(plan)) if o in index]
    for i, a in known:
        forward[i] = big_f[a]
        for j, b in known:
            transfer[i, j] = big_t[a, b]
    return replace(plan.costs, transfer_s=transfer, forward_s=forward)


def with_network(emu: dict[str, object], nodes: Sequence[int], costs: Costs) -> dict[str, object]:
    """``emu`` (a plan's ``meta["emulation"]``) with the network of original nodes ``nodes`` set
    to ``costs`` (its nodes in that order); the figures of other nodes it held are kept."""
    net = emu.get("network")
    old_nodes = [int(x) for x in net["nodes"]] if isinstance(net, dict) else []
    ids = old_nodes + [int(n) for n in nodes if int(n) not in old_nodes]
    at = {o: k for k, o in enumerate(ids)}
    transfer, forward = np.zeros((len(ids), len(ids))), np.zeros(len(ids))
    if isinstance(net, dict) and old_nodes:
        k = len(old_nodes)
        transfer[:k, :k] = np.asarray(net["transfer_s"], dtype=float)
        forward[:k] = np.asarray(net["forward_s"], dtype=float)
    for i, a in enumerate(nodes):
        forward[at[int(a)]] = float(costs.forward_s[i])
        for j, b in enumerate(nodes):
            transfer[at[int(a)], at[int(b)]] = float(costs.transfer_s[i, j])
    return {**emu, "network": {"nodes": ids, "transfer_s": transfer.tolist(), "forward_s": forward.tolist()}}


def changed_transfer(transfer_s: np.ndarray, changes: Sequence[LinkChange], iteration: int) -> np.ndarray:
    """``transfer_s`` with every change due by ``iteration`` (1-based) applied, both directions."""
    out = np.array(transfer_s, dtype=float)
    for c in changes:
        if c.iteration <= iteration:
            out[c.a, c.b] /= c.factor
            out[c.b, c.a] /= c.factor
    return out


@dataclass(frozen=True)
class Emulation:
    enabled: bool
    time_scale: float
    pad_compute: bool
    costs: Costs  # the costs emulated in the current iteration
    changes: tuple[LinkChange, ...] = ()
    base: Costs | None = None  # the plan's costs (before any change)
    due: int = 0  # how many changes ``costs`` holds

    @classmethod
    def from_plan(cls, plan: Plan, enabled: bool, time_scale: float, pad_compute: bool = True,
                  events: Sequence[object] = ()) -> Emulation:
        changes = tuple(link_changes(plan, events)) if enabled else ()
        truth = network_costs(plan)
        return cls(enabled=enabled, time_scale=time_scale, pad_compute=pad_compute, costs=truth, changes=changes, base=truth)

    def at_iteration(self, iteration: int) -> Emulation:
        """The emulation of iteration ``iteration`` (1-based): the link changes due by then applied."""
        due = sum(1 for c in self.changes if c.iteration <= iteration)
        if due == self.due or self.base is None:
            return self
        costs = replace(self.base, transfer_s=changed_transfer(self.base.transfer_s, self.changes, iteration))
        return replace(self, costs=costs, due=due)

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
