"""Chain candidates kept with their processing orders (``planner.routing.ordered``)."""

from __future__ import annotations

from skippipe.cluster_gen import single_site_cluster
from skippipe.planner.allocation import allocate
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.planner.routing.candidates import PRIVATE_CHAINS, Candidate, stage_orders
from skippipe.planner.routing.evaluate import Evaluator
from skippipe.planner.routing.ordered import (
    CHAIN_CANDIDATES,
    CHAIN_ORDER_OPS,
    CHAIN_ORDER_SIMS,
    chain_order_sims,
    ordered_chains,
)
from skippipe.planner.routing.schedule import build_plan
from skippipe.planner.routing.search import RouteSearch
from skippipe.planner.routing.static import chain_candidate
from skippipe.workload import Workload


def _chains(seed: int):
    """The suite's single-site cluster (18 equal nodes, S = 4, L = 3): six data nodes, each
    with a private chain of two nodes."""
    problem = build_problem(single_site_cluster(18), Workload(num_stages=4, path_length=3))
    stages = allocate(problem, seed=seed)
    caps, seqs = problem.load_caps(stages), stage_orders(problem, stages)
    routes = chain_candidate(problem, stages, caps, seqs, None)
    ev = Evaluator(problem, stages)
    cand = Candidate(PRIVATE_CHAINS, stages, routes, ev.score(routes))

    def make_search(c, limits):
        return RouteSearch(ev, c.stages, caps, seqs, seed, limits)

    return problem, cand, make_search


def test_a_chain_candidate_is_kept_with_its_orders():
    problem, cand, make_search = _chains(seed=1)
    assert len({d for d, _ in cand.routes}) == 6 and all(len(set(p)) == 2 for _, p in cand.routes)
    (ordered,) = ordered_chains([cand], make_search, lead=cand.score.makespan)
    assert ordered.timed and ordered.name == f"{PRIVATE_CHAINS} (ordered)"
    assert ordered.routes == cand.routes  # the paths stay the chains
    assert ordered.score < cand.score  # first come, first served 66.60 s
    plan = build_plan(problem, cand.stages, ordered.routes, "skippipe", 1, ordered.orders)
    assert abs(plan.predicted_makespan_s - ordered.score.makespan) < 1e-9  # the simulator follows the orders


def test_only_promising_chain_candidates_are_ordered():
    _, cand, make_search = _chains(seed=1)
    assert "balanced" not in CHAIN_CANDIDATES
    other = Candidate("balanced", cand.stages, cand.routes, cand.score)
    assert ordered_chains([other], make_search, lead=cand.score.makespan) == []
    assert ordered_chains([cand], make_search, lead=cand.score.makespan / 1.2) == []  # 20 % behind the best


def test_skippipe_is_no_worse_than_its_chains_with_their_orders():
    """Planner seed 1 used to let the path search trade the chains for mixed paths that ended
    at 65.79 s once ordered; the chains with their orders take at most 64.25 s."""
    problem, cand, make_search = _chains(seed=1)
    (ordered,) = ordered_chains([cand], make_search, lead=cand.score.makespan)
    plan = make_plan("skippipe", problem, seed=1)
    assert plan.predicted_makespan_s <= ordered.score.makespan + 1e-9


def test_the_chain_order_search_is_shorter_only_with_many_microbatches():
    """Up to 96 microbatches per data node of L = 4 (9 operations each) a chain's orders get
    every simulation; beyond, as many as keep the operations simulated within the same total
    (with 400 microbatches, 2,000 simulations took 55 s of a profiled planning of 105 s)."""
    assert chain_order_sims(6 * 9) == chain_order_sims(96 * 9) == CHAIN_ORDER_SIMS
    assert chain_order_sims(192 * 9) == CHAIN_ORDER_SIMS // 2
    assert chain_order_sims(1000 * 9) * 1000 * 9 <= CHAIN_ORDER_OPS < (chain_order_sims(1000 * 9) + 1) * 1000 * 9
