"""On generated clusters (``cluster_gen``), every method's plan obeys the jump rule, and skippipe
is never worse than skippipe-no-tc2, random or naive. A workload is accepted exactly when every
stage lies on some valid path (else one line: which stages would never be trained)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skippipe.cli import main
from skippipe.cluster_gen import random_global_cluster, single_site_cluster
from skippipe.errors import UserError, WorkloadError
from skippipe.planfile import plan_violations
from skippipe.planner.methods import make_plan, method_names
from skippipe.planner.problem import build_problem
from skippipe.planner.stage_orders import stage_sequences
from skippipe.workload import Workload, least_max_jump


def jump_breaks(stages_visited: list[int], max_jump: int) -> list[tuple[int, int]]:
    """(frontier, stage) of every visit more than ``max_jump`` stages past the frontier."""
    frontier, out = stages_visited[0], []
    for s in stages_visited[1:]:
        if s > frontier:
            if s - frontier > max_jump:
                out.append((frontier, s))
            frontier = s
    return out


def test_jump_breaks_counts_stages_past_the_frontier():
    assert jump_breaks([0, 4], 4) == [] and jump_breaks([0, 5], 4) == [(0, 5)]
    assert jump_breaks([0, 2, 1, 6], 4) == [] and jump_breaks([0, 1, 6], 4) == [(1, 6)]


@st.composite
def cases(draw):
    s = draw(st.integers(5, 8))
    L = draw(st.integers(3, 4))
    n = draw(st.integers(s + 3, 14))
    seed = draw(st.integers(0, 10_000))
    if draw(st.booleans()):
        cluster = random_global_cluster(n, seed=seed, speed=(0.5, 2.0), memory=(2, 4), broken=0.1)
    else:
        cluster = single_site_cluster(n, seed=seed, speed=(0.5, 2.0), memory=(2, 4))
    max_jump = draw(st.integers(max(min(4, s - L), least_max_jump(s, L)), 4))  # binding: S - 1 > max_jump
    wl = Workload(num_stages=s, path_length=L, n_layers=2 * s, microbatches_per_data_node=draw(st.integers(2, 6)),
                  max_jump=max_jump)
    return build_problem(cluster, wl), seed


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_method_obeys_the_jump_rule(case):
    problem, seed = case
    made = {}
    for method in method_names():
        try:
            plan = make_plan(method, problem, seed=seed)
        except UserError:  # e.g. no routing that finishes with this memory: refused in one line
            continue
        assert plan_violations(plan) == []
        stage_of = {x: k for k, st_ in enumerate(plan.stages) for x in st_}
        for mb in plan.microbatches:
            assert jump_breaks([stage_of[x] for x in [mb.data_node, *mb.path]], problem.workload.max_jump) == []
        made[method] = plan.predicted_makespan_s
    assert made, "no method made a plan"
    if "skippipe" in made:
        for other in ("skippipe-no-tc2", "random", "naive"):
            if other in made:
                assert made["skippipe"] <= made[other] + 1e-9, other



@settings(max_examples=200, deadline=None)
@given(s=st.integers(2, 9), L=st.integers(2, 9), swaps=st.integers(0, 2), jump=st.integers(0, 9))
def test_a_workload_is_accepted_exactly_when_every_stage_is_on_some_path(s, L, swaps, jump):
    L = min(L, s)
    reached = {t for seq in stage_sequences(s, L, swaps, jump) for t in seq}
    try:
        Workload(num_stages=s, path_length=L, max_swaps=swaps, max_jump=jump, n_layers=s)
    except WorkloadError as exc:
        assert exc.key == "max_jump" and "would never be trained" in str(exc)
        assert s - 1 not in reached
        return
    assert reached == set(range(1, s))


def test_a_pipeline_with_unreachable_stages_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "plan.json"
    args = ["plan", "--cluster", "gcp-2025/geo-distributed/20", "--stages", "8", "--path-length", "2", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stages 5..7 would never be trained: use max_jump >= 7" in err, err
    assert not out.exists()
    assert main([*args, "--max-jump", "7"]) == 0
