"""Private chains where not every data node can have one: the data nodes left over are routed
over the free nodes, at most one chain node per microbatch, on few chains."""

from __future__ import annotations

from skippipe.cluster_gen import single_site_cluster
from skippipe.planfile import Microbatch, plan_violations
from skippipe.planner.problem import build_problem
from skippipe.planner.routing.evaluate import Evaluator
from skippipe.planner.routing.groups import private_chain_sets
from skippipe.planner.routing.schedule import _allocation, stage_orders
from skippipe.planner.routing.static import _chain_routing, _gathered_leftovers, chain_candidate
from skippipe.workload import Workload


def _setting():
    # one site, 44 nodes, S = 9, L = 5: 9 data nodes and 35 others, so 8 chains of 4 at most
    problem = build_problem(single_site_cluster(44, 0), Workload(num_stages=9, path_length=5))
    stages = _allocation(problem, 0, None)
    caps = problem.load_caps(stages)
    seqs = stage_orders(problem, stages)
    return problem, stages, caps, seqs, private_chain_sets(problem, stages, caps, seqs)


def test_the_quota_gives_chains_the_greedy_left_out():
    # the greedy takes the cheapest stage orders first and strands stages the jump rule cannot
    # reach; chain_quota's counts give 8 of the 9 data nodes a chain
    *_, sets = _setting()
    assert [len(chains) for chains in sets] == [5, 8]


def test_leftovers_take_one_chain_node_per_microbatch_on_few_chains():
    problem, stages, caps, seqs, sets = _setting()
    chains = max(sets, key=len)
    routes = _gathered_leftovers(problem, stages, caps, seqs, chains)
    assert routes is not None
    owner = {x: d for d, chain in chains.items() for x in chain}
    left = [d for d in stages[0] if d not in chains]
    foreign = [[owner[x] for x in path if x in owner] for d, path in routes if d in left]
    assert len(left) == 1 and len(foreign) == problem.workload.microbatches_per_data_node
    assert all(len(visits) <= 1 for visits in foreign)
    assert len({d for visits in foreign for d in visits}) <= 3  # gathered: not one chain per visit
    assert all(list(path) == chains[d] for d, path in routes if d in chains)
    plan = problem.make_plan(stages, [Microbatch(i, d, list(path)) for i, (d, path) in enumerate(routes)], "test", 0)
    assert not plan_violations(plan)


def test_the_candidate_beats_the_greedy_chains_with_the_rest_routed_statically():
    # what chain_candidate gave before: the greedy's 5 chains, 4 data nodes routed over the
    # capacity left (80.59 s first come, first served); now 8 chains and one gathered (57.20 s)
    problem, stages, caps, seqs, sets = _setting()
    ev = Evaluator(problem, stages)
    before = ev.score(_chain_routing(problem, stages, caps, dict(min(sets, key=len)))).makespan
    after = ev.score(chain_candidate(problem, stages, caps, seqs, None, ev.score)).makespan
    assert after < 0.8 * before
