"""A sharper floor for one data-node set: its visits routed under the TC1 caps.

``floors.free_allocation_floor`` lets every data node run all its round trips at its fastest
and asks only that each node the caps cannot spare be visited once. With the caps summing to
just the visits (one site per node, even compute: every node outside stage 0 must take its full
share) that is far from what the routing can do. For a set D of data nodes, an integer
programme chooses how many of each data node's m microbatches take each path through L-1
distinct other nodes (any order: a relaxation of the stage rules), such that

- no node takes more visits than its TC1 cap (``Problem.load_caps``: the caps depend only on
  which nodes are outside D);
- the round trips of d fit on its k = min(M, m) slot chains: the sum of its round trips plus
  ``op_gap`` between consecutive trips of a chain (m - k of them at least) is at most k x T;
- every node that is visited fits its visits between its head and tail (as in
  ``relaxed_floors.capacity_floor``; a 0/1 variable per node says whether it is visited, so
  a node that no microbatch needs, such as one behind broken links, asks nothing of T);
- T is at least every data node's own floor (``trip_floor``);

and minimises T. A round trip costs what ``floors._round_trips`` counts (the data node's
forward, loss and backward, the visits' forward and backward, every hop both ways). Every
plan on an allocation with data nodes D routes its microbatches this way, so T bounds it.
The programme is built only while it is small (``MAX_PATHS`` paths x data nodes) and its
search stops after ``NODE_LIMIT`` branch-and-bound nodes (deterministic, unlike a time limit);
the solver's dual bound is what is used, so a stopped search still gives a floor.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from skippipe.planner.problem import Problem
from skippipe.planner.relaxed_floors import heads_and_tails, round_trip_terms

MAX_PATHS = 4_000  # variables of one programme (paths x data nodes) at most
NODE_LIMIT = 20  # branch-and-bound nodes of one programme (its dual bound stays a floor)


def path_count(problem: Problem) -> int:
    """Variables of the programme of one data-node set (paths through the others x data nodes)."""
    others = problem.n - int(problem.stage_sizes[0])
    hops = problem.workload.path_length - 1
    perms = math.perm(others, hops)
    return int(problem.stage_sizes[0]) * (perms if hops < 2 else perms // 2)


def routed_set_floor(problem: Problem, data: tuple[int, ...], trip_floors: np.ndarray) -> float:
    """A lower bound on the least T of the module text's programme for data nodes ``data`` (the
    solver's dual bound; never below their ``trip_floors``; inf when no routing exists)."""
    head, tail = heads_and_tails(problem)
    w, cm = problem.workload, problem.cost_model
    m, hops, og = w.microbatches_per_data_node, w.path_length - 1, cm.op_gap_s
    edge, visit, own, gaps = round_trip_terms(problem)
    others = [x for x in range(problem.n) if x not in data]
    caps = problem.load_caps([list(data), others])  # they depend only on which nodes are data nodes
    paths = np.array([p for p in itertools.permutations(range(len(others)), hops) if hops < 2 or p[0] < p[-1]],
                     dtype=int).reshape(-1, hops)
    nodes = np.asarray(others)[paths]  # P x hops, cluster ids
    inner = visit[nodes].sum(axis=1) + sum(edge[nodes[:, i], nodes[:, i + 1]] for i in range(hops - 1))
    P, k_data, n_others = len(paths), len(data), len(others)
    n_vars = k_data * P + n_others + 1  # y[d, p] ..., u[x] (x visited) ..., T
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0
    for i, d in enumerate(data):
        k = max(1, min(int(problem.memory[d]), m))
        trip = own[d] + np.maximum(inner + edge[d, nodes[:, 0]] + edge[nodes[:, -1], d], gaps)
        ids = i * P + np.arange(P)
        rows += [r] * P + [r + 1] * P + [r + 1]
        cols += list(ids) + list(ids) + [n_vars - 1]
        vals += [1.0] * P + list(trip) + [-float(k)]
        lo += [m, -np.inf]
        hi += [m, -max(0, m - k) * og]
        r += 2
    per = visit + 2 * og
    reach = head[others] + tail[others] - og  # a visited node's window asks T >= reach + its visits
    for j, x in enumerate(others):
        hit = np.flatnonzero((paths == j).any(axis=1))
        for i in range(k_data):
            rows += [r] * len(hit) + [r + 1] * len(hit)
            cols += list(i * P + hit) * 2
            vals += [1.0] * len(hit) + [float(per[x])] * len(hit)
        # visits <= cap x u[x]; visits x per + (head + tail - og) u[x] <= T
        rows += [r, r + 1, r + 1]
        cols += [k_data * P + j, k_data * P + j, n_vars - 1]
        vals += [-float(caps[x]), float(reach[j]), -1.0]
        lo += [-np.inf, -np.inf]
        hi += [0.0, 0.0]
        r += 2
    matrix = coo_matrix((vals, (rows, cols)), shape=(r, n_vars)).tocsr()
    cost = np.zeros(n_vars)
    cost[-1] = 1.0
    integral = np.ones(n_vars)  # the linear relaxation moves no floor of the sweep: integrality is the point
    integral[-1] = 0
    least = float(trip_floors[list(data)].max())
    # u[x] = 1 where the window asks nothing of T beyond ``least`` anyway: the linear relaxation
    # stays as tight as without u there
    lower = np.r_[np.zeros(k_data * P), (reach <= least).astype(float), least]
    upper = np.r_[np.full(k_data * P, np.inf), np.ones(n_others), np.inf]
    res = milp(cost, constraints=LinearConstraint(matrix, lo, hi), integrality=integral,
               bounds=Bounds(lower, upper),
               options={"node_limit": NODE_LIMIT, "mip_rel_gap": 1e-3})
    if res.status == 2:  # infeasible: no plan has these data nodes
        return math.inf
    bound = getattr(res, "mip_dual_bound", None)  # the incumbent may sit within the gap above it
    return max(least, float(bound)) if bound is not None and np.isfinite(bound) else least
