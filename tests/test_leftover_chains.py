"""Private chains where not every data node can have one: the data nodes left over are routed
over the free nodes, at most one chain node per microbatch, on few chains."""

from __future__ import annotations

from unittest import mock

import numpy as np

from skippipe.cluster_gen import single_site_cluster
from skippipe.planfile import Microbatch, plan_violations
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import static
from skippipe.planner.routing.evaluate import Evaluator
from skippipe.planner.routing.groups import NEAR_QUOTAS, chain_quota, near_chain_quotas, private_chain_sets
from skippipe.planner.routing.schedule import _allocation, stage_orders
from skippipe.planner.routing.static import (
    _chain_routing,
    _free_visits_suffice,
    _gathered_leftovers,
    _residual,
    chain_candidate,
)
from skippipe.workload import Workload
from toy_plans import consecutive_stages


def _setting():
    # one site, 44 nodes, S = 9, L = 5: 9 data nodes and 35 others, so 8 chains of 4 at most
    problem = build_problem(single_site_cluster(44, 0), Workload(num_stages=9, path_length=5))
    stages = _allocation(problem, 0, None)
    caps = problem.load_caps(stages)
    seqs = stage_orders(problem, stages)
    return problem, stages, caps, seqs, private_chain_sets(problem, stages, caps, seqs)


def test_the_quota_gives_chains_the_greedy_left_out():
    # the greedy takes the cheapest stage orders first and strands stages the jump rule cannot
    # reach; chain_quota's counts give 8 of the 9 data nodes a chain (and the near chains' too)
    *_, sets = _setting()
    assert len(sets[0]) == 5 and len(sets) >= 2 and all(len(chains) == 8 for chains in sets[1:])


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


def test_the_near_chain_quotas_leave_the_free_nodes_a_path_with_one_chain_node():
    # 44 nodes, stages of 9, 4, 4, 4, 4, 4, 5, 5, 5: 8 chains of 4 take 32 of the 35 others;
    # every near-chain count keeps 8 chains and leaves a usable node free in every stage of
    # its set, so the data node left over can go through three free nodes and one chain node
    sizes = [9, 4, 4, 4, 4, 4, 5, 5, 5]
    stages = consecutive_stages(sizes)
    problem = build_problem(single_site_cluster(44, 0), Workload(num_stages=9, path_length=5, stage_sizes=tuple(sizes)))
    seqs = stage_orders(problem, stages)
    usable = np.ones(problem.n, dtype=bool)
    quota = chain_quota(stages, usable, seqs, 9)
    assert sum(quota.values()) == 8
    near = near_chain_quotas(stages, usable, seqs, 9, quota)
    assert 2 <= len(near) <= NEAR_QUOTAS
    for counts in near:
        assert sum(counts.values()) == 8
        free = [len(stages[s]) - sum(c for seq, c in counts.items() if s in seq) for s in range(1, 9)]
        assert sum(free) == 3 and max(free) == 1
        assert any(all(free[s - 1] for i, s in enumerate(seq) if i != t) for seq in seqs for t in range(4))


def test_the_near_chains_route_the_leftover_where_the_plain_quota_could_not():
    # same cluster: the candidate is the quickest gathered routing of the near-chain sets
    # (58.26 s first come, first served); before them the free nodes of the quota's chains
    # lay in no near chain, no routing was gathered and the candidate was the greedy's four
    # chains with the rest routed statically (86.84 s)
    sizes = [9, 4, 4, 4, 4, 4, 5, 5, 5]
    stages = consecutive_stages(sizes)
    problem = build_problem(single_site_cluster(44, 0), Workload(num_stages=9, path_length=5, stage_sizes=tuple(sizes)))
    caps = problem.load_caps(stages)
    seqs = stage_orders(problem, stages)
    ev = Evaluator(problem, stages)
    sets = private_chain_sets(problem, stages, caps, seqs)
    greedy = ev.score(_chain_routing(problem, stages, caps, dict(sets[0]))).makespan
    routes = chain_candidate(problem, stages, caps, seqs, None, ev.score)
    assert ev.score(routes).makespan < 0.75 * greedy
    paths: dict[int, set[tuple[int, ...]]] = {}
    for d, path in routes:
        paths.setdefault(d, set()).add(tuple(path))
    chain_nodes = {x for d, ps in paths.items() if len(ps) == 1 for x in next(iter(ps))}
    left = [d for d, ps in paths.items() if len(ps) > 1]
    assert len(left) == 1 and len(chain_nodes) == 32
    assert all(sum(x in chain_nodes for x in path) <= 1 for d, path in routes if d == left[0])
    plan = problem.make_plan(stages, [Microbatch(i, d, list(path)) for i, (d, path) in enumerate(routes)], "test", 0)
    assert not plan_violations(plan)


def test_leftovers_are_refused_at_once_only_where_the_gathering_would_fail():
    # the count of free visits is a necessary condition: wherever it refuses a chain set, the
    # gathering without it fails too (it found no routing after routing part of them)
    refused = 0
    for n, S, L, seed in [(24, 6, 6, 0), (24, 9, 5, 2), (36, 6, 4, 0), (44, 9, 5, 0)]:
        problem = build_problem(single_site_cluster(n, seed, speed=(0.5, 2.0)), Workload(num_stages=S, path_length=L))
        stages = _allocation(problem, 0, None)
        caps, seqs = problem.load_caps(stages), stage_orders(problem, stages)
        m = problem.workload.microbatches_per_data_node
        for chains in private_chain_sets(problem, stages, caps, seqs):
            rest = [d for d in stages[0] if d not in chains]
            owner = {x: d for d, chain in chains.items() for x in chain}
            left = np.asarray(_residual(caps, chains, m))
            if rest and not _free_visits_suffice(stages, owner, left, len(rest) * m, L - 1):
                refused += 1
                assert _gathered_leftovers(problem, stages, caps, seqs, chains) is None
                with mock.patch.object(static, "_free_visits_suffice", return_value=True):
                    assert _gathered_leftovers(problem, stages, caps, seqs, chains) is None
    assert refused >= 3
