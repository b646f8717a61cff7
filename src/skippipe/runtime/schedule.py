"""Which operation a node runs next, for one iteration of a plan. Torch-free.

Operations on microbatch ``m`` (as in the plan file): ``F`` forward of the node's stage (on the
data node: the injection, embedding + stage-0 layers), ``L`` head + loss on the data node when
the activations come back, ``B`` backward of the node's stage.

Rules (those of ``skippipe.sim``, so a run under emulation reproduces the simulated timeline):

- one operation at a time; a node holds the activations of at most ``M`` microbatches (from its
  ``F`` until its ``B``; a data node's own in-flight microbatches count against its M), so a
  forward (or an injection) that finds the node full waits for a backward;
- a data node's injection becomes ready at the microbatch's release time and, if it names
  ``after``, once that microbatch's backward has finished on this node;
- policy ``"fifo"`` (default, the simulator's): among arrived operations the one that arrived
  first, ties broken backward, then loss, then forward, then lower id; an injection, which
  starts new work, only when no arrived in-flight operation can run; a forward blocked by
  memory is passed over. Policy ``"backward-first"``: any ready backward, then loss, then
  forward, then injection, each kind in arrival order;
- with a ``processing_order`` in the plan the node performs exactly that sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from skippipe.planfile import Microbatch, Plan, parse_op

POLICIES = ("fifo", "backward-first")
_KIND_RANK = {"B": 0, "L": 1, "F": 2}


@dataclass(frozen=True)
class Hop:
    """Where one microbatch goes from this node: ``next`` for its forward output, ``prev`` for the
    gradient of its input (None: nothing to send, e.g. stage 0's backward)."""

    next: int | None
    prev: int | None


def node_work(plan: Plan, node: int) -> tuple[list[Microbatch], list[Microbatch]]:
    """(microbatches this data node owns, microbatches whose path visits this node)."""
    own = [mb for mb in plan.microbatches if mb.data_node == node]
    visiting = [mb for mb in plan.microbatches if node in mb.path]
    return own, visiting


def hops(mb: Microbatch, node: int) -> Hop:
    """Neighbours of ``node`` on the route of ``mb`` (data node, path..., data node)."""
    if node == mb.data_node:
        first = mb.path[0] if mb.path else None
        last = mb.path[-1] if mb.path else None
        return Hop(next=first, prev=last)  # F sends to path[0]; L sends the gradient to path[-1]
    i = mb.path.index(node)
    nxt = mb.path[i + 1] if i + 1 < len(mb.path) else mb.data_node
    prev = mb.path[i - 1] if i > 0 else mb.data_node
    return Hop(next=nxt, prev=prev)


def expected_messages(plan: Plan, node: int) -> int:
    """Messages a node receives in one iteration: an activation and a gradient per visiting
    microbatch; a data node gets back the activations and the gradient of each of its own."""
    own, visiting = node_work(plan, node)
    return 2 * len(visiting) + sum(2 for mb in own if mb.path)


@dataclass
class NodeSchedule:
    """The ready set and memory of one node during one iteration (times are seconds since the
    iteration started, on any clock the caller uses consistently)."""

    plan: Plan
    node: int
    policy: str = "fifo"
    held: int = 0
    _ready: dict[tuple[str, int], float] = field(default_factory=dict)
    _done: set[tuple[str, int]] = field(default_factory=set)
    _injections: list[Microbatch] = field(default_factory=list)
    _finished_b: dict[int, float] = field(default_factory=dict)
    _order: list[tuple[str, int]] | None = None
    _pos: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown scheduling policy {self.policy!r} (known: {', '.join(POLICIES)})")
        own, visiting = node_work(self.plan, self.node)
        self.memory = int(self.plan.memory[self.node])
        self._injections = sorted(own, key=lambda m: (m.release_s, m.id))
        self._own = {mb.id for mb in own}
        self.total_ops = 3 * len(own) + 2 * len(visiting)
        if self.plan.processing_order is not None and self.node in self.plan.processing_order:
            self._order = [parse_op(t) for t in self.plan.processing_order[self.node]]

    # ------------------------------------------------------------------ events
    def arrived(self, kind: str, mb: int, t: float) -> None:
        """An operation became possible at time t: ``F``/``L`` when activations arrived, ``B``
        when the gradient arrived (or the loss was computed locally)."""
        self._ready[(kind, mb)] = t

    def message_kind(self, mb: int, backward: bool) -> str:
        """Operation a received message enables: B for gradients, L for own activations, else F."""
        if backward:
            return "B"
        return "L" if mb in self._own else "F"

    def started(self, kind: str, mb: int) -> None:
        if kind == "F":
            self.held += 1
            if mb in self._own:
                self._injections = [m for m in self._injections if m.id != mb]
        self._ready.pop((kind, mb), None)
        if self._order is not None:
            self._pos += 1

    def finished(self, kind: str, mb: int, t: float = 0.0) -> None:
        self._done.add((kind, mb))
        if kind == "B":
            self.held -= 1
            self._finished_b[mb] = t

    def has_done(self, kind: str, mb: int) -> bool:
        return (kind, mb) in self._done

    @property
    def done(self) -> bool:
        return len(self._done) == self.total_ops

    # ------------------------------------------------------------------ decisions
    def _release(self, mb: Microbatch) -> float | None:
        """When the injection of ``mb`` is ready (None: its ``after`` has not finished yet)."""
        if mb.after is None:
            return mb.release_s
        if mb.after not in self._finished_b:
            return None
        return max(mb.release_s, self._finished_b[mb.after])

    def _key(self, kind: str, mb: int, t: float, injection: bool) -> tuple:
        if self.policy == "fifo":
            return (int(injection), t, _KIND_RANK[kind], mb)
        return (_KIND_RANK[kind] + int(injection), t, mb)

    def next_op(self, now: float) -> tuple[str, int] | None:
        """The operation to run at time ``now``, or None if nothing can run before another event."""
        if self._order is not None:
            if self._pos >= len(self._order):
                return None
            kind, mb = self._order[self._pos]
            if kind == "F" and mb in self._own:
                r = self._release(next(m for m in self._injections if m.id == mb))
                ok = r is not None and r <= now
            else:
                ok = (kind, mb) in self._ready
            if ok and kind == "F" and self.held >= self.memory:
                ok = False
            return (kind, mb) if ok else None
        free = self.held < self.memory
        best: tuple | None = None
        choice: tuple[str, int] | None = None
        for (kind, mb), t in self._ready.items():
            if kind == "F" and not free:
                continue
            key = self._key(kind, mb, t, False)
            if best is None or key < best:
                best, choice = key, (kind, mb)
        if free and (choice is None or self.policy == "backward-first"):
            for m in self._injections:
                r = self._release(m)
                if r is not None and r <= now:
                    key = self._key("F", m.id, r, True)
                    if best is None or key < best:
                        best, choice = key, ("F", m.id)
        return choice

    def next_release(self, now: float) -> float | None:
        """The earliest future time an injection becomes ready (to sleep until), if any."""
        if self.held >= self.memory:
            return None
        times = [r for m in self._injections if (r := self._release(m)) is not None and r > now]
        return min(times) if times else None


def awaited(
    own: list[Microbatch], visiting: list[Microbatch], hop_of: dict[int, Hop], sched: NodeSchedule, inputs: set[tuple[str, int]]
) -> list[tuple[str, int]]:
    """The messages a node still expects in an iteration: (what, from which node)."""
    out: list[tuple[str, int]] = []
    for mb in own:
        h = hop_of[mb.id]
        if h.prev is None:
            continue
        if sched.has_done("F", mb.id) and not sched.has_done("L", mb.id) and ("L", mb.id) not in inputs:
            out.append((f"activations of microbatch {mb.id}", h.prev))
        elif sched.has_done("L", mb.id) and not sched.has_done("B", mb.id) and ("B", mb.id) not in inputs:
            if h.next is not None:
                out.append((f"the gradient of microbatch {mb.id}", h.next))
    for mb in visiting:
        h = hop_of[mb.id]
        if not sched.has_done("F", mb.id) and ("F", mb.id) not in inputs:
            if h.prev is not None:
                out.append((f"activations of microbatch {mb.id}", h.prev))
        elif sched.has_done("F", mb.id) and not sched.has_done("B", mb.id) and ("B", mb.id) not in inputs:
            if h.next is not None:
                out.append((f"the gradient of microbatch {mb.id}", h.next))
    return out


def describe_awaited(awaited: list[tuple[str, int]]) -> str:
    """E.g. 'activations of microbatch 3 from node 5'."""
    if not awaited:
        return "nothing (its own work was done)"
    parts = [f"{what} from node {node}" for what, node in awaited[:3]]
    more = f" and {len(awaited) - 3} more" if len(awaited) > 3 else ""
    return ", ".join(parts) + more
