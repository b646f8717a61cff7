"""The timetable candidates of ``plan_skippipe`` (candidate 8 of ``routing.schedule``): the
timetable routing (``routing.timetable``) on the allocations of the best candidates, unpaced and
paced, then restarts with a perturbed path choice; the work charged to the search budget beyond
a free allowance. The first runs are independent of each other and run side by side in the
planning workers (``pool.map_calls``), kept in their order, so the candidate is the same with
any count of workers; the restarts share one random sequence and run one after another.
"""

from __future__ import annotations

import random

from skippipe.planner.problem import Problem
from skippipe.planner.routing.budget import planning_target_s
from skippipe.planner.routing.candidates import PACKED, Candidate, stage_orders
from skippipe.planner.routing.evaluate import Evaluator
from skippipe.planner.routing.pool import map_calls
from skippipe.planner.routing.search import SearchLimits
from skippipe.planner.routing.timetable import LARGEST as TIMETABLE_LARGEST
from skippipe.planner.routing.timetable import Timetable, estimated_work, timetable_routes

# up to this many nodes timetables are cheap (under 0.2 s each at 30 nodes): two allocations
# and restarts
TIMETABLE_SMALL = 32
# allocations a timetable routing is tried on (those of the best candidates)
TIMETABLE_ALLOCATIONS = 2
# timetable routings with a perturbed path choice, on the allocation of the best timetable
TIMETABLE_RESTARTS = 3
# up to this many nodes the first TIMETABLE_FREE_WORK work units of the timetables (about 0.6 s)
# are not charged to the search budget, the rest is (so that planning stays within 10 s there)
TIMETABLE_UNCHARGED = 40
TIMETABLE_FREE_WORK = 300_000
# work units charged as one search simulation, per node of the cluster: a unit takes about 2 us
# and a search simulation about 0.8 ms at 32 nodes (S = 9), so 10 per node up to 40 nodes;
# about 1 us and 3 ms at 100 nodes, so 30 per node above
TIMETABLE_WORK_PER_NODE_SMALL = 10
TIMETABLE_WORK_PER_NODE = 30
# above TIMETABLE_LARGEST nodes the timetables (unpaced, then paced) run only while their
# estimated CPU, TIMETABLE_S_PER_WORK x ``timetable.estimated_work`` each, fits TIMETABLE_SHARE
# of the planning-time target (the work is charged to the search budget as below; the share
# bounds what a timetable that does not win costs). Measured on the 2-core machine on four
# clusters of 120-400 nodes: 0.63-1.46 us of CPU per estimated unit
TIMETABLE_S_PER_WORK = 1.5e-6
TIMETABLE_SHARE = 0.5
# the quicker start (``thorough=False``, the groups of a large cluster) routes only the paced
# timetable from this many nodes: on the groups of 69-103 nodes of a 1,000-node cluster the
# unpaced one never won and took a quarter of the planning (106 -> 78 CPU s, the same plan),
# while groups of 20-40 nodes plan better with both (300 nodes in 30 sites: 59.82 s, 60.70 s)
PACED_ONLY_NODES = 50
# seconds per ``timetable.estimated_work`` unit on clusters of 12-32 nodes (measured 1.5-7.1 us):
# the first runs go side by side only where their estimate is worth the workers (``pool.map_calls``)
TIMETABLE_S_PER_WORK_SMALL = 4e-6
# how much a restart may perturb a path's end time when choosing (a factor up to 1 + this)
TIMETABLE_NOISE = 0.1


def timetable_candidates(
    problem: Problem, cands: list[Candidate], seed: int, evaluators: dict[int, Evaluator], limits: SearchLimits,
    thorough: bool = True,
) -> list[Candidate]:
    """The best timetable routing (``routing.timetable``), with its processing orders: on each
    of the ``TIMETABLE_ALLOCATIONS`` allocations of the best candidates in ``cands``
    (``evaluators``: by ``id`` of the stages), unpaced and paced; then ``TIMETABLE_RESTARTS``
    with a perturbed path choice on the allocation and variant that did best. Above
    ``TIMETABLE_SMALL`` nodes: only where compute is uneven (where it was seen to help), on the
    best allocation only; above ``TIMETABLE_LARGEST`` nodes, the runs that fit the time
    (``_timetable_runs``). The packed allocation (``PACKED``) is timetabled too where those
    rules leave it out (sweep case 4150, 38 nodes: 39.78 s on it, 43.88 s without it). The work
    is charged to ``limits`` beyond ``TIMETABLE_FREE_WORK`` units (all of it above
    ``TIMETABLE_UNCHARGED`` nodes, and all of the packed allocation's where the rules leave it
    out).
    ``thorough=False``: as above ``TIMETABLE_SMALL`` nodes at any size, and from
    ``PACED_ONLY_NODES`` nodes the paced timetable only."""
    small = _small(problem, thorough)
    if not small and problem.even_compute:
        return []
    best: tuple[Candidate, bool] | None = None
    work, packed_work = [0], [0]
    runs = first_runs(problem, cands, thorough)
    # these runs are independent: side by side in the planning workers, kept in this order
    estimate = TIMETABLE_S_PER_WORK_SMALL * sum(estimated_work(problem, cand.stages, stage_orders(problem, cand.stages))
                                                for cand, _, _ in runs)
    routed = map_calls(_routed, [(problem, cand.stages, paced) for cand, paced, _ in runs], estimate)
    for (cand, paced, beyond), (out, done) in zip(runs, routed):
        (packed_work if beyond else work)[0] += done
        got = _timed(cand, evaluators, out, paced)
        if got is not None and (best is None or got.score < best[0].score):
            best = (got, paced)
    rng = random.Random(seed)
    for _ in range(TIMETABLE_RESTARTS if small and best is not None else 0):
        out, done = _routed(problem, best[0].stages, best[1], rng)
        work[0] += done
        got = _timed(best[0], evaluators, out, best[1])
        if got is not None and got.score < best[0].score:
            best = (got, best[1])
    if problem.n <= TIMETABLE_UNCHARGED:
        per_sim = TIMETABLE_WORK_PER_NODE_SMALL * problem.n
        limits.spent += max(0, work[0] - TIMETABLE_FREE_WORK) // per_sim + packed_work[0] // per_sim
    else:
        limits.spent += (work[0] + packed_work[0]) // (TIMETABLE_WORK_PER_NODE * problem.n)
    return [best[0]] if best is not None else []


def first_runs(problem: Problem, cands: list[Candidate], thorough: bool) -> list[tuple[Candidate, bool, bool]]:
    """The first timetable routings of ``timetable_candidates``, in order: (the candidate on
    whose allocation, paced, beyond the allocations whose work is counted as free)."""
    small = _small(problem, thorough)
    variants = (False, True) if thorough or problem.n < PACED_ONLY_NODES else (True,)  # unpaced, paced
    seen: list[list[list[int]]] = []
    runs: list[tuple[Candidate, bool, bool]] = []
    for cand in sorted(cands, key=lambda c: c.score.key()):
        beyond = len(seen) >= (TIMETABLE_ALLOCATIONS if small else 1)
        if cand.stages in seen or (beyond and cand.name != PACKED):
            continue
        seen.append(cand.stages)
        runs += [(cand, paced, beyond) for paced in variants[:_timetable_runs(problem, cand.stages)]]
    return runs


def _timetable_runs(problem: Problem, stages: list[list[int]]) -> int:
    """How many timetables (0-2: unpaced, then paced) are routed on ``stages``: both up to
    ``TIMETABLE_LARGEST`` nodes, above that as many as fit ``TIMETABLE_SHARE`` of the
    planning-time target (each ``TIMETABLE_S_PER_WORK`` x its ``estimated_work``)."""
    if problem.n <= TIMETABLE_LARGEST:
        return 2
    one = TIMETABLE_S_PER_WORK * estimated_work(problem, stages, stage_orders(problem, stages))
    return min(2, int(TIMETABLE_SHARE * planning_target_s(problem.n) / one))


def _small(problem: Problem, thorough: bool) -> bool:
    """Whether the timetables go on two allocations and restart (``TIMETABLE_SMALL``)."""
    return thorough and problem.n <= TIMETABLE_SMALL


def _routed(problem: Problem, stages: list[list[int]], paced: bool, rng: random.Random | None = None
            ) -> tuple[Timetable | None, int]:
    """A timetable routing of ``stages`` (its path choice perturbed by ``rng`` where given) and
    its work units (also a call for ``map_calls``)."""
    work = [0]
    out = timetable_routes(problem, stages, problem.load_caps(stages), stage_orders(problem, stages), rng,
                           TIMETABLE_NOISE if rng is not None else 0.0, work, paced)
    return out, work[0]


def _timed(start: Candidate, evaluators: dict[int, Evaluator], out: Timetable | None, paced: bool) -> Candidate | None:
    """The candidate of a timetable routing ``out`` on ``start``'s allocation, scored with its orders."""
    if out is None:
        return None
    stages = start.stages
    name = start.name if start.timed else f"timetable{' (paced)' if paced else ''} ({start.name})"
    return Candidate(name, stages, out.routes, evaluators[id(stages)].score(out.routes, out.orders), out.orders, timed=True)
