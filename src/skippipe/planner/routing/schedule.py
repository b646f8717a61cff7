"""The SkipPipe path scheduler: methods ``skippipe-no-tc2`` and ``skippipe``.

``plan_no_tc2`` chooses paths for the network and the load only: every microbatch gets a cheap
valid path (CC1-CC3) under the TC1 caps and a static per-round slot limit, ignoring when
microbatches meet on a node (``routing.static`` and ``routing.assign``; nothing is simulated).
A data node injects its microbatches round by round, slowest path first within a round. When
the cluster fixes no allocation, both methods start from ``allocate`` (the GCMA-style search in
``planner.allocation``).

``plan_skippipe`` is collision-aware (TC2). It starts from the ``skippipe-no-tc2`` plan and
adds candidates built for the timeline:

1. private chains (``routing.groups``): every data node gets L-1 nodes of its own, so
   microbatches of different data nodes never queue on the same node (when the caps allow
   it); data nodes left without a chain share the capacity that is left;
2. balanced routing (``routing.balanced``; above 200 nodes over the 16 nodes per stage nearest
   each data node, two variants): each microbatch pays for the work already queued on the
   nodes it visits, so slow nodes carry fewer visits and fast ones more (the TC1 caps stay
   caps); it takes a share of the search only when it is the best start;
3. joint allocation (``routing.joint_groups``, only when the cluster fixes no allocation):
   groups of one data node and L-1 near nodes (the best of several starts of the group
   search), with stage labels handed out so that each group's chain is a valid path;
4. memory order (only when the cluster fixes no allocation and memory is uneven): the
   balanced routing on the allocation with its non-data nodes dealt to the stages by memory
   (``allocation.memory_order``: nodes with few slots late in the paths, where a visit holds
   its slot shortly), and on the hold-balanced dealing (``stage_caps.hold_balanced_stages``:
   least largest slot hold per slot; searched only as the best start; also where memory is
   equal but speed is not and the holds may bind, ``candidates._holds_differ``);
5. data-node exchanges (only when the cluster fixes no allocation, compute is uneven and N <= 100):
   the best balanced-routed allocation with its latest data nodes exchanged for other nodes
   while the simulated balanced routing improves (``routing.data_nodes``; above 32 nodes a
   shortlist of partners, its routings charged to the search budget);
6. slow links (only when the best start so far crosses a link that only trickles,
   ``routing.slow_link_search``): an allocation searched so that the TC1 caps can be kept over
   fast links alone, with the cheapest integer routing on it;
7. packed fast links (only where some links only trickle, the cluster fixes no allocation and
   for the user's seed's start, ``routing.fast_packing``; after 6, which it leaves as it was):
   from the allocation, an allocation searched by how well every microbatch's path packs over
   fast links (greedy, within the TC1 caps, a count of routings as its budget), with those
   paths;
8. timetable (up to 100 nodes, ``routing.timetable``, ``routing.timetabled``): on the allocations of the best
   candidates, every operation reserved on its node's timeline as the paths are chosen, so the
   paths come with processing orders that the simulator follows (unpaced and paced; up to 32
   nodes on two allocations and three more runs with a perturbed path choice, above that on
   one allocation where compute is uneven; the packed allocation of 7 too; its work beyond a
   free allowance charged to the budget). Its paths are not searched apart from its orders;
   when it leads after the first search phase its orders get a share of the rest of the
   budget (``TIMED_ORDERS``) before the second phase of the others;
9. chains kept with their orders (``routing.ordered``): the private-chain and group
   candidates, where no two data nodes share a node, with their processing orders searched
   before the path search can trade the chains for paths that look better first come, first
   served and end worse once ordered; their paths are not searched.
Under the default budget (no budget or time limit given, the allocation not fixed) candidates
1-9 (but 7) are also built on the allocations of the next seeds, as many as the planning-time estimate
leaves room for (``budget.allocation_starts``: up to four on small clusters with light
workloads, one from 30 nodes), and the search goes on from the seed whose quickest candidate is
quickest (the user's seed on a tie). The safety net and the fallbacks keep the user's seed.
Every candidate is scored by the simulator (``route_eval``, component by component) and
improved by local search on the critical data node (``route_search``: exchanges of nodes
between microbatches, stage reorders, path swaps, injection order; then iterated local search
on the best candidate), and finally by a search over the processing order of the nodes of the
critical component (an injection placed right after the backward that frees its slot is one of
the starting orders); where the best candidate's own orders (a timetable's) are slower than
its routes first come, first served, it keeps the routes without them. The best plan found
is returned; it is never worse than ``plan_no_tc2`` for the same problem and seed, because
that routing is one of the candidates (on the same allocation as long as ``allocate`` is not
cut short by the time limit). Deterministic for a
seed: the search budget counts simulations; ``time_limit_s`` only cuts it short (and then the
result depends on the machine's speed).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from skippipe.errors import UserError
from skippipe.planfile import Microbatch, Plan
from skippipe.planner.problem import Problem
from skippipe.planner.routing.balanced import balanced_candidate
from skippipe.planner.routing.budget import allocation_starts, default_budget
from skippipe.planner.routing.candidates import (
    GROUPS,
    PRIVATE_CHAINS,
    PROMISING,
    Candidate,
    Dealt,
    by_name,
    data_node_candidate,
    memory_candidates,
    packed_candidate,
    remembered_dealings,
    slow_link_candidate,
    stage_orders,
)
from skippipe.planner.routing.evaluate import Evaluator, Route
from skippipe.planner.routing.joint_groups import group_allocation
from skippipe.planner.routing.kept_start import KeptStart
from skippipe.planner.routing.ordered import improve_orders, ordered_chains
from skippipe.planner.routing.search import RouteSearch, SearchLimits
from skippipe.planner.routing.slow_link_search import SwapWork
from skippipe.planner.routing.static import chain_candidate, routes_on_chains, static_routes
from skippipe.planner.routing.timetabled import timetable_candidates
from skippipe.sim import simulate

# ----------------------------------------------------------------------------- helpers


def _deadline(time_limit_s: float | None) -> float | None:
    if time_limit_s is None:
        return None
    if time_limit_s <= 0:
        raise UserError(f"time limit must be > 0 seconds, got {time_limit_s}")
    return time.perf_counter() + float(time_limit_s)


def _allocation(problem: Problem, seed: int, time_limit_s: float | None) -> list[list[int]]:
    if problem.fixed_stages is not None:
        return [list(map(int, s)) for s in problem.fixed_stages]
    from skippipe.planner.allocation import allocate

    return allocate(problem, seed=seed, time_limit_s=time_limit_s)


def build_plan(
    problem: Problem,
    stages: list[list[int]],
    routes: list[Route],
    method: str,
    seed: int,
    orders: dict[int, list[str]] | None = None,
    meta: dict | None = None,
) -> Plan:
    """A plan file from routes (microbatch id = index; a data node injects lower ids first).

    With ``orders`` the plan carries a processing order for every node: the given orders where
    set, and elsewhere the order in which the node serves its work on its own (so the runtime
    can follow the plan exactly); the simulated makespan is the same.
    """
    mbs = [Microbatch(id=i, data_node=d, path=list(p)) for i, (d, p) in enumerate(routes)]
    plan = problem.make_plan(stages, mbs, method=method, seed=seed, meta=meta)
    if orders:
        plan.processing_order = {int(k): list(v) for k, v in orders.items()}
        full = simulate(plan, bound=False).processing_order()
        plan.processing_order = {int(k): list(v) for k, v in sorted(full.items())}
    res = simulate(plan, record=False, bound=False)  # the kept plan gets its bound in make_plan
    plan.predicted_makespan_s = float(res.makespan_s)
    return plan


# the order search of a timetable routing that leads after phase 1: its share of the rest of
# the budget (phase 2 of the other candidates gets the remainder)
TIMED_ORDERS = 0.4


# ----------------------------------------------------------------------------- methods


def plan_no_tc2(problem: Problem, seed: int = 0, time_limit_s: float | None = None) -> Plan:
    """Paths for the network and the load, ignoring time collisions (method ``skippipe-no-tc2``)."""
    stages = _allocation(problem, seed, time_limit_s)
    stage_orders(problem, stages)
    routes = static_routes(problem, stages)
    return build_plan(problem, stages, routes, "skippipe-no-tc2", seed)


def plan_skippipe(
    problem: Problem, seed: int = 0, time_limit_s: float | None = None, budget: int | None = None,
    fallbacks: Callable[[list[list[int]]], list[tuple[str, Plan]]] | None = None, thorough: bool = True,
    kept: KeptStart | None = None, on_start: Callable[[KeptStart], None] | None = None,
) -> Plan:
    """Collision-aware paths and processing orders (method ``skippipe``).

    ``thorough=False`` makes the start quicker (for the groups of a large cluster): up to 32
    nodes one timetable allocation without restarts and the data-node exchanges of larger
    clusters (a third less planning on a 300-node cluster), from 50 nodes the paced timetable
    only, and no packed allocation (candidate 7).

    ``fallbacks(stages)``, given the allocation of ``seed``, returns simulated
    plans of other methods (a safety net): one that is quicker is returned instead, relabelled
    ``skippipe`` with its origin in ``meta.candidate``.

    Under no time limit ``on_start`` is given the first start as built (``KeptStart``), and a
    start ``kept`` from an earlier call on the same problem with the same seed and ``thorough``
    is gone on from instead of being built again (the same plan, sooner).
    """
    deadline = _deadline(time_limit_s)
    default = budget is None and deadline is None and problem.fixed_stages is None
    budget = budget if budget is not None else default_budget(problem)
    if kept is not None and deadline is None and kept.fits(seed, thorough):
        stages, cands, evaluators, limits, dealt = kept.restored(problem, budget, deadline)
        first = _Start(seed, stages, cands, evaluators, limits, kept.slow_link_s, dealt)
        if not kept.complete:
            first = _completed(problem, first, deadline, thorough, packing=True)
    else:
        first = _start(problem, seed, budget, deadline, time_limit_s, thorough)
    if on_start is not None and deadline is None:
        on_start(KeptStart.of(seed, thorough, first.stages, first.cands, first.limits.spent, first.slow_link_s,
                              first.dealt))
    start = first
    # under the default budget, the next allocation seeds' starts too where they fit (the search goes on from the quickest)
    for k in range(1, allocation_starts(problem, budget, first.slow_link_s) if default else 1):
        other = _start(problem, seed + k, budget, None, None, thorough, packing=False)
        if other.quickest < start.quickest - 1e-9:
            start = other
    cands, evaluators, limits = start.cands, start.evaluators, start.limits
    searchable = _searchable(cands)
    lead = searchable[0].score.makespan

    # phase 1: each promising candidate (within 10 % of the best) descends on its paths with
    # an equal share of 40 % of the budget; phase 2: the best one goes on with iterated local
    # search on its paths (half of the rest) and then on its processing orders
    # (a timetable's paths go with its orders: they are not searched, its orders are below)
    promising = [c for c in searchable if c.score.makespan <= PROMISING * lead] if math.isfinite(lead) else searchable[:1]
    # the balanced routing and the data-node exchanges take a share of the search only when best
    promising = [c for c in promising if not c.searched_only_if_best or c is searchable[0]]
    searches = {}
    phase1 = _portion(limits, deadline, 0.4)
    for k, cand in enumerate(promising):
        share = _portion(phase1, phase1.deadline, 1.0 / (len(promising) - k))
        search = _search(problem, cand, evaluators[id(cand.stages)], start.seed, share)
        searches[id(cand)] = search
        cand.routes, cand.score = search.improve_paths(cand.routes, cand.score, kicks=0)
        phase1.spent += share.spent
    limits.spent += phase1.spent
    timed = min((c for c in cands if c.timed), key=lambda c: c.score.key(), default=None)
    if timed is not None and timed.score < min(c.score for c in promising):
        # the timetable leads: its processing orders get a share of the rest of the budget
        search = _search(problem, timed, evaluators[id(timed.stages)], start.seed,
                         _portion(limits, deadline, TIMED_ORDERS))
        timed.orders, timed.score = improve_orders(search, timed.routes, timed.score, timed.orders)
        limits.spent += search.limits.spent
    lead_cand = min(promising, key=lambda c: c.score.key())
    search = searches[id(lead_cand)]
    search.limits = _portion(limits, deadline, 0.5)
    lead_cand.routes, lead_cand.score = search.improve_paths(lead_cand.routes, lead_cand.score)
    limits.spent += search.limits.spent
    search.limits = _portion(limits, deadline, 1.0)
    lead_cand.orders, lead_cand.score = improve_orders(search, lead_cand.routes, lead_cand.score)
    limits.spent += search.limits.spent
    best = min(cands, key=lambda c: c.score.key())
    if best.orders:  # its routes first come, first served where that is quicker than its orders (a timetable's can be)
        served = evaluators[id(best.stages)].score(best.routes)
        if served < best.score:
            best.orders, best.score = None, served
    meta = {"candidate": best.name, "simulations": limits.spent, "allocation_seed": start.seed}
    plan = build_plan(problem, best.stages, best.routes, "skippipe", seed, best.orders, meta)
    # safety net: the plan file must not be worse than the no-tc2 routing it started from (that
    # of the user's seed, which ``plan_no_tc2`` gives, and that of the start searched)
    bases = [by_name(first.cands, "no-tc2")] + ([by_name(cands, "no-tc2")] if start is not first else [])
    for base in bases:
        if base is not None and base is not best:
            ref = build_plan(problem, base.stages, base.routes, "skippipe", seed, base.orders, meta)
            if ref.predicted_makespan_s < plan.predicted_makespan_s:
                plan = ref
    return quickest(plan, fallbacks(first.stages) if fallbacks is not None else [])


@dataclass
class _Start:
    """The candidate routings of one allocation seed, before the path search (``_start``)."""

    seed: int
    stages: list[list[int]]  # the allocation of its seed (the user's seed's goes to the fallbacks)
    cands: list[Candidate]
    evaluators: dict[int, Evaluator]  # by id of a candidate's stages
    limits: SearchLimits  # the budget, with what the starts charged to it spent
    slow_link_s: float  # the estimated CPU of its searches around slow links (``slow_links.programme_s``)
    dealt: Dealt  # the memory dealings computed, by allocation (``candidates.remembered_dealings``)

    @property
    def quickest(self) -> float:
        """The quickest candidate's makespan (timed candidates too)."""
        return min(c.score.makespan for c in self.cands)


def _start(
    problem: Problem, seed: int, budget: int, deadline: float | None, time_limit_s: float | None, thorough: bool = True,
    packing: bool = True,
) -> _Start:
    """Candidates 1-9 of the module text on the allocation of ``seed`` (and its joint allocation);
    ``packing``: candidate 7 too (only the user's seed's start builds it)."""
    quick = quick_start(problem, seed, budget, deadline, time_limit_s, thorough)
    return _completed(problem, quick, deadline, thorough, packing)


def quick_start(
    problem: Problem, seed: int, budget: int, deadline: float | None, time_limit_s: float | None, thorough: bool = True,
) -> _Start:
    """The quick part of a start (``workers.quick_plan``): the allocation of ``seed``, its
    balanced routing, memory orders and data-node exchanges (candidates 2, 4, 5: none reads
    another); its ``skippipe-no-tc2`` routing (a third of this CPU at 26-52 nodes, and slower)
    only where none is built, else ``_completed`` adds it first in the list, as ``_start`` was."""
    limits = SearchLimits(budget=budget, deadline=deadline)
    stages = _allocation(problem, seed, None if deadline is None else 0.25 * float(time_limit_s))
    ev = Evaluator(problem, stages)
    cands: list[Candidate] = []
    balanced = balanced_candidate(problem, stages, problem.load_caps(stages), stage_orders(problem, stages), ev)
    if balanced is not None:
        cands.append(Candidate("balanced", stages, *balanced, balanced=True, searched_only_if_best=True))
    evaluators = {id(stages): ev}
    dealt: Dealt = {}
    for found in memory_candidates(problem, stages, lambda st: static_routes(problem, st),
                                   remembered_dealings(problem, dealt)(stages)):
        _add(cands, evaluators, found)
    dn_cand = data_node_candidate(problem, cands, limits, thorough)
    if dn_cand is not None:
        evaluators[id(dn_cand.stages)] = Evaluator(problem, dn_cand.stages)
        cands.append(dn_cand)
    start = _Start(seed, stages, cands, evaluators, limits, 0.0, dealt)
    return start if cands else _with_base(problem, start)


def _with_base(problem: Problem, start: _Start) -> _Start:
    """``start`` with its ``skippipe-no-tc2`` routing first in its candidates (where it lacks it)."""
    if by_name(start.cands, "no-tc2") is None:
        routes = static_routes(problem, start.stages)
        start.cands.insert(0, Candidate("no-tc2", start.stages, routes, start.evaluators[id(start.stages)].score(routes)))
    return start


def _completed(problem: Problem, quick: _Start, deadline: float | None, thorough: bool, packing: bool) -> _Start:
    """A quick start (``quick_start``) completed: the ``skippipe-no-tc2`` routing and the private
    chains first and second in the list (as built first), then candidates 3 and 6-9."""
    quick = _with_base(problem, quick)
    seed, stages, cands, evaluators, limits = quick.seed, quick.stages, list(quick.cands), quick.evaluators, quick.limits
    ev = evaluators[id(stages)]
    routes = chain_candidate(problem, stages, problem.load_caps(stages), stage_orders(problem, stages), deadline,
                             ev.score)
    if routes is not None:
        cands.insert(1, Candidate(PRIVATE_CHAINS, stages, routes, ev.score(routes)))
    dealings = remembered_dealings(problem, quick.dealt)
    if problem.fixed_stages is None:
        grouped = group_allocation(problem, seed, deadline, leftovers=thorough)
        if grouped is not None:
            g_stages, g_chains = grouped
            g_ev = Evaluator(problem, g_stages)
            routes = routes_on_chains(problem, g_stages, problem.load_caps(g_stages), stage_orders(problem, g_stages),
                                      g_chains, g_ev.score)
            if routes is not None:
                evaluators[id(g_stages)] = g_ev
                cands.append(Candidate(GROUPS, g_stages, routes, g_ev.score(routes)))
    work = SwapWork()
    _add(cands, evaluators, slow_link_candidate(problem, cands, dealings, work))
    _add(cands, evaluators, packed_candidate(problem, stages, seed) if thorough and packing else None)
    cands += timetable_candidates(problem, cands, seed, evaluators, limits, thorough)
    lead = _searchable(cands)[0].score.makespan
    cands += ordered_chains(cands, lambda c, lim: _search(problem, c, evaluators[id(c.stages)], seed, lim), lead,
                            deadline)
    return _Start(seed, stages, cands, evaluators, limits, work.spent_s, quick.dealt)


def _add(cands: list[Candidate], evaluators: dict[int, Evaluator], found: tuple[Candidate, Evaluator] | None) -> None:
    """A candidate found (with its evaluator) added to a start's."""
    if found is not None:
        evaluators[id(found[0].stages)] = found[1]
        cands.append(found[0])


def _searchable(cands: list[Candidate]) -> list[Candidate]:
    """The candidates whose paths are searched (not timed), best first come, first served first."""
    return sorted((c for c in cands if not c.timed), key=lambda c: c.score.key())


def _search(problem: Problem, cand: Candidate, ev: Evaluator, seed: int, limits: SearchLimits) -> RouteSearch:
    """A local search on the paths and orders of ``cand`` (scored by ``ev``) within ``limits``."""
    return RouteSearch(ev, cand.stages, problem.load_caps(cand.stages), stage_orders(problem, cand.stages), seed, limits)


def safety_net(
    problem: Problem, seed: int, fallbacks: Callable[[list[list[int]]], list[tuple[str, Plan]]]
) -> list[tuple[str, Plan]]:
    """The simulated plans a plan of the groups must beat (the safety net of ``plan_skippipe``,
    for plans of the whole cluster in parts): the ``skippipe-no-tc2`` plan and the fallbacks
    on its allocation."""
    base = plan_no_tc2(problem, seed=seed)
    return [("no-tc2", base), *fallbacks(base.stages)]


def quickest(plan: Plan, others: list[tuple[str, Plan]]) -> Plan:
    """``plan``, or the quickest of the simulated ``others`` that beats it, relabelled
    ``skippipe`` with its origin in ``meta.candidate`` (the safety net of method ``skippipe``)."""
    for name, alt in others:
        if alt.predicted_makespan_s is not None and alt.predicted_makespan_s < plan.predicted_makespan_s:
            alt.method = "skippipe"
            alt.meta = {**alt.meta, "candidate": name}
            plan = alt
    return plan


def _portion(limits: SearchLimits, deadline: float | None, fraction: float) -> SearchLimits:
    """A fraction of what is left of a budget and of the time to a deadline."""
    left = max(0, limits.budget - limits.spent)
    dl = None
    if deadline is not None:
        dl = time.perf_counter() + max(0.0, deadline - time.perf_counter()) * fraction
    return SearchLimits(budget=max(1, int(left * fraction)), deadline=dl)
