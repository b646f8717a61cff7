"""Groups planned in worker processes (``planner.routing.workers``): the same plans as in one
process, errors raised in the caller with their type, no workers where the process runs other
threads, and the worker count read from ``SKIPPIPE_PLANNING_WORKERS``."""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import time

import pytest

from cluster_strategies import islands_the_caps_cannot_carry
from skippipe.cli import main
from skippipe.cluster_gen import random_global_cluster
from skippipe.errors import LoadCapsTooSmall, UserError
from skippipe.planner import methods
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import decompose, pool
from skippipe.planner.routing import site_groups as G
from skippipe.planner.routing import workers as W
from skippipe.workload import Workload

WORKLOAD = Workload(num_stages=4, path_length=3)


def _file(plan) -> dict:
    """The plan file without the wall-clock seconds it took (``meta.planning_s``)."""
    out = plan.to_dict()
    out["meta"].pop("planning_s", None)
    return out


def _group_problems(seed: int) -> list:
    problem = build_problem(random_global_cluster(36, seed=seed, sites=3, speed=(0.5, 2.0), memory=(1, 4)), WORKLOAD)
    groups = decompose.locality_groups(problem.transfer_s, 10)
    sizes = decompose.apportion(problem.stage_sizes, groups, 1.0 / problem.forward_s)
    return [decompose.sub_problem(problem, g, row) for g, row in zip(groups, sizes)]


def test_groups_planned_in_workers_are_the_plans_of_one_process():
    subs = _group_problems(seed=2)
    assert len(subs) >= 2
    here = W.GroupPlanner(workers=1).plan(subs, seed=0, budget=80)
    with W.GroupPlanner(workers=2) as planner:
        assert planner.start()  # pytest runs one thread: the workers are forked
        there = planner.plan(subs, seed=0, budget=80)
        whole = planner.submit(methods.make_plan, "naive", subs[0], seed=0).result()
    assert [_file(p) for p in there] == [_file(p) for p in here]
    assert _file(whole) == _file(methods.make_plan("naive", subs[0], seed=0))


def test_skippipe_plans_the_same_with_one_worker_or_two(monkeypatch):
    """Whole and in groups (the 24-200-node candidate, here with groups of 8): the whole search
    and the groups go to the workers; the plan file is the same but for the seconds it took."""
    monkeypatch.setattr(G, "SPLIT_NODES", 24)
    monkeypatch.setattr(G, "GROUP_NODES", 8)
    problem = build_problem(random_global_cluster(30, seed=5, sites=3, speed=(0.5, 2.0), memory=(1, 4)), WORKLOAD)
    assert G.site_groups(problem) is not None
    plans = {}
    for count in ("1", "2"):
        monkeypatch.setenv(pool.WORKERS_ENV, count)
        plans[count] = _file(methods.make_plan("skippipe", problem, seed=0))
    assert plans["1"] == plans["2"]
    assert "whole_makespan_s" in plans["2"]["meta"] or "grouped_makespan_s" in plans["2"]["meta"]


def test_an_error_in_a_worker_is_raised_in_the_caller_with_its_type():
    """Two islands whose apportioned stages the TC1 caps cannot route (``islands_the_caps_cannot_carry``)."""
    problem = islands_the_caps_cannot_carry()
    groups = decompose.islands(problem.transfer_s)
    sizes = decompose.apportion(problem.stage_sizes, groups, 1.0 / problem.forward_s)
    subs = [decompose.sub_problem(problem, g, row) for g, row in zip(groups, sizes)]
    with pytest.raises(LoadCapsTooSmall):
        W.GroupPlanner(workers=1).plan(subs, seed=0, budget=50)
    with W.GroupPlanner(workers=2) as planner, pytest.raises(LoadCapsTooSmall):
        planner.plan(subs, seed=0, budget=50)


def _refuse_one_or_sleep(sub, *, marker: str, refused: bytes, **kwargs):
    """A group planner for the workers: the group of costs ``refused`` is refused at once, the
    others sleep and then leave ``marker`` behind."""
    if decompose.cost_key(sub) == refused:
        raise LoadCapsTooSmall("refused at once")
    time.sleep(15)
    pathlib.Path(marker).write_text("planned")
    return None


def test_fail_fast_raises_the_first_error_and_stops_the_other_groups(monkeypatch, tmp_path):
    """The islands' first probe (``decompose.plan_in_groups``) gives the split up on any
    error: the groups still planning are not waited for, and the planner forks new workers
    for the next batch."""
    subs = _group_problems(seed=2)
    assert len(subs) >= 2
    marker, planner_of_groups = tmp_path / "planned", W.plan_skippipe
    monkeypatch.setattr(W, "plan_skippipe", _refuse_one_or_sleep)
    with W.GroupPlanner(workers=2) as planner:
        with pytest.raises(LoadCapsTooSmall):
            planner.plan(subs, fail_fast=True, marker=str(marker), refused=decompose.cost_key(subs[0]))
        assert not marker.exists()  # the sleeping groups were stopped, not waited for
        monkeypatch.setattr(W, "plan_skippipe", planner_of_groups)
        here = W.GroupPlanner(workers=1).plan(subs[:2], seed=0, budget=40)
        assert [_file(p) for p in planner.plan(subs[:2], seed=0, budget=40)] == [_file(p) for p in here]
    assert not marker.exists()


def test_no_workers_are_forked_from_a_process_that_runs_other_threads():
    release = threading.Event()
    other = threading.Thread(target=release.wait, daemon=True)
    other.start()
    try:
        with W.GroupPlanner(workers=2) as planner:
            assert not planner.start() and planner.workers == 1
            subs = _group_problems(seed=2)[:2]
            assert [_file(p) for p in planner.plan(subs, seed=0, budget=40)] == \
                [_file(p) for p in W.GroupPlanner(workers=1).plan(subs, seed=0, budget=40)]
    finally:
        release.set()
        other.join()


@pytest.mark.parametrize("raw,count", [("", pool.DEFAULT_WORKERS), ("1", 1), (" 3 ", 3)])
def test_the_worker_count_comes_from_the_environment(monkeypatch, raw, count):
    monkeypatch.setenv(pool.WORKERS_ENV, raw)
    assert pool.planning_workers() == count


@pytest.mark.parametrize("raw", ["0", "two", "-1", "65", "1.5"])
def test_a_bad_worker_count_is_refused(monkeypatch, raw):
    monkeypatch.setenv(pool.WORKERS_ENV, raw)
    with pytest.raises(UserError, match=pool.WORKERS_ENV):
        pool.planning_workers()


def test_the_cli_refuses_a_bad_worker_count_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(pool.WORKERS_ENV, "many")
    out = tmp_path / "plan.json"
    code = main(["plan", "--cluster", "gcp-2025/geo-distributed/20", "--method", "skippipe", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and pool.WORKERS_ENV in err
    assert not out.exists()


def test_the_plan_command_progress_bar_starts_no_thread():
    """``skippipe plan``'s bar (shown on a terminal) must leave the process to one thread, or
    the planner would plan every group in the command's process."""
    from skippipe.commands.plan import progress

    before = threading.active_count()
    with progress("planning", 2) as bar:
        bar.update(1)
        assert threading.active_count() == before


def test_groups_are_planned_here_when_a_worker_dies():
    subs = _group_problems(seed=2)
    here = [_file(p) for p in W.GroupPlanner(workers=1).plan(subs, seed=0, budget=40)]
    with W.GroupPlanner(workers=2) as planner:
        assert planner.start()
        pending = planner.submit(os.getpid)  # the worker's pid, then kill it
        os.kill(pending.result(), signal.SIGKILL)
        assert [_file(p) for p in planner.plan(subs, seed=0, budget=40)] == here


def _pid(k: int) -> tuple[int, int]:
    return k, os.getpid()


def test_map_calls_keeps_the_order_and_sends_only_batches_worth_the_workers(monkeypatch):
    monkeypatch.setenv("SKIPPIPE_PLANNING_WORKERS", "2")
    calls = [(k,) for k in range(5)]
    here = pool.map_calls(_pid, calls, estimated_s=pool.SIDE_BY_SIDE_S / 2)  # too little to fork for
    assert [k for k, _ in here] == list(range(5)) and {p for _, p in here} == {os.getpid()}
    apart = pool.map_calls(_pid, calls, estimated_s=pool.SIDE_BY_SIDE_S)
    assert [k for k, _ in apart] == list(range(5)) and os.getpid() not in {p for _, p in apart}
    assert {p for _, p in pool.map_calls(_pid, calls[:1])} == {os.getpid()}  # one call: here
    assert pool.split(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert pool.split([1], 4) == [[1]] and pool.split([], 2) == [[]]
