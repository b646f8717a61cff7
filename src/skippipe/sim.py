"""Discrete-event simulation of one training iteration of a plan (torch-free).

Every microbatch runs this chain of operations (route ``d, p1, .., pk, d``)::

    F@d  ->hop->  F@p1 ->hop-> .. F@pk ->hop->  L@d  ->hop->  B@pk ->hop-> .. B@p1 ->hop->  B@d

``F`` costs ``forward_s[node]``, ``L`` (final norm + head + loss, on the data node)
``loss_factor * forward_s``, ``B`` ``backward_factor * forward_s``; a hop i -> j takes
``transfer_s[i][j]`` and occupies no node. The loss is a separate operation on the data node
and the gradient travels back to the last path node: this is what the reference simulator does
and what reproduces its figures (see the README, "What the simulator models").

Node service (the reference's rules): one operation at a time; after an injection (``F`` on the
data node) the node idles ``inject_gap_s``, after any other operation ``op_gap_s``. A forward
takes one of the node's ``memory`` activation slots, which the microbatch's backward on that node
returns; a forward that finds no free slot waits (the data node's own in-flight microbatches use
its slots too). When a node is free it serves, among the operations that have arrived, the one
that arrived first (ties: backward, then loss, then forward, then lower microbatch id); an
injection, which starts new work, is served only when no arrived in-flight operation can run.
With a processing order a node performs its operations in exactly the given order instead.

An injection becomes ready at the microbatch's ``release_s`` and, if it names ``after``, not
before that microbatch's last backward has finished. The makespan is the time the last backward
finishes on a data node. A plan that cannot finish (memory deadlock, a processing order that
waits on itself) ends with ``finished=False``, the stuck microbatches listed in ``unfinished``
and ``makespan_s = inf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from heapq import heappop, heappush

from skippipe.planfile import Plan
from skippipe.sim_ops import BWD, FWD, INJECT, KIND_CHAR, OpTables, RouteOps, order_lists, plan_tables

# tie rank when two operations arrived at the same moment: backward, loss, forward first
_RANK = (2, 2, 1, 0)


@dataclass
class OpRecord:
    node: int
    mb: int
    kind: str  # 'F' | 'L' | 'B'
    start: float
    end: float
    ready: float = math.nan  # when the operation could have started (arrived, released); wait = start - ready


@dataclass
class SimResult:
    makespan_s: float  # last backward finished on any data node (inf when not finished)
    finished: bool  # every microbatch finished its backward
    unfinished: list[int]  # ids that never finished (deadlock / memory)
    ops: list[OpRecord]  # empty when record=False
    busy_s: list[float]  # per node compute time
    lower_bound_s: float
    last_finish_s: float = 0.0  # last backward finished, counting finished microbatches only
    finish_s: dict[int, float] = field(default_factory=dict)  # microbatch id -> last backward end
    _order: list[list[int]] = field(default_factory=list, repr=False)  # executed op indices per node
    _compiled: OpTables | None = field(default=None, repr=False)  # the plan's op tables (tokens on demand)

    def processing_order(self) -> dict[int, list[str]]:
        """Executed order per node, e.g. ``{3: ["F0", "F5", "B0", ...]}`` (nodes with work only)."""
        tok = self._compiled.tokens() if self._compiled is not None else []
        return {node: [tok[o] for o in ops] for node, ops in enumerate(self._order) if ops}

    def idle_s(self) -> list[float]:
        end = self.makespan_s if self.finished else self.last_finish_s
        return [max(0.0, end - b) for b in self.busy_s]


def simulate(
    plan: Plan,
    processing_order: dict[int, list[str]] | None = None,
    record: bool = True,
    bound: bool = True,
) -> SimResult:
    """Simulate one iteration of ``plan``.

    ``processing_order`` None uses ``plan.processing_order`` if set, else first-ready-first-
    served; a node missing from the order is served first-ready-first-served. ``record=False``
    skips the per-operation records (the fast mode for search loops); ``bound=False`` skips the
    lower bound (``lower_bound_s`` is then 0.0).
    """
    c = plan_tables(plan)
    n = plan.n_nodes
    order = processing_order if processing_order is not None else plan.processing_order
    fixed = order_lists(c, n, order) if order else [None] * n
    finish, busy, done_order, start, ready = _run(c, n, [int(m) for m in plan.memory], fixed)

    ids, mbl, kind, dur = c.ids, c.mb, c.kind, c.dur
    unfinished = [ids[i] for i, f in enumerate(finish) if f < 0]
    done = [f for f in finish if f >= 0]
    last_finish = max(done) if done else 0.0
    ops: list[OpRecord] = []
    if record:
        ops = [
            OpRecord(nd, ids[mbl[o]], KIND_CHAR[kind[o]], start[o], start[o] + dur[o], ready[o])
            for nd, nd_ops in enumerate(done_order)
            for o in nd_ops
        ]
    lb = 0.0
    if bound:
        from skippipe.bounds import lower_bound

        lb = lower_bound(plan)
    return SimResult(
        makespan_s=last_finish if not unfinished else math.inf,
        finished=not unfinished,
        unfinished=unfinished,
        ops=ops,
        busy_s=busy,
        lower_bound_s=lb,
        last_finish_s=last_finish,
        finish_s={ids[i]: f for i, f in enumerate(finish) if f >= 0},
        _order=done_order,
        _compiled=c,
    )


def route_finish_times(
    route_ops: RouteOps, microbatches: list[tuple[int, int, tuple[int, ...]]], memory: list[int],
    processing_order: dict[int, list[str]] | None = None,
) -> list[float]:
    """The finish time of each ``(id, data node, path)`` microbatch (released at 0, none waiting
    for another) on the nodes of ``route_ops``, -1 for one that never finishes: what ``simulate``
    gives for a plan of just these microbatches, without building the plan (the planner's
    scoring runs)."""
    c = route_ops.tables(microbatches)
    n = route_ops.n
    slots = list(memory)
    used = {x for _, d, path in microbatches for x in (d, *path)}
    if 4 * len(used) < n:  # a few nodes of many: per-node state for those alone (same order of nodes)
        local = {x: k for k, x in enumerate(sorted(used))}
        c.node = [local[x] for x in c.node]
        n, slots = len(local), [slots[x] for x in local]
        if processing_order:
            processing_order = {local[x]: ops for x, ops in processing_order.items()}
    fixed = order_lists(c, n, processing_order) if processing_order else [None] * n
    return _run(c, n, slots, fixed)[0]


def _run(
    c: OpTables, n: int, slots: list[int], fixed: list[list[int] | None]
) -> tuple[list[float], list[float], list[list[int]], list[float], list[float]]:
    """The event loop: per microbatch its finish (-1: never), per node its busy seconds and
    executed operations, per operation its start and ready time. ``slots`` is used up."""
    node, dur, hop, kind, mbl, gap = c.node, c.dur, c.hop, c.kind, c.mb, c.gap
    last = c.last
    busy = [0.0] * n
    done_order: list[list[int]] = [[] for _ in range(n)]
    fq: list[list[tuple]] = [[] for _ in range(n)]  # arrived forwards (need a slot)
    oq: list[list[tuple]] = [[] for _ in range(n)]  # arrived loss / backward
    arrived = [False] * len(node)
    pos = [0] * n  # next index into a fixed order
    has_event = [False] * n  # a free/dispatch event is pending for the node
    free_at = [0.0] * n  # when the node's last operation and its gap end
    finish = [-1.0] * len(c.ids)
    start = [-1.0] * len(node)
    ready = [-1.0] * len(node)
    waiters: dict[int, list[int]] = {}
    events: list[tuple] = []  # (time, 0 = arrival | 1 = node free, op or node)
    push, pop = heappush, heappop  # local names: this loop is the planner's hot path
    op_id = c.op_id
    release, first = c.release, c.first

    for i, (rel, dep) in enumerate(zip(c.release, c.after)):
        if dep < 0:
            heappush(events, (rel, 0, c.first[i]))
        else:
            waiters.setdefault(dep, []).append(i)

    while events:
        t, typ, x = pop(events)
        if typ == 0:  # operation x arrives at its node
            nd = node[x]
            ready[x] = t
            k = kind[x]
            if fixed[nd] is not None:
                arrived[x] = True
            elif k == INJECT:  # new work waits behind arrived in-flight work
                push(fq[nd], (1, t, 3, op_id[x], x))
            elif k == FWD:
                push(fq[nd], (0, t, 2, op_id[x], x))
            else:
                push(oq[nd], (0, t, _RANK[k], op_id[x], x))
            if not has_event[nd]:
                has_event[nd] = True
                ft = free_at[nd]
                push(events, (ft if ft > t else t, 1, nd))
            continue

        nd = x  # node nd is free at t: pick its next operation
        has_event[nd] = False
        seq = fixed[nd]
        if seq is not None:
            p = pos[nd]
            if p >= len(seq):
                continue
            o = seq[p]
            if not arrived[o] or (kind[o] <= FWD and slots[nd] <= 0):
                continue  # wait for its arrival (or, deadlocked, for a slot that never frees)
            pos[nd] = p + 1
        else:
            f, q = fq[nd], oq[nd]
            if f and slots[nd] > 0 and (not q or f[0] < q[0]):
                o = pop(f)[4]
            elif q:
                o = pop(q)[4]
            else:
                continue
        k = kind[o]
        if k <= FWD:
            slots[nd] -= 1
        elif k == BWD:
            slots[nd] += 1
        end = t + dur[o]
        start[o] = t
        busy[nd] += dur[o]
        done_order[nd].append(o)
        if o == last[mbl[o]]:
            m = mbl[o]
            finish[m] = end
            for w in waiters.pop(m, ()):
                push(events, (max(release[w], end), 0, first[w]))
        else:
            push(events, (end + hop[o], 0, o + 1))
        free_at[nd] = end + gap[o]
        # the node looks for work when it is free again; with nothing arrived yet the next
        # arrival asks instead (the same event, at the same time: no empty look)
        if (fq[nd] or oq[nd]) if seq is None else (pos[nd] < len(seq) and arrived[seq[pos[nd]]]):
            has_event[nd] = True
            push(events, (free_at[nd], 1, nd))

    return finish, busy, done_order, start, ready
