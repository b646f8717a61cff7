"""Scoring candidate routings with the simulator (``skippipe.sim.simulate``), piece by piece.

Microbatches that share no node never wait for each other, so a routing splits into
*components* (microbatches linked through the nodes they use, data node included) that the
simulator can run separately: each component runs on its routes' operation segments
(``sim.route_finish_times``; a route's segment is built once per evaluator), and the iteration's
makespan is the largest component makespan. This is the same simulator on the same operations,
so the numbers are exactly those of a whole-plan simulation (tests check both steps); it only
avoids re-simulating the parts a search move did not touch, and it keeps each simulation small
at 1,000 nodes. Results are cached by content.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from skippipe.planfile import Constraints, Costs, Microbatch, Plan
from skippipe.planner.problem import Problem
from skippipe.sim import route_finish_times, simulate
from skippipe.sim_ops import RouteOps

Route = tuple[int, tuple[int, ...]]  # (data node, path)
Orders = dict[int, list[str]]  # node -> its processing order (operation tokens such as 'F3', 'B3')


@dataclass(frozen=True)
class Score:
    """Lexicographic: makespan, then the data nodes' finish times from the latest down
    (so that a move that helps the second-latest data node still counts), then their sum."""

    makespan: float
    finishes: tuple[float, ...]
    latest: tuple[int, ...] = ()  # data nodes, latest finish first (not compared)

    def key(self) -> tuple:
        return (round(self.makespan, 9), tuple(round(-x, 9) for x in self.finishes))

    def __lt__(self, other: Score) -> bool:
        return self.key() < other.key()

    def __le__(self, other: Score) -> bool:
        return self.key() <= other.key()


INFEASIBLE = Score(math.inf, ())


class Evaluator:
    """Simulates routings component by component, with a cache.

    A routing is a list of routes (one per microbatch, index = microbatch id; within a data node
    the lower id is injected first) plus an optional processing order per node.
    """

    def __init__(self, problem: Problem, stages: list[list[int]]) -> None:
        self.problem = problem
        self.stages = stages
        self.transfer = np.asarray(problem.transfer_s, dtype=float)
        self.forward = np.asarray(problem.forward_s, dtype=float)
        self.memory = [int(x) for x in problem.memory]
        cm = problem.cost_model
        self.factors = (cm.backward_factor, cm.loss_factor, cm.inject_gap_s, cm.op_gap_s)
        self.path_length = problem.workload.path_length
        self.route_ops = RouteOps(self._costs(self.transfer, self.forward))
        self.cache: dict[tuple, dict[int, float]] = {}
        self.simulations = 0

    # ------------------------------------------------------------------ components
    @staticmethod
    def components(routes: list[Route]) -> list[list[int]]:
        """Microbatch ids grouped by shared nodes (union-find over nodes)."""
        parent: dict[int, int] = {}

        def find(x: int) -> int:
            while parent.setdefault(x, x) != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for d, path in routes:
            rd = find(d)
            for x in path:
                rx = find(x)
                if rx != rd:
                    parent[rx] = rd
        groups: dict[int, list[int]] = {}
        for i, (d, _) in enumerate(routes):
            groups.setdefault(find(d), []).append(i)
        return sorted(groups.values(), key=lambda g: g[0])

    # ------------------------------------------------------------------ simulation
    def _costs(self, transfer: np.ndarray, forward: np.ndarray) -> Costs:
        """The plan-file costs of these transfer and forward times under the problem's factors."""
        bf, lf, g_inj, g_op = self.factors
        return Costs(transfer_s=transfer, forward_s=forward, backward_factor=bf, loss_factor=lf,
                     inject_gap_s=g_inj, op_gap_s=g_op)

    def subplan(
        self, routes: list[Route], ids: list[int], orders: dict[int, list[str]] | None = None
    ) -> tuple[Plan, list[int]]:
        """The microbatches ``ids`` as a bare plan over just their nodes (re-indexed 0..k-1),
        and the global id of each local node. Not a plan file: only what ``simulate`` reads."""
        nodes = sorted({x for i in ids for x in (routes[i][0], *routes[i][1])})
        local = {x: k for k, x in enumerate(nodes)}
        idx = np.asarray(nodes, dtype=int)
        costs = self._costs(self.transfer[np.ix_(idx, idx)], self.forward[idx])
        mbs = [Microbatch(id=i, data_node=local[routes[i][0]], path=[local[x] for x in routes[i][1]]) for i in ids]
        order = None
        if orders:
            order = {local[x]: list(orders[x]) for x in nodes if x in orders}
        plan = Plan(
            stages=[sorted({local[routes[i][0]] for i in ids})], layers=[[0]],
            memory=[self.memory[x] for x in nodes], constraints=Constraints(path_length=self.path_length),
            costs=costs, microbatches=mbs, processing_order=order or None,
        )
        return plan, nodes

    def component_finish(
        self, routes: list[Route], ids: list[int], orders: dict[int, list[str]] | None = None
    ) -> dict[int, float]:
        """Finish time of every data node of one component (inf if it cannot finish)."""
        key = self._key(routes, ids, orders)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        order = None
        if orders:
            order = {x: orders[x] for i in ids for x in (routes[i][0], *routes[i][1]) if x in orders}
        self.simulations += 1
        finish = route_finish_times(self.route_ops, [(i, *routes[i]) for i in ids], self.memory, order)
        out: dict[int, float] = {}
        for i, f in zip(ids, finish):
            d = routes[i][0]
            out[d] = max(out.get(d, 0.0), f if f >= 0 else math.inf)
        if len(self.cache) > 200_000:
            self.cache.clear()
        self.cache[key] = out
        return out

    @staticmethod
    def _key(routes: list[Route], ids: list[int], orders: dict[int, list[str]] | None) -> tuple:
        part = None
        if orders:
            nodes = {x for i in ids for x in (routes[i][0], *routes[i][1])}
            part = tuple(sorted((x, tuple(orders[x])) for x in nodes if x in orders)) or None
        return (tuple((i, routes[i]) for i in ids), part)

    def score(self, routes: list[Route], orders: dict[int, list[str]] | None = None) -> Score:
        finish: dict[int, float] = {}
        for ids in self.components(routes):
            finish.update(self.component_finish(routes, ids, orders))
        ranked = sorted(finish, key=lambda d: (-finish[d], d))
        values = tuple(finish[d] for d in ranked)
        return Score(values[0] if values else 0.0, values, tuple(ranked))

    def realized_orders(
        self, routes: list[Route], ids: list[int], orders: dict[int, list[str]] | None = None
    ) -> dict[int, list[str]]:
        """The order in which each node of one component served its operations (global ids)."""
        plan, nodes = self.subplan(routes, ids, orders)
        res = simulate(plan, record=False, bound=False)
        return {nodes[x]: ops for x, ops in res.processing_order().items()}


class Incremental:
    """The score of one routing kept up to date under small changes.

    ``propose(new_routes, touched)`` scores a routing that differs from the current one only in
    the microbatches ``touched``: only the components those microbatches leave or join are
    re-simulated (through the evaluator's cache); ``accept`` makes the proposal current. The
    score equals ``Evaluator.score`` on the same routing.
    """

    def __init__(self, ev: Evaluator, routes: list[Route], orders: dict[int, list[str]] | None = None) -> None:
        self.ev = ev
        self.orders = orders
        self._set(routes, ev.components(routes))

    def _set(self, routes: list[Route], comps: list[list[int]]) -> None:
        self.routes = routes
        self.comp_of: dict[int, int] = {}
        self.members: dict[int, list[int]] = {}
        self.node_comp: dict[int, int] = {}
        self.finish: dict[int, dict[int, float]] = {}
        self._next = 0
        for ids in comps:
            self._add(ids, self.ev.component_finish(routes, ids, self.orders))
        self.score = self._combine(self.finish)

    def _add(self, ids: list[int], fin: dict[int, float]) -> None:
        c = self._next
        self._next += 1
        self.members[c] = ids
        self.finish[c] = fin
        for i in ids:
            self.comp_of[i] = c
            d, path = self.routes[i]
            self.node_comp[d] = c
            for x in path:
                self.node_comp[x] = c

    @staticmethod
    def _combine(finish: dict[int, dict[int, float]]) -> Score:
        per_node: dict[int, float] = {}
        for fin in finish.values():
            per_node.update(fin)
        ranked = sorted(per_node, key=lambda d: (-per_node[d], d))
        values = tuple(per_node[d] for d in ranked)
        return Score(values[0] if values else 0.0, values, tuple(ranked))

    def propose(self, routes: list[Route], touched: list[int]) -> tuple[Score, tuple]:
        old = {self.comp_of[i] for i in touched}
        for i in touched:
            d, path = routes[i]
            for x in (d, *path):
                c = self.node_comp.get(x)
                if c is not None:
                    old.add(c)
        ids = sorted(i for c in old for i in self.members[c])
        sub = [routes[i] for i in ids]
        new_comps = [[ids[k] for k in comp] for comp in Evaluator.components(sub)]
        finish = {c: f for c, f in self.finish.items() if c not in old}
        fresh = []
        for k, comp in enumerate(new_comps):
            fin = self.ev.component_finish(routes, comp, self.orders)
            finish[-1 - k] = fin
            fresh.append((comp, fin))
        return self._combine(finish), (routes, old, fresh)

    def accept(self, proposal: tuple) -> None:
        routes, old, fresh = proposal
        for c in old:
            for i in self.members.pop(c):
                self.comp_of.pop(i, None)
            self.finish.pop(c)
        # nodes of the old components are re-pointed by the fresh ones below
        stale = [x for x, c in self.node_comp.items() if c in old]
        for x in stale:
            del self.node_comp[x]
        self.routes = routes
        for comp, fin in fresh:
            self._add(comp, fin)
        self.score = self._combine(self.finish)
