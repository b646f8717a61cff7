"""A start of ``plan_skippipe`` kept from a probe for the later plan (``routing.kept_start``)."""

from __future__ import annotations

from skippipe.cluster_gen import random_global_cluster
from skippipe.planner import methods
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import decompose as D
from skippipe.planner.routing import schedule
from skippipe.planner.routing.pool import WORKERS_ENV
from skippipe.planner.routing.workers import probe_skippipe
from skippipe.workload import Workload


def _problem():
    cluster = random_global_cluster(14, seed=5, speed=(0.5, 2.0), memory=(1, 3), broken=0.3)
    return build_problem(cluster, Workload(num_stages=5, path_length=3, microbatches_per_data_node=3, n_layers=15))


def _same(a, b) -> bool:
    return (a.stages == b.stages and a.predicted_makespan_s == b.predicted_makespan_s
            and [(m.data_node, m.path) for m in a.microbatches] == [(m.data_node, m.path) for m in b.microbatches]
            and a.processing_order == b.processing_order and a.meta == b.meta)


def test_a_plan_from_its_probes_start_is_the_plan_built_from_scratch(monkeypatch):
    problem = _problem()
    probe, kept = probe_skippipe(problem, seed=0, budget=20)
    assert kept is not None and kept.fits(0, True) and not kept.fits(1, True) and not kept.fits(0, False)
    fresh = schedule.plan_skippipe(problem, seed=0)
    built = []
    real = schedule._start
    monkeypatch.setattr(schedule, "_start", lambda *a, **k: built.append(a[1]) or real(*a, **k))
    again = schedule.plan_skippipe(problem, seed=0, kept=kept)
    twice = schedule.plan_skippipe(problem, seed=0, kept=kept)  # the kept start is not changed by a plan
    assert 0 not in built  # the user's seed's start came from the probe (the next seeds' are built)
    assert _same(fresh, again) and _same(fresh, twice)
    assert probe.predicted_makespan_s >= fresh.predicted_makespan_s


def test_a_start_of_another_seed_or_kind_or_under_a_time_limit_is_built_again(monkeypatch):
    problem = _problem()
    _, kept = probe_skippipe(problem, seed=0, budget=20)
    built = []
    real = schedule._start
    monkeypatch.setattr(schedule, "_start", lambda *a, **k: built.append(a[1]) or real(*a, **k))
    schedule.plan_skippipe(problem, seed=1, budget=20, kept=kept)
    schedule.plan_skippipe(problem, seed=0, budget=20, kept=kept, thorough=False)
    schedule.plan_skippipe(problem, seed=0, time_limit_s=30.0, kept=kept)
    assert built == [1, 0, 0]
    assert probe_skippipe(problem, seed=0, time_limit_s=30.0)[1] is None


def test_each_island_builds_the_start_of_the_users_seed_once(monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "1")  # every plan in this process, so that the starts can be counted
    cluster = random_global_cluster(30, seed=3, sites=2, speed=(0.5, 2.0), broken=1.0)
    problem = build_problem(cluster, Workload(num_stages=5, path_length=3, microbatches_per_data_node=3, n_layers=15))
    built: list[tuple[bytes, int]] = []
    real = schedule._start
    monkeypatch.setattr(schedule, "_start",
                        lambda p, seed, *a, **k: built.append((D.cost_key(p), seed)) or real(p, seed, *a, **k))
    methods.make_plan("skippipe", problem, seed=0)
    whole = D.cost_key(problem)
    islands = [key for key, seed in built if seed == 0 and key != whole]
    assert len(islands) >= 2 and whole not in {key for key, _ in built}
    assert len(islands) == len(set(islands))  # each island's (each probed split's) first start built once


def test_a_plan_from_a_quick_start_is_the_plan_built_from_scratch(monkeypatch):
    import pickle

    from skippipe.planner.routing.workers import quick_plan

    problem = _problem()
    starts = []
    real = schedule.quick_start
    for thorough in (True, False):
        fresh = schedule.plan_skippipe(problem, seed=0, budget=40, thorough=thorough)
        quick, kept = quick_plan(problem, seed=0, budget=40, thorough=thorough)
        assert not kept.complete and kept.fits(0, thorough) and quick.meta["quick"]
        assert quick.predicted_makespan_s >= fresh.predicted_makespan_s
        assert "no-tc2" not in [c.name for c in kept.cands]  # built only where the plan goes on
        kept = pickle.loads(pickle.dumps(kept))  # as it comes back from a worker
        monkeypatch.setattr(schedule, "quick_start", lambda *a, **k: starts.append(a[1]) or real(*a, **k))
        again = schedule.plan_skippipe(problem, seed=0, budget=40, thorough=thorough, kept=kept)
        monkeypatch.setattr(schedule, "quick_start", real)
        assert starts == [] and _same(fresh, again)
