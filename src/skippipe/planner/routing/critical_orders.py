"""Processing orders improved along the critical path (job-shop style moves).

The order search of ``RouteSearch`` moves any operation a few places in its node's order, at
random. On a large component (one site, every data node sharing every node: hundreds of
operations) a descent over those moves does not finish one pass within its budget, and few of
the moves touch the operations that decide the makespan. Here the moves come from the
critical path of the simulated schedule instead:

- the path is walked back from the operation that ends last: an operation that started as
  soon as it arrived follows the previous operation of its microbatch; one that waited for
  its node follows the operation its node ran before it (a wait for an activation slot ends
  the walk);
- consecutive operations of the path on one node form a *block*; the moves swap the first two
  and the last two operations of each block, and move its last operation to its front and its
  first to its back (as job-shop local search does: a swap inside a block leaves the path's
  length as it was);
- a descent takes the first move that lowers the score and walks the new path; when none
  helps, a kick (a few operations of the path moved one or two places at random) and a new
  descent, kept when it ends lower, until the budget is spent.

Every simulation (the walks included) is charged to the search's budget, and the random
choices come from the search's generator, so the result is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from random import Random
from typing import Protocol

from skippipe.planner.routing.evaluate import Evaluator, Orders, Route, Score
from skippipe.sim import OpRecord, simulate

# a wait after the node's previous operation shorter than this is that operation's gap (the
# op gap or the injection gap): the node was busy; a longer one is a wait for a slot
GAP_SLACK_S = 0.25
KICK_MOVES = 2  # operations of the critical path moved by one kick


class OrderSearch(Protocol):
    """What this search uses of ``search.RouteSearch``: its evaluator, budget and generator,
    and its scoring of one component's orders."""

    ev: Evaluator
    limits: SearchBudget
    rng: Random

    def component_score(self, routes: list[Route], comp: list[int], orders: Orders) -> Score: ...

    def first_better(self, routes: list[Route], comp: list[int], orders: Orders,
                     proposals: Iterable[tuple[int, list[str]]], best: Score, stop: int) -> tuple[Score, bool]: ...


class SearchBudget(Protocol):
    spent: int

    def done(self) -> bool: ...


@dataclass
class _Walk:
    ops: list[OpRecord]  # the critical path, first operation first
    nodes: list[int]  # global node of each local node of the simulated component


def _token(op: OpRecord) -> str:
    return f"{op.kind}{op.mb}"


def critical_walk(search: OrderSearch, routes: list[Route], comp: list[int], orders: Orders) -> _Walk:
    """The critical path of the component's schedule under ``orders`` (one simulation)."""
    plan, nodes = search.ev.subplan(routes, comp, orders)
    search.limits.spent += 1
    ops = simulate(plan, bound=False).ops
    if not ops:  # orders that deadlock before any operation
        return _Walk([], nodes)
    by_node: dict[int, list[OpRecord]] = {}
    by_mb: dict[int, list[OpRecord]] = {}
    for op in sorted(ops, key=lambda o: o.start):
        by_node.setdefault(op.node, []).append(op)
        by_mb.setdefault(op.mb, []).append(op)
    node_pos = {id(op): k for run in by_node.values() for k, op in enumerate(run)}
    mb_pos = {id(op): k for run in by_mb.values() for k, op in enumerate(run)}
    cur = max(ops, key=lambda o: o.end)
    path = [cur]
    while True:
        k = node_pos[id(cur)]
        if cur.start > cur.ready + 1e-9:
            if k == 0:
                break
            prev = by_node[cur.node][k - 1]
            if cur.start - prev.end >= GAP_SLACK_S:
                break  # it waited for a slot
            cur = prev
        else:
            j = mb_pos[id(cur)]
            if j == 0:
                break
            cur = by_mb[cur.mb][j - 1]
        path.append(cur)
    path.reverse()
    return _Walk(path, nodes)


def block_moves(walk: _Walk) -> list[tuple[int, str, str, str]]:
    """(node, token, other token, how) for every block of the critical path: 'swap' the two,
    'before' (the first token moves right before the other) or 'after'."""
    if not walk.ops:
        return []
    blocks, run = [], [walk.ops[0]]
    for a, b in zip(walk.ops, walk.ops[1:]):
        if b.node == a.node:
            run.append(b)
        else:
            blocks.append(run)
            run = [b]
    blocks.append(run)
    moves = []
    for block in blocks:
        if len(block) < 2:
            continue
        x = walk.nodes[block[0].node]
        first, last = _token(block[0]), _token(block[-1])
        moves.append((x, first, _token(block[1]), "swap"))
        if len(block) > 2:
            moves.append((x, _token(block[-2]), last, "swap"))
            moves.append((x, last, first, "before"))
            moves.append((x, first, last, "after"))
    return moves


def _moved(seq: list[str], a: str, b: str, how: str) -> list[str]:
    new = list(seq)
    if how == "swap":
        i, j = new.index(a), new.index(b)
        new[i], new[j] = new[j], new[i]
        return new
    new.remove(a)
    j = new.index(b)
    new.insert(j if how == "before" else j + 1, a)
    return new


def _descend(search: OrderSearch, routes: list[Route], comp: list[int], orders: Orders, best: Score, budget: int
             ) -> tuple[Orders, Score, _Walk | None]:
    """First-improvement descent over the block moves, within ``budget`` simulations; the orders,
    their score and their critical path (None when the budget ended the descent first)."""
    stop = search.limits.spent + budget
    while search.limits.spent < stop and not search.limits.done():
        walk = critical_walk(search, routes, comp, orders)
        best, improved = search.first_better(routes, comp, orders, (
            (x, _moved(orders[x], a, b, how)) for x, a, b, how in block_moves(walk)), best, stop)
        if not improved:
            return orders, best, walk
    return orders, best, None


def critical_orders(search: OrderSearch, routes: list[Route], comp: list[int], orders: Orders, score: Score, budget: int
                    ) -> tuple[Orders, Score]:
    """Iterated descent over the critical path's block moves from ``orders`` (scored ``score``;
    every node of the component listed, as ``Evaluator.realized_orders`` gives them), within
    ``budget`` simulations; the best orders and their score."""
    stop = search.limits.spent + budget
    best_orders, best, best_walk = _descend(search, routes, comp, dict(orders), score, budget)
    while search.limits.spent < stop and not search.limits.done():
        trial = {x: list(v) for x, v in best_orders.items()}
        walk = best_walk if best_walk is not None else critical_walk(search, routes, comp, trial)
        if not walk.ops:
            break
        for _ in range(KICK_MOVES):
            op = search.rng.choice(walk.ops)
            seq = trial[walk.nodes[op.node]]
            i = seq.index(_token(op))
            j = i + search.rng.choice((-2, -1, 1, 2))
            if 0 <= j < len(seq):
                seq.insert(j, seq.pop(i))
        s = search.component_score(routes, comp, trial)
        if not math.isfinite(s.makespan):
            continue  # the kick deadlocked the slots
        trial, s, trial_walk = _descend(search, routes, comp, trial, s, stop - search.limits.spent)
        if s < best:
            best_orders, best, best_walk = trial, s, trial_walk
    return best_orders, best
