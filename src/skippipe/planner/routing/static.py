"""The ``skippipe-no-tc2`` routing and the private-chain routes built beside it.

``static_routes`` chooses min-cost paths under the TC1 caps and a per-round slot limit
(``routing.assign``; nothing is simulated but whether the routing finishes). ``chain_candidate``
gives the data nodes that can have one a private chain (``routing.groups``) and routes the
others statically over the capacity left. Both are starts of ``routing.schedule``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from skippipe.errors import UserError
from skippipe.planner.problem import Problem
from skippipe.planner.routing.assign import assign_static, round_of
from skippipe.planner.routing.evaluate import Evaluator, Route, Score
from skippipe.planner.routing.exchange import Paths
from skippipe.planner.routing.groups import private_chain_sets
from skippipe.planner.routing.sequences import RouteCosts, cheapest_over_sequences, search_width


def static_routes(problem: Problem, stages: list[list[int]], caps: list[int] | None = None) -> list[Route]:
    """The ``skippipe-no-tc2`` routing: min-cost paths under the caps (``assign_static``).

    Paths are chosen round by round (``route_assign``: a node takes no more microbatches of
    one round than it has activation slots); a data node injects round by round, slowest path
    first within a round. Paths with swaps can
    wait on each other for memory in a circle (a deadlock, with little memory); if the routing
    does not finish in the simulator it is redone without swaps, where the microbatch furthest
    along can always move on.
    """
    caps = problem.load_caps(stages) if caps is None else caps
    routes = _static_routes(problem, stages, caps, None)
    if not math.isfinite(Evaluator(problem, stages).score(routes).makespan):
        routes = _static_routes(problem, stages, caps, 0)
        if not math.isfinite(Evaluator(problem, stages).score(routes).makespan):
            raise UserError("no routing found that finishes: the microbatches wait on each other for memory")
    return routes


def _static_routes(problem: Problem, stages: list[list[int]], caps: list[int], max_swaps: int | None) -> list[Route]:
    rc = RouteCosts.from_problem(problem)

    def finishes(paths: Paths) -> bool:
        return math.isfinite(Evaluator(problem, stages).score(_in_rounds(problem, rc, stages, paths)).makespan)

    # large clusters: greedy paths with swaps that deadlock are not polished (they are routed
    # again without swaps)
    check = finishes if max_swaps is None and search_width(problem.n) is not None else None
    return _in_rounds(problem, rc, stages, assign_static(problem, stages, caps, max_swaps=max_swaps, finishes=check))


def _in_rounds(problem: Problem, rc: RouteCosts, stages: list[list[int]], paths: Paths) -> list[Route]:
    """The routes of every data node, round by round, slowest path first within a round."""
    routes: list[Route] = []
    for d in stages[0]:
        plist = [tuple(int(x) for x in p) for p in paths.get(d, [])]
        # round by round (the greedy's rounds: a node's slots suffice within one), slowest first
        order = sorted(range(len(plist)), key=lambda k: (round_of(problem, d, k), -rc.round_trip(d, plist[k]), plist[k]))
        routes += [(int(d), plist[k]) for k in order]
    return routes


def chain_routes(stages: list[list[int]], chains: dict[int, list[int]], m: int) -> list[Route]:
    return [(int(d), tuple(int(x) for x in chains[d])) for d in stages[0] for _ in range(m)]


def chain_candidate(
    problem: Problem, stages: list[list[int]], caps: list[int], seqs: tuple[tuple[int, ...], ...], deadline: float | None,
    score: Callable[[list[Route]], Score] | None = None,
) -> list[Route] | None:
    """Private chains for the data nodes that can have one; the others share what capacity is
    left, routed statically (when they cannot be, the least critical chain is given up) or
    gathered (``_gathered_leftovers``; the quota's chain set only so where data nodes are left
    over). Of these routings of the chain sets of ``private_chain_sets``, the one that
    ``score`` finds quickest (by default the first)."""
    routings = []
    for k, chains in enumerate(private_chain_sets(problem, stages, caps, seqs, deadline)):
        # the quota's chains (the first set) shared too; the others, with data nodes left over, gathered only
        routings += _chain_set_routings(problem, stages, caps, seqs, chains, shared=k == 0)
    if not routings:
        return None
    return min(routings, key=score) if score is not None and len(routings) > 1 else routings[0]


def routes_on_chains(
    problem: Problem, stages: list[list[int]], caps: list[int], seqs: tuple[tuple[int, ...], ...],
    chains: dict[int, list[int]], score: Callable[[list[Route]], Score],
) -> list[Route] | None:
    """Every data node on its chain (``chains``, e.g. the joint allocation's); the data nodes
    without one as ``chain_candidate`` routes them, gathered or shared, the quicker by
    ``score``; None where neither routes them."""
    routings = _chain_set_routings(problem, stages, caps, seqs, chains, shared=True)
    return min(routings, key=score) if routings else None


def _chain_set_routings(
    problem: Problem, stages: list[list[int]], caps: list[int], seqs: tuple[tuple[int, ...], ...],
    chains: dict[int, list[int]], shared: bool,
) -> list[list[Route]]:
    """The routings of one chain set: its chains alone where every data node has one; else the
    data nodes left over gathered (``_gathered_leftovers``) and, with ``shared``, routed
    statically over the capacity left (``_chain_routing``), those that route."""
    if len(chains) == len(stages[0]):
        return [chain_routes(stages, chains, problem.workload.microbatches_per_data_node)]
    routings = [_gathered_leftovers(problem, stages, caps, seqs, chains)]
    if shared:
        routings.append(_chain_routing(problem, stages, caps, dict(chains)))
    return [r for r in routings if r is not None]


def _chain_routing(
    problem: Problem, stages: list[list[int]], caps: list[int], chains: dict[int, list[int]]
) -> list[Route] | None:
    """``chain_candidate`` for one chain set (``chains`` loses the chains given up)."""
    m = problem.workload.microbatches_per_data_node
    order = list(chains)
    while chains:
        rest = [d for d in stages[0] if d not in chains]
        if not rest:
            return chain_routes(stages, chains, m)
        try:
            shared = static_routes(problem, [rest, *stages[1:]], _residual(caps, chains, m))
        except UserError:
            chains.pop(order.pop())
            continue
        by_node: dict[int, list[Route]] = {}
        for r in shared:
            by_node.setdefault(r[0], []).append(r)
        return _with_chains(stages, chains, m, by_node)
    return None


def _residual(caps: list[int], chains: dict[int, list[int]], m: int) -> list[int]:
    """The TC1 caps less what the chains take (m visits on each chain node)."""
    residual = list(caps)
    for chain in chains.values():
        for x in chain:
            residual[x] -= m
    return residual


def _with_chains(stages: list[list[int]], chains: dict[int, list[int]], m: int, shared: dict[int, list[Route]]
                 ) -> list[Route]:
    """Every data node's routes in stage-0 order: ``shared``'s where it has them, else its chain."""
    return [r for d in stages[0] for r in (shared[d] if d in shared else chain_routes([[d]], chains, m))]


def _gathered_leftovers(
    problem: Problem, stages: list[list[int]], caps: list[int], seqs: tuple[tuple[int, ...], ...],
    chains: dict[int, list[int]],
) -> list[Route] | None:
    """``chain_candidate`` for one chain set with the data nodes left without a chain routed
    over the free nodes first, and where they must visit a chain node (its spare cap), on as
    few chains as possible: a node of a chain already visited so costs one visit more on the
    routing's scale, one of a new chain two. The static routing of the rest spreads them over
    any capacity left, so that one foreign visit lands on many chains (one site, 84 nodes,
    S = 9, L = 5: 16 chains and one data node left, 24 visits on 24 chain nodes, 68.44 s first
    come, first served; gathered, 6 visits on few chains, 59.11 s, and the plan 54.85 s against
    57.67 s). None where the greedy finds no path for some microbatch, or where a microbatch
    would visit two chain nodes (then its data node is no chain with one shared visit but a
    shared routing, and the search from it ended slower on 6 of 44 one-site clusters); None at
    once where the free nodes' capacity cannot hold that (``_free_visits_suffice``)."""
    m = problem.workload.microbatches_per_data_node
    rest = [d for d in stages[0] if d not in chains]
    if not rest or not seqs:
        return None
    owner = {x: d for d, chain in chains.items() for x in chain}
    left = np.asarray(_residual(caps, chains, m), dtype=int)
    if not _free_visits_suffice(stages, owner, left, len(rest) * m, problem.workload.path_length - 1):
        return None
    rc = RouteCosts.from_problem(problem)
    chain_nodes = np.fromiter(owner, dtype=int, count=len(owner))
    arrays = [np.asarray(s, dtype=int) for s in stages]
    touched: set[int] = set()
    routes: dict[int, list[Route]] = {d: [] for d in rest}
    for _ in range(m):
        for d in rest:
            penalty = np.zeros(problem.n)
            if len(chain_nodes):
                visited = np.array([owner[int(x)] in touched for x in chain_nodes])
                penalty[chain_nodes] = rc.node[chain_nodes] * np.where(visited, 1.0, 2.0)
            # over the nodes with capacity left only
            _, path = cheapest_over_sequences(rc, d, [a[left[a] > 0] for a in arrays], seqs, penalty)
            if not path:
                return None
            foreign = [owner[x] for x in path if x in owner]
            if len(foreign) > 1:
                return None
            left[path] -= 1
            touched.update(foreign)
            routes[d].append((int(d), tuple(int(x) for x in path)))
    return _with_chains(stages, chains, m, routes)


def _free_visits_suffice(stages: list[list[int]], owner: dict[int, int], left: np.ndarray, paths: int, visits: int
                         ) -> bool:
    """Whether the nodes outside stage 0 and outside every chain have capacity ``left`` for
    ``paths`` paths of ``visits`` visits each with at most one on a chain node: every path the
    gathering takes uses at least ``visits - 1`` of it, so where the sum falls short the
    gathering fails somewhere (985 nodes with one slot each: 60 data nodes left over need 2,400
    free visits where 2,077 are left; found so after 219 of 480 paths and 5.8 s before)."""
    free = sum(int(max(0, left[x])) for s in stages[1:] for x in s if x not in owner)
    return free >= paths * max(0, visits - 1)
