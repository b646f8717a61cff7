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

import dataclasses
import heapq
import math
import random
from dataclasses import dataclass

import numpy as np

from skippipe.planner.problem import Problem
from skippipe.planner.routing.evaluate import Orders, Route
from skippipe.planner.routing.timeline import Timeline

# paths reserved in full per microbatch (ranked by their forward finish and static backward)
TRIED = 6
# times a forward is moved behind a freed slot before a path is given up
SLOT_RETRIES = 12
# largest cluster routed this way whatever it costs (the pass over the stage layers is per
# microbatch, in Python: about 1-2.5 s a timetable at 100 nodes); above it ``estimated_work``
# decides (``timetabled.timetable_candidates``)
LARGEST = 100


@dataclass
class Timetable:
    routes: list[Route]  # microbatch id = index; a data node injects its lower ids first
    orders: Orders  # every node's processing order (its reservations in time order)
    makespan: float  # the last reserved backward's end: the simulated makespan is at most this


@dataclass
class _Costs:
    forward: list[float]  # Python floats: read one at a time in the inner loops, where numpy's
    transfer: list[list[float]]  # element access cost three times as much (same values)
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
            clash, end = None, t + dur + gap
            for s, e in taken.get(node, ()):
                if s < end and t < e:
                    clash = e
                    break
            if clash is None:
                taken.setdefault(node, []).append((t, end))
                return t
            t = clash

    ops: list[Op] = [(d, t0, "I", f[d], c.inject_gap)]
    t, prev = t0 + f[d], d
    first: dict[int, float] = {}
    for x in path:
        s = place(x, max(t + T[prev][x], not_before.get(x, 0.0)), f[x], c.op_gap, c.memory[x])
        ops.append((x, s, "F", f[x], c.op_gap))
        first[x], t, prev = s, s + f[x], x
    loss = c.loss_factor * f[d]
    s = place(d, t + T[prev][d], loss, c.op_gap)
    ops.append((d, s, "L", loss, c.op_gap))
    t, prev = s + loss, d
    for x in (*reversed(path), d):
        dur = c.backward_factor * f[x]
        s = place(x, t + T[prev][x], dur, c.op_gap)
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
    share its layers; each layer keeps its nodes' paths and the sums of their hops back."""
    f, T = c.forward, c.transfer
    layer_of: dict[tuple[int, ...], dict[int, _Reach]] = {(): {d: (end0, (), 0)}}
    out = []
    tail = c.loss_factor * f[d]
    for seq in seqs:
        layer = layer_of.get(seq)
        if layer is None:
            for k in range(1, len(seq) + 1):
                if seq[:k] not in layer_of:
                    layer_of[seq[:k]] = _next_layer(lines, c, layer_of[seq[:k - 1]], stages[seq[k - 1]], room, work)
            layer = layer_of[seq]
        for x, (fin, path, hops_back) in layer.items():
            back = c.backward_factor * (_summed([f[y] for y in path]) + f[d])
            hops = T[d][x] + hops_back + T[path[0]][d]
            out.append((fin + T[x][d] + tail + back + hops, path))
    out.sort()
    return out


def _summed(values: list[float]) -> float:
    """The sum of ``values`` as numpy sums them (in order below 8 values, pairwise from 8), so
    that paths are ranked as they were with numpy arrays."""
    if len(values) < 8:
        total = 0.0
        for v in values:
            total += v
        return total
    return float(np.sum(values))


# a node's best prefix in ``_ranked_paths``: when its forward ends, the path to it, and the sum of
# that path's hops back (from each node to the one before it, in path order)
_Reach = tuple[float, tuple[int, ...], float]


def _next_layer(
    lines, c: _Costs, prev: dict[int, _Reach], nodes: list[int], room: list[int], work: list[int]
) -> dict[int, _Reach]:
    """One more stage of ``_ranked_paths``' prefix: per node of ``nodes`` with room, when its
    forward can finish after the best node of ``prev`` (the layer one stage shorter), the path
    through that node, and the path's hops back."""
    f, T = c.forward, c.transfer
    got: dict[int, _Reach] = {}
    for x in nodes if prev else ():
        if room[x] <= 0:
            continue
        y, arr = -1, math.inf  # the first node of ``prev`` where x's forward can start first
        for z, (fin, _, _) in prev.items():
            a = fin + T[z][x]
            if y < 0 or a < arr:
                y, arr = z, a
        _, path, hops_back = prev[y]
        got[x] = (lines[x].earliest_forward(arr, f[x], c.op_gap, c.memory[x]) + f[x], (*path, x),
                  hops_back + T[x][y] if path else hops_back)
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
    routing = Routing.start(problem, stages, caps, seqs, work if work is not None else [0])
    while (ready := routing.next()) is not None:
        d, t0, still = ready
        routed = len(routing.done)
        due = (routed + 1) / (routed + 1 + still) if paced else None  # share of the microbatches routed
        best = routing.route(d, t0, still, due, rng, noise)
        if best is None:
            return None
        routing.commit(d, t0, best)
    return routing.timetable()


Reserved = tuple[float, tuple[int, ...], list[Op]]  # end of the final backward, path, operations


@dataclass
class Routing:
    """A timetable routing under way: the nodes' timelines, the TC1 room left, the microbatches
    still to route (by the time they can start) and those routed. ``copy`` lets a caller try a
    choice and route on from it (``routing.lookahead``)."""

    c: _Costs
    m: int
    data: list[int]
    stages: list[list[int]]
    seqs: tuple[tuple[int, ...], ...]
    caps: list[int]
    stage_of: dict[int, int]
    lines: list[Timeline]
    room: list[int]
    left: dict[int, int]
    queue: list[tuple[float, int, int]]  # (ready, tie, data node): round robin over the data nodes
    done: list[tuple[int, tuple[int, ...], float, list[Op]]]
    work: list[int]

    @classmethod
    def start(cls, problem: Problem, stages: list[list[int]], caps: list[int], seqs: tuple[tuple[int, ...], ...],
              work: list[int]) -> Routing:
        cm = problem.cost_model
        c = _Costs(np.asarray(problem.forward_s, dtype=float).tolist(), np.asarray(problem.transfer_s, dtype=float).tolist(),
                   [int(x) for x in problem.memory], cm.backward_factor, cm.loss_factor, cm.inject_gap_s, cm.op_gap_s)
        m = problem.workload.microbatches_per_data_node
        data = [int(d) for d in stages[0]]
        queue: list[tuple[float, int, int]] = []
        for k, d in enumerate(data):
            for j in range(max(1, min(c.memory[d], m))):
                heapq.heappush(queue, (0.0, j * len(data) + k, d))
        return cls(c, m, data, stages, seqs, caps, {x: k for k, st in enumerate(stages) for x in st},
                   [Timeline() for _ in range(problem.n)], list(caps), {d: m for d in data}, queue, [], work)

    def copy(self) -> Routing:
        return dataclasses.replace(self, lines=[line.copy() for line in self.lines], room=list(self.room),
                                   left=dict(self.left), queue=list(self.queue), done=list(self.done))

    def next(self) -> tuple[int, float, int] | None:
        """The next microbatch to route: its data node, its injection's earliest start and how
        many microbatches are left after it; None when all are routed."""
        while self.queue:
            ready, _, d = heapq.heappop(self.queue)
            if self.left[d] > 0:
                self.left[d] -= 1
                return d, self.lines[d].earliest(ready, self.c.forward[d], self.c.inject_gap), sum(self.left.values())
        return None

    def route(self, d: int, t0: float, still: int, due: float | None = None, rng=None, noise: float = 0.0
              ) -> Reserved | None:
        """The kept path of this microbatch (``_route``), reserved tentatively; None when none fits."""
        return _route(self.lines, self.c, d, t0, self.seqs, self.stages, self.room, self.caps, self.stage_of, still,
                      due, rng, noise, self.work)

    def options(self, d: int, t0: float, still: int) -> list[Reserved]:
        """The best-ranked ``TRIED`` paths of this microbatch whose slots fit as reserved."""
        paths = _usable(self.lines, self.c, d, t0, self.seqs, self.stages, self.room, self.room, self.stage_of, still,
                        self.work)
        return list(_reserved(self.lines, self.c, d, t0, paths[:TRIED], 1, self.work))

    def commit(self, d: int, t0: float, best: Reserved) -> None:
        """Reserve ``best`` on the timelines: the microbatch is routed."""
        _, path, ops = best
        mb = len(self.done)
        first: dict[int, float] = {}
        for node, start, kind, dur, gap in ops:
            self.lines[node].reserve(start, dur, gap, ("F" if kind in "IF" else kind, mb))
            if kind in "IF":
                first[node] = start
            elif kind == "B":
                self.lines[node].hold(first[node], start)
        for x in path:
            self.room[x] -= 1
        self.done.append((d, path, t0, ops))
        heapq.heappush(self.queue, (ops[-1][1], self.m * len(self.data) + mb, d))  # the slot frees as the final backward starts

    @property
    def makespan(self) -> float:
        """The last reserved backward's end so far."""
        return max((ops[-1][1] + ops[-1][3] for *_, ops in self.done), default=0.0)

    def timetable(self) -> Timetable:
        done, data = self.done, self.data
        order = sorted(range(len(done)), key=lambda i: (data.index(done[i][0]), done[i][2]))
        new_id = {old: k for k, old in enumerate(order)}
        routes = [(done[i][0], tuple(int(x) for x in done[i][1])) for i in order]
        orders = {x: [f"{kind}{new_id[mb]}" for kind, mb in line.tokens] for x, line in enumerate(self.lines) if line.tokens}
        return Timetable(routes, orders, self.makespan)


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
    if due is not None:  # first within the visits due by now
        usable = [min(r, math.ceil(cap * due) - (cap - r)) for r, cap in zip(room, caps)]
        best = _choose(lines, c, d, t0, _usable(lines, c, d, t0, seqs, stages, usable, room, stage_of, still, work)[:TRIED],
                       1, rng, noise, work)
        if best is not None:
            return best
    # the best few paths whose slots fit as reserved, else any such path, else forwards that
    # wait for a slot
    paths = _usable(lines, c, d, t0, seqs, stages, room, room, stage_of, still, work)
    return (_choose(lines, c, d, t0, paths[:TRIED], 1, rng, noise, work)
            or _choose(lines, c, d, t0, paths[TRIED:], 1, None, 0.0, work)
            or _choose(lines, c, d, t0, paths, SLOT_RETRIES, None, 0.0, work))


def _usable(lines, c: _Costs, d: int, t0: float, seqs, stages, usable: list[int], room: list[int],
            stage_of: dict[int, int], still: int, work: list[int]) -> list[tuple[int, ...]]:
    """The paths of ``_ranked_paths`` over the nodes with ``usable`` room, best first, that keep
    of the ``room`` left what the other microbatches need (``_keeps_room``)."""
    stage_room = [sum(max(0, room[x]) for x in st) for st in stages]
    found = _ranked_paths(lines, c, d, t0 + c.forward[d], seqs, stages, usable, work)
    return [p for _, p in found if _keeps_room(p, stage_room, stage_of, still)]


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
    for got in _reserved(lines, c, d, t0, paths, tries, work):
        key = got[0] * (1.0 + rng.random() * noise) if rng is not None else got[0]
        if key < best_key:
            best, best_key = got, key
    return best


def _reserved(lines, c: _Costs, d: int, t0: float, paths: list[tuple[int, ...]], tries: int, work):
    """Each of ``paths`` whose microbatch fits within ``tries`` placements, reserved tentatively."""
    for path in paths:
        got = _reserve(lines, c, d, path, t0, tries, work)
        if got is not None:
            yield got[0], path, got[1]
