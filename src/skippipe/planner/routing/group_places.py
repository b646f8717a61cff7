"""Where the joint allocation's nodes go besides its groups (``joint_groups.group_allocation``):
the stages' places the chains leave to spare nodes, the data nodes left without a chain where
the nodes are too few, and whether enough nodes can take a chain's TC1 cap at all."""

from __future__ import annotations

import math

import numpy as np

from skippipe.planner.problem import Problem
from skippipe.planner.routing.groups import GroupCosts
from skippipe.workload import tc1_caps


def leftover_data_nodes(gc: GroupCosts, eligible: np.ndarray, k: int, L: int) -> list[int] | None:
    """Where the nodes are too few for D groups, the k data nodes without a chain, chosen
    before the groups (which would leave them the nodes no data node wants): the eligible
    ones with the most slots (more of their microbatches in flight while they share visited
    nodes), then the nearest to their 2 (L-1) nearest nodes (their shared paths); None where
    too few are eligible."""
    pool = np.flatnonzero(eligible)
    if len(pool) < k:
        return None
    edge = gc.rc.edge.copy()
    np.fill_diagonal(edge, math.inf)
    near = np.sort(edge[pool], axis=1)[:, :2 * (L - 1)].sum(axis=1)
    order = sorted(range(len(pool)), key=lambda i: (-int(gc.memory[pool[i]]), float(near[i]), int(pool[i])))
    return [int(pool[i]) for i in order[:k]]


def enough_chain_nodes(problem: Problem, D: int, G: int | None = None) -> bool:
    """Whether G x (L-1) nodes (G = D by default) can have a TC1 cap of m, as chain nodes
    must (each takes all m microbatches of its data node). A node's cap is at most its share of the visits by speed
    among the nodes outside stage 0 with stage 0 as fast as it can be (loosened by a
    billionth, past rounding); a node whose cap stays under m is a data node or a spare, so
    stage 0 holds at least that many of them less the spares, which slows it and lowers
    every cap: repeated until nothing changes (a cap grows with speed, so those nodes are the
    slowest). There must be places for them in stage 0 and among the spares. Where compute is
    uneven enough the groups would only be searched to be refused (1.2 s of the suite's
    40-node 6-sites cluster)."""
    w = problem.workload
    m = w.microbatches_per_data_node
    chain_nodes = (D if G is None else G) * (w.path_length - 1)
    spare = problem.n - D - chain_nodes
    speed = 1.0 / np.asarray(problem.forward_s, dtype=float)
    low = np.zeros(problem.n, dtype=bool)
    while True:
        forced = min(D, max(0, int(low.sum()) - spare))  # low nodes stage 0 must hold
        fastest = np.sort(speed[low])[::-1][:forced].sum() + np.sort(speed[~low])[::-1][:D - forced].sum()
        caps = tc1_caps(speed, D * m * (w.path_length - 1), float(speed.sum() - fastest) * (1.0 - 1e-9))
        now = caps < m
        if int(now.sum()) > D + spare:  # else the nodes that can take a cap of m fill the chains
            return False
        if (now == low).all():
            return True
        low = now


def spare_places(sizes: list[int], spare: int) -> tuple[list[int], list[int]] | None:
    """Where the cluster has ``spare`` nodes more than D groups of L take (D = sizes[0]): the
    stage sizes the chains fill and the stages the spare nodes go to (each to the stage with
    the most places left, the later on a tie; the search may route through them later); None
    where the groups need more nodes than there are."""
    if spare < 0:
        return None
    need = list(sizes)
    stages = []
    for _ in range(spare):
        s = max(range(1, len(need)), key=lambda k: (need[k], k))
        need[s] -= 1
        stages.append(s)
    return need, stages
