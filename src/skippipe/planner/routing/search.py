"""Local search over paths and per-node processing orders, scored by the simulator.

Every step looks at the data node that finishes last (the critical one) and tries moves that
touch its microbatches, first improvement wins:

- exchange: one of its microbatches and another one swap their nodes of the same stage (the
  loads, and so the TC1 caps, do not change); or the node is replaced by one of the same stage
  with capacity left;
- reorder: the same nodes in another valid stage order (e.g. a swap of two adjacent stages);
- swap paths with a microbatch of another data node (loads unchanged);
- injection order: two of its microbatches trade places in the data node's queue.

The score (``route_eval.Score``) is the makespan, then the other data nodes' finish times, so a
step may also help the second-latest data node. The order search then rearranges the
operations on the nodes of the critical component: an operation moves a few places earlier
or later in its node's order (the simulator follows a processing order exactly), starting
from the order the nodes served on their own and from one that injects a new microbatch right
after a backward frees its slot. Before those, half of the budget left goes to moves on the
critical path of the schedule (``critical_orders``): on a component of hundreds of operations
the random moves do not finish one pass within their budget. Everything is deterministic for
a seed; ``budget`` counts simulations, the deadline only cuts the search short.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from skippipe.planner.routing.critical_orders import critical_orders
from skippipe.planner.routing.evaluate import Evaluator, Incremental, Orders, Route, Score


@dataclass
class SearchLimits:
    budget: int  # simulations
    deadline: float | None = None
    spent: int = 0
    started: float = field(default_factory=time.perf_counter)

    def done(self) -> bool:
        if self.spent >= self.budget:
            return True
        return self.deadline is not None and time.perf_counter() > self.deadline


class RouteSearch:
    def __init__(
        self,
        ev: Evaluator,
        stages: list[list[int]],
        caps: list[int],
        sequences: tuple[tuple[int, ...], ...],
        seed: int,
        limits: SearchLimits,
    ) -> None:
        self.ev = ev
        self.stages = stages
        self.caps = caps
        self.stage_of = {x: s for s, nodes in enumerate(stages) for x in nodes}
        self.orders_of: dict[frozenset[int], list[tuple[int, ...]]] = {}  # stage set -> its valid orders
        for seq in dict.fromkeys(tuple(q) for q in sequences):
            self.orders_of.setdefault(frozenset(seq), []).append(seq)
        self.rng = random.Random(seed)
        self.limits = limits
        self.patterns: dict[tuple, dict[int, list[tuple[str, int]]]] = {}
        self.kicks = 12  # iterated-local-search restarts per component order search

    # ------------------------------------------------------------------ helpers
    def _seq(self, path: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(self.stage_of[x] for x in path)

    def _reorders(self, path: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The other valid orders of the path's nodes, in the order ``itertools.permutations``
        lists them (the valid stage orders of its stage set, not all L-1 factorial)."""
        seq = self._seq(path)
        node_of = dict(zip(seq, path))
        place = {x: k for k, x in enumerate(path)}
        perms = [tuple(node_of[s] for s in other) for other in self.orders_of.get(frozenset(seq), ()) if other != seq]
        return sorted(perms, key=lambda perm: tuple(place[x] for x in perm))

    # ------------------------------------------------------------------ path moves
    def _moves(self, routes: list[Route], d: int) -> Iterator[tuple]:
        mine = [i for i, (dn, _) in enumerate(routes) if dn == d]
        users: dict[int, list[int]] = {}
        load: dict[int, int] = {}
        for i, (_, path) in enumerate(routes):
            for x in path:
                users.setdefault(x, []).append(i)
                load[x] = load.get(x, 0) + 1
        moves = []
        for i in mine:
            path = routes[i][1]
            for pos, x in enumerate(path):
                for y in self.stages[self.stage_of[x]]:
                    if y == x:
                        continue
                    if load.get(y, 0) < self.caps[y]:
                        moves.append(("move", i, pos, y))
                    for j in users.get(y, ()):
                        if j != i and x not in routes[j][1]:
                            moves.append(("exchange", i, pos, j))
            for perm in self._reorders(path):
                moves.append(("reorder", i, perm))
            for j in mine:
                if j > i and routes[j][1] != path:
                    moves.append(("inject", i, j))
        others = [j for j, (dn, _) in enumerate(routes) if dn != d]
        for i in mine:
            for j in self.rng.sample(others, min(len(others), 12)):
                if routes[j][1] != routes[i][1]:
                    moves.append(("swap", i, j))
        self.rng.shuffle(moves)
        for mv in moves:
            touched = [mv[1]] if mv[0] in ("move", "reorder") else [mv[1], mv[3] if mv[0] == "exchange" else mv[2]]
            yield touched, self._apply(routes, mv)

    def _apply(self, routes: list[Route], mv: tuple) -> list[Route]:
        new = list(routes)
        kind = mv[0]
        if kind == "move":
            _, i, pos, y = mv
            d, path = new[i]
            new[i] = (d, tuple(y if k == pos else v for k, v in enumerate(path)))
        elif kind == "exchange":
            _, i, pos, j = mv
            di, pi = new[i]
            dj, pj = new[j]
            x = pi[pos]
            y = next(v for v in pj if self.stage_of[v] == self.stage_of[x])
            new[i] = (di, tuple(y if v == x else v for v in pi))
            new[j] = (dj, tuple(x if v == y else v for v in pj))
        elif kind == "reorder":
            _, i, perm = mv
            new[i] = (new[i][0], tuple(perm))
        elif kind == "inject":
            _, i, j = mv
            new[i], new[j] = new[j], new[i]
        elif kind == "swap":
            _, i, j = mv
            (di, pi), (dj, pj) = new[i], new[j]
            new[i], new[j] = (di, pj), (dj, pi)
        return new

    def improve_paths(
        self, routes: list[Route], score: Score | None = None, kicks: int | None = None
    ) -> tuple[list[Route], Score]:
        """First-improvement descent on the critical data node until no move helps; then, while
        the budget lasts (at most ``kicks`` times), iterated local search: two random moves
        around the critical data node, a new descent, kept if it ends better."""
        state = self._descend_paths(Incremental(self.ev, routes))
        best_routes, best = state.routes, state.score
        kicks = 10**9 if kicks is None else kicks
        while kicks > 0 and not self.limits.done():
            kicks -= 1
            kicked = best_routes
            touched: list[int] = []
            for _ in range(2):
                moves = self._moves(kicked, self._latest(kicked, best))
                step = next(moves, None)
                if step is None:
                    break
                touched += step[0]
                kicked = step[1]
            if not touched:
                break
            trial = Incremental(self.ev, kicked)
            self.limits.spent += 1
            trial = self._descend_paths(trial)
            if trial.score < best:
                best_routes, best = trial.routes, trial.score
        return best_routes, best

    @staticmethod
    def _latest(routes: list[Route], score: Score) -> int:
        return score.latest[0] if score.latest else routes[0][0]

    def _descend_paths(self, state: Incremental) -> Incremental:
        while not self.limits.done():
            improved = False
            best = state.score
            for d in best.latest[:1]:
                for touched, cand in self._moves(state.routes, d):
                    if self.limits.done():
                        break
                    self.limits.spent += 1
                    s, proposal = state.propose(cand, touched)
                    if s < best:
                        state.accept(proposal)
                        improved = True
                        break
            if not improved:
                break
        return state

    # ------------------------------------------------------------------ processing orders
    def component_score(self, routes: list[Route], comp: list[int], orders: Orders) -> Score:
        self.limits.spent += 1
        return Incremental._combine({0: self.ev.component_finish(routes, comp, orders)})

    def _signature(self, routes: list[Route], comp: list[int]) -> tuple[tuple, list[int]]:
        """A key under which two components are the same scheduling problem, and the component's
        nodes in the order that key uses."""
        nodes: list[int] = []
        for i in comp:
            for x in (routes[i][0], *routes[i][1]):
                if x not in nodes:
                    nodes.append(x)
        local = {x: k for k, x in enumerate(nodes)}
        idx = np.asarray(nodes, dtype=int)
        key = (
            tuple((local[routes[i][0]], tuple(local[x] for x in routes[i][1])) for i in comp),
            np.round(self.ev.transfer[np.ix_(idx, idx)], 9).tobytes(),
            np.round(self.ev.forward[idx], 9).tobytes(),
            tuple(self.ev.memory[x] for x in nodes),
        )
        return key, nodes

    def knows(self, routes: list[Route], comp: list[int]) -> bool:
        """Whether orders of the same scheduling problem are known already."""
        return self._signature(routes, comp)[0] in self.patterns

    def improve_orders(
        self, routes: list[Route], comp: list[int], orders: Orders, per_start: int = 800, critical: bool = True
    ) -> tuple[Orders, Score]:
        """Processing orders for the nodes of one component (``orders`` of other nodes are kept).

        A component that is the same scheduling problem as one optimised before (same routes up
        to renaming, same costs) first tries that component's orders; any other first gets half
        of the budget left for the moves on its critical path (``critical_orders``; not with
        ``critical=False``)."""
        current = self.component_score(routes, comp, orders)
        best_orders, best = orders, current
        key, nodes = self._signature(routes, comp)
        mb_index = {i: k for k, i in enumerate(comp)}
        pattern = self.patterns.get(key)
        starts = []
        if pattern is not None:
            starts.append({nodes[k]: [f"{kind}{comp[j]}" for kind, j in ops] for k, ops in pattern.items()})
        first = self.ev.realized_orders(routes, comp, orders)
        starts += [first, interleaved(first, routes, comp, self.ev.memory)]
        share = (self.limits.budget - self.limits.spent) // 2
        if critical and pattern is None and share > 0:  # first the moves on the critical path, with half of what is left
            found, s = critical_orders(self, routes, comp, {**orders, **first}, current, share)
            if s < best:
                best, best_orders = s, found
        for n_start, start in enumerate(starts):
            merged = {**orders, **start}
            budget = 0 if (pattern is not None and n_start == 0) else per_start
            found, s = self._descend_orders(routes, comp, merged, sorted(start), budget)
            if s < best:
                best, best_orders = s, found
            if pattern is not None and n_start == 0 and s < current:
                break  # the known orders help here too
        # iterated local search: kick the best orders (a few random moves), descend again
        kicks = 0
        while not self.limits.done() and kicks < self.kicks:
            kicks += 1
            kicked = {x: list(v) for x, v in best_orders.items()}
            movable = [x for x in nodes if x in kicked and len(kicked[x]) > 1]
            if not movable:
                break
            for _ in range(3):
                x = self.rng.choice(movable)
                p = self.rng.randrange(len(kicked[x]) - 1)
                kicked[x][p], kicked[x][p + 1] = kicked[x][p + 1], kicked[x][p]
            found, s = self._descend_orders(routes, comp, kicked, sorted(x for x in nodes if x in kicked), per_start // 2)
            if s < best:
                best, best_orders = s, found
        if best < current:
            local = {x: k for k, x in enumerate(nodes)}
            self.patterns[key] = {
                local[x]: [(tok[0], mb_index[int(tok[1:])]) for tok in best_orders[x]] for x in nodes if x in best_orders
            }
        return best_orders, best

    def _descend_orders(
        self, routes: list[Route], comp: list[int], orders: Orders, nodes: list[int], budget: int
    ) -> tuple[Orders, Score]:
        orders = {x: list(v) for x, v in orders.items()}
        best = self.component_score(routes, comp, orders)
        stop = self.limits.spent + budget
        while not self.limits.done() and self.limits.spent < stop:
            moves = [(x, p, q) for x in nodes for p in range(len(orders[x]))
                     for q in range(max(0, p - 3), min(len(orders[x]), p + 4)) if q != p]
            self.rng.shuffle(moves)
            best, improved = self.first_better(routes, comp, orders, (
                (x, _moved_to(orders[x], p, q)) for x, p, q in moves), best, stop)
            if not improved:
                break
        return orders, best

    def first_better(
        self, routes: list[Route], comp: list[int], orders: Orders, proposals: Iterable[tuple[int, list[str]]],
        best: Score, stop: int,
    ) -> tuple[Score, bool]:
        """Tries each (node, new order of the node) of ``proposals`` in turn until one scores below
        ``best`` (it is then kept in ``orders``) or the search has spent ``stop`` simulations; the
        best score and whether a proposal was kept."""
        for x, new in proposals:
            if self.limits.done() or self.limits.spent >= stop:
                break
            old = orders[x]
            orders[x] = new
            s = self.component_score(routes, comp, orders)
            if s < best:
                return s, True
            orders[x] = old
        return best, False


def _moved_to(ops: list[str], p: int, q: int) -> list[str]:
    """``ops`` with the operation at place ``p`` moved to place ``q``."""
    new = list(ops)
    new.insert(q, new.pop(p))
    return new


def interleaved(orders: Orders, routes: list[Route], ids: list[int], memory: list[int]) -> Orders:
    """A data node's order with every injection beyond its first ``memory`` ones moved to right
    after the backward that frees a slot for it (instead of after all waiting work)."""
    out = {x: list(v) for x, v in orders.items()}
    data = sorted({routes[i][0] for i in ids})
    for d in data:
        ops = out.get(d)
        if not ops:
            continue
        mine = {f"F{i}" for i in ids if routes[i][0] == d}
        injections = [o for o in ops if o in mine]
        k = memory[d]
        later = injections[k:]
        if not later:
            continue
        rest = [o for o in ops if o not in set(later)]
        finals = {f"B{i}" for i in ids if routes[i][0] == d}
        new, pending = [], list(later)
        for o in rest:
            new.append(o)
            if o in finals and pending:
                new.append(pending.pop(0))
        new.extend(pending)
        out[d] = new
    return out
