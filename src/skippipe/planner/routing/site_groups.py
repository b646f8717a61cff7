"""Clusters of ``SPLIT_NODES`` to ``decompose.DECOMPOSE_NODES`` nodes at several sites: planned
whole and in groups, the quicker kept (method ``skippipe``).

Above ``DECOMPOSE_NODES`` nodes a cluster of sites is planned in groups only
(``decompose.decomposed_plan``). Below, one search over the whole cluster was the only plan,
and on clusters of sites it stayed far above what the sites could do alone: the 100-node
cluster of 12 GCP regions planned at 66.31 s, while the same search on groups of about two
regions each, merged, gives 61.90 s. Groups are not always better (a cluster with a node per
site and one slot per node: 162.96 s whole against 263.04 s in groups), so both are planned:

1. the search over the whole cluster (``plan_skippipe`` with its fallbacks) on half its default
   budget (measured on ten 75-116-node clusters: 0-2.7 % slower plans than the full budget, in
   55-60 % of the time);
2. ``decompose.locality_groups`` of at least ``GROUP_NODES`` nodes (a site, or near sites
   joined), stage sizes by ``decompose.apportion``, each group planned with
   ``decompose.GROUP_BUDGET`` simulations; data nodes moved between groups by the groups'
   makespans (``decompose.moved_data_nodes``, the same rounds as for islands); merged.

The quicker plan is kept. Under a time limit the whole search gets half of it and the group
plans share 40 %. Not tried on one site (no hop dearer than ``decompose.TIGHT`` x the
cheapest): groups of one site are arbitrary; nor with a fixed allocation or fixed stage sizes.
"""

from __future__ import annotations

from collections.abc import Callable

from skippipe.errors import UserError
from skippipe.planfile import Plan
from skippipe.planner.problem import Problem
from skippipe.planner.routing import decompose
from skippipe.planner.routing.budget import default_budget
from skippipe.planner.routing.schedule import plan_skippipe, quickest
from skippipe.sim import simulate

SPLIT_NODES = 48  # clusters from this many nodes get the candidate
GROUP_NODES = 16  # a group holds at least this many nodes
CANDIDATE = "groups of sites"


def site_groups(problem: Problem) -> list[list[int]] | None:
    """The groups of the candidate, or None where it is not tried (see the module text)."""
    if problem.fixed_stages is not None or problem.workload.stage_sizes is not None:
        return None
    if not SPLIT_NODES <= problem.n <= decompose.DECOMPOSE_NODES:
        return None
    if decompose.tight(problem.transfer_s, [list(range(problem.n))]):
        return None
    groups = decompose.locality_groups(problem.transfer_s, max(GROUP_NODES, problem.num_stages))
    return groups if len(groups) >= 2 else None


def grouped_plan(problem: Problem, groups: list[list[int]], seed: int, time_limit_s: float | None) -> Plan | None:
    """The merged plan of ``groups`` (step 2 of the module text), simulated; None when the
    stages cannot be dealt over the groups or a group cannot be planned."""
    sizes = decompose.apportion(problem.stage_sizes, groups, 1.0 / problem.forward_s)
    if sizes is None:
        return None
    share = None if time_limit_s is None else 0.4 * time_limit_s / (len(groups) * (decompose.REBALANCE_ROUNDS + 1))
    budget = decompose.GROUP_BUDGET if time_limit_s is None else None
    planned: dict[bytes, Plan] = {}

    def plan_group(sub: Problem) -> Plan:
        key = decompose.cost_key(sub)
        if key not in planned:
            planned[key] = plan_skippipe(sub, seed=seed, time_limit_s=share, budget=budget)
        return planned[key]

    try:
        rows = decompose.probed_rows(problem, groups, sizes, plan_group)
        parts = [(nodes, plan_group(decompose.sub_problem(problem, nodes, row))) for nodes, row in zip(groups, rows)]
    except UserError:  # a group the caps or the path rules cannot serve: the whole plan stands
        return None
    meta = {"candidate": CANDIDATE, "groups": [len(g) for g in groups], "group_data_nodes": [row[0] for row in rows]}
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
    """Method ``skippipe`` below ``DECOMPOSE_NODES`` nodes: the whole cluster's plan, or the
    grouped one where the candidate is tried and quicker (see the module text)."""
    groups = site_groups(problem)
    if groups is None:
        return plan_skippipe(problem, seed=seed, time_limit_s=time_limit_s, fallbacks=fallbacks)
    half = None if time_limit_s is None else 0.5 * time_limit_s
    budget = None if time_limit_s is not None else max(1, default_budget(problem) // 2)
    whole = plan_skippipe(problem, seed=seed, time_limit_s=half, budget=budget, fallbacks=fallbacks)
    split = grouped_plan(problem, groups, seed, time_limit_s)
    if split is None:
        return whole
    plan = quickest(whole, [(CANDIDATE, split)])
    other = whole if plan is split else split  # what the other candidate reached, for the record
    plan.meta["whole_makespan_s" if plan is split else "grouped_makespan_s"] = round(float(other.predicted_makespan_s), 6)
    return plan
