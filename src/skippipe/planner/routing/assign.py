"""Static path assignment (no time collisions): every microbatch gets a cheap valid path while the
per-node TC1 caps hold.

Microbatches are routed one at a time, round robin over the data nodes (the data node whose best
round trip is slowest goes first in every round, so the critical ones are served before the
cheap nodes run out), each on the cheapest path through nodes with capacity left. A stage-level
check keeps the greedy from painting itself into a corner: a path is only taken when the
microbatches still to route can each find L-1 distinct stages with capacity afterwards. A few
re-routing passes then move microbatches to cheaper paths that freed up.

Load rule (static, collision-blind): a data node with M activation slots has its microbatches
in flight M at a time, in *rounds* (``round_of``). While a path exists within the limit, a node
takes at most as many microbatches of one round as it has slots, so the microbatches in flight
together never need more activation slots on a node than it has (the main source of waiting
when several data nodes share cheap nodes); a path beyond that limit is taken only when it costs
less than half as much (``ROUND_TOLERANCE``). Times are never simulated.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from skippipe.errors import UserError
from skippipe.planner.problem import Problem
from skippipe.planner.routing.exchange import Paths, exchange_nodes
from skippipe.planner.routing.sequences import (
    RouteCosts,
    cheapest_over_sequences,
    close_chain,
    nearest,
    node_classes,
    search_width,
    sequence_array,
    stage_cap_sums,
    tc1_refusal,
)
from skippipe.planner.stage_orders import ROUTING_ORDERS, sequence_quotas, stage_sequences


class Capacity:
    """Residual per-node capacity (TC1) with stage totals and the greedy's feasibility check.

    Nodes that are interchangeable (``node_classes``) are searched through one representative
    per class and stage: the member with the least capacity left, so a class fills node by node.
    With ``width`` (large clusters) a data node's paths use only the ``width`` representatives
    per stage nearest to it (``nearest``), all stage orders in one batched search.
    """

    def __init__(self, stages: list[list[int]], caps: list[int], classes: np.ndarray, width: int | None = None) -> None:
        n = len(classes)
        self.width = width
        self.stages = [list(map(int, s)) for s in stages]
        self.classes = classes
        self.stage_of = np.full(n, -1, dtype=int)
        for s, nodes in enumerate(self.stages):
            self.stage_of[nodes] = s
        self.left = np.zeros(n, dtype=int)
        for s in self.stages[1:]:
            for x in s:
                self.left[x] = int(caps[x])
        self.stage_left = np.array([int(self.left[s].sum()) for s in self.stages], dtype=int)
        self.members: list[dict[int, list[int]]] = []
        for nodes in self.stages:
            by_class: dict[int, list[int]] = {}
            for x in sorted(nodes):
                by_class.setdefault(int(classes[x]), []).append(x)
            self.members.append(by_class)
        self._reps: list[np.ndarray | None] = [None] * len(self.stages)
        self.version = [0] * len(self.stages)  # names the stage's representatives (``reps``)
        self._ids: dict[tuple[int, bytes], int] = {}
        self._chains: dict[tuple, tuple[float, list[int]]] = {}
        # the dynamic programme's layers per stage prefix, for one data-node class at a time
        self._prefix: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._prefix_owner = -1
        # stages of singleton classes, searched as whole stages (``_cheapest``)
        self.single = [all(len(v) == 1 for v in by_class.values()) for by_class in self.members]
        self.full = [np.asarray(sorted(nodes), dtype=int) for nodes in self.stages]
        self._blocks: dict[tuple[int, int], np.ndarray] = {}
        self._blocks_of: np.ndarray | None = None
        self._costs: dict[tuple, np.ndarray] = {}
        self._floors: dict[int, float] = {}
        # optional per-round memory limit (``use_round``): in round r a node takes at most
        # ``round_cap[x]`` microbatches (its activation slots), counted in ``round_used[r]``
        self.round_cap: np.ndarray | None = None
        self.round_used: dict[int, np.ndarray] = {}
        self.round: int | None = None

    def use_round(self, r: int | None) -> None:
        """Restrict the representatives to nodes with a free slot in round ``r`` (None: no limit)."""
        if r == self.round:
            return
        self.round = r
        if r is not None:
            self.round_used.setdefault(r, np.zeros(len(self.left), dtype=int))
        self._reps = [None] * len(self.stages)  # their versions follow in ``reps``

    def _live(self, x: int) -> bool:
        if self.left[x] <= 0:
            return False
        if self.round is None or self.round_cap is None:
            return True
        return bool(self.round_used[self.round][x] < self.round_cap[x])

    def reps(self, s: int) -> np.ndarray:
        """One node with capacity left per class of stage s."""
        r = self._reps[s]
        if r is None and self.single[s]:  # every node its own class: the live nodes, in id order
            nodes = self.full[s]
            live = self.left[nodes] > 0
            if self.round is not None and self.round_cap is not None:
                live &= self.round_used[self.round][nodes] < self.round_cap[nodes]
            r = nodes[live]
        elif r is None:
            out = []
            for nodes in self.members[s].values():
                live = [x for x in nodes if self._live(x)]
                if live:
                    out.append(min(live, key=lambda x: (self.left[x], x)))
            r = np.asarray(sorted(out), dtype=int)
        if self._reps[s] is None:  # the version names the content, so a stage that comes back to
            # representatives it had (a round switched back and forth, a visit given and taken) hits the caches
            self._reps[s] = r
            self.version[s] = self._ids.setdefault((s, r.tobytes()), len(self._ids))
        return r

    def chain(self, rc: RouteCosts, data_node: int, seq: tuple[int, ...]) -> tuple[float, list[int]]:
        """``cheapest_chain`` over the representatives, cached per data-node class and sequence
        until one of the sequence's stages changes its representatives."""
        for s in seq:
            self.reps(s)
        key = (int(self.classes[data_node]), seq, tuple(self.version[s] for s in seq))
        hit = self._chains.get(key)
        if hit is None:
            hit = self._cheapest(rc, data_node, seq)
            if len(self._chains) > 500_000:
                self._chains.clear()
            self._chains[key] = hit
        cost, chain = hit
        return cost, list(chain)

    def _cheapest(self, rc: RouteCosts, data_node: int, seq: tuple[int, ...]) -> tuple[float, list[int]]:
        """``cheapest_chain`` over the representatives (the same operations and result), the DP layers
        shared by sequences that start alike (153 sequences of 4 stages: 18 first pairs, 64 triples)."""
        layers = [self.reps(s) for s in seq]
        if any(len(nodes) == 0 for nodes in layers):
            return float("inf"), []
        dc = int(self.classes[data_node])
        if self._prefix_owner != dc:
            self._prefix.clear()
            self._prefix_owner = dc
        # stages whose nodes are all alone in their class: the representatives are the live
        # nodes in id order, so the full stage with the others at an infinite cost gives the
        # same minima and the same first argmins, over edge blocks gathered once
        whole = all(self.single[s] for s in seq)
        if whole:
            layers = [self.full[s] for s in seq]
        prev_nodes = np.array([data_node])
        prev_val = np.array([float(rc.own[data_node])])
        back: list[np.ndarray] = []
        for i, nodes in enumerate(layers):
            pkey = (whole, seq[: i + 1], tuple(self.version[s] for s in seq[: i + 1]))
            step = self._prefix.get(pkey)
            if step is None:
                block = self._block(rc, seq[i - 1], seq[i]) if whole and i > 0 else rc.edge[prev_nodes[:, None], nodes]
                m = prev_val[:, None] + block
                step = (m.min(axis=0) + (self._live_cost(rc, seq[i]) if whole else rc.node[nodes]), m.argmin(axis=0))
                self._prefix[pkey] = step
            prev_val = step[0]
            back.append(step[1])
            prev_nodes = nodes
        return close_chain(rc, data_node, layers, prev_nodes, prev_val, back)

    def floor(self, rc: RouteCosts, data_node: int, seqs: tuple[tuple[int, ...], ...]) -> float:
        """A little below the cheapest path of ``data_node`` with no caps (so at most any path
        ``chain`` finds for it), once per data-node class, over one member of each class."""
        dc = int(self.classes[data_node])
        if dc not in self._floors:
            firsts = [np.asarray(sorted(nodes[0] for nodes in by_class.values()), dtype=int) for by_class in self.members]
            firsts = firsts if self.width is None else nearest(rc, data_node, firsts, None, self.width)
            self._floors[dc] = cheapest_over_sequences(rc, data_node, firsts, seqs)[0] * (1.0 - 1e-9)
        return self._floors[dc]

    def _block(self, rc: RouteCosts, a: int, b: int) -> np.ndarray:
        """``rc.edge`` between the whole stages a and b (gathered once per pair)."""
        if self._blocks_of is not rc.edge:
            self._blocks.clear()
            self._blocks_of = rc.edge
        block = self._blocks.get((a, b))
        if block is None:
            block = rc.edge[np.ix_(self.full[a], self.full[b])]
            self._blocks[(a, b)] = block
        return block

    def _live_cost(self, rc: RouteCosts, s: int) -> np.ndarray:
        """A visit's cost per node of the whole stage s; inf where the node is not live."""
        key = (s, self.version[s], id(rc.node))
        hit = self._costs.get(key)
        if hit is None:
            live = np.zeros(len(self.full[s]), dtype=bool)
            live[np.searchsorted(self.full[s], self.reps(s))] = True
            hit = np.where(live, rc.node[self.full[s]], np.inf)
            if len(self._costs) > 4096:
                self._costs.clear()
            self._costs[key] = hit
        return hit

    def _touch(self, x: int, delta: int) -> None:
        self.left[x] += delta
        s = self.stage_of[x]
        self.stage_left[s] += delta
        self._reps[s] = None  # recomputed, with its version, when next asked for

    def take(self, path: list[int], r: int | None = None) -> None:
        """Use one visit of each node of ``path`` (and, with ``r``, one of its slots in round r)."""
        for x in path:
            if r is not None:
                self.round_used.setdefault(r, np.zeros(len(self.left), dtype=int))[x] += 1
            self._touch(x, -1)

    def give(self, path: list[int], r: int | None = None) -> None:
        for x in path:
            if r is not None:
                self.round_used[r][x] -= 1
            self._touch(x, +1)


def route_one(
    rc: RouteCosts,
    cap: Capacity,
    data_node: int,
    sequences: tuple[tuple[int, ...], ...],
    remaining: int,
) -> tuple[float, list[int]]:
    """Cheapest path for one microbatch under the residual capacity; ``(inf, [])`` if none."""
    best: tuple[float, list[int]] = (float("inf"), [])
    if not sequences:
        return best
    # after one more microbatch on a sequence, can ``remaining`` others still find len(seq)
    # distinct stages with capacity (sum over stages of min(left, remaining))? The visit lowers
    # that sum by the number of its stages with at most ``remaining`` visits left
    seqa = sequence_array(sequences)
    left = cap.stage_left[seqa]
    ok = left.min(axis=1) > 0
    if remaining > 0:
        room = int(np.minimum(cap.stage_left[1:], remaining).sum()) - (left <= remaining).sum(axis=1)
        ok &= room >= remaining * seqa.shape[1]
    if cap.width is not None or len(sequences) > ROUTING_ORDERS:  # every order at once: the nearest
        # representatives of a large cluster, or thousands of orders (the same sums as one by one)
        usable = tuple(seq for seq, u in zip(sequences, ok.tolist()) if u)
        layers = [cap.reps(s) for s in range(len(cap.stages))]
        if cap.width is not None:
            layers = nearest(rc, data_node, layers, None, cap.width)
        best = cheapest_over_sequences(rc, data_node, layers, usable)
    else:
        for seq, u in zip(sequences, ok.tolist()):
            if u and (found := cap.chain(rc, data_node, seq))[0] < best[0]:
                best = found
    if not best[1] and remaining > 0:  # the stage check is a heuristic; fall back without it
        return route_one(rc, cap, data_node, sequences, 0)
    return best


def critical_order(rc: RouteCosts, cap: Capacity, sequences: tuple[tuple[int, ...], ...]) -> list[int]:
    """Data nodes, slowest best round trip first (ties by node id)."""
    best = {d: route_one(rc, cap, d, sequences, 0)[0] for d in cap.stages[0]}
    return sorted(cap.stages[0], key=lambda d: (-best[d], d))


def assign_static(
    problem: Problem, stages: list[list[int]], caps: list[int], passes: int = 4, max_swaps: int | None = None,
    use_rounds: bool = True, finishes: Callable[[Paths], bool] | None = None,
) -> Paths:
    """Cheap valid paths for all microbatches under the caps, ignoring time collisions. With
    ``finishes``, greedy paths it rejects (a memory deadlock) are returned without the passes.

    The greedy may paint itself into a corner on tight caps; it then starts over with the
    number of microbatches per stage sequence fixed by ``sequence_quotas``. Raises a
    ``UserError`` when no routing can respect the caps.
    """
    w = problem.workload
    rc = RouteCosts.from_problem(problem)
    swaps = w.max_swaps if max_swaps is None else min(max_swaps, w.max_swaps)
    seqs = stage_sequences(len(stages), w.path_length, swaps, w.max_jump)
    if not seqs:
        raise UserError(f"no stage order of length L={w.path_length} satisfies the path rules (CC2/CC3)")
    classes = node_classes(problem.transfer_s, problem.forward_s, problem.memory)
    paths = _greedy(problem, rc, stages, caps, classes, seqs, None, use_rounds)
    if paths is None:
        total = len(stages[0]) * w.microbatches_per_data_node
        quotas = sequence_quotas(seqs, stage_cap_sums(caps, stages), total)
        if quotas is None:
            raise tc1_refusal(caps, stages, total, w.path_length)
        paths = _greedy(problem, rc, stages, caps, classes, seqs, quotas, use_rounds)
        assert paths is not None, "routing with feasible sequence quotas cannot fail"
    if finishes is not None and not finishes(paths):
        return paths
    cap = Capacity(stages, caps, classes, search_width(problem.n))
    cap.round_cap = np.asarray(problem.memory, dtype=int)
    rounds = {d: [round_of(problem, d, k) for k in range(len(plist))] for d, plist in paths.items()} if use_rounds else None
    for d, plist in paths.items():
        for k, path in enumerate(plist):
            cap.take(path, None if rounds is None else rounds[d][k])
    slots = {d: int(problem.memory[d]) for d in paths}
    gap = problem.cost_model.op_gap_s
    for _ in range(passes):
        moved = improve_static(rc, cap, paths, seqs, rounds)
        swapped = exchange_nodes(rc, cap.stages, paths, slots, gap, rounds=rounds)
        if not (moved or swapped):
            break
    return paths


def _greedy(
    problem: Problem, rc: RouteCosts, stages: list[list[int]], caps: list[int], classes: np.ndarray,
    seqs: tuple[tuple[int, ...], ...], quotas: list[int] | None, rounds: bool = True,
) -> Paths | None:
    """Round robin over the data nodes (slowest first), cheapest path each; None if stuck.

    With ``rounds`` a node takes at most as many microbatches of one round (``round_of``) as it
    has activation slots, while a path within that limit exists: microbatches in flight
    together then do not wait for each other's slots (a static, collision-blind load rule).
    """
    m = problem.workload.microbatches_per_data_node
    cap = Capacity(stages, caps, classes, search_width(problem.n))
    cap.round_cap = np.asarray(problem.memory, dtype=int)
    order = critical_order(rc, cap, seqs)
    paths: Paths = {d: [] for d in order}
    left = dict(quotas) if quotas is not None else None
    total = m * len(order)
    done = 0
    for k in range(m):
        for d in order:
            done += 1
            allowed = seqs if left is None else tuple(q for q in seqs if left.get(q, 0) > 0)
            r = round_of(problem, d, k) if rounds else None
            cap.use_round(r)
            cost, path = route_one(rc, cap, d, allowed, total - done if left is None else 0)
            # a path beyond the round's slots, when it is much cheaper (or the only one); never
            # when even the cheapest path with no caps at all is not (the same choice, skipped)
            if r is not None and not (path and cost <= ROUND_TOLERANCE * cap.floor(rc, d, seqs)):
                cap.use_round(None)
                free_cost, free_path = route_one(rc, cap, d, allowed, total - done if left is None else 0)
                if free_path and (not path or cost > ROUND_TOLERANCE * free_cost):
                    cost, path = free_cost, free_path
            if not path:
                return None
            if left is not None:
                left[tuple(cap.stage_of[x] for x in path)] -= 1
            cap.take(path, r)
            paths[d].append(path)
    cap.use_round(None)
    return paths


# a path beyond the round's slots is taken instead when it costs less than 1 / ROUND_TOLERANCE of
# the best path within them (waiting for a slot costs about one round trip more, not several)
ROUND_TOLERANCE = 2.0


def round_of(problem: Problem, data_node: int, k: int) -> int:
    """The round of a data node's k-th microbatch: with M activation slots, microbatches
    0..M-1 are in flight together, then M..2M-1, and so on."""
    return k // max(1, int(problem.memory[data_node]))


def improve_static(
    rc: RouteCosts, cap: Capacity, paths: Paths, seqs: tuple[tuple[int, ...], ...], rounds: dict[int, list[int]] | None = None
) -> bool:
    """One pass: move each microbatch to a cheaper path if capacity freed up (within its
    round's slots when ``rounds`` gives each microbatch's round). True if any moved."""
    moved = False
    # round by round, so that the per-round representatives are rebuilt once per round
    todo = [(None if rounds is None else rounds[d][i], k, d, i)
            for k, (d, plist) in enumerate(paths.items()) for i in range(len(plist))]
    todo.sort(key=lambda t: (-1 if t[0] is None else t[0], t[1], t[3]))
    for r, _, d, i in todo:
        plist = paths[d]
        old = plist[i]
        old_cost = rc.round_trip(d, old)
        cap.give(old, r)
        cap.use_round(r)
        cost, path = route_one(rc, cap, d, seqs, 0)
        # beyond the round's slots only when much cheaper than both (never when not even the
        # cheapest path with no caps is: the same choice, skipped)
        if r is not None and ROUND_TOLERANCE * cap.floor(rc, d, seqs) < min(old_cost, cost if path else float("inf")):
            cap.use_round(None)
            free_cost, free_path = route_one(rc, cap, d, seqs, 0)
            cap.use_round(r)
            if free_path and ROUND_TOLERANCE * free_cost < min(old_cost, cost if path else float("inf")):
                cost, path = free_cost, free_path
        if path and cost < old_cost - 1e-9:
            plist[i] = path
            moved = True
        else:
            path = old
        cap.take(path, r)
    cap.use_round(None)
    return moved
