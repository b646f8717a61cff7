"""Processing orders along the critical path (``planner.routing.critical_orders``)."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from skippipe.cluster_gen import random_global_cluster, single_site_cluster
from skippipe.errors import UserError
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.planner.routing.candidates import stage_orders
from skippipe.planner.routing.critical_orders import _moved, block_moves, critical_orders, critical_walk
from skippipe.planner.routing.evaluate import Evaluator, Incremental
from skippipe.planner.routing.search import RouteSearch, SearchLimits
from skippipe.sim import simulate
from skippipe.workload import Workload


def _random_routing(cluster, stages: int, length: int, seed: int, budget: int = 400):
    """A random plan's routes on ``cluster``, its evaluator and a search over them."""
    problem = build_problem(cluster, Workload(num_stages=stages, path_length=length))
    try:
        plan = make_plan("random", problem, seed=seed)
    except UserError:  # a random plan that deadlocks on its slots
        assume(False)
    routes = [(m.data_node, tuple(m.path)) for m in plan.microbatches]
    ev = Evaluator(problem, plan.stages)
    search = RouteSearch(ev, plan.stages, problem.load_caps(plan.stages), stage_orders(problem, plan.stages), seed,
                         SearchLimits(budget=budget))
    comp = max(ev.components(routes), key=len)
    return problem, plan.stages, routes, ev, search, comp


def _score(ev, routes, comp, orders):
    return Incremental._combine({0: ev.component_finish(routes, comp, orders)})


clusters = st.builds(
    lambda n, seed, site, mem: (single_site_cluster(n, seed, speed=(0.5, 2.0), memory=(1, mem)) if site else
                                random_global_cluster(n, seed, sites=3, speed=(0.5, 2.0), memory=(1, mem))),
    st.integers(8, 14), st.integers(0, 10_000), st.booleans(), st.integers(1, 4),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters, seed=st.integers(0, 100))
def test_the_critical_walk_is_a_chain_of_operations_that_ends_the_schedule(cluster, seed):
    _, _, routes, ev, search, comp = _random_routing(cluster, 4, 3, seed)
    orders = ev.realized_orders(routes, comp)
    walk = critical_walk(search, routes, comp, orders)
    finish = _score(ev, routes, comp, orders).makespan
    assert abs(walk.ops[-1].end - finish) < 1e-9  # it ends with the last operation
    for a, b in zip(walk.ops, walk.ops[1:]):
        assert b.start >= a.end - 1e-9  # each starts after the one before it ends
        if b.node == a.node and b.mb != a.mb:  # waited for its node: a is the node's operation just before
            served = orders[walk.nodes[a.node]]
            assert served.index(f"{b.kind}{b.mb}") == served.index(f"{a.kind}{a.mb}") + 1
        else:  # a is its microbatch's operation just before: b started as it arrived
            assert b.mb == a.mb and abs(b.start - b.ready) < 1e-9


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters, seed=st.integers(0, 100))
def test_critical_orders_never_end_later_and_the_simulator_follows_them(cluster, seed):
    _, _, routes, ev, search, comp = _random_routing(cluster, 5, 3, seed)
    start = _score(ev, routes, comp, None)
    orders, score = critical_orders(search, routes, comp, ev.realized_orders(routes, comp), start, 200)
    assert not start < score
    assert search.limits.spent <= 200 + 2  # a walk or a score past the budget's end at most
    nodes = {x for i in comp for x in (routes[i][0], *routes[i][1])}
    assert set(orders) >= nodes  # every node of the component listed
    plan, _ = ev.subplan(routes, comp, orders)  # the plan simulator, not the planner's scoring
    assert abs(simulate(plan, bound=False).makespan_s - score.makespan) < 1e-9


def test_a_block_move_keeps_every_operation_once():
    seq = ["F1", "F2", "B1", "F3", "B2", "B3"]
    assert _moved(seq, "F2", "F3", "swap") == ["F1", "F3", "B1", "F2", "B2", "B3"]
    assert _moved(seq, "F3", "F1", "before") == ["F3", "F1", "F2", "B1", "B2", "B3"]
    assert _moved(seq, "F1", "B1", "after") == ["F2", "B1", "F1", "F3", "B2", "B3"]


def test_critical_orders_shorten_a_schedule_that_first_come_first_served_leaves_long():
    """Uneven nodes (0.5-2x, 1-4 slots) of one site, a random routing: the moves on the
    critical path find a shorter schedule within 300 simulations."""
    _, _, routes, ev, search, comp = _random_routing(single_site_cluster(12, 3, speed=(0.5, 2.0), memory=(1, 4)),
                                                     5, 3, seed=0)
    start = _score(ev, routes, comp, None)
    walk = critical_walk(search, routes, comp, ev.realized_orders(routes, comp))
    assert block_moves(walk)
    _, score = critical_orders(search, routes, comp, ev.realized_orders(routes, comp), start, 300)
    assert score.makespan < start.makespan - 0.1
