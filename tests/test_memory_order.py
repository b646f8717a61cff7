"""Uneven memory in the path scheduler: the memory-ordered allocation (``allocation.memory_order``)
and the slot-hold term of the balanced routing (``routing.balanced``)."""

from __future__ import annotations

from collections import Counter
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_strategies import dealings, generated_problems
from skippipe.cluster_gen import random_global_cluster, single_site_cluster
from skippipe.planfile import Microbatch, plan_violations
from skippipe.planner.allocation import allocate, memory_order, random_allocation, stage_caps
from skippipe.planner.allocation.memory_order import KEYS, memory_ordered
from skippipe.planner.allocation.stage_caps import HOLD_GAP, hold_balanced_stages, least_hold_bound
from skippipe.planner.floors import free_allocation_floor
from skippipe.planner.methods import make_plan, with_allocation
from skippipe.planner.problem import build_problem
from skippipe.planner.routing import candidates
from skippipe.planner.routing.balanced import balanced_routes, slot_holds
from skippipe.planner.routing.schedule import build_plan
from skippipe.planner.routing.sequences import RouteCosts, stage_cap_sums
from skippipe.planner.stage_orders import sequence_quotas, stage_sequences
from skippipe.sim import simulate
from skippipe.workload import Workload


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(), st.sampled_from(KEYS))
def test_memory_ordered_keeps_data_nodes_and_sizes_and_sorts_by_its_key(problem, key):
    stages = allocate(problem, seed=0)
    with patch.object(memory_order, "balance_stage_caps", lambda _problem, dealt: dealt):
        out = memory_ordered(problem, stages, key)  # the dealing alone, before the cap repair
    if out is None:
        return
    assert sorted(out[0]) == sorted(stages[0])
    assert [len(s) for s in out] == [len(s) for s in stages]
    assert sorted(x for s in out for x in s) == list(range(problem.n))
    mem, fwd = problem.memory, problem.forward_s
    rank = (lambda x: float(mem[x]) * float(fwd[x])) if key == "per-visit" else (lambda x: int(mem[x]))
    for a, b in zip(out[1:], out[2:]):
        assert min(rank(x) for x in a) >= max(rank(x) for x in b)  # fewer slots (per visit) in later stages


def _caps_carry(problem, stages) -> bool:
    w = problem.workload
    seqs = stage_sequences(len(stages), w.path_length, w.max_swaps, w.max_jump)
    total = len(stages[0]) * w.microbatches_per_data_node
    return sequence_quotas(seqs, stage_cap_sums(problem.load_caps(stages), stages), total) is not None


@pytest.mark.parametrize("seed", [4, 6, 13])
def test_a_memory_order_whose_caps_fall_short_is_dealt_again(seed):
    # L = S: every microbatch visits every stage, and dealing by memory puts a stage of slow
    # nodes where their caps cannot carry a visit per microbatch (found for these seeds)
    cluster = random_global_cluster(20, seed=seed, speed=(0.5, 2.0), memory=(1, 2))
    problem = build_problem(cluster, Workload(num_stages=5, path_length=5, microbatches_per_data_node=4, n_layers=15))
    stages = random_allocation(problem, np.random.default_rng(seed))
    assert _caps_carry(problem, stages)
    with patch.object(memory_order, "balance_stage_caps", lambda _problem, dealt: dealt):
        dealt = memory_ordered(problem, stages, "per-visit")
    assert dealt is not None and not _caps_carry(problem, dealt)
    out = memory_ordered(problem, stages, "per-visit")
    assert _caps_carry(problem, out)
    assert sorted(out[0]) == sorted(stages[0]) and [len(s) for s in out] == [len(s) for s in stages]


def test_memory_ordered_leaves_uniform_memory_alone():
    problem = build_problem(single_site_cluster(14, seed=1, speed=(0.5, 2.0)), Workload(num_stages=4, path_length=3, n_layers=16))
    assert all(memory_ordered(problem, allocate(problem, seed=0), key) is None for key in KEYS)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(), st.integers(0, 10_000))
def test_slot_holds_equal_the_simulated_holds_of_a_lone_microbatch(problem, seed):
    # one microbatch alone never waits: each path node's slot is held from its forward's start
    # to its backward's end, which is what slot_holds counts
    rng = np.random.default_rng(seed)
    hops = problem.workload.path_length - 1
    nodes = [int(x) for x in rng.permutation(problem.n)[: hops + 1]]
    d, chain = nodes[0], nodes[1:]
    stages = [[d], *[[x] for x in chain]]
    stages[-1] += [x for x in range(problem.n) if x not in nodes]
    plan = problem.make_plan(stages, [Microbatch(id=0, data_node=d, path=chain)], method="skippipe", seed=0,
                       path_length=hops + 1, max_load=[1] * problem.n)
    ops = simulate(plan, record=True).ops
    start = {o.node: o.start for o in ops if o.kind == "F" and o.node != d}
    end = {o.node: o.end for o in ops if o.kind == "B" and o.node != d}
    loss = float(problem.forward_s[d]) * problem.cost_model.loss_factor
    want = [end[x] - start[x] for x in chain]
    got = slot_holds(RouteCosts.from_problem(problem), d, chain, loss)
    assert np.allclose(got, want, rtol=0, atol=1e-9)


def test_one_slot_nodes_carry_fewer_early_visits_with_the_hold_term():
    # single site, memory 1-4: the balanced routing avoids making one-slot nodes the first hop
    cluster = single_site_cluster(24, seed=0, speed=(0.5, 2.0), memory=(1, 4))
    problem = build_problem(cluster, Workload(num_stages=6, path_length=4, n_layers=24))
    stages = allocate(problem, seed=0)
    caps = problem.load_caps(stages)
    w = problem.workload
    seqs = stage_sequences(len(stages), w.path_length, w.max_swaps, w.max_jump)
    routes = balanced_routes(problem, stages, caps, seqs, 1.0, holds=True)
    assert routes is not None
    first = Counter(p[0] for _, p in routes)
    visits = Counter(x for _, p in routes for x in p)
    plan = build_plan(problem, stages, routes, "skippipe", 0)
    assert plan_violations(plan) == []
    one_slot = [x for x in visits if int(problem.memory[x]) == 1]
    assert one_slot and sum(first[x] for x in one_slot) <= sum(visits[x] for x in one_slot) / 2


def test_skippipe_on_uneven_memory_beats_the_given_allocation_alone():
    # the memory-ordered candidate is taken when low-memory nodes sit early in the paths
    cluster = single_site_cluster(24, seed=0, speed=(0.5, 2.0), memory=(1, 4))
    problem = build_problem(cluster, Workload(num_stages=6, path_length=4))
    stages = allocate(problem, seed=0)
    ours = make_plan("skippipe", problem, seed=0)
    fixed = make_plan("skippipe", with_allocation(problem, stages), seed=0)
    assert ours.predicted_makespan_s < fixed.predicted_makespan_s


def _largest_hold_per_slot(problem, stages) -> float:
    """max over nodes of cap x hold(stage) / slots, as ``hold_balanced_stages`` scores a dealing."""
    w, cm = problem.workload, problem.cost_model
    seqs = stage_sequences(len(stages), w.path_length, w.max_swaps, w.max_jump)
    rest = [x for s in stages[1:] for x in s]
    unit = float(np.median(problem.forward_s[rest])) * (1.0 + cm.backward_factor)
    caps = problem.load_caps(stages)
    worst = 0.0
    for s in range(1, len(stages)):
        through = [seq for seq in seqs if s in seq]
        hold = unit * sum(len(seq) - seq.index(s) for seq in through) / max(1, len(through))
        worst = max([worst] + [caps[x] * hold / max(1, int(problem.memory[x])) for x in stages[s]])
    return worst


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(max_path=6))
def test_the_hold_balanced_dealing_lowers_the_largest_hold_per_slot_and_keeps_the_caps(problem):
    stages = allocate(problem, seed=0)
    out = hold_balanced_stages(problem, stages)
    if not _caps_carry(problem, stages):
        return
    assert out is not None  # the allocation itself is a feasible dealing
    assert sorted(out[0]) == sorted(stages[0]) and [len(s) for s in out] == [len(s) for s in stages]
    assert sorted(x for s in out for x in s) == list(range(problem.n))
    assert _caps_carry(problem, out)
    # optimal within the programme's relative gap, so never above the allocation it started from
    assert _largest_hold_per_slot(problem, out) <= (1 + HOLD_GAP) * _largest_hold_per_slot(problem, stages) + 1e-9


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(stages=(3, 4), max_path=4, extra_nodes=2, max_nodes=9))
def test_the_hold_balanced_dealing_is_the_best_dealing_by_brute_force(problem):
    stages = allocate(problem, seed=0)
    rest = [x for s in stages[1:] for x in s]
    best = min((_largest_hold_per_slot(problem, [stages[0], *d]) for d in dealings(rest, [len(s) for s in stages[1:]])
                if _caps_carry(problem, [stages[0], *d])), default=None)
    out = hold_balanced_stages(problem, stages)
    if best is None:
        assert out is None
        return
    assert out is not None and _largest_hold_per_slot(problem, out) <= (1 + HOLD_GAP) * best + 1e-9


def test_the_dealing_programmes_stop_at_a_count_of_branch_and_bound_nodes():
    # a limit in seconds alone stops a slow machine earlier than a fast one (another dealing,
    # another plan): the node count binds first wherever the 2-core machine solves it in time
    problem = build_problem(random_global_cluster(16, seed=5, speed=(0.5, 2.0), memory=(1, 2)),
                            Workload(num_stages=5, path_length=4, microbatches_per_data_node=3))
    stages = allocate(problem, seed=0)
    seen = []
    solve = stage_caps.milp

    def recording(*args, **kwargs):
        seen.append(dict(kwargs["options"]))  # a copy: scipy takes the options it knows out of the dict
        return solve(*args, **kwargs)

    with patch.object(stage_caps, "milp", recording):
        hold_balanced_stages(problem, stages)
    assert seen and all(o["node_limit"] == stage_caps.NODE_LIMIT for o in seen)
    assert stage_caps.NODE_LIMIT >= 1699  # the most any measured dealing needed to prove its gap


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(stages=(3, 4), max_path=4, extra_nodes=2, max_nodes=9))
def test_the_least_hold_bound_is_the_least_largest_hold_of_every_dealing_caps_left_out(problem):
    stages = allocate(problem, seed=0)
    rest = [x for s in stages[1:] for x in s]
    every = [stage_caps.largest_hold_per_slot(problem, [stages[0], *d])
             for d in dealings(rest, [len(s) for s in stages[1:]])]
    assert least_hold_bound(problem, stages) == min(every)  # the same weights, so equal bit for bit
    held = hold_balanced_stages(problem, stages)
    if held is not None:
        assert stage_caps.largest_hold_per_slot(problem, held) >= least_hold_bound(problem, stages)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_problems(max_path=5, sites=True))
def test_skipping_the_hold_programme_changes_no_memory_candidate(problem):
    # the programme is skipped only where memory_candidates would drop its dealing anyway
    stages = allocate(problem, seed=0)
    static = lambda st: []  # noqa: E731 - only asked for a dealing the balanced routing cannot route

    def names_and_stages(dealt):
        return [(c.name, c.stages, c.score.key()) for c, _ in candidates.memory_candidates(problem, stages, static, dealt)]

    skipped = candidates.memory_dealings(problem, stages)
    with patch.object(candidates, "_hold_may_help", lambda *args: True):
        solved = candidates.memory_dealings(problem, stages)
    assert {k: v for k, v in solved.items() if k != "hold-balanced"} == {k: v for k, v in skipped.items()
                                                                      if k != "hold-balanced"}
    assert names_and_stages(skipped) == names_and_stages(solved)


@pytest.mark.parametrize(("n", "seed", "speed", "memory", "workload", "solved"), [
    # one site (no slow link): S = L = 9, the hold-balanced dealing kept (its largest hold 80.58
    # against 0.8 x 120.88 of the memory orders), so the programme must run
    (27, 59, (0.5, 2.0), (1, 4), Workload(num_stages=9, path_length=9, microbatches_per_data_node=7, n_layers=27,
                                          max_jump=5), True),
    # one site, 1-2 slots: every dealing holds at least 29.70, above 0.8 x 29.70: skipped
    (28, 5, None, (1, 2), Workload(num_stages=8, path_length=3, microbatches_per_data_node=5, n_layers=24), False),
])
def test_the_hold_programme_runs_where_its_dealing_can_be_kept(n, seed, speed, memory, workload, solved):
    problem = build_problem(single_site_cluster(n, seed=seed, speed=speed, memory=memory), workload)
    stages = allocate(problem, seed=0)
    calls = []
    solve = stage_caps.hold_balanced_stages

    def recording(*args):
        calls.append(args)
        return solve(*args)

    with patch.object(stage_caps, "hold_balanced_stages", recording):
        dealt = candidates.memory_dealings(problem, stages)
    assert bool(calls) == solved
    kept = [c.name for c, _ in candidates.memory_candidates(problem, stages, lambda st: [], dealt)]
    assert ("hold-balanced" in kept) == solved


def _one_slot_uneven_problem():
    # exact_small.py case 29: 7 nodes at random places, compute 0.5-2x, one slot on every node
    # outside stage 0; its exact optimum over every allocation is 42.19-42.25 s
    cluster = random_global_cluster(7, 29, speed=(0.5, 2.0), memory=(1, 4))
    return build_problem(cluster, Workload(num_stages=4, path_length=3, microbatches_per_data_node=3, max_swaps=0))


def test_one_slot_nodes_of_uneven_speed_get_the_hold_balanced_dealing():
    problem = _one_slot_uneven_problem()
    stages = allocate(problem, seed=0)
    rest = [x for s in stages[1:] for x in s]
    assert {int(problem.memory[x]) for x in rest} == {1}  # memory alone would not ask for the dealing
    dealt = candidates.memory_dealings(problem, stages)
    assert "hold-balanced" in dealt
    fast_last = min(rest, key=lambda x: problem.forward_s[x])
    assert fast_last in dealt["hold-balanced"][-1]  # the fastest node, the most visits, holds shortest
    plan = make_plan("skippipe", problem, seed=0)
    floor = free_allocation_floor(problem).value
    assert plan.predicted_makespan_s <= 1.05 * floor  # 63.80 s (1.51 x) without the dealing


def test_equal_slots_of_uneven_speed_get_no_dealing_where_the_holds_stay_below_the_floor():
    # 3 slots everywhere: the holds per slot (about 30 s) stay below the data-node floor (about 47 s)
    problem = build_problem(random_global_cluster(24, 1, speed=(0.5, 1.7)), Workload(num_stages=7, path_length=4))
    stages = allocate(problem, seed=0)
    assert not candidates._holds_differ(problem, stages, [x for s in stages[1:] for x in s])
    assert "hold-balanced" not in candidates.memory_dealings(problem, stages)
