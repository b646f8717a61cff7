"""Processing orders component by component, and chain candidates kept with their orders.

``improve_orders`` runs the order search of ``RouteSearch`` on the critical component of a
routing, then on the next critical one, until the critical one cannot be improved.

``ordered_chains`` protects the chain candidates of ``plan_skippipe`` (private chains and the
joint groups: every data node on its own chain) from the path search. That search scores
paths first come, first served and only then searches the processing orders of the paths it
ended on; on chains it may trade a chain's well-ordered pattern for paths that look better
first come, first served and end worse once ordered (the suite's single-site cluster on
planner seed 1: 65.79 s, where the chains with their orders take 63.77-64.25 s; gcp-2025
geo-distributed on seed 0: 68.40 s, the groups with their orders 66.75 s). So each promising
chain candidate is also kept as it is, with its orders searched (``CHAIN_ORDER_SIMS``
simulations, most of them of one data node's small component, and the components that are
the same scheduling problem share their orders), as a candidate whose paths are not searched.
Only chains that no two data nodes share are kept so (the suite's 12- to 20-node clusters;
on the 100-node one the data nodes left without a chain share nodes in components of up to
20 nodes, and ordering them took 3.6 s for nothing).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from skippipe.planner.routing.candidates import GROUPS, PRIVATE_CHAINS, PROMISING, Candidate
from skippipe.planner.routing.evaluate import Incremental, Route, Score
from skippipe.planner.routing.search import RouteSearch, SearchLimits

# the chain candidates kept with their orders
CHAIN_CANDIDATES = (PRIVATE_CHAINS, GROUPS)
# simulations of the order search of each (not charged to the search budget: a component is
# one data node and its chain, 0.1-0.3 s a candidate)
CHAIN_ORDER_SIMS = 2000
# and at most this many operations simulated in all: a component holds a data node's m
# microbatches, 2L + 1 operations each, so the simulations are fewer only beyond that many
# (L = 4: beyond 96 microbatches per data node; with 400 the 2,000 took 55 s of a profiled
# planning of 105 s)
CHAIN_ORDER_OPS = CHAIN_ORDER_SIMS * 96 * 9


def improve_orders(
    search: RouteSearch, routes: list[Route], score: Score, start: dict[int, list[str]] | None = None
) -> tuple[dict[int, list[str]] | None, Score]:
    """Processing orders for the critical component, then for the next critical one, until
    the critical one cannot be improved (its finish is then the makespan); from the orders
    ``start`` (scored ``score``), which are returned when nothing better is found."""
    ev = search.ev
    orders: dict[int, list[str]] = dict(start or {})
    comps = ev.components(routes)
    comp_of = {routes[i][0]: k for k, ids in enumerate(comps) for i in ids}
    finish = {k: ev.component_finish(routes, ids, orders) for k, ids in enumerate(comps)}
    best = Incremental._combine(finish)
    while best.latest:
        k = comp_of[best.latest[0]]
        if search.limits.done() and not search.knows(routes, comps[k]):
            break  # out of budget; a component solved before still gets its known orders
        before = Incremental._combine({0: finish[k]})
        new_orders, comp_score = search.improve_orders(routes, comps[k], orders)
        if not comp_score < before:
            break
        orders = new_orders
        finish[k] = ev.component_finish(routes, comps[k], orders)
        best = Incremental._combine(finish)
    if not best < score:
        return start, score
    return (orders or None), best


def ordered_chains(
    cands: list[Candidate], make_search: Callable[[Candidate, SearchLimits], RouteSearch], lead: float,
    deadline: float | None = None,
) -> list[Candidate]:
    """The chain candidates of ``cands`` within ``PROMISING`` x ``lead`` (the best first
    come, first served makespan) where no two data nodes share a node (every component is one
    data node and its chain), each with its processing orders searched for
    ``CHAIN_ORDER_SIMS`` simulations, fewer where the largest component would take more than
    ``CHAIN_ORDER_OPS`` operations in all (``make_search(candidate, limits)`` gives the search), as
    candidates whose orders come with their paths; those the orders improved. ``deadline``
    (``time.perf_counter``) cuts the order search short."""
    out = []
    for cand in cands:
        span = cand.score.makespan
        if cand.name not in CHAIN_CANDIDATES or cand.timed or not (math.isfinite(span) and span <= PROMISING * lead):
            continue
        search = make_search(cand, SearchLimits(budget=CHAIN_ORDER_SIMS, deadline=deadline))
        comps = search.ev.components(cand.routes)
        if any(len({cand.routes[i][0] for i in ids}) > 1 for ids in comps):
            continue  # data nodes share chain nodes (a large cluster's leftovers): no small problems
        search.limits.budget = chain_order_sims(max(len(ids) for ids in comps) * (2 * len(cand.routes[0][1]) + 3))
        orders, score = improve_orders(search, cand.routes, cand.score)
        if orders and score < cand.score:
            out.append(dataclasses.replace(cand, name=f"{cand.name} (ordered)", routes=list(cand.routes),
                                           score=score, orders=orders, timed=True))
    return out


def chain_order_sims(operations: int) -> int:
    """Simulations of a chain candidate's order search whose largest component has this many
    operations: ``CHAIN_ORDER_SIMS``, fewer beyond ``CHAIN_ORDER_OPS`` operations in all."""
    return min(CHAIN_ORDER_SIMS, max(1, CHAIN_ORDER_OPS // max(1, operations)))
