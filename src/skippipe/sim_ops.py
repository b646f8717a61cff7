"""The operation tables the simulator runs on (torch-free).

A microbatch with route ``d, p1, .., pk, d`` is the chain of operations
``F@d, F@p1, .., F@pk, L@d, B@pk, .., B@p1, B@d`` (see ``skippipe.sim``). ``RouteOps`` turns a
route into its segment of the flat per-operation lists (node, kind, duration, hop to the next
operation's node, idle gap after it) for one set of costs, and keeps each segment: a planner that
simulates thousands of routings that differ in a few routes builds each route's segment once.
``plan_tables`` flattens a whole plan file with the same segments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from skippipe.errors import PlanError
from skippipe.planfile import Costs, Plan, parse_op

# operation kinds, as stored in the flat op tables
INJECT, FWD, LOSS, BWD = 0, 1, 2, 3
KIND_CHAR = ("F", "F", "L", "B")

Segment = tuple[list[int], list[int], list[float], list[float], list[float]]  # node, kind, dur, hop, gap


@dataclass
class OpTables:
    """Microbatches flattened into per-operation lists (one entry per operation)."""

    node: list[int]
    dur: list[float]
    hop: list[float]  # transfer time to the next operation's node
    kind: list[int]
    mb: list[int]  # microbatch index
    op_id: list[int]  # microbatch id (the queue's tie-break)
    first: list[int]  # per microbatch: index of its injection
    last: list[int]  # per microbatch: index of its final backward
    ids: list[int]
    release: list[float]
    after: list[int]  # per microbatch: index it waits for, -1 for none
    gap: list[float]  # per operation: idle time of its node afterwards
    _tokens: list[str] | None = field(default=None, repr=False)

    def tokens(self) -> list[str]:
        """Per operation its processing-order token (``F3``, ``L3``, ``B3``): built on first use
        (an order read, or asked for after the run), not in the search's scoring runs."""
        if self._tokens is None:
            ids = self.ids
            self._tokens = [f"{KIND_CHAR[k]}{ids[m]}" for k, m in zip(self.kind, self.mb)]
        return self._tokens


def kind_costs(costs: Costs) -> tuple[list[float], list[float]]:
    """Per operation kind: its multiple of the node's forward time, and its node's idle gap after it."""
    factor = [float(costs.op_factor(KIND_CHAR[k])) for k in range(4)]
    return factor, [float(costs.inject_gap_s)] + [float(costs.op_gap_s)] * 3


def route_layout(data_node: int, path: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """Per operation of one route: its node, the node of the operation after it, its kind."""
    d, k = data_node, len(path)
    back = list(path[::-1])
    node = [d, *path, d, *back, d]
    nxt = [*path, d, back[0] if k else d, *((back[1:] + [d]) if k else []), d]
    kind = [INJECT, *([FWD] * k), LOSS, *([BWD] * (k + 1))]
    return node, nxt, kind


def stacked_index(sizes: list[int], ids: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """For microbatches whose operations (``sizes`` of them each) lie end to end: per operation
    its microbatch index and id, per microbatch the index of its first and of its last operation."""
    mbl: list[int] = []
    op_id: list[int] = []
    first: list[int] = []
    last: list[int] = []
    for m, (size, mb_id) in enumerate(zip(sizes, ids, strict=True)):
        first.append(len(mbl))
        mbl += [m] * size
        op_id += [mb_id] * size
        last.append(len(mbl) - 1)
    return mbl, op_id, first, last


class RouteOps:
    """Operation segments of routes under fixed costs, each built once."""

    def __init__(self, costs: Costs) -> None:
        self.n = int(np.asarray(costs.forward_s).shape[0])
        self._fwd = np.asarray(costs.forward_s, dtype=float).tolist()
        self._transfer = np.asarray(costs.transfer_s, dtype=float)
        self._rows: dict[int, list[float]] = {}  # transfer rows as lists, on first use
        self._factor, self._gap = kind_costs(costs)
        self._segments: dict[tuple[int, tuple[int, ...]], Segment] = {}

    def segment(self, data_node: int, path: tuple[int, ...]) -> Segment:
        """The operations of one route, in the order the microbatch runs them."""
        seg = self._segments.get((data_node, path))
        if seg is None:
            node, nxt, kind = route_layout(data_node, path)
            fwd, factor, gap = self._fwd, self._factor, self._gap
            seg = (
                node, kind,
                [fwd[x] * factor[t] for x, t in zip(node, kind)],
                [self._row(x)[y] for x, y in zip(node, nxt)],
                [gap[t] for t in kind],
            )
            self._segments[(data_node, path)] = seg
        return seg

    def _row(self, x: int) -> list[float]:
        row = self._rows.get(x)
        if row is None:
            row = self._rows[x] = self._transfer[x].tolist()
        return row

    def tables(self, microbatches: Sequence[tuple[int, int, tuple[int, ...]]],
               release: list[float] | None = None, after: list[int] | None = None) -> OpTables:
        """The tables of ``(id, data node, path)`` microbatches, in this order (``release``:
        seconds per microbatch, default 0; ``after``: the index each waits for, -1 for none)."""
        node: list[int] = []
        kind: list[int] = []
        dur: list[float] = []
        hop: list[float] = []
        gap: list[float] = []
        sizes: list[int] = []
        for _, d, path in microbatches:
            s_node, s_kind, s_dur, s_hop, s_gap = self.segment(d, path)
            node += s_node
            kind += s_kind
            dur += s_dur
            hop += s_hop
            gap += s_gap
            sizes.append(len(s_node))
        ids = [mb[0] for mb in microbatches]
        mbl, op_id, first, last = stacked_index(sizes, ids)
        count = len(microbatches)
        return OpTables(
            node=node, dur=dur, hop=hop, kind=kind, mb=mbl, op_id=op_id, first=first, last=last, ids=ids,
            release=release if release is not None else [0.0] * count,
            after=after if after is not None else [-1] * count, gap=gap,
        )


def plan_tables(plan: Plan) -> OpTables:
    """The operation tables of a plan file (its ids unique, its nodes and ``after`` valid)."""
    n = plan.n_nodes
    ids = [mb.id for mb in plan.microbatches]
    index = {mb_id: i for i, mb_id in enumerate(ids)}
    if len(index) != len(ids):
        raise PlanError("simulate: microbatch ids must be unique")
    after: list[int] = []
    for mb in plan.microbatches:
        if any(not 0 <= x < n for x in (mb.data_node, *mb.path)):
            raise PlanError(f"simulate: microbatch {mb.id} visits a node outside 0..{n - 1}")
        if mb.after is None:
            after.append(-1)
        elif mb.after not in index:
            raise PlanError(f"simulate: microbatch {mb.id} waits for microbatch {mb.after}, which does not exist")
        else:
            after.append(index[mb.after])
    node: list[int] = []
    nxt: list[int] = []
    kind: list[int] = []
    sizes: list[int] = []
    for mb in plan.microbatches:
        r_node, r_nxt, r_kind = route_layout(mb.data_node, list(mb.path))
        node += r_node
        nxt += r_nxt
        kind += r_kind
        sizes.append(len(r_node))
    mbl, op_id, first, last = stacked_index(sizes, ids)
    costs = plan.costs
    node_a, kind_a = np.asarray(node, dtype=np.int64), np.asarray(kind, dtype=np.int64)
    factor, gaps = (np.asarray(v, dtype=float) for v in kind_costs(costs))
    fwd = np.asarray(costs.forward_s, dtype=float)
    transfer = np.asarray(costs.transfer_s, dtype=float)
    return OpTables(
        node=node, dur=(fwd[node_a] * factor[kind_a]).tolist() if node else [],
        hop=transfer[node_a, np.asarray(nxt, dtype=np.int64)].tolist() if node else [],
        kind=kind, mb=mbl, op_id=op_id, first=first, last=last, ids=ids,
        release=[float(mb.release_s) for mb in plan.microbatches], after=after,
        gap=gaps[kind_a].tolist() if node else [],
    )


def order_lists(c: OpTables, n: int, order: dict[int, list[str]]) -> list[list[int] | None]:
    """Processing order tokens -> per-node lists of operation indices (None: serve FIFO)."""
    by_token: list[dict[str, int]] = [{} for _ in range(n)]
    for o, (x, tok) in enumerate(zip(c.node, c.tokens())):
        by_token[x][tok] = o
    out: list[list[int] | None] = [None] * n
    for key, ops in order.items():
        x = int(key)
        if not 0 <= x < n:
            raise PlanError(f"simulate: processing order names node {x}, but nodes are 0..{n - 1}")
        want = by_token[x]
        seq = []
        for tok in ops:
            if tok not in want:
                parse_op(tok)  # a malformed token gets its own message
                raise PlanError(f"simulate: processing order of node {x} lists {tok}, which node {x} does not perform")
            seq.append(want[tok])
        if len(set(seq)) != len(seq) or len(seq) != len(want):
            missing = sorted(set(want) - set(ops))
            raise PlanError(
                f"simulate: processing order of node {x} must list each of its {len(want)} operations once"
                + (f" (missing {missing[:4]})" if missing else " (duplicates)")
            )
        out[x] = seq
    return out
