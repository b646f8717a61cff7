"""Stages that route over fast links alone, by data-node set (``planner.routing.fast_allocation``)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_strategies import dealings, half_broken_problem
from skippipe.planner import methods
from skippipe.planner.problem import Problem
from skippipe.planner.routing.candidates import stage_orders
from skippipe.planner.routing.fast_allocation import fast_allocation, fast_stages
from skippipe.planner.routing.slow_links import min_cost_routing, slow_link_mask, uses_slow_link


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(6, 7), stages=st.integers(3, 4), length=st.integers(2, 4),
       m=st.integers(1, 3), swaps=st.integers(0, 1))
def test_a_set_is_feasible_exactly_when_some_allocation_with_it_routes_over_fast_links(seed, n, stages, length, m, swaps):
    problem = half_broken_problem(n, seed, stages, min(length, stages), m, swaps, jump=stages)
    slow = slow_link_mask(problem.transfer_s)
    if slow is None:
        return
    fast = ~slow
    sizes = list(problem.stage_sizes)
    seqs = stage_orders(problem, [[]] * stages)
    for data in itertools.islice(itertools.combinations(range(n), sizes[0]), 4):
        found = fast_stages(problem, data, seqs, fast)
        others = [x for x in range(n) if x not in data]
        some = any(min_cost_routing(problem, [list(data), *split], seqs, slow, integral=False, fast_only=True)
                   is not None for split in dealings(others, sizes[1:]))
        assert found.infeasible != (found.stages is not None)  # small programmes end either way
        assert (found.stages is not None) == some
        if found.stages is not None:
            assert found.stages[0] == list(data)
            assert [len(s) for s in found.stages] == sizes
            assert sorted(x for s in found.stages for x in s) == list(range(n))
            assert min_cost_routing(problem, found.stages, seqs, slow, integral=False, fast_only=True) is not None


def _stuck() -> Problem:
    # sweep case 4074: 11 nodes, one site each, half the links broken, one slot, S = L = 5, no
    # swap; the exchanges of two nodes' stages stopped with five microbatches on slow links
    return half_broken_problem(11, seed=4074, stages=5, length=5, m=6, swaps=0, jump=5)


def test_the_search_by_data_node_set_finds_fast_stages_the_exchanges_missed():
    problem = _stuck()
    slow = slow_link_mask(problem.transfer_s)
    start = [[3, 10], [0, 2, 8], [1, 5], [4, 6], [7, 9]]  # data nodes whose sets one exchange away route fast
    seqs = stage_orders(problem, start)
    assert min_cost_routing(problem, start, seqs, slow, integral=True, fast_only=True) is None
    found = fast_allocation(problem, start, seqs, slow)
    assert found is not None
    stages, paths = found
    assert len(set(stages[0]) & {3, 10}) == 1  # one exchange away
    routes = [(d, p) for d in stages[0] for p in paths[d]]
    assert len(routes) == 2 * 6 and not uses_slow_link(slow, routes)
    assert fast_allocation(problem, start, seqs, slow, work=1) is None  # no room for one programme


def test_skippipe_plans_the_stuck_cluster_over_fast_links():
    problem = _stuck()
    slow = slow_link_mask(problem.transfer_s)
    plan = methods.make_plan("skippipe", problem, seed=0)
    assert not uses_slow_link(slow, [(mb.data_node, tuple(mb.path)) for mb in plan.microbatches])
    assert plan.predicted_makespan_s < float(np.max(problem.transfer_s))
