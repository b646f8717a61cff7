"""Timetable routing: paths and processing orders chosen with every node's timeline in view.

The other candidates of ``plan_skippipe`` choose paths from static costs and let the simulator
find out where microbatches wait. Here every operation is *reserved* on its node's timeline as
the microbatch is routed, so the waiting is known when the path is chosen:

- microbatches are routed in the order they can start: a data node's first ``min(M, m)`` at 0,
  each further one when the backward that frees its slot starts;
- for every valid stage order, a forward pass over the stage layers gives each node the earliest
  time its forward can *finish* there (the forward takes the earliest gap on the node's timeline
  after it arrives, with a free activation slot); the path candidates are ranked by that finish
  plus the static loss, backwards and hops back; the best few are reserved tentatively in full
  (forwards, loss, backwards, each in the earliest gap) and the one whose final backward ends
  first is kept (``noise`` perturbs that choice for restarts);
- a path is kept only if the nodes it visits keep enough TC1 room for the microbatches still to
  route (each needs L-1 distinct stages with room), and a visit only if the node's activation
  slots suffice from its forward to its backward (else the forward waits for a slot to free).

The processing order of every node is the order of its reservations. A node following that
order starts each operation no later than reserved (the reserved times obey every constraint
the simulator enforces, and the order alone fixes the slots in use at each forward), so the
simulated makespan is at most the reserved one; a test checks it.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from dataclasses import dataclass, field

import numpy as np

from skippipe.planner.problem import Problem
from skippipe.planner.routing.evaluate import Route

# paths reserved in full per microbatch (ranked by their forward finish and static backward)
TRIED = 6
# times a forward is moved behind a freed slot before a path is given up
SLOT_RETRIES = 12
# largest cluster routed this way whatever it costs (the pass over the stage layers is per
# microbatch, in Python: about 1-2.5 s a timetable at 100 nodes); above it ``estimated_work``
# decides (``candidates.timetable_candidates``)
LARGEST = 100

Orders = dict[int, list[str]]


@dataclass
class Timetable:
    routes: list[Route]  # microbatch id = index; a data node injects its lower ids first
    orders: Orders  # every node's processing order (its reservations in time order)
    makespan: float  # the last reserved backward's end: the simulated makespan is at most this


@dataclass
class Timeline:
    """One node's reserved operations: sorted starts, busy-until (end plus the gap after), the
    operation tokens, and the activation-slot holds ``[forward start, backward start)``, sorted by
    their starts (a hold covering a time started at most the longest hold before it: with many
    microbatches a node holds hundreds, and only those few are looked at)."""

    starts: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    tokens: list[tuple[str, int]] = field(default_factory=list)
    holds: list[tuple[float, float]] = field(default_factory=list)
    longest: float = 0.0  # the longest hold

    def earliest(self, ready: float, dur: float, gap: float) -> float:
        """Earliest start >= ready of an operation that fits, with its gap, between reservations."""
        i = bisect.bisect_right(self.starts, ready)
        t = max(ready, self.busy[i - 1]) if i else ready
        while i < len(self.starts):
            if t + dur + gap <= self.starts[i] + 1e-12:
                return t
            t = max(t, self.busy[i])
            i += 1
        return t

    def earliest_forward(self, ready: float, dur: float, gap: float, slots: int) -> float:
        """``earliest``, also with one of ``slots`` activation slots free at the start."""
        t = ready
        while True:
            t = self.earliest(t, dur, gap)
            covering = self._covering(t)
            if len(covering) < max(1, slots):
                return t
            t = min(covering)

    def hold_fits(self, start: float, end: float, slots: int) -> bool:
        """Whether a hold ``[start, end)`` keeps every forward on the node within ``slots``."""
        return all(1 + len(self._covering(p)) <= slots for p in (start, *(a for a, _ in self._inside(start, end))))

    def overlapping_ends(self, start: float, end: float) -> list[float]:
        """The ends of the holds that overlap ``[start, end)``: those covering ``start`` and those
        starting inside."""
        return self._covering(start) + [b for _, b in self._inside(start, end)]

    def _inside(self, start: float, end: float) -> list[tuple[float, float]]:
        """The holds that start strictly between ``start`` and ``end``."""
        return self.holds[bisect.bisect_right(self.holds, (start, math.inf)):bisect.bisect_left(self.holds, (end, -math.inf))]

    def hold(self, start: float, end: float) -> None:
        """Record an activation-slot hold ``[start, end)``."""
        bisect.insort(self.holds, (start, end))
        self.longest = max(self.longest, end - start)

    def _covering(self, t: float) -> list[float]:
        """The ends of the holds that cover ``t`` (start <= t < end), in no particular order."""
        ends = []
        j = bisect.bisect_right(self.holds, (t, math.inf))  # the holds that start by t come before j
        low = t - self.longest - 1e-9 * max(1.0, abs(t))  # a hold starting before it ended by t
        while j > 0 and self.holds[j - 1][0] >= low:
            j -= 1
            if t < self.holds[j][1]:
                ends.append(self.holds[j][1])
        return ends

    def reserve(self, start: float, dur: float, gap: float, token: tuple[str, int]) -> None:
        i = bisect.bisect_right(self.starts, start)
        self.starts.insert(i, start)
        self.busy.insert(i, start + dur + gap)
        self.tokens.insert(i, token)


@dataclass
class _Costs:
    forward: np.ndarray
    transfer: np.ndarray
    memory: list[int]
    backward_factor: float
    loss_factor: float
    inject_gap: float
    op_gap: float


Op = tuple[int, float, str, float, float]  # node, start, kind (I, F, L, B), duration, gap after


@dataclass
class _SlotTaken:
    """A tentative reservation that would overfill ``node``'s slots: retry with the forward there
    no sooner than ``free`` (when a hold ends)."""

    node: int
    free: float


def _reserve(
    lines: list[Timeline], c: _Costs, d: int, path: tuple[int, ...], t0: float, tries: int, work: list[int]
) -> tuple[float, list[Op]] | None:
    """Every operation of a microbatch of ``d`` along ``path``, injected at ``t0``, placed in the
    earliest gaps: (end of the final backward, operations), or None when the slots do not fit
    within ``tries`` placements (each retry moves a forward behind the slot that frees first)."""
    not_before: dict[int, float] = {}
    for _ in range(tries):
        placed = _place_all(lines, c, d, path, t0, not_before)
        work[0] += 2 * len(path) + 3
        if not isinstance(placed, _SlotTaken):
            return placed
        not_before[placed.node] = placed.free
    return None


def _place_all(
    lines: list[Timeline], c: _Costs, d: int, path: tuple[int, ...], t0: float, not_before: dict[int, float]
) -> tuple[float, list[Op]] | _SlotTaken:
    f, T = c.forward, c.transfer
    taken: dict[int, list[tuple[float, float]]] = {d: [(t0, t0 + f[d] + c.inject_gap)]}

    def place(node: int, ready: float, dur: float, gap: float, slots: int = 0) -> float:
        t = ready
        while True:  # the microbatch's own earlier operations on the node are not on its timeline yet
            t = lines[node].earliest_forward(t, dur, gap, slots) if slots else lines[node].earliest(t, dur, gap)
            clash = next((e for s, e in taken.get(node, ()) if s < t + dur + gap and t < e), None)
            if clash is None:
                taken.setdefault(node, []).append((t, t + dur + gap))
                return t
            t = clash

    ops: list[Op] = [(d, t0, "I", f[d], c.inject_gap)]
    t, prev = t0 + f[d], d
    first: dict[int, float] = {}
    for x in path:
        s = place(x, max(t + T[prev, x], not_before.get(x, 0.0)), f[x], c.op_gap, c.memory[x])
        ops.append((x, s, "F", f[x], c.op_gap))
        first[x], t, prev = s, s + f[x], x
    loss = c.loss_factor * f[d]
    s = place(d, t + T[prev, d], loss, c.op_gap)
    ops.append((d, s, "L", loss, c.op_gap))
    t, prev = s + loss, d
    for x in (*reversed(path), d):
        dur = c.backward_factor * f[x]
        s = place(x, t + T[prev, x], dur, c.op_gap)
        if x != d and not lines[x].hold_fits(first[x], s, c.memory[x]):
            frees = lines[x].overlapping_ends(first[x], s)
            return _SlotTaken(x, min(frees) if frees else s)
        ops.append((x, s, "B", dur, c.op_gap))
        t, prev = s + dur, x
    return t, ops


def _ranked_paths(
    lines, c: _Costs, d: int, end0: float, seqs, stages, room: list[int], work: list[int]
) -> list[tuple[float, tuple[int, ...]]]:
    """Per stage order and last node: the path whose forwards finish first, with its estimate
    (that finish, then loss, backwards and hops back without waiting). Orders sharing a prefix
    share its layers."""
    f, T = c.forward, c.transfer
    layer_of: dict[tuple[int, ...], dict[int, tuple[float, int]]] = {(): {d: (end0, -1)}}
    out = []
    for seq in seqs:
        for k in range(1, len(seq) + 1):
            if seq[:k] not in layer_of:
                layer_of[seq[:k]] = _next_layer(lines, c, layer_of[seq[:k - 1]], stages[seq[k - 1]], room, work)
        for x, (fin, _) in layer_of[seq].items():
            path = [x]
            for k in range(len(seq) - 1, 0, -1):
                path.append(layer_of[seq[:k + 1]][path[-1]][1])
            path.reverse()
            back = c.backward_factor * (f[path].sum() + f[d])
            hops = T[d, path[-1]] + sum(T[b, a] for a, b in zip(path, path[1:])) + T[path[0], d]
            out.append((fin + T[x, d] + c.loss_factor * f[d] + back + hops, tuple(path)))
    out.sort()
    return out


def _next_layer(
    lines, c: _Costs, prev: dict[int, tuple[float, int]], nodes: list[int], room: list[int], work: list[int]
) -> dict[int, tuple[float, int]]:
    """One more stage of ``_ranked_paths``' prefix: per node of ``nodes`` with room, when its
    forward can finish after the best node of ``prev`` (the layer one stage shorter), and that node."""
    f, T = c.forward, c.transfer
    got: dict[int, tuple[float, int]] = {}
    for x in nodes if prev else ():
        if room[x] <= 0:
            continue
        arr, par = min(((fin + T[y, x], y) for y, (fin, _) in prev.items()), key=lambda a: a[0])
        got[x] = (lines[x].earliest_forward(arr, f[x], c.op_gap, c.memory[x]) + f[x], par)
    work[0] += len(got) * len(prev)
    return got


def timetable_routes(
    problem: Problem, stages: list[list[int]], caps: list[int], seqs: tuple[tuple[int, ...], ...],
    rng: random.Random | None = None, noise: float = 0.0, work: list[int] | None = None,
    paced: bool = False,
) -> Timetable | None:
    """Routes and processing orders reserved on the nodes' timelines (see the module text), or
    None when some microbatch finds no path.
    ``work[0]`` grows by the operations placed and the path cells looked at (a measure of the
    time taken that does not depend on the machine)."""
    work = work if work is not None else [0]
    cm = problem.cost_model
    c = _Costs(np.asarray(problem.forward_s, dtype=float), np.asarray(problem.transfer_s, dtype=float),
               [int(x) for x in problem.memory], cm.backward_factor, cm.loss_factor, cm.inject_gap_s, cm.op_gap_s)
    m = problem.workload.microbatches_per_data_node
    data = [int(d) for d in stages[0]]
    lines = [Timeline() for _ in range(problem.n)]
    room = list(caps)
    stage_of = {x: k for k, st in enumerate(stages) for x in st}
    left = {d: m for d in data}
    queue: list[tuple[float, int, int]] = []  # (ready, tie, data node): round robin over the data nodes
    for k, d in enumerate(data):
        for j in range(max(1, min(c.memory[d], m))):
            heapq.heappush(queue, (0.0, j * len(data) + k, d))
    done: list[tuple[int, tuple[int, ...], float, list[Op]]] = []
    while queue:
        ready, _, d = heapq.heappop(queue)
        if left[d] <= 0:
            continue
        left[d] -= 1
        t0 = lines[d].earliest(ready, c.forward[d], c.inject_gap)
        still = sum(left.values())
        due = (len(done) + 1) / (len(done) + 1 + still) if paced else None  # share of the microbatches routed
        best = _route(lines, c, d, t0, seqs, stages, room, caps, stage_of, still, due, rng, noise, work)
        if best is None:
            return None
        _, path, ops = best
        mb = len(done)
        first: dict[int, float] = {}
        for node, start, kind, dur, gap in ops:
            lines[node].reserve(start, dur, gap, ("F" if kind in "IF" else kind, mb))
            if kind in "IF":
                first[node] = start
            elif kind == "B":
                lines[node].hold(first[node], start)
        for x in path:
            room[x] -= 1
        done.append((d, path, t0, ops))
        heapq.heappush(queue, (ops[-1][1], m * len(data) + mb, d))  # the slot frees as the final backward starts
    order = sorted(range(len(done)), key=lambda i: (data.index(done[i][0]), done[i][2]))
    new_id = {old: k for k, old in enumerate(order)}
    routes = [(done[i][0], tuple(int(x) for x in done[i][1])) for i in order]
    orders = {x: [f"{kind}{new_id[mb]}" for kind, mb in line.tokens] for x, line in enumerate(lines) if line.tokens}
    return Timetable(routes, orders, max((ops[-1][1] + ops[-1][3] for *_, ops in done), default=0.0))


def estimated_work(problem: Problem, stages: list[list[int]], seqs: tuple[tuple[int, ...], ...]) -> int:
    """The ``work`` units one ``timetable_routes`` is expected to count: per microbatch, the path
    cells of every stage-order prefix (the nodes of its last stage x those of the stage before;
    1 before the first), as if every node kept TC1 room, and ``TRIED`` paths (or as many as
    there are) reserved once. Measured against the count on four clusters of 120-400 nodes:
    0.74-1.27 x (the room running out and the retries pull opposite ways); on 40 of 101-112
    nodes 0.79-1.18 x unpaced, 0.44-1.48 x paced (which looks first only at the nodes within
    their share). Not meant for small clusters with tight caps, where a microbatch whose best
    paths collide reserves every other path (up to 2.1 x seen at 14 nodes)."""
    prefixes = {seq[:k] for seq in seqs for k in range(1, len(seq) + 1)}
    cells = sum(len(stages[p[-1]]) * (len(stages[p[-2]]) if len(p) > 1 else 1) for p in prefixes)
    paths = sum(len(stages[seq[-1]]) for seq in seqs)
    placed = min(TRIED, paths) * (2 * (problem.workload.path_length - 1) + 3)
    return len(stages[0]) * problem.workload.microbatches_per_data_node * (cells + placed)


def _route(lines, c: _Costs, d: int, t0: float, seqs, stages, room: list[int], caps: list[int],
           stage_of: dict[int, int], still: int, due: float | None, rng, noise: float, work: list[int]):
    """The kept path of a microbatch of ``d`` injected at ``t0`` (``_choose``), ``still``
    microbatches left to route after it; None when no path fits. With ``due`` (paced: the share
    of the microbatches routed once this one is) a node first takes at most that share of its cap."""
    stage_room = [sum(max(0, room[x]) for x in st) for st in stages]

    def ranked(usable: list[int]) -> list[tuple[int, ...]]:
        found = _ranked_paths(lines, c, d, t0 + c.forward[d], seqs, stages, usable, work)
        return [p for _, p in found if _keeps_room(p, stage_room, stage_of, still)]

    if due is not None:  # first within the visits due by now
        usable = [min(r, math.ceil(cap * due) - (cap - r)) for r, cap in zip(room, caps)]
        best = _choose(lines, c, d, t0, ranked(usable)[:TRIED], 1, rng, noise, work)
        if best is not None:
            return best
    # the best few paths whose slots fit as reserved, else any such path, else forwards that
    # wait for a slot
    paths = ranked(room)
    return (_choose(lines, c, d, t0, paths[:TRIED], 1, rng, noise, work)
            or _choose(lines, c, d, t0, paths[TRIED:], 1, None, 0.0, work)
            or _choose(lines, c, d, t0, paths, SLOT_RETRIES, None, 0.0, work))


def _keeps_room(path: tuple[int, ...], stage_room: list[int], stage_of: dict[int, int], still: int) -> bool:
    """Whether, after ``path``, the ``still`` microbatches to route can each find ``len(path)``
    distinct stages with TC1 room (stage 0 aside)."""
    room = list(stage_room)
    for x in path:
        room[stage_of[x]] -= 1
    return sum(min(v, still) for v in room[1:]) >= still * len(path)


def _choose(lines, c: _Costs, d: int, t0: float, paths: list[tuple[int, ...]], tries: int, rng, noise: float, work):
    """The path whose final backward ends first (perturbed by ``noise``), reserved tentatively."""
    best, best_key = None, float("inf")
    for path in paths:
        got = _reserve(lines, c, d, path, t0, tries, work)
        if got is None:
            continue
        key = got[0] * (1.0 + rng.random() * noise) if rng is not None else got[0]
        if key < best_key:
            best, best_key = (got[0], path, got[1]), key
    return best
