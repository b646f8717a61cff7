"""Node exchanges between the paths of two data nodes: swap the nodes two microbatches use at one
stage when that lowers the later of the two data nodes' estimated finish times (``slot_estimate``:
round trips on the data node's activation slots, longest first, collisions ignored)."""

from __future__ import annotations

import numpy as np

from skippipe.planner.routing.sequences import RouteCosts

Paths = dict[int, list[list[int]]]  # data node -> one path per microbatch


def slot_estimate(trips: list[float], slots: int, gap: float) -> float:
    """Finish time of a data node whose round trips run on ``slots`` parallel slots, longest
    first onto the slot that frees first (collisions ignored)."""
    loads = [0.0] * max(1, min(slots, len(trips)))
    for t in sorted(trips, reverse=True):
        k = loads.index(min(loads))
        loads[k] += t + (gap if loads[k] > 0 else 0.0)
    return max(loads) if trips else 0.0


def exchange_nodes(
    rc: RouteCosts, stages: list[list[int]], paths: Paths, slots: dict[int, int], gap: float, candidates: int = 8,
    rounds: dict[int, list[int]] | None = None,
) -> bool:
    """One pass of pairwise exchanges: two microbatches swap their nodes of one stage when that
    lowers the later of their data nodes' estimated finishes (``slot_estimate``), or keeps it
    and lowers their round trips (the loads do not change, so the caps keep holding).

    For each microbatch (most expensive first) and each node on its path, the ``candidates``
    nodes of the same stage that would suit it best are tried against their current users.
    True if any exchange was made.
    """
    stage_of = {x: s for s, nodes in enumerate(stages) for x in nodes}
    arrays = [np.asarray(s, dtype=int) for s in stages]
    flat = [(d, k) for d, plist in paths.items() for k in range(len(plist))]
    users: dict[int, set[int]] = {}
    for idx, (d, k) in enumerate(flat):
        for x in paths[d][k]:
            users.setdefault(x, set()).add(idx)
    cost = [rc.round_trip(d, paths[d][k]) for d, k in flat]
    trips = {d: [cost[i] for i, (dd, _) in enumerate(flat) if dd == d] for d in paths}
    est = {d: slot_estimate(trips[d], slots[d], gap) for d in paths}

    def estimate_with(d: int, k: int, new_cost: float, d2: int | None = None, k2: int | None = None, c2: float = 0.0) -> float:
        t = list(trips[d])
        t[k] = new_cost
        if d2 == d and k2 is not None:
            t[k2] = c2
        return slot_estimate(t, slots[d], gap)

    swapped = False
    for i in sorted(range(len(flat)), key=lambda i: -cost[i]):
        di, ki = flat[i]
        for pos in range(len(paths[di][ki])):
            path_i = paths[di][ki]
            x = path_i[pos]
            nodes = arrays[stage_of[x]]
            prev = di if pos == 0 else path_i[pos - 1]
            nxt = di if pos == len(path_i) - 1 else path_i[pos + 1]
            gain_i = rc.edge[prev, nodes] + rc.edge[nodes, nxt] + rc.node[nodes]
            gain_i = gain_i - (rc.edge[prev, x] + rc.edge[x, nxt] + rc.node[x])
            for t in np.argsort(gain_i, kind="stable")[:candidates]:
                if gain_i[t] >= -1e-9:
                    break
                y = int(nodes[t])
                done = False
                new_i: list[int] | None = None
                for j in sorted(users.get(y, ())):
                    dj, kj = flat[j]
                    path_j = paths[dj][kj]
                    if j == i or x in path_j:
                        continue
                    if rounds is not None and rounds[di][ki] != rounds[dj][kj]:
                        continue  # the round loads would change
                    if new_i is None:  # microbatch i's side of the exchange is the same for every j
                        new_i = [y if v == x else v for v in path_i]
                        ci = rc.round_trip(di, new_i)
                        ei_alone = estimate_with(di, ki, ci)
                    new_j = [x if v == y else v for v in path_j]
                    cj = rc.round_trip(dj, new_j)
                    if di == dj:
                        ei = estimate_with(di, ki, ci, dj, kj, cj)
                        before, after = (est[di], cost[i] + cost[j]), (ei, ci + cj)
                    else:
                        ei, ej = ei_alone, estimate_with(dj, kj, cj)
                        before = (max(est[di], est[dj]), cost[i] + cost[j])
                        after = (max(ei, ej), ci + cj)
                    if after[0] < before[0] - 1e-9 or (after[0] <= before[0] + 1e-9 and after[1] < before[1] - 1e-9):
                        paths[di][ki], paths[dj][kj] = new_i, new_j
                        cost[i], cost[j] = ci, cj
                        trips[di][ki], trips[dj][kj] = ci, cj
                        est[di] = slot_estimate(trips[di], slots[di], gap)
                        est[dj] = slot_estimate(trips[dj], slots[dj], gap)
                        users[x].discard(i)
                        users[y].discard(j)
                        users[y].add(i)
                        users[x].add(j)
                        swapped = done = True
                        break
                if done:
                    break
    return swapped
