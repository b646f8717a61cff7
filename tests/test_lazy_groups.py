"""Groups of a large cluster searched only where they could be the slowest
(``planner.routing.lazy_groups``): the merged plan is as quick as with every group searched."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.cluster_gen import random_global_cluster
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import decompose
from skippipe.planner.routing import site_groups as G
from skippipe.planner.routing.lazy_groups import FIRST_SEARCHED, LazyGroups
from skippipe.planner.routing.pool import WORKERS_ENV
from skippipe.planner.routing.workers import GroupPlanner
from skippipe.workload import Workload


def _group(k: int) -> SimpleNamespace:
    """A stand-in group: only its costs (``decompose.cost_key``) are read."""
    return SimpleNamespace(transfer_s=np.full((1, 1), float(k)), forward_s=np.ones(1), memory=np.ones(1),
                           stage_sizes=[1])


class _Planner:
    """Quick and searched plans of stand-in groups, by their costs; every call recorded."""

    def __init__(self, quick: list[float], searched: list[float]) -> None:
        self.quick_s, self.searched_s = quick, searched
        self.quick_calls: list[list[int]] = []
        self.searches: list[list[int]] = []

    def quick(self, subs, **kwargs):
        ids = [int(sub.transfer_s[0, 0]) for sub in subs]
        self.quick_calls.append(ids)
        return [(SimpleNamespace(predicted_makespan_s=self.quick_s[k], meta={"quick": True}), f"kept {k}") for k in ids]

    def plan(self, subs, starts, **kwargs):
        ids = [int(sub.transfer_s[0, 0]) for sub in subs]
        assert starts == [f"kept {k}" for k in ids]  # each search goes on from its quick start
        self.searches.append(ids)
        return [SimpleNamespace(predicted_makespan_s=self.searched_s[k], meta={}) for k in ids]


@st.composite
def _spans(draw):
    n = draw(st.integers(1, 12))
    searched = draw(st.lists(st.floats(10.0, 100.0), min_size=n, max_size=n))
    quick = [s * draw(st.floats(1.0, 2.0)) for s in searched]  # a search is never slower than its start
    return quick, searched


@settings(max_examples=200, deadline=None)
@given(_spans())
def test_the_merged_plan_is_as_quick_as_with_every_group_searched(spans):
    quick, searched = spans
    planner = _Planner(quick, searched)
    lazy = LazyGroups(planner, seed=0, budget=10, thorough=False)
    groups = [_group(k) for k in range(len(quick))]
    plans = lazy.plans(groups)
    got = [p.predicted_makespan_s for p in plans]
    assert max(got) == max(searched)
    done = [k for call in planner.searches for k in call]
    assert len(done) == len(set(done))  # each group searched at most once
    assert all(got[k] == (searched[k] if k in done else quick[k]) for k in range(len(quick)))
    # the first round is the slowest quick plans; a later one only groups slower than every search before it
    first = sorted(range(len(quick)), key=lambda k: -quick[k])[:FIRST_SEARCHED]
    assert planner.searches[0] == first
    for r, call in enumerate(planner.searches[1:], start=1):
        before = max(searched[k] for c in planner.searches[:r] for k in c)
        assert all(quick[k] > before for k in call)
    assert all(quick[k] <= max(searched) for k in range(len(quick)) if k not in done)
    # the spans for moving data nodes: searched exact, quick ones scaled by the searches' median
    # share, so the slowest stays exact and no estimate passes it
    shares = sorted(min(1.0, searched[k] / quick[k]) for k in done)
    estimated = lazy.spans(groups)
    assert max(estimated) == max(searched)
    for k in range(len(quick)):
        assert estimated[k] == (searched[k] if k in done else quick[k] * shares[len(shares) // 2])
    # a second call on the same groups plans nothing again
    assert lazy.plans(groups[::-1]) == plans[::-1]
    assert planner.quick_calls == [list(range(len(quick)))]


def test_groups_of_the_same_costs_are_planned_once():
    planner = _Planner([50.0, 40.0], [45.0, 39.0])
    lazy = LazyGroups(planner, seed=0, budget=10, thorough=False)
    plans = lazy.plans([_group(0), _group(1), _group(0)])
    assert [p.predicted_makespan_s for p in plans] == [45.0, 39.0, 45.0]
    assert planner.quick_calls == [[0, 1]] and planner.searches == [[0, 1]]
    planner = _Planner([50.0, 40.0, 44.0], [45.0, 39.0, 30.0])
    lazy = LazyGroups(planner, seed=0, budget=10, thorough=False)
    lazy.plans([_group(0), _group(1)])
    lazy.plans([_group(0), _group(2)])  # a new split: only the new group planned, and it stays quick (44 < 45)
    assert planner.quick_calls == [[0, 1], [2]] and planner.searches == [[0, 1]]


def test_real_groups_lazily_as_quick_as_all_searched(monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "1")
    problem = build_problem(random_global_cluster(36, seed=1, sites=4, speed=(0.5, 2.0), memory=(1, 4)),
                            Workload(num_stages=4, path_length=3))
    groups = decompose.locality_groups(problem.transfer_s, 8)
    sizes = decompose.apportion(problem.stage_sizes, groups, 1.0 / problem.forward_s)
    subs = [decompose.sub_problem(problem, g, row) for g, row in zip(groups, sizes)]
    with GroupPlanner(workers=1) as planner:
        every = planner.plan(subs, seed=0, budget=decompose.GROUP_BUDGET, thorough=False)
        lazy = LazyGroups(planner, seed=0, budget=decompose.GROUP_BUDGET, thorough=False).plans(subs)
    assert max(p.predicted_makespan_s for p in lazy) == max(p.predicted_makespan_s for p in every)
    quick = [p for p in lazy if p.meta.get("quick")]
    assert quick and len(quick) < len(lazy)  # some groups left quick, some searched
    by_cost = {decompose.cost_key(s): p for s, p in zip(subs, every)}
    for sub, plan in zip(subs, lazy):  # a searched group's plan is the one it gets searched directly
        if not plan.meta.get("quick"):
            assert plan.predicted_makespan_s == by_cost[decompose.cost_key(sub)].predicted_makespan_s


def test_the_grouped_plan_of_a_large_cluster_records_the_groups_searched(large_path):
    problem = build_problem(random_global_cluster(36, seed=1, sites=4, speed=(0.5, 2.0), memory=(1, 4)),
                            Workload(num_stages=4, path_length=3))
    groups = G.site_groups(problem)
    plan = G.grouped_plan(problem, groups, seed=0, time_limit_s=None, thorough=False)
    assert plan is not None and 1 <= plan.meta["groups_searched"] <= len(groups)
    thorough = G.grouped_plan(problem, groups, seed=0, time_limit_s=None, thorough=True)  # every group searched
    assert "groups_searched" not in thorough.meta
