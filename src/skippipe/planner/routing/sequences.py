"""Path building blocks for the SkipPipe scheduler: valid stage sequences and cheapest node chains.

A microbatch of data node ``d`` with path ``[a, b, c]`` runs forward d -> a -> b -> c -> d (loss on
d) and backward d -> c -> b -> a -> d. Without waiting, its *round trip* takes

    own(d) + cost(a) + cost(b) + cost(c) + E[d,a] + E[a,b] + E[b,c] + E[c,d]

with ``cost(x) = forward(x) * (1 + backward_factor)``, ``own(d) = cost(d) + loss(d)`` and
``E[i,j] = transfer[i,j] + transfer[j,i]`` (each link is crossed once forward, once backward).
``cheapest_chain`` finds the cheapest nodes for one stage sequence by dynamic programming over the
stage layers (one matrix minimum per layer), so it stays fast at 1,000 nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from skippipe.errors import LoadCapsTooSmall
from skippipe.planner.problem import Problem


@lru_cache(maxsize=64)
def sequence_array(sequences: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """The stage orders as a (orders x stages) array (cached)."""
    return np.asarray(sequences, dtype=int).reshape(len(sequences), -1)


@dataclass
class RouteCosts:
    """Static (collision-free) costs of routing microbatches, in seconds."""

    edge: np.ndarray  # N x N: transfer[i,j] + transfer[j,i]
    node: np.ndarray  # N: forward + backward of one visit
    own: np.ndarray  # N: forward + backward + loss of a data node for its own microbatch
    forward: np.ndarray  # N: forward seconds

    @classmethod
    def from_problem(cls, problem: Problem) -> RouteCosts:
        t = np.asarray(problem.transfer_s, dtype=float)
        f = np.asarray(problem.forward_s, dtype=float)
        cm = problem.cost_model
        node = f * (1.0 + cm.backward_factor)
        return cls(edge=t + t.T, node=node, own=node + f * cm.loss_factor, forward=f)

    def round_trip(self, data_node: int, path: list[int] | tuple[int, ...]) -> float:
        route = [data_node, *path, data_node]
        hops = sum(self.edge[route[i], route[i + 1]] for i in range(len(route) - 1))
        return float(self.own[data_node] + sum(self.node[x] for x in path) + hops)


def node_classes(transfer: np.ndarray, forward: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Class id per node; two nodes share a class when swapping them changes no cost: the same
    forward time and memory, and the same transfer times to and from every other node.

    Presets place many nodes at one location, so at 1,000 nodes a stage holds a dozen classes
    instead of 150 nodes, and the path search only has to look at one node per class.
    """
    t = np.asarray(transfer, dtype=float)
    n = t.shape[0]
    # candidate classes by a content hash of the sorted-free parts, then verified exactly
    key_rows = np.round(np.sort(t, axis=1), 9)
    key_cols = np.round(np.sort(t, axis=0).T, 9)
    buckets: dict[bytes, list[int]] = {}
    for i in range(n):
        k = (key_rows[i].tobytes() + key_cols[i].tobytes() + np.float64(forward[i]).tobytes()
             + np.int64(memory[i]).tobytes())
        buckets.setdefault(k, []).append(i)
    cls = np.full(n, -1, dtype=int)
    nxt = 0
    for members in buckets.values():
        reps: list[int] = []
        for i in members:
            for r in reps:
                mask = np.ones(n, dtype=bool)
                mask[[i, r]] = False
                if np.array_equal(t[i, mask], t[r, mask]) and np.array_equal(t[mask, i], t[mask, r]) \
                        and t[i, r] == t[r, i]:
                    cls[i] = cls[r]
                    break
            else:
                reps.append(i)
                cls[i] = nxt
                nxt += 1
    return cls


def cheapest_chain(
    rc: RouteCosts,
    data_node: int,
    layers: list[np.ndarray],
    penalty: np.ndarray | None = None,
) -> tuple[float, list[int]]:
    """Cheapest round trip from ``data_node`` through one node of each layer, in layer order.

    ``penalty`` (per node, ``inf`` = unusable) is added to a node's cost when it is visited.
    Returns ``(inf, [])`` when no chain exists.
    """
    if any(len(nodes) == 0 for nodes in layers):
        return float("inf"), []
    prev_nodes = np.array([data_node])
    prev_val = np.array([float(rc.own[data_node])])
    back: list[np.ndarray] = []
    for nodes in layers:
        prev_val, arg = _next_layer(rc, prev_nodes, prev_val, nodes, penalty)
        back.append(arg)
        prev_nodes = nodes
    return close_chain(rc, data_node, layers, prev_nodes, prev_val, back)


def _next_layer(
    rc: RouteCosts, prev_nodes: np.ndarray, prev_val: np.ndarray, nodes: np.ndarray, penalty: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """One layer of a chain search: the cheapest chain so far ending at each of ``nodes`` (its
    visit included), and which of ``prev_nodes`` it came from."""
    cost = rc.node[nodes] if penalty is None else rc.node[nodes] + penalty[nodes]
    m = prev_val[:, None] + rc.edge[prev_nodes[:, None], nodes]
    return m.min(axis=0) + cost, m.argmin(axis=0)


def cheapest_path(
    rc: RouteCosts,
    data_node: int,
    stages: list[list[int]],
    sequences: tuple[tuple[int, ...], ...],
    penalty: np.ndarray | None = None,
) -> tuple[float, list[int]]:
    """Cheapest valid path of ``data_node`` over all stage sequences (``inf, []`` if none)."""
    return cheapest_over_sequences(rc, data_node, [np.asarray(s, dtype=int) for s in stages], sequences, penalty)


# above this many nodes a path search looks only at the ``LARGE_WIDTH`` nodes (or node classes)
# per stage nearest to the data node (``nearest``): a 1,000-node cluster's stages hold 100 nodes
LARGE_NODES = 200
LARGE_WIDTH = 16


def search_width(n: int) -> int | None:
    """Nodes (or node classes) per stage a path search of an ``n``-node cluster looks at: all
    up to ``LARGE_NODES`` (None), else ``LARGE_WIDTH``."""
    return LARGE_WIDTH if n > LARGE_NODES else None


class PrefixLevel(NamedTuple):
    """The distinct stage-order prefixes of one length: each one's last stage and the index of
    its prefix one stage shorter (None for the first level)."""

    stage: np.ndarray
    parent: np.ndarray | None


@lru_cache(maxsize=64)
def prefix_tree(sequences: tuple[tuple[int, ...], ...]) -> tuple[PrefixLevel, ...]:
    """The stage orders as a tree of their distinct prefixes, one level per stage; the last
    level holds the orders themselves, in their order. Orders that share a prefix share its
    path search (and its sums), so the search keeps its result with less work."""
    seqa = sequence_array(sequences)
    k = seqa.shape[1]
    levels: list[PrefixLevel] = []
    prev_ids: np.ndarray | None = None
    for i in range(k):
        if i == k - 1:
            first = ids = np.arange(len(seqa))
        else:
            _, first, ids = np.unique(seqa[:, : i + 1], axis=0, return_index=True, return_inverse=True)
            ids = ids.reshape(-1)
        levels.append(PrefixLevel(seqa[first, i], None if prev_ids is None else prev_ids[first]))
        prev_ids = ids
    return tuple(levels)


# above this many (sequence x node x node) entries per layer, or (stage x node) squared edges
# gathered, the sequences are searched one by one
BATCH_LIMIT = 2_000_000


def cheapest_over_sequences(
    rc: RouteCosts,
    data_node: int,
    stages: list[np.ndarray],
    sequences: tuple[tuple[int, ...], ...],
    penalty: np.ndarray | None = None,
) -> tuple[float, list[int]]:
    """``cheapest_chain`` for every sequence at once (``SequenceSearch``): the same sums, so the
    same result as looping over ``sequences`` and keeping the first cheapest; ``(inf, [])`` if none."""
    return SequenceSearch(rc, stages, sequences).cheapest(data_node, penalty)


# the edges between the stages of each level are gathered once per search up to this many
# entries in all (a routing searches one allocation for every microbatch), else at each search
PREPARED_LIMIT = 1_000_000


class SequenceSearch:
    """``cheapest_over_sequences`` prepared for one set of costs, stages and sequences, one
    layer per level of ``prefix_tree``: the stages padded to the widest (``pad``, ``valid``) and
    the edges each level reduces over, so that the searches of a routing (one per microbatch,
    each with its own ``penalty``) share them. Above ``BATCH_LIMIT`` the sequences are
    searched one by one (``_one_by_one``)."""

    def __init__(self, rc: RouteCosts, stages: list[np.ndarray], sequences: tuple[tuple[int, ...], ...]) -> None:
        self.rc, self.stages, self.sequences = rc, stages, sequences
        width = max((len(s) for s in stages), default=0)
        self.batched = bool(sequences) and width > 0 and max(len(sequences), len(stages) ** 2) * width * width <= BATCH_LIMIT
        if not self.batched:
            return
        num = len(stages)
        self.pad = np.zeros((num, width), dtype=int)
        self.valid = np.zeros((num, width), dtype=bool)
        for k, nodes in enumerate(stages):
            self.pad[k, : len(nodes)] = nodes
            self.valid[k, : len(nodes)] = True
        self.levels = prefix_tree(sequences)
        flat = self.pad.reshape(-1)
        # into[a, b, k, j] = edge from node j of stage a to node k of stage b (reduced over j, the last axis)
        self.into = rc.edge[flat[None, :], flat[:, None]].reshape(num, width, num, width).transpose(2, 0, 1, 3)
        entries = sum(len(level.stage) for level in self.levels[1:]) * width * width
        self.edges = [self._edges(i) for i in range(1, len(self.levels))] if entries <= PREPARED_LIMIT else None

    def _edges(self, i: int) -> np.ndarray:
        """The edges level ``i`` reduces over: per prefix, from each node of its parent's last
        stage to each node of its own."""
        level, prev = self.levels[i], self.levels[i - 1].stage
        return self.into[prev[level.parent], level.stage]

    def cheapest(self, data_node: int, penalty: np.ndarray | None = None) -> tuple[float, list[int]]:
        """The cheapest valid path of ``data_node`` (``penalty`` added to each visit); ``(inf, [])`` if none."""
        if not self.batched:
            if not self.sequences:
                return float("inf"), []
            return _one_by_one(self.rc, data_node, self.stages, self.sequences, penalty)
        rc, levels, pad = self.rc, self.levels, self.pad
        cost = rc.node[pad] if penalty is None else rc.node[pad] + penalty[pad]
        cost = np.where(self.valid, cost, np.inf)
        prev_stage = levels[0].stage
        val = (rc.own[data_node] + rc.edge[data_node][pad[prev_stage]]) + cost[prev_stage]
        back = []
        for i, level in enumerate(levels[1:], start=1):
            edges = self.edges[i - 1] if self.edges is not None else self._edges(i)
            m = val[level.parent][:, None, :] + edges
            back.append(m.argmin(axis=2))
            val = m.min(axis=2) + cost[level.stage]  # the entries at the argmin: the same numbers
            prev_stage = level.stage
        total = val + rc.edge[pad[prev_stage], data_node]
        last = total.argmin(axis=1)
        per_seq = total[np.arange(len(total)), last]
        q = int(per_seq.argmin())
        if not np.isfinite(per_seq[q]):
            return float("inf"), []
        j, p = int(last[q]), q
        chain = [int(pad[levels[-1].stage[p], j])]
        for i in range(len(levels) - 1, 0, -1):
            j = int(back[i - 1][p, j])
            p = int(levels[i].parent[p])
            chain.append(int(pad[levels[i - 1].stage[p], j]))
        chain.reverse()
        return float(per_seq[q]), chain


def nearest(
    rc: RouteCosts, d: int, arrays: Sequence[np.ndarray], penalty: np.ndarray | None, width: int
) -> list[np.ndarray]:
    """Per stage, the ``width`` usable nodes (finite ``penalty``; None: all) cheapest to visit
    from ``d`` on their own (the hops to and from ``d``, the visit and the penalty; ties by
    node id), in id order: the candidates of a large cluster's path search."""
    out = []
    for a in arrays:
        if penalty is not None:
            a = a[np.isfinite(penalty[a])]
        if len(a) > width:
            cost = rc.edge[d, a] + rc.node[a] + (0.0 if penalty is None else penalty[a])
            a = np.sort(a[np.lexsort((a, cost))[:width]])
        out.append(a)
    return out


def stage_cap_sums(caps: list[int], stages: list[list[int]]) -> list[int]:
    """Per stage the sum of its nodes' TC1 caps, the capacities ``sequence_quotas`` splits the
    microbatches under (0 for stage 0: its nodes run their own microbatches)."""
    return [0] + [int(sum(caps[x] for x in s)) for s in stages[1:]]


def tc1_refusal(caps: list[int], stages: list[list[int]], microbatches: int, path_length: int) -> LoadCapsTooSmall:
    """The one-line refusal when the stages' TC1 caps admit no routing of ``microbatches``."""
    sums = stage_cap_sums(caps, stages)[1:]
    short = [s + 1 for s, x in enumerate(sums) if x == min(sums)]
    if any(len(s) > 1 for s in stages):
        fix = (f"give stage(s) {', '.join(map(str, short))} more nodes (workload stage_sizes, --stage-sizes) "
               "or use a shorter path_length")
    else:  # no stage has a node to spare
        fix = "every stage has one node: use a shorter path_length, fewer stages or a cluster of more nodes"
    return LoadCapsTooSmall(
        f"no routing respects the per-node load caps (TC1): the stages can take {sums} "
        f"visits, too few for {microbatches} microbatches on paths of {path_length} stages; {fix}"
    )


def _one_by_one(
    rc: RouteCosts, data_node: int, stages: list[np.ndarray], sequences: tuple[tuple[int, ...], ...],
    penalty: np.ndarray | None,
) -> tuple[float, list[int]]:
    """``cheapest_chain`` of each sequence in turn, the first cheapest kept; the layers of a
    prefix that an earlier sequence shares are reused (the same sums: S = 9, L = 7 has 133
    orders of 6 layers but 328 distinct prefixes, not 798)."""
    best: tuple[float, list[int]] = (float("inf"), [])
    start: tuple[np.ndarray, np.ndarray, list[np.ndarray]] = (
        np.array([data_node]), np.array([float(rc.own[data_node])]), [])
    known: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, list[np.ndarray]]] = {(): start}
    for seq in sequences:
        layers = [stages[s] for s in seq]
        if any(len(nodes) == 0 for nodes in layers):
            continue
        done = len(seq)
        while seq[:done] not in known:
            done -= 1
        prev_nodes, prev_val, back = known[seq[:done]]
        for i in range(done, len(seq)):
            prev_val, arg = _next_layer(rc, prev_nodes, prev_val, layers[i], penalty)
            back, prev_nodes = [*back, arg], layers[i]
            known[seq[:i + 1]] = (prev_nodes, prev_val, back)
        cost, chain = close_chain(rc, data_node, layers, prev_nodes, prev_val, back)
        if chain and cost < best[0]:
            best = (cost, chain)
    return best


def close_chain(
    rc: RouteCosts, data_node: int, layers: Sequence[np.ndarray], last_nodes: np.ndarray, last_val: np.ndarray,
    back: Sequence[np.ndarray],
) -> tuple[float, list[int]]:
    """End of a chain search: the hop back to ``data_node`` from the best last node, then the
    chain read back through ``back`` (the argmin of every layer); ``(inf, [])`` when none is finite."""
    total = last_val + rc.edge[last_nodes, data_node]
    j = int(np.argmin(total))
    best = float(total[j])
    if not np.isfinite(best):
        return float("inf"), []
    chain = []
    for nodes, arg in zip(reversed(layers), reversed(back), strict=True):
        chain.append(int(nodes[j]))
        j = int(arg[j])
    chain.reverse()
    return best, chain
