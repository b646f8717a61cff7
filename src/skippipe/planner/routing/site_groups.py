"""Clusters of ``SPLIT_NODES`` nodes or more at several sites: planned whole and in groups, the
quicker kept (method ``skippipe``); above ``decompose.DECOMPOSE_NODES`` nodes in groups only.

Where a cluster falls apart into islands, or above ``DECOMPOSE_NODES`` nodes into sites of at
least ``decompose.GROUP_NODES`` nodes each, ``decompose.decomposed_plan`` plans it. Otherwise
one search over the whole cluster was the only plan,
and on clusters of sites it stayed far above what the sites could do alone: the 100-node
cluster of 12 GCP regions planned at 66.31 s, while the same search on groups of about two
regions each, merged, gives 61.90 s. Groups are not always better (a cluster with a node per
site and one slot per node: 162.96 s whole against 263.04 s in groups), so both are planned:

1. the search over the whole cluster (``plan_skippipe`` with its fallbacks), from
   ``HALF_BUDGET_NODES`` nodes on half its default budget (measured on ten 75-116-node
   clusters: 0-2.7 % slower plans than the full budget, in 55-60 % of the time), below on all
   of it (the plan is then never slower than the whole search alone);
2. ``decompose.locality_groups`` of at least ``least_group`` nodes (a site, or near sites
   joined; 16, or 12 below 32 nodes), stage sizes by ``decompose.apportion``, each group planned with
   ``decompose.GROUP_BUDGET`` simulations; data nodes moved between groups by the groups'
   makespans (``decompose.moved_data_nodes``, the same rounds as for islands, then up to
   ``SINGLE_ROUNDS`` single moves from the slowest group; below ``HALF_BUDGET_NODES`` nodes
   each split after the first only while the groups' plans (``group_plan_s``) fit on the
   worker the whole search leaves them); with uneven compute the slowest
   group's plan then tried against the look-ahead timetable (``looked_ahead``), in the room
   that the groups' estimate leaves of the planning-time target (``grouped_wall_estimate``
   with the thorough start: each group's search counted by its operations, so many
   microbatches leave less room); merged.

The quicker plan is kept. Under a time limit the whole search gets half of it and the group
plans share 40 %. Not tried on one site (no hop dearer than ``decompose.TIGHT`` x the
cheapest): groups of one site are arbitrary; nor with a fixed allocation or fixed stage sizes.

Above ``DECOMPOSE_NODES`` nodes the search over the whole cluster has a small budget per node
and plans far above the groups (global uneven, 300 nodes: 72.42 s whole, 59.82 s in groups;
1,000 nodes: 68.55 s against 55.67 s), and both would not fit the planning-time target. So
there the groups are planned alone, each with a quicker start (``plan_skippipe(...,
thorough=False)``), behind the same safety net as the whole search (the ``skippipe-no-tc2``
plan and the fallbacks on its allocation); and only where the cluster has sites
(``has_sites``: where every node is a site of its own, groups are arbitrary) and the groups'
estimated wall clock (``grouped_wall_estimate``: every group once and the single moves, on the
planning workers) fits the planning-time target; else the whole search, as before. The rounds
of many moves are planned there only while their estimate still fits (``grouped_plan``'s
``room_s``): on the 1,000-node global uneven suite row the one they would add took 18 s of
wall clock, and without it the single moves reach the same plan (61.85 s). Each group there
is searched in full only where it could be the slowest (``lazy_groups``); the estimate still
counts every group searched, so it errs on the safe side.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from skippipe.errors import UserError
from skippipe.planfile import Plan
from skippipe.planner.problem import Problem
from skippipe.planner.routing import decompose
from skippipe.planner.routing.budget import PLANNING_SHARE, SIM_OP_S, default_budget, operations, planning_target_s
from skippipe.planner.routing.candidates import stage_orders
from skippipe.planner.routing.lazy_groups import LazyGroups, plan_span
from skippipe.planner.routing.lookahead import lookahead_routes, lookahead_work
from skippipe.planner.routing.pool import DEFAULT_WORKERS
from skippipe.planner.routing.schedule import build_plan, plan_skippipe, quickest, safety_net
from skippipe.planner.routing.workers import GroupPlanner
from skippipe.sim import simulate

# clusters from this many nodes get the candidate (two groups of SMALL_GROUP_NODES). From 48
# until 2026-11-29; at 32-47 nodes, where the planning workers run the whole search beside the
# groups, it made 21 of 91 generated clusters (sites, or a site per node) quicker by 0.3-10.5 %
# and none slower, in at most 9.0 s of wall clock (43 nodes; 8.5 s before); at 24-31 nodes 5
# of 52 quicker by 0.9-15.9 %, none slower
SPLIT_NODES = 24
# from this many nodes the whole search beside the groups has half its default budget; below,
# the default search itself, so the plan is never slower than without the groups (on half the
# budget the 45-node gcp-2025 5-clusters planned at 62.01 s against 60.61 s)
HALF_BUDGET_NODES = 48
GROUP_NODES = 16  # a group holds at least this many nodes
SMALL_GROUP_NODES = 12  # or this many in a cluster of fewer than 2 x GROUP_NODES nodes
CANDIDATE = "groups of sites"
# after the moves of ``decompose.probed_rows``, single data nodes moved from the slowest group,
# probed, at most this many times: where one group stays the slowest, a move from it alone
# still pays (midsize row 9, 600 nodes in 40 sites: 66.89 -> 64.46 s; a 450-node cluster of 35
# sites 63.25 -> 62.47 s; the same plans on ten other clusters of 80-350 nodes)
SINGLE_ROUNDS = 3
# above DECOMPOSE_NODES nodes: a node's site mates are the nodes within SITE_HOP x its cheapest
# hop, and the cluster has sites when the median node has SITE_MATES mates or more (measured on
# generated clusters of 201-800 nodes: 3-6 with one node per site, 9-11 with sites of 10 nodes)
SITE_HOP = 1.05
SITE_MATES = 7
# above DECOMPOSE_NODES nodes the groups are planned only where the estimated wall clock of their
# planning fits PLANNING_SHARE of the planning-time target (``grouped_wall_estimate``): a group
# plan with the quicker start is estimated at GROUP_PLAN_S x n^2 x S of CPU (the start dominates
# it). Measured on the 2-core machine, the mean over the groups of six clusters of 250-1,000
# nodes: 0.14-0.25 ms (0.36 ms the most of one group)
GROUP_PLAN_S = 0.25e-3
# the seconds of the look-ahead on a group (``looked_ahead``) per unit of the work it counts:
# 2.7e-6 s fitted on the 2-core machine (2026-11-30, see ``lookahead.ROUTE_WORK``), rounded up
LOOKAHEAD_S_PER_WORK = 3e-6
# below ``HALF_BUDGET_NODES`` nodes, the look-ahead's share of the planning-time target at most,
# whatever room the groups' own estimate leaves: there the whole search beside the groups has
# its full budget, and the groups, planned with the start of a small cluster, take longer than
# ``grouped_wall_estimate`` counts (fuzz case 568, 37 nodes: 5.8 s without the look-ahead, 10.0 s
# with it on a group of 16 nodes and 119 microbatches, whose plan was not kept)
LOOKAHEAD_SHARE = 0.3
# the CPU of a group's thorough start (its candidate routings) per operation of an iteration,
# beyond GROUP_PLAN_S x n^2 x S: the start routes every microbatch. Fitted on the 2-core machine
# (2026-12-02) to 44 thorough group plans of 600 simulations (16-24 nodes, S = 6-9, 6 and 17
# microbatches per data node, ``benchmarks/planning_time_heavy.py`` cases 0-29): their CPU is
# 0.37-1.19 x the estimate with 6 microbatches (median 0.80), 0.47-1.30 x with 17 (median 1.08);
# without it 0.51-1.76 x and 0.79-2.30 x
THOROUGH_START_OP_S = 2e-3


def whole_budget(problem: Problem) -> int | None:
    """The simulations of the whole search beside the groups: half the default budget from
    ``HALF_BUDGET_NODES`` nodes; below, None: the default search itself (its budget and
    allocation starts), the plan ``skippipe`` makes without the groups."""
    return max(1, default_budget(problem) // 2) if problem.n >= HALF_BUDGET_NODES else None


def least_group(n: int) -> int:
    """The fewest nodes a group of a cluster of n nodes holds: ``GROUP_NODES``, or
    ``SMALL_GROUP_NODES`` where two such groups would not fit."""
    return GROUP_NODES if n >= 2 * GROUP_NODES else SMALL_GROUP_NODES


def has_sites(transfer_s: np.ndarray) -> bool:
    """Whether the median node has ``SITE_MATES`` site mates or more (see above)."""
    hops = np.where(np.eye(transfer_s.shape[0], dtype=bool), np.inf, 0.5 * (transfer_s + transfer_s.T))
    mates = (hops <= SITE_HOP * hops.min(axis=1, keepdims=True)).sum(axis=1)
    return float(np.median(mates)) >= SITE_MATES


def group_plan_s(sub: Problem, thorough: bool = False) -> float:
    """The estimated CPU seconds of one group's plan: the quicker start (``GROUP_PLAN_S``), and
    with the ``thorough`` start of a group below ``DECOMPOSE_NODES`` nodes also that start's
    routings (``THOROUGH_START_OP_S``) and its search of ``GROUP_BUDGET`` simulations
    (``SIM_OP_S``), both per operation of an iteration, so they grow with the microbatches."""
    per_op = decompose.GROUP_BUDGET * SIM_OP_S + THOROUGH_START_OP_S if thorough else 0.0
    return GROUP_PLAN_S * sub.n**2 * sub.num_stages + per_op * operations(sub)


def batch_wall_s(subs: list[Problem], thorough: bool = False) -> float:
    """The estimated wall clock of planning the groups ``subs`` (``group_plan_s``) on
    ``DEFAULT_WORKERS`` workers: the larger of the largest group's plan and the batch's CPU
    shared by the workers. A count, so the same on every machine."""
    cpu = [group_plan_s(sub, thorough) for sub in subs]
    return max(max(cpu, default=0.0), sum(cpu) / DEFAULT_WORKERS)


def grouped_wall_estimate(problem: Problem, groups: list[list[int]], thorough: bool = False) -> float:
    """The estimated wall clock of what ``grouped_plan`` always plans: every group of distinct
    costs once, and ``SINGLE_ROUNDS`` single moves (two groups each, at most the largest's
    plan), each group with the ``thorough`` start or not (``group_plan_s``); infinite when the
    stages cannot be dealt over the groups. The rounds of many moves come on top, while they fit
    (``grouped_plan``'s ``room_s``)."""
    sizes = decompose.apportion(problem.stage_sizes, groups, 1.0 / problem.forward_s)
    if sizes is None:
        return float("inf")
    subs = list(decompose.fresh_groups([decompose.sub_problem(problem, g, row) for g, row in zip(groups, sizes)], ()).values())
    return batch_wall_s(subs, thorough) + SINGLE_ROUNDS * max(batch_wall_s([sub], thorough) for sub in subs)


def site_groups(problem: Problem) -> list[list[int]] | None:
    """The groups of the candidate, or None where it is not tried (see the module text)."""
    if problem.fixed_stages is not None or problem.workload.stage_sizes is not None:
        return None
    if problem.n < SPLIT_NODES or decompose.tight(problem.transfer_s, [list(range(problem.n))]):
        return None
    large = problem.n > decompose.DECOMPOSE_NODES
    if large and not has_sites(problem.transfer_s):
        return None
    groups = decompose.locality_groups(problem.transfer_s, max(least_group(problem.n), problem.num_stages))
    if len(groups) < 2:
        return None
    if large and grouped_wall_estimate(problem, groups) > PLANNING_SHARE * planning_target_s(problem.n):
        return None
    return groups


def grouped_plan(
    problem: Problem, groups: list[list[int]], seed: int, time_limit_s: float | None, thorough: bool = True,
    planner: GroupPlanner | None = None, room_s: float | None = None,
) -> Plan | None:
    """The merged plan of ``groups`` (step 2 of the module text), simulated; None when the
    stages cannot be dealt over the groups or a group cannot be planned. ``thorough``: the
    start of each group's search (``plan_skippipe``); ``planner`` plans the groups (by default
    in this process, one after another); ``room_s``: where given, the estimated wall clock
    (``batch_wall_s``) the rounds of many moves may take together, the rounds that would not
    fit are left out (the single moves follow). Below ``HALF_BUDGET_NODES`` nodes under the
    default budget the room is set here instead: the target's share on the one worker the whole
    search leaves, which the first split and then every split probed, single moves too, take from."""
    sizes = decompose.apportion(problem.stage_sizes, groups, 1.0 / problem.forward_s)
    if sizes is None:
        return None
    # under a time limit each group plan's share: the 40 % over every plan the rounds may make
    # (every group once per round of many moves, two groups per single move)
    most = len(groups) * (decompose.REBALANCE_ROUNDS + 1) + 2 * SINGLE_ROUNDS
    share = None if time_limit_s is None else 0.4 * time_limit_s / most
    budget = decompose.GROUP_BUDGET if time_limit_s is None else None
    planned: dict[bytes, Plan] = {}
    plans = planner or GroupPlanner(workers=1)
    # the quicker start under the default budget (above DECOMPOSE_NODES nodes): each group
    # searched only where it could be the slowest
    lazy = LazyGroups(plans, seed, budget, thorough) if time_limit_s is None and not thorough else None

    def plan_groups(subs: list[Problem]) -> list[Plan]:
        if lazy is not None:
            return lazy.plans(subs)
        return decompose.distinct_plans(
            subs, lambda batch: plans.plan(batch, seed=seed, time_limit_s=share, budget=budget, thorough=thorough),
            planned)

    # below HALF_BUDGET_NODES nodes, under the default budget, the whole search runs beside the
    # groups on one of the two default workers: every split after the first is probed only while
    # the CPU of the groups' plans so far and its own (``group_plan_s``) fits the target's share
    # on the other worker. Without it heavy workloads overran the target: 38 nodes, S = 6, L = 4,
    # 17 microbatches per data node (``benchmarks/planning_time_heavy.py`` case 25) planned in
    # 12.8 s, the whole search 8.0 s and two splits of two groups 9.8 s beside it
    beside = room_s is None and time_limit_s is None and problem.n < HALF_BUDGET_NODES

    def fresh(rows: list[list[int]], seen) -> list[Problem]:  # the groups of a split not planned yet
        return list(decompose.fresh_groups([decompose.sub_problem(problem, g, r) for g, r in zip(groups, rows)], seen).values())

    def cost_s(subs: list[Problem]) -> float:
        return sum(group_plan_s(sub, thorough) for sub in subs) if beside else batch_wall_s(subs, thorough)

    left_s = PLANNING_SHARE * planning_target_s(problem.n) - cost_s(fresh(sizes, ())) if beside else room_s

    def affordable(rows: list[list[int]]) -> bool:
        nonlocal left_s
        left_s -= cost_s(fresh(rows, planned if lazy is None else lazy.quick))
        return left_s >= 0.0

    try:
        spans = lazy.spans if lazy is not None else lambda subs: [plan_span(plan) for plan in plan_groups(subs)]
        rows = decompose.probed_rows(problem, groups, sizes, spans, SINGLE_ROUNDS,
                                     None if left_s is None else affordable, single_free=not beside)
        subs = [decompose.sub_problem(problem, nodes, row) for nodes, row in zip(groups, rows)]
        parts = list(zip(groups, plan_groups(subs)))
    except UserError:  # a group the caps or the path rules cannot serve: the whole plan stands
        return None
    if time_limit_s is None and room_s is None and not problem.even_compute:  # up to DECOMPOSE_NODES nodes
        target = planning_target_s(problem.n)
        room = PLANNING_SHARE * target - grouped_wall_estimate(problem, groups, thorough)
        parts = looked_ahead(subs, parts, seed, room if problem.n >= HALF_BUDGET_NODES else min(room, LOOKAHEAD_SHARE * target))
    meta = {"candidate": CANDIDATE, "groups": [len(g) for g in groups], "group_data_nodes": [row[0] for row in rows]}
    if lazy is not None:
        meta["groups_searched"] = sum(not plan.meta.get("quick", False) for _, plan in parts)
    plan = decompose.merge(problem, parts, seed, meta)
    result = simulate(plan, record=False, bound=False)
    if not result.finished:
        return None
    plan.predicted_makespan_s = float(result.makespan_s)
    return plan


def plan_whole_or_grouped(
    problem: Problem, seed: int, time_limit_s: float | None,
    fallbacks: Callable[[list[list[int]]], list[tuple[str, Plan]]],
) -> Plan:
    """Method ``skippipe`` where ``decompose.plan_in_groups`` does not split the cluster: the
    whole cluster's plan, or the grouped one where the candidate is tried and quicker (see the
    module text)."""
    groups = site_groups(problem)
    if groups is None:
        return plan_skippipe(problem, seed=seed, time_limit_s=time_limit_s, fallbacks=fallbacks)
    with GroupPlanner() as planner:
        if problem.n > decompose.DECOMPOSE_NODES:
            net = planner.submit(safety_net, problem, seed, fallbacks)  # beside the groups
            room = None if time_limit_s is not None else (
                PLANNING_SHARE * planning_target_s(problem.n) - grouped_wall_estimate(problem, groups))
            split = grouped_plan(problem, groups, seed, time_limit_s, thorough=False, planner=planner, room_s=room)
            if split is None:
                return plan_skippipe(problem, seed=seed, time_limit_s=time_limit_s, fallbacks=fallbacks)
            return quickest(split, net.result())
        half = None if time_limit_s is None else 0.5 * time_limit_s
        budget = None if time_limit_s is not None else whole_budget(problem)
        whole_search = planner.submit(plan_skippipe, problem, seed=seed, time_limit_s=half, budget=budget,
                                      fallbacks=fallbacks)
        split = grouped_plan(problem, groups, seed, time_limit_s, planner=planner)
        whole = whole_search.result()
    if split is None:
        return whole
    plan = quickest(whole, [(CANDIDATE, split)])
    other = whole if plan is split else split  # what the other candidate reached, for the record
    plan.meta["whole_makespan_s" if plan is split else "grouped_makespan_s"] = round(float(other.predicted_makespan_s), 6)
    return plan


def looked_ahead(
    subs: list[Problem], parts: list[tuple[list[int], Plan]], seed: int, room_s: float
) -> list[tuple[list[int], Plan]]:
    """``parts`` with the slowest group's plan replaced by the look-ahead timetable on its
    allocation (``routing.lookahead``) where that is quicker, then the next slowest, while the
    slowest has not been tried and its estimated seconds (``LOOKAHEAD_S_PER_WORK`` x
    ``lookahead_work``) fit in ``room_s``. Each look-ahead also stops where the work it counts
    would pass the room left, keeping the quickest routing it completed, and what it counted is
    taken from the room: counts, so the same on every machine."""
    parts, tried = list(parts), set()
    while True:
        i = max(range(len(parts)), key=lambda k: plan_span(parts[k][1]))
        if i in tried:
            return parts
        sub, (nodes, plan) = subs[i], parts[i]
        seqs = stage_orders(sub, plan.stages)
        if LOOKAHEAD_S_PER_WORK * lookahead_work(sub, plan.stages, seqs) > room_s:
            return parts
        tried.add(i)
        work = [0]
        got = lookahead_routes(sub, plan.stages, sub.load_caps(plan.stages), seqs, work,
                               limit=int(room_s / LOOKAHEAD_S_PER_WORK))
        room_s -= LOOKAHEAD_S_PER_WORK * work[0]
        if got is None:
            continue
        ahead = build_plan(sub, plan.stages, got.routes, "skippipe", seed, got.orders, {**plan.meta, "lookahead": True})
        if ahead.predicted_makespan_s < plan.predicted_makespan_s:
            parts[i] = (nodes, ahead)
