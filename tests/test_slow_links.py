"""Routing around links that only trickle (``planner.routing.slow_links``)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from skippipe.cluster_gen import random_global_cluster
from skippipe.planfile import check_plan
from skippipe.planner import methods
from skippipe.planner.allocation import allocate, random_allocation
from skippipe.planner.allocation.stage_caps import largest_hold_per_slot
from skippipe.planner.problem import Problem, build_problem
from skippipe.planner.routing import candidates, slow_links
from skippipe.planner.routing.candidates import Candidate, remembered_dealings, slow_link_candidate, stage_orders
from skippipe.planner.routing.evaluate import Evaluator
from skippipe.planner.routing.pool import WORKERS_ENV, WorkerPool
from skippipe.planner.routing.schedule import build_plan
from skippipe.planner.routing.sequences import RouteCosts
from skippipe.planner.routing.slow_link_search import RenamedRelaxation, SwapWork, exchanged_stages, slow_link_allocation
from skippipe.planner.routing.slow_links import (
    DEALING_MAX_ARCS,
    _shape,
    arc_count,
    integral_paths,
    min_cost_routing,
    programme_s,
    programme_size,
    slow_link_cutoff,
    slow_link_mask,
    uses_slow_link,
)
from skippipe.planner.routing.static import static_routes
from skippipe.workload import Workload, least_max_jump


def _problem(n: int, seed: int, stages: int, length: int, m: int, swaps: int = 0, memory: int = 1) -> Problem:
    cluster = random_global_cluster(n, seed=seed, speed=(0.5, 2.0), memory=(memory, memory), broken=0.5)
    workload = Workload(num_stages=stages, path_length=length, microbatches_per_data_node=m, n_layers=3 * stages,
                        max_jump=max(least_max_jump(stages, length), 2), max_swaps=swaps)
    return build_problem(cluster, workload)


def _cheapest_by_brute_force(problem: Problem, stages: list[list[int]]) -> float:
    """Every choice of m paths per data node (with repeats) that keeps the TC1 caps."""
    seqs = stage_orders(problem, stages)
    rc = RouteCosts.from_problem(problem)
    caps = problem.load_caps(stages)
    m = problem.workload.microbatches_per_data_node
    choices = []
    for d in stages[0]:
        paths = [p for seq in seqs for p in itertools.product(*(stages[s] for s in seq))]
        choices.append([(d, combo) for combo in itertools.combinations_with_replacement(paths, m)])
    best = np.inf
    for pick in itertools.product(*choices):
        load = np.zeros(problem.n, dtype=int)
        cost = 0.0
        for d, combo in pick:
            for p in combo:
                load[list(p)] += 1
                cost += rc.round_trip(d, p) - rc.own[d]
        if all(load[x] <= caps[x] for s in stages[1:] for x in s):
            best = min(best, cost)
    return float(best)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(5, 7), stages=st.integers(3, 4), length=st.integers(2, 3),
       m=st.integers(1, 2), swaps=st.integers(0, 1))
def test_the_integer_routing_is_the_cheapest_within_the_caps(seed, n, stages, length, m, swaps):
    length = min(length, stages)
    problem = _problem(n, seed, stages, length, m, swaps)
    alloc = random_allocation(problem, np.random.default_rng(seed))
    if len(alloc[0]) * m > 2 and len(alloc[0]) > 1:
        m = 1  # keeps the brute force small: two data nodes route one microbatch each
        problem = _problem(n, seed, stages, length, m, swaps)
        alloc = random_allocation(problem, np.random.default_rng(seed))
    seqs = stage_orders(problem, alloc)
    slow = slow_link_mask(problem.transfer_s)
    exact = min_cost_routing(problem, alloc, seqs, slow, integral=True)
    brute = _cheapest_by_brute_force(problem, alloc)
    if exact is None:
        assert brute == np.inf
        return
    assert abs(exact.cost - brute) <= 1e-6 * max(1.0, brute)
    relaxed = min_cost_routing(problem, alloc, seqs, slow, integral=False)
    assert relaxed is not None and relaxed.cost <= exact.cost + 1e-6
    # the paths read back from the flows: m valid paths per data node, caps kept, same cost
    rc = RouteCosts.from_problem(problem)
    caps = problem.load_caps(alloc)
    load = np.zeros(problem.n, dtype=int)
    stage_of = {x: k for k, s in enumerate(alloc) for x in s}
    total = 0.0
    for d in alloc[0]:
        assert len(exact.paths[d]) == m
        for p in exact.paths[d]:
            assert tuple(stage_of[x] for x in p) in seqs
            load[list(p)] += 1
            total += rc.round_trip(d, p) - rc.own[d]
    assert all(load[x] <= caps[x] for x in range(problem.n) if stage_of[x] > 0)
    assert abs(total - exact.cost) <= 1e-6 * max(1.0, total)


def test_slow_links_are_those_above_a_jump_in_the_link_costs():
    t = np.array([[0, 1, 2, 100], [1, 0, 1.5, 2], [2, 1.5, 0, 1], [100, 2, 1, 0]], dtype=float)
    assert slow_link_cutoff(t) == 2.0
    slow = slow_link_mask(t)
    assert slow.tolist() == (np.maximum(t, t.T) > 2.0).tolist() and slow[0, 3] and slow[3, 0]
    assert uses_slow_link(slow, [(1, (3, 0))])  # the hop back from 0 to 3
    assert not uses_slow_link(slow, [(0, (1, 2)), (1, (3, 2))])
    no_jump = np.array([[0, 1, 5], [1, 0, 2], [5, 2, 0]], dtype=float)
    assert slow_link_cutoff(no_jump) is None and slow_link_mask(no_jump) is None


def test_the_allocation_search_leaves_the_slow_links_when_it_can():
    # 11 nodes, one site each, half of the links broken, one slot per node, S = 9 (sweep case 15)
    problem = _problem(11, seed=15, stages=9, length=4, m=4)
    slow = slow_link_mask(problem.transfer_s)
    assert slow is not None
    seqs = stage_orders(problem, [[]] * 9)
    rng = np.random.default_rng(0)
    start = next(a for a in (random_allocation(problem, rng) for _ in range(50))
                 if min_cost_routing(problem, a, seqs, slow, integral=False).slow_nodes)
    stages, paths = slow_link_allocation(problem, start, seqs, slow)
    assert [len(s) for s in stages] == [len(s) for s in start]
    assert sorted(x for s in stages for x in s) == list(range(problem.n))
    routes = [(d, p) for d in stages[0] for p in paths[d]]
    assert len(routes) == len(stages[0]) * 4
    assert not uses_slow_link(slow, routes)
    fast = min_cost_routing(problem, stages, seqs, slow, integral=True, fast_only=True)
    assert fast is not None and not fast.slow_nodes


def test_skippipe_plans_around_slow_links():
    problem = _problem(11, seed=15, stages=9, length=4, m=4)
    slow = slow_link_mask(problem.transfer_s)
    plan = methods.make_plan("skippipe", problem, seed=0)
    check_plan(plan)
    routes = [(mb.data_node, tuple(mb.path)) for mb in plan.microbatches]
    assert not uses_slow_link(slow, routes)
    assert plan.predicted_makespan_s < float(np.max(problem.transfer_s))  # less than one slow hop



def _few_slot_problem(n: int, seed: int, sites: int | None, stages: int, length: int, jump: int, swaps: int) -> Problem:
    """Sweep-like: 20 % of the links broken, compute 0.5-2x, 1-3 slots per node, L close to S."""
    cluster = random_global_cluster(n, seed=seed, sites=sites, speed=(0.5, 2.0), memory=(1, 3), broken=0.2)
    workload = Workload(num_stages=stages, path_length=length, microbatches_per_data_node=8, n_layers=3 * stages,
                        max_jump=jump, max_swaps=swaps)
    return build_problem(cluster, workload)


def _start(problem: Problem) -> Candidate:
    stages = allocate(problem, seed=0)
    routes = static_routes(problem, stages)
    return Candidate("no-tc2", stages, routes, Evaluator(problem, stages).score(routes))


def test_the_slow_link_search_also_starts_from_the_memory_dealings():
    # sweep case 94: 15 nodes in 3 sites, S = 9, L = 8; the exchanges that leave the slow links
    # from the best start leave one-slot nodes early in the paths, where a visit holds its slot
    # for the rest of the round trip
    problem = _few_slot_problem(15, seed=94, sites=3, stages=9, length=8, jump=3, swaps=0)
    slow = slow_link_mask(problem.transfer_s)
    start = _start(problem)
    assert uses_slow_link(slow, start.routes)
    found = slow_link_candidate(problem, [start], remembered_dealings(problem))
    assert found is not None
    cand, ev = found
    assert not uses_slow_link(slow, cand.routes)
    assert ev.score(cand.routes).makespan == cand.score.makespan
    stages, paths = slow_link_allocation(problem, start.stages, stage_orders(problem, start.stages), slow)
    alone = Evaluator(problem, stages).score([(d, p) for d in stages[0] for p in paths[d]])
    assert cand.score.makespan < alone.makespan
    assert largest_hold_per_slot(problem, cand.stages) < largest_hold_per_slot(problem, stages)


def test_the_searches_from_several_allocations_find_the_same_in_workers_or_here(monkeypatch):
    """The searches of one start (the best start and its memory dealings) run side by side in
    the planning workers: the same candidate and the same estimate of their programmes."""
    problem = _few_slot_problem(15, seed=94, sites=3, stages=9, length=8, jump=3, swaps=0)
    start = _start(problem)
    dealings = remembered_dealings(problem)
    assert len(dealings(start.stages)) >= 1  # with the start: two searches or more
    forked = []

    class Pool(WorkerPool):
        def start(self) -> bool:
            forked.append(super().start())
            return forked[-1]

    monkeypatch.setattr(candidates, "WorkerPool", Pool)
    found = {}
    for count in ("1", "2"):
        monkeypatch.setenv(WORKERS_ENV, count)
        work = SwapWork()
        cand, _ = slow_link_candidate(problem, [start], dealings, work)
        found[count] = (cand.name, cand.stages, cand.routes, cand.score.makespan, work.spent_s)
        assert any(forked) == (count == "2")
    assert found["1"] == found["2"]
    assert found["1"][-1] > 0.0


def test_memory_dealings_that_need_slow_links_are_searched_too():
    # sweep case 81: 23 nodes, one site each, S = 8, L = 7; the best start keeps to fast links,
    # the memory orders (dealt without the network) cross slow links and had no candidate
    problem = _few_slot_problem(23, seed=81, sites=None, stages=8, length=7, jump=4, swaps=1)
    slow = slow_link_mask(problem.transfer_s)
    start = _start(problem)
    assert not uses_slow_link(slow, start.routes)
    found = slow_link_candidate(problem, [start], remembered_dealings(problem))
    assert found is not None
    cand, _ = found
    assert not uses_slow_link(slow, cand.routes)
    assert cand.score.makespan < start.score.makespan
    assert largest_hold_per_slot(problem, cand.stages) < largest_hold_per_slot(problem, start.stages)
    check_plan(build_plan(problem, cand.stages, cand.routes, "skippipe", 0))


def test_memory_dealings_above_the_integer_limit_are_kept_where_the_relaxation_is_integral():
    # sweep case 4135: 42 nodes in 5 sites, half of the links broken, even compute, S = 7, L = 4:
    # the best start keeps to fast links; its memory dealings need them and have 5,250 arcs, so
    # no integer programme is solved (left out entirely before: the plan was 32.74 s, now 27.15 s)
    cluster = random_global_cluster(42, seed=4135, sites=5, memory=(1, 3), broken=0.5)
    workload = Workload(num_stages=7, path_length=4, microbatches_per_data_node=2, n_layers=21, max_jump=2,
                        max_swaps=1)
    problem = build_problem(cluster, workload)
    slow = slow_link_mask(problem.transfer_s)
    start = _start(problem)
    assert not uses_slow_link(slow, start.routes)
    dealt = remembered_dealings(problem)(start.stages)
    assert all(arc_count(d, stage_orders(problem, d)) > DEALING_MAX_ARCS for d in dealt.values())
    found = slow_link_candidate(problem, [start], remembered_dealings(problem))
    assert found is not None
    cand, _ = found
    assert cand.score.makespan < start.score.makespan
    check_plan(build_plan(problem, cand.stages, cand.routes, "skippipe", 0))
    # the routing kept is an optimal integer one: its relaxation is integral and costs the same
    seqs = stage_orders(problem, cand.stages)
    exact = min_cost_routing(problem, cand.stages, seqs, slow, integral=True)
    loose = min_cost_routing(problem, cand.stages, seqs, slow, integral=False)
    assert integral_paths(problem, cand.stages, seqs, loose.flow) is not None
    assert abs(loose.cost - exact.cost) <= 1e-6 * exact.cost


def _drawn_allocation(problem: Problem, slow: np.ndarray, integral: bool):
    """The first of 40 random allocations whose relaxation is integral (and crosses a slow
    link) or not, with its stage orders and relaxation."""
    rng = np.random.default_rng(1)
    for _ in range(40):
        alloc = random_allocation(problem, rng)
        seqs = stage_orders(problem, alloc)
        loose = min_cost_routing(problem, alloc, seqs, slow, integral=False)
        if loose is not None and (integral_paths(problem, alloc, seqs, loose.flow) is not None) == integral \
                and (loose.slow_nodes or not integral):
            return alloc, seqs
    raise AssertionError(f"no allocation with {'an integral' if integral else 'a fractional'} relaxation")


def test_above_the_integer_limit_a_fractional_relaxation_gives_no_routing():
    problem = _problem(16, seed=3, stages=6, length=4, m=4, swaps=1, memory=2)
    slow = slow_link_mask(problem.transfer_s)
    alloc, seqs = _drawn_allocation(problem, slow, integral=False)
    frozen = dataclasses.replace(problem, cluster=dataclasses.replace(problem.cluster, stages=alloc))
    assert slow_link_allocation(frozen, alloc, seqs, slow, integer_arcs=0) is None
    found = slow_link_allocation(frozen, alloc, seqs, slow)
    assert found is not None and found[0] == alloc


def test_an_integral_relaxation_is_kept_without_the_integer_programme(monkeypatch):
    problem = _problem(16, seed=3, stages=6, length=4, m=4, swaps=1, memory=2)
    slow = slow_link_mask(problem.transfer_s)
    alloc, seqs = _drawn_allocation(problem, slow, integral=True)
    exact = min_cost_routing(problem, alloc, seqs, slow, integral=True)
    frozen = dataclasses.replace(problem, cluster=dataclasses.replace(problem.cluster, stages=alloc))

    def no_integer_programme(*args, **kwargs):
        raise AssertionError("the integer programme was solved")

    monkeypatch.setattr(slow_links, "milp", no_integer_programme)
    work = SwapWork()
    found = slow_link_allocation(frozen, alloc, seqs, slow, work)
    assert found is not None and found[0] == alloc
    rc = RouteCosts.from_problem(problem)
    paths = found[1]
    assert sorted(paths) == sorted(alloc[0]) and all(len(paths[d]) == problem.workload.microbatches_per_data_node
                                                    for d in alloc[0])
    cost = sum(rc.round_trip(d, p) - rc.own[d] for d in paths for p in paths[d])
    assert abs(cost - exact.cost) <= 1e-6 * exact.cost  # an optimal integer routing
    assert work.spent_s == pytest.approx(programme_s(alloc, seqs))  # one relaxation, no integer programme charged


def test_the_programme_is_built_once_per_stage_sizes_and_renamed():
    # 12 nodes, S = 9, L = 5, two swaps: 185 stage orders, one graph of 27 states
    cluster = random_global_cluster(12, seed=4053, speed=(0.5, 2.0), memory=(1, 3), broken=0.5)
    problem = build_problem(cluster, Workload(num_stages=9, path_length=5, microbatches_per_data_node=3, n_layers=27,
                                              max_jump=5, max_swaps=2))
    slow = slow_link_mask(problem.transfer_s)
    rng = np.random.default_rng(0)
    alloc = random_allocation(problem, rng)
    seqs = stage_orders(problem, alloc)
    per_order = len(alloc[0]) * sum(
        sum(a * b for a, b in zip([1, *(len(alloc[s]) for s in seq)], [*(len(alloc[s]) for s in seq), 1])) for seq in seqs)
    arcs, rows = programme_size(alloc, seqs)
    assert len(seqs) == 185 and arcs * 5 < per_order
    before = _shape.cache_info().misses
    first = min_cost_routing(problem, alloc, seqs, slow, integral=True)
    # the same nodes in the same stages, listed in another order: the same programme, renamed
    shuffled = [list(rng.permutation(s)) for s in alloc]
    again = min_cost_routing(problem, shuffled, seqs, slow, integral=True)
    other = min_cost_routing(problem, random_allocation(problem, rng), seqs, slow, integral=False)
    assert _shape.cache_info().misses - before <= 1
    assert first is not None and again is not None and other is not None
    assert abs(first.cost - again.cost) <= 1e-9 * first.cost
    stage_of = {x: k for k, s in enumerate(alloc) for x in s}
    for d, paths in again.paths.items():
        assert stage_of[d] == 0 and len(paths) == 3
        assert all(tuple(stage_of[x] for x in p) in seqs for p in paths)


_RELAXATIONS = dict(seed=st.integers(0, 10_000), n=st.integers(7, 11), stages=st.integers(3, 5),
                    length=st.integers(2, 3), m=st.integers(1, 4), swaps=st.integers(0, 1))


@dataclasses.dataclass
class _Relaxed:
    """A random allocation of a broken-link cluster, its relaxation and what judges its exchanges."""

    problem: Problem
    alloc: list[list[int]]
    seqs: tuple
    slow: np.ndarray
    own: np.ndarray
    value: float  # the relaxation, the data nodes' own compute included
    renamed: RenamedRelaxation
    where: dict[int, int]

    def exchanges(self):
        """(a, b, the allocation after their exchange) for every two nodes of different stages."""
        for a, b in itertools.combinations(range(self.problem.n), 2):
            if self.where[a] != self.where[b]:
                yield a, b, exchanged_stages(self.alloc, a, b, self.where)

    def relaxed(self, stages: list[list[int]]) -> float | None:
        """The relaxation of ``stages``, the data nodes' own compute included (None: no routing)."""
        there = min_cost_routing(self.problem, stages, self.seqs, self.slow, integral=False)
        return None if there is None else there.cost + float(self.own[stages[0]].sum())


def _relaxed(seed: int, n: int, stages: int, length: int, m: int, swaps: int) -> _Relaxed:
    problem = _problem(n, seed, stages, min(length, stages), m, swaps)
    alloc = random_allocation(problem, np.random.default_rng(seed))
    seqs = stage_orders(problem, alloc)
    slow = slow_link_mask(problem.transfer_s)
    own = RouteCosts.from_problem(problem).own * m
    here = min_cost_routing(problem, alloc, seqs, slow, integral=False)
    assume(here is not None)  # no routing within the caps
    where = {v: k for k, s in enumerate(alloc) for v in s}
    return _Relaxed(problem, alloc, seqs, slow, own, here.cost + float(own[alloc[0]].sum()),
                    RenamedRelaxation(problem, alloc, seqs, here, own), where)


@settings(max_examples=12, deadline=None)
@given(**_RELAXATIONS)
def test_a_renamed_flow_bounds_the_exchanged_relaxation_from_above(seed, n, stages, length, m, swaps):
    # the search judges an exchange without a programme where the current relaxation's flow,
    # renamed, fits the exchanged allocation's caps: its cost must bound that relaxation
    case = _relaxed(seed, n, stages, length, m, swaps)
    judged = 0
    for a, b, exchanged in case.exchanges():
        change = case.renamed.change(a, b, exchanged)
        if change is None:
            continue
        there = case.relaxed(exchanged)
        judged += 1
        assert there is not None
        assert there <= case.value + change + 1e-6 * max(1.0, case.value)
    assume(judged > 0)  # an example where no renamed flow fits proves nothing


@settings(max_examples=12, deadline=None)
@given(**_RELAXATIONS)
def test_the_priced_caps_bound_the_exchanged_relaxation_from_below(seed, n, stages, length, m, swaps):
    # the search solves no programme for an exchange whose bound from the current relaxation's
    # cap prices leaves no room below it: that bound must hold for every exchange, and be the
    # relaxation itself where two nodes of one stage only exchange their positions
    case = _relaxed(seed, n, stages, length, m, swaps)
    for a, b in itertools.combinations(range(case.problem.n), 2):
        if case.where[a] == case.where[b]:
            assert abs(case.renamed.least(a, b, case.alloc) - case.value) <= 1e-6 * max(1.0, case.value)
    for a, b, exchanged in case.exchanges():
        least = case.renamed.least(a, b, exchanged)
        there = case.relaxed(exchanged)
        if there is not None:  # else no routing within the exchanged caps: any bound holds
            assert least <= there + 1e-6 * max(1.0, case.value)
