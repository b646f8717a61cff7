"""Large clusters planned in parts: nodes grouped by the network, each group planned as a
cluster of its own, the group plans merged into one plan (method ``skippipe``, in place of the
search over the whole cluster, when the cluster falls apart into islands or, above
``DECOMPOSE_NODES`` nodes, splits into sites).

Why: on a large cluster most of the floor is reachable inside one site or a few near sites (a
round trip that stays there pays no long hop), while one search over all nodes at once has only
a small budget per node. Each group is small enough (``GROUP_NODES`` to about twice that) for
the full search of ``plan_skippipe`` on it; microbatches of a group's data nodes visit only that
group's nodes, so the groups do not meet on any node and the merged plan's makespan is the
slowest group's.

0. ``islands``: a cluster that only trickling links join (the sorted link costs jump by
   ``slow_links.SLOW_GAP`` x or more, e.g. sites whose link to each other is broken) is split into the
   parts the other links join, at any size; each part is planned with the default search.
1. Else, above ``DECOMPOSE_NODES`` nodes, ``locality_groups``: start from single nodes; the
   smallest group joins the group it is nearest to (mean hop seconds both ways) until every
   group holds at least ``min_size`` nodes.
   The candidate is made only when every group is one site (``TIGHT``): groups that span
   sites were measured to plan worse than the search over the whole cluster (global uneven,
   1,000 nodes, 60 sites of about 17 nodes: 71.14 s against 68.55 s), at more planning time.
2. ``apportion``: the whole cluster's stage sizes are split over the groups: data nodes in
   proportion to the groups' compute speed (largest remainder), the other stages dealt so that
   every group gets its size and every stage its total. The merged plan keeps the workload's
   data-node count, so it trains on as many microbatches per iteration as any other plan.
3. Each group is planned with ``plan_skippipe`` (its own allocation inside the group's stage
   sizes, ``GROUP_BUDGET`` simulations and the quicker start, ``thorough=False``; islands of a
   cluster up to ``DECOMPOSE_NODES`` nodes the default search); groups with the same costs are
   planned once, in worker processes (``workers``), beside the safety net (``schedule.safety_net``).
4. ``merge``: node ids and microbatch ids mapped back, processing orders renamed; a node's TC1
   cap is its group's (visits in proportion to speed inside the group).
5. Islands of clusters up to ``REBALANCE_NODES`` nodes: compute speed alone does not say how
   fast an island serves its microbatches (sweep case 76: an island with 7 one-slot and 7
   two-slot nodes of 22, every path through every stage, was planned at 1.5-1.9 x the others).
   So the islands are first probed (planned with ``PROBE_BUDGET`` simulations; the safety net
   queued behind), data nodes moved by those makespans (``moved_data_nodes``) and the moved
   split probed again, up to ``REBALANCE_ROUNDS`` times while its slowest island gets
   quicker; the split that probed best is then planned in full, each island going on from
   the start its probe built (``kept_start``). An island that cannot be
   planned (too few or too slow nodes in a stage for its visits under the TC1 caps, say) gives
   the split up at once (``GroupPlanner.plan``'s ``fail_fast``): the cluster is planned whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from skippipe.cluster import Cluster
from skippipe.errors import UserError
from skippipe.planfile import Microbatch, Plan
from skippipe.planner.problem import Problem
from skippipe.planner.routing.group_sizes import chain_sized_groups, cheapest_hop, one_site
from skippipe.planner.routing.kept_start import KeptStart
from skippipe.planner.routing.pool import Pending
from skippipe.planner.routing.schedule import quickest, safety_net
from skippipe.planner.routing.slow_links import slow_link_mask
from skippipe.planner.routing.workers import GroupPlanner
from skippipe.sim import simulate

DECOMPOSE_NODES = 200  # clusters above this many nodes get the candidate
GROUP_NODES = 50  # a group holds at least this many nodes (and at least 5 per stage)
GROUP_BUDGET = 600  # simulations of the search inside each group
TIGHT = 1.25  # a group is one site: no hop inside it dearer than this x the cluster's cheapest hop
REBALANCE_NODES = 200  # islands of clusters up to this many nodes get their data nodes moved
REBALANCE_ROUNDS = 3  # moved splits probed at most
PROBE_BUDGET = 50  # simulations of the search when an island is probed (about 0.5 s at 20 nodes)


def min_group_size(problem: Problem) -> int:
    return max(GROUP_NODES, 5 * problem.num_stages)


def locality_groups(transfer_s: np.ndarray, min_size: int) -> list[list[int]]:
    """Nodes grouped by the network (see the module text); every group has ``min_size`` nodes
    or more (one group when the cluster is smaller). Deterministic: ties go to lower ids."""
    n = transfer_s.shape[0]
    if n <= min_size:
        return [list(range(n))]
    sym = 0.5 * (transfer_s + transfer_s.T)
    sums = sym.astype(np.float64).copy()  # pair sums between groups (row g: group g's sums)
    sizes = np.ones(n)
    members: list[list[int]] = [[i] for i in range(n)]
    alive = np.ones(n, dtype=bool)
    while True:
        live_sizes = np.where(alive, sizes, np.inf)
        g = int(np.argmin(live_sizes))
        if sizes[g] >= min_size:
            break
        mean = sums[g] / (sizes[g] * sizes)
        mean[~alive] = np.inf
        mean[g] = np.inf
        h = int(np.argmin(mean))
        sums[g] += sums[h]
        sums[:, g] += sums[:, h]
        sizes[g] += sizes[h]
        alive[h] = False
        members[g] = sorted(members[g] + members[h])
    return [members[g] for g in np.flatnonzero(alive)]


def islands(transfer_s: np.ndarray) -> list[list[int]]:
    """The parts of the cluster joined only by links far dearer than the rest: where the sorted
    link costs (dearer way of each pair) jump by ``SLOW_GAP`` x or more, the links above the
    jump (``slow_links.slow_link_mask``) are cut and the connected components of the others
    returned (one part when there is no such jump or nothing is cut off)."""
    n = transfer_s.shape[0]
    slow = slow_link_mask(transfer_s)
    if slow is None:
        return [list(range(n))]
    count, label = connected_components(csr_matrix(~slow & ~np.eye(n, dtype=bool)), directed=False)
    return [np.flatnonzero(label == c).tolist() for c in range(count)]


def tight(transfer_s: np.ndarray, groups: list[list[int]]) -> bool:
    """Whether every group is one site (``TIGHT``, ``group_sizes.one_site``)."""
    cheapest = cheapest_hop(transfer_s)
    return all(one_site(transfer_s, g, TIGHT, cheapest) for g in groups)


def _largest_remainder(total: int, weights: np.ndarray, least: int, most: list[int]) -> list[int] | None:
    """``total`` split in proportion to ``weights``, part i between ``least`` and ``most[i]``
    (a part over its most is held there and the rest shared again); None if impossible."""
    k = len(weights)
    if not least * k <= total <= sum(most):
        return None
    fixed: dict[int, int] = {}
    while True:
        free = [i for i in range(k) if i not in fixed]
        spare = total - sum(fixed.values()) - least * len(free)
        w = weights[free]
        share = spare * w / w.sum()
        over = [i for i, x in zip(free, share) if least + x > most[i]]
        if not over:
            break
        for i in over:
            fixed[i] = most[i]
    parts = np.floor(share).astype(int)
    for j in np.argsort(-(share - parts), kind="stable")[: spare - int(parts.sum())]:
        parts[j] += 1
    out = dict(fixed)
    out.update({i: int(x) + least for i, x in zip(free, parts)})
    return [out[i] for i in range(k)]


def apportion(stage_sizes: list[int], groups: list[list[int]], speed: np.ndarray) -> list[list[int]] | None:
    """Per group, its stage sizes (see the module text): rows add up to the group sizes,
    columns to ``stage_sizes``; None when some group cannot hold one node of every stage."""
    sizes = [len(g) for g in groups]
    S = len(stage_sizes)
    if any(n < S for n in sizes):
        return None
    data = _largest_remainder(stage_sizes[0], np.array([speed[g].sum() for g in groups]), 1, [n - (S - 1) for n in sizes])
    if data is None:
        return None
    rest = [n - d for n, d in zip(sizes, data)]
    # stages 1..S-1 dealt evenly: label k of stage s sits at (k + 0.5) / size_s
    labels = sorted(((k + 0.5) / stage_sizes[s], s) for s in range(1, S) for k in range(stage_sizes[s]))
    out, start = [], 0
    for d, r in zip(data, rest):
        row = [d] + [0] * (S - 1)
        for _, s in labels[start:start + r]:
            row[s] += 1
        start += r
        out.append(row)
    for row in out:  # a group the dealing left without some stage trades a node with one that has two
        for s in range(1, S):
            if row[s] == 0 and not _trade(out, row, s):
                return None
    return out


def _trade(rows: list[list[int]], row: list[int], s: int) -> bool:
    """One node of stage ``s`` from another group for one of a stage ``row`` has twice; sums kept."""
    for t in range(1, len(row)):
        if row[t] < 2:
            continue
        for other in rows:
            if other[s] >= 2:
                other[s] -= 1
                other[t] += 1
                row[s] += 1
                row[t] -= 1
                return True
    return False


def moved_data_nodes(rows: list[list[int]], spans: list[float], single: bool = False) -> list[list[int]]:
    """Stage sizes per island with data nodes moved from slow islands to quick ones, ``spans``
    being the islands' planned makespans. An island's makespan is taken to scale with its data
    nodes (its microbatches); a data node goes from the island that would be slowest to the one
    that would stay quickest after taking it, while that lowers the slowest of the two; the
    taker gives up a node of its largest stage, the latest of them (its visits hold their slots
    the shortest: a path holds a slot from its visit to the end), the giver gains one there and
    keeps a data node. Row sums and stage totals are kept; ``rows`` when the slowest island
    would not get quicker. ``single``: one data node at most, from the island planned slowest,
    even where another is as slow (whether that pays is left to the probe)."""
    out = [list(r) for r in rows]

    def after(i: int, data: int) -> float:  # exact at the island's own count (ties stay ties)
        return spans[i] if data == rows[i][0] else spans[i] * data / rows[i][0]

    for _ in range(1 if single else sum(r[0] for r in rows)):
        slow = max(range(len(out)), key=lambda i: (after(i, out[i][0]), -i))
        if out[slow][0] < 2:
            break
        takers = [i for i in range(len(out)) if i != slow and max(out[i][1:]) >= 2]
        if not takers:
            break
        take = min(takers, key=lambda i: (after(i, out[i][0] + 1), i))
        if max(after(slow, out[slow][0] - 1), after(take, out[take][0] + 1)) >= after(slow, out[slow][0]):
            break
        s = max(range(1, len(out[take])), key=lambda k: (out[take][k], k))  # the latest largest stage
        out[slow][0] -= 1
        out[slow][s] += 1
        out[take][0] += 1
        out[take][s] -= 1
    if not single and max(after(i, r[0]) for i, r in enumerate(out)) >= max(spans):
        return [list(r) for r in rows]  # islands tied at the slowest: nothing won
    return out


def sub_problem(problem: Problem, nodes: list[int], sizes: list[int]) -> Problem:
    """``problem`` restricted to ``nodes`` (ids 0..len-1 in their order) with stage sizes ``sizes``."""
    transfer, memory = problem.transfer_s[np.ix_(nodes, nodes)], problem.memory[nodes]
    c = problem.cluster
    cluster = Cluster(
        name=f"{c.name}[{len(nodes)} nodes from {nodes[0]}]", n=len(nodes),
        locations=None if c.locations is None else [c.locations[i] for i in nodes],
        transfer_s=transfer, compute_speed=np.asarray(c.compute_speed)[nodes], memory=memory, t_layer_s=c.t_layer_s,
    )
    workload = dataclasses.replace(problem.workload, stage_sizes=tuple(sizes))
    return dataclasses.replace(problem, cluster=cluster, workload=workload, transfer_s=transfer,
                               forward_s=problem.forward_s[nodes], memory=memory, stage_sizes=list(sizes))


def _rename(op: str, offset: int) -> str:
    return f"{op[0]}{int(op[1:]) + offset}"


def merge(problem: Problem, parts: list[tuple[list[int], Plan]], seed: int, meta: dict) -> Plan:
    """One plan of ``problem`` from group plans (``(global ids of the group's nodes, plan)``)."""
    stages: list[list[int]] = [[] for _ in range(problem.num_stages)]
    mbs: list[Microbatch] = []
    orders: dict[int, list[str]] = {}
    caps = [0] * problem.n
    for nodes, plan in parts:
        offset = len(mbs)
        for s, members in enumerate(plan.stages):
            stages[s].extend(nodes[i] for i in members)
        for mb in plan.microbatches:
            mbs.append(Microbatch(id=mb.id + offset, data_node=nodes[mb.data_node], path=[nodes[i] for i in mb.path],
                                  release_s=mb.release_s, after=None if mb.after is None else mb.after + offset))
        for local, ops in (plan.processing_order or {}).items():
            orders[nodes[int(local)]] = [_rename(op, offset) for op in ops]
        for local, cap in enumerate(plan.constraints.max_load or []):
            caps[nodes[local]] = int(cap)
    mbs.sort(key=lambda mb: mb.id)
    return problem.make_plan([sorted(s) for s in stages], mbs, method="skippipe", seed=seed, max_load=caps,
                             processing_order={k: orders[k] for k in sorted(orders)} or None, meta=meta)


def cost_key(p: Problem) -> bytes:
    return b"".join(np.ascontiguousarray(a).tobytes() for a in (p.transfer_s, p.forward_s, p.memory,
                                                                 np.asarray(p.stage_sizes)))


def fresh_groups(subs: list[Problem], planned: Collection[bytes]) -> dict[bytes, Problem]:
    """The groups of ``subs`` of distinct costs (``cost_key``) not in ``planned``, by their
    cost: those a batch of ``distinct_plans`` plans."""
    return {key: sub for sub in subs if (key := cost_key(sub)) not in planned}


def distinct_plans(
    subs: list[Problem], plan_batch: Callable[[list[Problem]], list[Plan]], planned: dict[bytes, Plan]
) -> list[Plan]:
    """The plans of ``subs``, each cost (``cost_key``) planned once: those not yet in ``planned``
    (``fresh_groups``) by one call of ``plan_batch``, kept in ``planned``."""
    fresh = fresh_groups(subs, planned)
    planned.update(zip(fresh, plan_batch(list(fresh.values()))))
    return [planned[cost_key(sub)] for sub in subs]


def probed_rows(
    problem: Problem, groups: list[list[int]], sizes: list[list[int]],
    split_spans: Callable[[list[Problem]], list[float]], single_rounds: int = 0,
    affordable: Callable[[list[list[int]]], bool] | None = None, single_free: bool = True,
) -> list[list[int]]:
    """The stage sizes per island whose probed plans have the quickest slowest island: the
    apportioned ones, then data nodes moved by the probed makespans (see the module text), then
    up to ``single_rounds`` single data nodes moved from the slowest island (``moved_data_nodes``
    with ``single``). ``split_spans``: a split's islands' makespans, planned (``distinct_plans``)
    or estimated with the slowest exact (``lazy_groups``); ``affordable(rows)``, where given,
    says whether a split of many moves may be probed (else the single moves follow), and with
    ``single_free`` False also a split of a single move."""

    def spans(rows: list[list[int]]) -> list[float]:
        subs = [sub_problem(problem, nodes, row) for nodes, row in zip(groups, rows)]
        return split_spans(subs)

    rows, now = sizes, spans(sizes)
    for single, rounds in ((False, REBALANCE_ROUNDS), (True, single_rounds)):
        for _ in range(rounds):
            moved = moved_data_nodes(rows, now, single)
            if moved == rows or not ((single and single_free) or affordable is None or affordable(moved)):
                break
            try:
                then = spans(moved)
            except UserError:  # a moved split the caps cannot carry
                break
            if max(then) >= max(now) - 1e-9:
                break
            rows, now = moved, then
    return rows


def decomposed_plan(
    problem: Problem, seed: int, plan_groups: Callable[[list[Problem], int], list[Plan]],
    probe_groups: Callable[[list[Problem]], list[Plan]] | None = None, on_split: Callable[[], None] | None = None,
) -> Plan | None:
    """The merged plan of the groups (see the module text), or None when the cluster is not
    split: a fixed allocation or stage sizes, groups that are not one site each, or too small
    for the stages. ``plan_groups(sub_problems, number_of_groups)`` plans a batch of groups
    (those of distinct costs); ``probe_groups(sub_problems)``, quick plans of a batch, are used
    to move data nodes between islands (none moved without it); ``on_split()`` is called once
    the cluster is split and probed, before its groups are planned in full."""
    if problem.fixed_stages is not None or problem.workload.stage_sizes is not None:
        return None
    groups, candidate = islands(problem.transfer_s), "islands"
    if len(groups) < 2:
        if problem.n <= DECOMPOSE_NODES:
            return None
        groups, candidate = locality_groups(problem.transfer_s, min_group_size(problem)), "groups of sites"
        groups = chain_sized_groups(problem.transfer_s, problem.forward_s, groups, problem.workload.path_length,
                                    min_group_size(problem), TIGHT)
        if len(groups) < 2 or not tight(problem.transfer_s, groups):
            return None
    sizes = apportion(problem.stage_sizes, groups, 1.0 / problem.forward_s)
    if sizes is None:
        return None
    meta: dict = {"candidate": candidate, "groups": [len(g) for g in groups]}
    if candidate == "islands" and problem.n <= REBALANCE_NODES and probe_groups is not None:
        probed: dict[bytes, Plan] = {}
        rows = probed_rows(problem, groups, sizes, lambda subs: [
            float(plan.predicted_makespan_s or 0.0) for plan in distinct_plans(subs, probe_groups, probed)])
        if rows != sizes:
            sizes = rows
            meta["data_nodes_moved"] = [row[0] for row in rows]
    if on_split is not None:
        on_split()
    subs = [sub_problem(problem, nodes, row) for nodes, row in zip(groups, sizes)]
    planned: dict[bytes, Plan] = {}
    plans = distinct_plans(subs, lambda batch: plan_groups(batch, len(groups)), planned)
    meta["group_plans"] = len(planned)
    return merge(problem, list(zip(groups, plans)), seed, meta)


def plan_in_groups(
    problem: Problem, seed: int, time_limit_s: float | None,
    fallbacks: Callable[[list[list[int]]], list[tuple[str, Plan]]],
) -> Plan | None:
    """Method ``skippipe`` on a cluster that splits into sites (``decomposed_plan``): the merged
    plan, unless the ``skippipe-no-tc2`` plan or a fallback on its allocation is quicker (the
    same safety net as ``plan_skippipe``); None when the cluster does not split."""
    kept: dict[bytes, KeptStart] = {}  # the probes' starts, by the island's costs

    def plan_groups(subs: list[Problem], groups: int) -> list[Plan]:
        share = None if time_limit_s is None else 0.8 * time_limit_s / groups
        large = problem.n > DECOMPOSE_NODES  # small islands: the default search
        return planner.plan(subs, seed=seed, time_limit_s=share, budget=GROUP_BUDGET if large else None,
                            thorough=not large, starts=[kept.get(cost_key(sub)) for sub in subs])

    net: list[Pending[list[tuple[str, Plan]]]] = []

    def submit_net() -> None:  # once, behind the first batch: a worker is idle while the last groups plan
        if not net:
            net.append(planner.submit(safety_net, problem, seed, fallbacks))

    def probe_groups(subs: list[Problem]) -> list[Plan]:  # the first batch is given up at its first error
        share = None if time_limit_s is None else 0.02 * time_limit_s
        probed = planner.probe(subs, fail_fast=not net, submitted=submit_net, seed=seed, time_limit_s=share,
                               budget=PROBE_BUDGET)
        kept.update((cost_key(sub), start) for sub, (_, start) in zip(subs, probed) if start is not None)
        return [plan for plan, _ in probed]

    with GroupPlanner() as planner:
        try:
            split = decomposed_plan(problem, seed, plan_groups, probe_groups, submit_net)
        except UserError:  # an island cannot carry the visits of its share (or its path rules): plan the cluster whole
            return None
        if split is None:
            return None
        others = net[0].result()
    split.predicted_makespan_s = float(simulate(split, record=False, bound=False).makespan_s)
    return quickest(split, others)

