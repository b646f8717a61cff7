"""The starting routings of ``plan_skippipe`` beyond the no-tc2, private-chain, balanced and
joint-allocation ones: memory order, data-node exchanges and slow links (see ``routing.schedule``;
the timetables: ``routing.timetabled``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from skippipe.errors import UserError
from skippipe.planner.problem import Problem
from skippipe.planner.routing.balanced import balanced_candidate
from skippipe.planner.routing.data_nodes import LARGEST as DATA_NODES_LARGEST
from skippipe.planner.routing.data_nodes import MAX_NODES as DATA_NODES_MAX_NODES
from skippipe.planner.routing.data_nodes import ROUTING_CHARGE, data_node_search
from skippipe.planner.routing.evaluate import Evaluator, Route, Score
from skippipe.planner.routing.fast_allocation import fast_allocation
from skippipe.planner.routing.fast_packing import packed_allocation
from skippipe.planner.routing.pool import WorkerPool
from skippipe.planner.routing.search import SearchLimits
from skippipe.planner.routing.sequences import RouteCosts, stage_cap_sums
from skippipe.planner.routing.slow_link_search import SwapWork, searched_allocation
from skippipe.planner.routing.slow_links import (
    DEALING_MAX_ARCS,
    MAX_ARCS,
    programme_shape,
    slow_link_mask,
    uses_slow_link,
)
from skippipe.planner.stage_orders import routing_orders

# the hold-balanced dealing is a candidate only when its largest slot hold per slot is at most
# this x the best of the allocation and its memory orders (sweep case 16: 0.385, case 25: 0.714;
# the suite's clusters 0.98-1.02, where it only moved the search)
HOLD_GAIN = 0.8
# and only up to this many nodes (its programme took 1.1 s at 116 nodes and 8.7 s at 1,000)
HOLD_LARGEST = 200

# the names of the chain candidates of ``plan_skippipe``: private chains on the allocation,
# and the groups of the joint allocation
PRIVATE_CHAINS = "private-chains"
GROUPS = "groups"
PACKED = "packed fast links"
# a candidate within this factor of the best start (first come, first served) is promising:
# it takes a share of the path search (and, a chain candidate, is kept with its orders)
PROMISING = 1.10


@dataclass
class Candidate:
    name: str
    stages: list[list[int]]
    routes: list[Route]
    score: Score
    orders: dict[int, list[str]] | None = None
    balanced: bool = False  # routed by ``routing.balanced`` (a start for the data-node exchanges)
    searched_only_if_best: bool = False  # takes a share of the search only as the best start
    timed: bool = False  # its processing orders come with its paths (``routing.timetable``)


def stage_orders(problem: Problem, stages: list[list[int]]) -> tuple[tuple[int, ...], ...]:
    """The valid stage orders of the workload (CC2/CC3) for an allocation with these stages."""
    w = problem.workload
    sums = stage_cap_sums(problem.load_caps(stages), stages)
    seqs = routing_orders(sums, len(stages[0]) * w.microbatches_per_data_node, w.path_length, w.max_swaps, w.max_jump)
    if not seqs:
        raise UserError(f"no stage order of length L={w.path_length} satisfies the path rules (CC2/CC3)")
    return seqs


def memory_dealings(problem: Problem, stages: list[list[int]]) -> dict[str, list[list[int]]]:
    """The memory-ordered variants of an allocation (``allocation.memory_order``, by key) and,
    up to ``HOLD_LARGEST`` nodes where the other stages' memory is uneven (or their speed, where
    the holds may bind: ``_holds_differ``), its hold-balanced
    dealing (``stage_caps.hold_balanced_stages``, as "hold-balanced", when it differs from
    ``stages`` and may be used: ``_hold_may_help``). Empty when the cluster fixes the allocation."""
    if problem.fixed_stages is not None:
        return {}
    from skippipe.planner.allocation.memory_order import KEYS, memory_ordered
    from skippipe.planner.allocation.stage_caps import hold_balanced_stages

    out: dict[str, list[list[int]]] = {}
    for key in KEYS:
        dealt = memory_ordered(problem, stages, key)
        if dealt is not None and dealt not in out.values():
            out[key] = dealt
    rest = [x for s in stages[1:] for x in s]
    if (problem.n <= HOLD_LARGEST and _holds_differ(problem, stages, rest)
            and _hold_may_help(problem, stages, list(out.values()))):
        held = hold_balanced_stages(problem, stages)
        if held is not None and held != stages:
            out["hold-balanced"] = held
    return out


def _holds_differ(problem: Problem, stages: list[list[int]], rest: list[int]) -> bool:
    """Whether dealing the nodes ``rest`` of stages 1..S-1 differently may matter for their slot
    holds: their memory differs, or their speed does (a fast node's TC1 cap is high, so it holds
    more; late in the paths its holds are short) and the largest hold per slot of ``stages``
    is above their data-node floor (the slots, not the data nodes, would bind). On an exact small
    case (7 nodes, one slot on each node of stages 1-3, compute 0.5-2x) dealing the fastest
    node last took the plan from 63.80 to 42.25 s, the exact optimum; on the suite's global
    uneven cluster (24 nodes, 3 slots each: holds 29.54 s per slot, floor 47.36 s) the dealing
    only moved the search (58.98 -> 60.14 s)."""
    if len({int(problem.memory[x]) for x in rest}) > 1:
        return True
    if len({float(problem.forward_s[x]) for x in rest}) <= 1:
        return False
    from skippipe.planner.allocation.stage_caps import largest_hold_per_slot
    from skippipe.planner.floors import allocation_floor_reaches

    return not allocation_floor_reaches(problem, stages, largest_hold_per_slot(problem, stages))


def _hold_may_help(problem: Problem, stages: list[list[int]], orders: list[list[list[int]]]) -> bool:
    """False where the hold-balanced dealing of ``stages`` would be dropped whatever the programme
    finds, so that it need not be solved: no link only trickles (``slow_link_candidate``, the
    other user of the dealings, then starts from none), and even the least largest hold per slot
    of any dealing (``stage_caps.least_hold_bound``, a bound below the programme's) is above
    ``HOLD_GAIN`` x the best of ``stages`` and its memory ``orders`` (``memory_candidates`` drops
    it there). On the 36 groups of a 972-node cluster of sites with 1-4 slots it was dropped in
    every one, after 14 of their 65 s of planning CPU."""
    from skippipe.planner.allocation.stage_caps import least_hold_bound

    if slow_link_mask(problem.transfer_s) is not None:
        return True
    return not least_hold_bound(problem, stages) > _hold_bar(problem, [stages, *orders])


def _hold_bar(problem: Problem, dealings: list[list[list[int]]]) -> float:
    """The largest hold per slot the hold-balanced dealing must not exceed to be a candidate:
    ``HOLD_GAIN`` x the least of ``dealings`` (the allocation and its memory orders)."""
    from skippipe.planner.allocation.stage_caps import largest_hold_per_slot

    return HOLD_GAIN * min(largest_hold_per_slot(problem, d) for d in dealings)


Dealt = dict[tuple[tuple[int, ...], ...], dict[str, list[list[int]]]]  # memory dealings by allocation


def remembered_dealings(
    problem: Problem, known: Dealt | None = None
) -> Callable[[list[list[int]]], dict[str, list[list[int]]]]:
    """``memory_dealings`` of ``problem``, each allocation's computed once (the hold-balanced
    dealing is a programme: 1.1 s at 116 nodes), kept in ``known`` where given."""
    known = {} if known is None else known

    def dealings(stages: list[list[int]]) -> dict[str, list[list[int]]]:
        key = tuple(tuple(int(x) for x in s) for s in stages)
        if key not in known:
            known[key] = memory_dealings(problem, stages)
        return dict(known[key])

    return dealings


def packed_candidate(problem: Problem, stages: list[list[int]], seed: int) -> tuple[Candidate, Evaluator] | None:
    """Where some links only trickle and the cluster fixes no allocation: the allocation that
    ``fast_packing.packed_allocation`` finds from ``stages`` (its exchanges in the order of
    ``seed``), with its packed paths over fast links (each data node's longest round trips
    first), scored; None where it finds none."""
    slow = slow_link_mask(problem.transfer_s)
    if slow is None or problem.fixed_stages is not None:
        return None
    found = packed_allocation(problem, stages, stage_orders(problem, stages), slow, seed=seed)
    if found is None:
        return None
    packed, paths = found
    rc = RouteCosts.from_problem(problem)
    routes = [(d, p) for d in packed[0] for p in sorted(paths[d], key=lambda p: -rc.round_trip(d, p))]
    ev = Evaluator(problem, packed)
    return Candidate(PACKED, packed, routes, ev.score(routes)), ev


def memory_candidates(
    problem: Problem, stages: list[list[int]], static: Callable[[list[list[int]]], list[Route]],
    dealt: dict[str, list[list[int]]],
) -> list[tuple[Candidate, Evaluator]]:
    """Balanced routings on ``dealt``, the memory dealings of the allocation (``memory_dealings``):
    its memory orders, and its hold-balanced dealing only when that dealing's largest hold per
    slot is at most ``HOLD_GAIN`` x that of the allocation and of its memory orders (routed by
    ``static`` when the balanced routing finds no path under the caps, and searched only as the
    best start)."""
    from skippipe.planner.allocation.stage_caps import largest_hold_per_slot

    out: list[tuple[Candidate, Evaluator]] = []
    dealt = dict(dealt)
    held = dealt.pop("hold-balanced", None)
    for key, mem_stages in dealt.items():
        ev = Evaluator(problem, mem_stages)
        found = balanced_candidate(problem, mem_stages, problem.load_caps(mem_stages), stage_orders(problem, mem_stages), ev)
        if found is not None:
            out.append((Candidate(f"memory-order ({key})", mem_stages, *found, balanced=True), ev))
    if held is None or any(held == c.stages for c, _ in out):
        return out
    if largest_hold_per_slot(problem, held) > _hold_bar(problem, [stages, *dealt.values()]):
        return out  # the memory orders balance the holds about as well
    ev = Evaluator(problem, held)
    found = balanced_candidate(problem, held, problem.load_caps(held), stage_orders(problem, held), ev)
    if found is None:
        try:
            routes = static(held)
        except UserError:
            return out
        found = (routes, ev.score(routes))
    out.append((Candidate("hold-balanced", held, *found, searched_only_if_best=True), ev))
    return out


def data_node_candidate(
    problem: Problem, cands: list[Candidate], limits: SearchLimits, thorough: bool = True
) -> Candidate | None:
    """The balanced routing on the best balanced-routed allocation so far with its data nodes
    exchanged for other nodes while the simulator says it helps (``routing.data_nodes``), when
    the cluster fixes no allocation and compute is uneven; above ``DATA_NODES_MAX_NODES`` nodes
    its routings are charged to ``limits``. ``thorough=False``: the shortlist at any size."""
    if problem.fixed_stages is not None or problem.n > DATA_NODES_LARGEST or problem.even_compute:
        return None
    starts = [c for c in cands if c.balanced]
    if not starts:
        return None
    start = min(starts, key=lambda c: c.score.key())
    tally = [0]
    found = data_node_search(problem, start.stages, stage_orders(problem, start.stages), start.score, tally, thorough)
    if problem.n > DATA_NODES_MAX_NODES:
        limits.spent += tally[0] * ROUTING_CHARGE
    if found is None:
        return None
    return Candidate(f"data nodes ({start.name})", *found, balanced=True, searched_only_if_best=True)


def slow_link_candidate(
    problem: Problem, cands: list[Candidate], dealings: Callable[[list[list[int]]], dict[str, list[list[int]]]],
    work: SwapWork | None = None,
) -> tuple[Candidate, Evaluator] | None:
    """The cheapest integer routing under the TC1 caps on an allocation searched to avoid slow
    links (``routing.slow_links``), scored; the best of its starts. When the best candidate so
    far crosses a slow link, the search starts from its allocation and from its memory dealings
    (``dealings``: the exchanges that leave the slow links may leave the few-slot nodes where
    their holds are long). Otherwise it starts from those memory dealings that have no
    candidate over fast links alone (dealt by memory, the network unseen, they may need slow
    links; above ``DEALING_MAX_ARCS`` arcs only where the relaxation is integral, as no integer
    programme is solved there), and is kept only when it is a
    better start than the best so far (else it would only move the search: sweep case 42 ended
    2.4 % worse). Where the best start crosses and the exchanges leave slow links in use, whole
    allocations are also tried by data-node set (``routing.fast_allocation``; not where the
    cluster fixes the allocation). The estimated CPU of the exchanges' programmes is added to
    ``work``."""
    slow = slow_link_mask(problem.transfer_s)
    if slow is None:
        return None
    start = min(cands, key=lambda c: c.score.key())
    crossing = uses_slow_link(slow, start.routes)
    fast = [c.stages for c in cands if not uses_slow_link(slow, c.routes)]
    begins = [(start.name, start.stages)] if crossing else []
    for key, dealt in dealings(start.stages).items():
        if all(dealt != b for _, b in begins) and (crossing or dealt not in fast):
            begins.append((key, dealt))
    integer_arcs = MAX_ARCS if crossing else DEALING_MAX_ARCS
    rc = RouteCosts.from_problem(problem)
    work = SwapWork() if work is None else work
    best: tuple[Candidate, Evaluator] | None = None

    def keep(name: str, found: tuple[list[list[int]], dict[int, list[tuple[int, ...]]]] | None) -> None:
        nonlocal best
        if found is None:
            return
        stages, paths = found
        routes = [(d, p) for d in stages[0] for p in sorted(paths[d], key=lambda p: -rc.round_trip(d, p))]
        ev = Evaluator(problem, stages)
        cand = Candidate(name, stages, routes, ev.score(routes))
        if best is None or cand.score.key() < best[0].score.key():
            best = (cand, ev)

    orders = [stage_orders(problem, begin) for _, begin in begins]
    if len(begins) > 1:  # each programme's shape built here once (cached by stage sizes): the workers inherit it
        for (_, begin), seqs in zip(begins, orders):
            programme_shape(problem, begin, seqs)
    # the searches are independent: side by side in the planning workers (a pool forks in about 0.02 s,
    # one programme takes 4 ms or more)
    with WorkerPool(workers=None if len(begins) > 1 else 1) as pool:
        searches = [pool.submit(searched_allocation, problem, begin, seqs, slow, integer_arcs)
                    for (_, begin), seqs in zip(begins, orders)]
        for (name, _), search in zip(begins, searches):
            found, spent_s = search.result()
            work.spent_s += spent_s
            keep(f"slow links ({start.name if crossing else name})", found)
    if best is not None and not crossing and not best[0].score.key() < start.score.key():
        return None  # from the memory dealings: only a start better than the best so far
    if crossing and problem.fixed_stages is None and (best is None or uses_slow_link(slow, best[0].routes)):
        begin = start.stages if best is None else best[0].stages  # the exchanges stopped on slow links
        keep(f"fast links ({start.name})", fast_allocation(problem, begin, stage_orders(problem, begin), slow))
    return best


def by_name(cands: list[Candidate], name: str) -> Candidate | None:
    return next((c for c in cands if c.name == name), None)
