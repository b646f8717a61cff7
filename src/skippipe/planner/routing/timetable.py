"""Timetable scheduling: microbatches placed one at a time into per-node reservation tables.

A collision-aware constructive scheduler in the spirit of the reference's prioritised, time-aware
path finding, but with the simulator's exact semantics, so the plan it writes replays to the
same timeline:

- every node keeps its reserved operations in time order (``NodeLine``): start, end plus the
  gap the node idles afterwards (``inject_gap_s`` after an injection, ``op_gap_s`` otherwise),
  and the number of activation slots held after each operation;
- a microbatch is placed by choosing its path and, for each of its operations
  ``F@d, F@p1 .. F@pk, L@d, B@pk .. B@p1, B@d``, the earliest idle window at or after its arrival
  that fits the operation and its gap without moving any operation already placed
  (``NodeLine.fit``). Its forward holds a slot on each node until its backward there; a path
  is only taken when no node would ever hold more activations than it has slots;
- the path is found by a beam search over the valid stage orders (a prefix tree of
  ``stage_sequences``) and the nodes of each stage with TC1 capacity left, ranked by the
  forward pass's end plus the backward work still to come; the complete paths of the beam are
  timed to the end of their last backward, and the earliest finish wins.

The processing order of every node is then its reserved operations in time order, and the
simulator, following that order, reproduces the reserved times exactly (an operation inserted
into a window never delays the next one, and the slot condition holds at every prefix). Which
microbatch is placed next is decided event by event: the data node whose next injection can
start first, with a head start for data nodes that finished late in earlier passes
(``schedule`` runs a few passes, each from scratch, and keeps the best).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

Route = tuple[int, tuple[int, ...]]
Orders = dict[int, list[str]]


class NodeLine:
    """The operations reserved on one node, in time order."""

    __slots__ = ("start", "free", "token", "open", "memory")

    def __init__(self, memory: int) -> None:
        self.start: list[float] = []
        self.free: list[float] = []  # end + idle gap: the next operation starts no sooner
        self.token: list[str] = []
        self.open: list[int] = []  # activation slots held after the operation
        self.memory = memory

    def fit(self, ready: float, dur: float, gap: float) -> tuple[float, int]:
        """Earliest start >= ready of an operation that fits (with its gap) before the next
        reserved one; and the index it would take."""
        i = bisect_right(self.start, ready)
        n = len(self.start)
        while True:
            t = ready if i == 0 else max(ready, self.free[i - 1])
            if i == n or t + dur + gap <= self.start[i] + 1e-12:
                return t, i
            i += 1

    def slot_free(self, first: int, last: int) -> bool:
        """Can one more activation be held from index ``first`` to just before ``last``?"""
        held = self.open[first - 1] if first > 0 else 0
        if first < last:
            held = max(held, max(self.open[first:last]))
        return held + 1 <= self.memory

    def insert(self, index: int, start: float, dur: float, gap: float, token: str, delta: int) -> None:
        """Reserve an operation at ``index``; ``delta`` +1 takes a slot (until the matching
        backward, -1, is inserted), 0 leaves the slots alone."""
        held = (self.open[index - 1] if index > 0 else 0) + delta
        self.start.insert(index, start)
        self.free.insert(index, start + dur + gap)
        self.token.insert(index, token)
        self.open.insert(index, held)
        if delta:
            for k in range(index + 1, len(self.open)):
                self.open[k] += delta

    def free_from(self) -> float:
        """When a new injection may start at the earliest: after the backward that brings the
        slots held below the memory for good (0 when a slot is free at the end)."""
        for q in range(len(self.open) - 1, -1, -1):
            if self.open[q] >= self.memory:
                return self.start[q + 1] if q + 1 < len(self.start) else math.inf
        return 0.0


@dataclass
class Costs:
    """What placing a microbatch needs: hop and operation seconds per node."""

    transfer: np.ndarray
    forward: np.ndarray
    backward: np.ndarray
    loss: np.ndarray
    inject_gap: float
    op_gap: float

    @classmethod
    def from_problem(cls, problem) -> Costs:  # noqa: ANN001 (Problem, kept import-light)
        f = np.asarray(problem.forward_s, dtype=float)
        cm = problem.cost_model
        return cls(np.asarray(problem.transfer_s, dtype=float), f, f * cm.backward_factor, f * cm.loss_factor,
                   cm.inject_gap_s, cm.op_gap_s)


@dataclass
class Placement:
    finish: float
    path: tuple[int, ...]
    ops: list[tuple[int, float, int, float, float, str, int]] = field(default_factory=list)
    # (node, start, index at evaluation, dur, gap, kind, slot delta)


def _prefix_tree(sequences: tuple[tuple[int, ...], ...]) -> dict[tuple[int, ...], list[int]]:
    tree: dict[tuple[int, ...], list[int]] = {}
    for seq in sequences:
        for k in range(len(seq)):
            nxt = tree.setdefault(seq[:k], [])
            if seq[k] not in nxt:
                nxt.append(seq[k])
    return tree


class Timetable:
    """Reservation tables of every node, and the placement of one microbatch at a time."""

    def __init__(self, problem, stages: list[list[int]], caps: list[int], sequences, beam: int = 6,  # noqa: ANN001
                 per_stage: int = 8) -> None:
        self.c = Costs.from_problem(problem)
        self.lines = [NodeLine(int(x)) for x in problem.memory]
        self.stages = [np.asarray(s, dtype=int) for s in stages]
        self.left = np.zeros(problem.n, dtype=int)
        for s in stages[1:]:
            for x in s:
                self.left[x] = int(caps[x])
        self.tree = _prefix_tree(tuple(sequences))
        self.hops = len(sequences[0]) if sequences else 0
        self.beam = beam
        self.per_stage = per_stage
        f = self.c.forward
        visit = f + self.c.backward
        edge = self.c.transfer + self.c.transfer.T
        # per stage, every node's candidates in that stage by static cost from it (hop + visit)
        self.ranked = [np.argsort(edge[:, s] + visit[s][None, :], axis=1, kind="stable") for s in self.stages]
        self.routes: list[Route] = []

    # ------------------------------------------------------------------ one microbatch
    def _candidates(self, prev: int, s: int) -> list[int]:
        nodes = self.stages[s]
        out = []
        for j in self.ranked[s][prev]:
            x = int(nodes[j])
            if self.left[x] > 0:
                out.append(x)
                if len(out) >= self.per_stage:
                    break
        return out

    def place(self, d: int, ready: float) -> Placement | None:
        """The best path for a new microbatch of data node ``d`` injected at or after ``ready``
        (None when every path would overfill a node's slots or caps)."""
        c = self.c
        line_d = self.lines[d]
        ready = max(ready, line_d.free_from())
        if not math.isfinite(ready):
            return None
        t0, i0 = line_d.fit(ready, float(c.forward[d]), c.inject_gap)
        start_op = (d, t0, i0, float(c.forward[d]), c.inject_gap, "F", 1)
        # beam over the prefix tree: (key, forward end, path, ops)
        level: dict[tuple[int, ...], list[tuple[float, float, tuple[int, ...], list]]] = {
            (): [(0.0, t0 + float(c.forward[d]), (), [start_op])]
        }
        done: list[tuple[float, float, tuple[int, ...], list]] = []
        for _ in range(self.hops):
            nxt: dict[tuple[int, ...], list] = {}
            for prefix, beam in level.items():
                for s in self.tree.get(prefix, ()):
                    cands = []
                    for _key, fe, path, ops in beam:
                        last = path[-1] if path else d
                        for x in self._candidates(last, s):
                            fx = float(c.forward[x])
                            t, i = self.lines[x].fit(fe + c.transfer[last, x], fx, c.op_gap)
                            back = sum(float(c.backward[y]) for y in path) + float(c.backward[x])
                            cands.append((t + fx + back, t + fx, (*path, x), [*ops, (x, t, i, fx, c.op_gap, "F", 1)]))
                    cands.sort(key=lambda e: (e[0], e[2]))
                    nxt[(*prefix, s)] = cands[: self.beam]
            level = nxt
        for beam in level.values():
            done.extend(beam)
        best: Placement | None = None
        for _key, fe, path, ops in sorted(done, key=lambda e: (e[0], e[2]))[: 2 * self.beam]:
            p = self._complete(d, fe, path, ops)
            if p is not None and (best is None or (p.finish, p.path) < (best.finish, best.path)):
                best = p
        return best

    def _complete(self, d: int, fe: float, path: tuple[int, ...], ops: list) -> Placement | None:
        """Time the loss and the backward pass of a forward path; check every node's slots."""
        c = self.c
        last = path[-1] if path else d
        ops = list(ops)
        t, i = self.lines[d].fit(fe + c.transfer[last, d], float(c.loss[d]), c.op_gap)
        ops.append((d, t, i, float(c.loss[d]), c.op_gap, "L", 0))
        end, prev = t + float(c.loss[d]), d
        for x in (*reversed(path), d):
            bx = float(c.backward[x])
            t, i = self.lines[x].fit(end + c.transfer[prev, x], bx, c.op_gap)
            ops.append((x, t, i, bx, c.op_gap, "B", -1))
            end, prev = t + bx, x
        first = {op[0]: op[2] for op in ops if op[5] == "F"}
        for op in ops:
            if op[5] == "B" and not self.lines[op[0]].slot_free(first[op[0]], op[2]):
                return None
        return Placement(end, path, ops)

    def commit(self, d: int, p: Placement) -> int:
        """Reserve a placement's operations; returns the new microbatch's id."""
        mb = len(self.routes)
        self.routes.append((d, p.path))
        # insert latest first so that the evaluated indices stay valid for earlier operations
        for node, t, i, dur, gap, kind, delta in sorted(p.ops, key=lambda o: (-o[1], o[0])):
            line = self.lines[node]
            idx = bisect_right(line.start, t)
            line.insert(idx, t, dur, gap, f"{kind}{mb}", delta)
        for x in p.path:
            self.left[x] -= 1
        return mb

    def orders(self) -> Orders:
        return {x: list(line.token) for x, line in enumerate(self.lines) if line.token}


def schedule_once(problem, stages, caps, sequences, priority: dict[int, float], beam: int = 6,  # noqa: ANN001
                  per_stage: int = 8) -> tuple[list[Route], Orders, dict[int, float]] | None:
    """Place every microbatch, event by event: next is the data node whose next injection could
    start first, less its ``priority`` head start (seconds). Returns routes (index = microbatch
    id), processing orders and each data node's finish; None when a microbatch finds no path."""
    m = problem.workload.microbatches_per_data_node
    tt = Timetable(problem, stages, caps, sequences, beam=beam, per_stage=per_stage)
    data = [int(d) for d in stages[0]]
    placed = {d: 0 for d in data}
    next_ready = {d: 0.0 for d in data}
    finish = {d: 0.0 for d in data}
    while True:
        todo = [d for d in data if placed[d] < m]
        if not todo:
            break
        d = min(todo, key=lambda d: (max(next_ready[d], tt.lines[d].free_from()) - priority.get(d, 0.0), d))
        p = tt.place(d, next_ready[d])
        if p is None:
            return None
        tt.commit(d, p)
        placed[d] += 1
        inject = p.ops[0]
        next_ready[d] = inject[1] + inject[3] + inject[4]
        finish[d] = max(finish[d], p.finish)
    return tt.routes, tt.orders(), finish
