"""Node -> stage allocation: bottleneck matchings, tours, the genetic search."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from skippipe.cluster import cluster_from_dict, load_cluster, preset_cluster
from skippipe.planfile import plan_violations
from skippipe.planner.allocation import (
    allocate,
    allocation_fitness,
    best_tour,
    bottleneck_matching,
    data_node_candidates,
    random_allocation,
)
from skippipe.planner.allocation.tours import _held_karp
from skippipe.planner.problem import build_problem
from skippipe.workload import Workload


def _brute_bottleneck(cost: np.ndarray) -> tuple[float, float]:
    """(least bottleneck, least total among matchings with that bottleneck), by enumeration."""
    r, c = cost.shape
    k = min(r, c)
    best = (np.inf, np.inf)
    for rows in itertools.combinations(range(r), k):
        for cols in itertools.permutations(range(c), k):
            vals = cost[list(rows), list(cols)]
            best = min(best, (float(vals.max()), float(vals.sum())))
    return best


def _check_matching(cost: np.ndarray, rows: np.ndarray, cols: np.ndarray, bottleneck: float) -> None:
    k = min(cost.shape)
    assert len(rows) == len(cols) == k
    assert len(set(rows.tolist())) == k and len(set(cols.tolist())) == k
    assert float(cost[rows, cols].max()) == pytest.approx(bottleneck)


@settings(max_examples=60, deadline=None)
@given(
    r=st.integers(1, 5), c=st.integers(1, 5), seed=st.integers(0, 10_000), levels=st.sampled_from([3, 1000]),
)
def test_bottleneck_matching_matches_enumeration(r, c, seed, levels):
    rng = np.random.default_rng(seed)
    cost = rng.integers(0, levels, size=(r, c)).astype(float)  # few levels: many ties
    rows, cols, b = bottleneck_matching(cost)
    _check_matching(cost, rows, cols, b)
    best_b, best_sum = _brute_bottleneck(cost)
    assert b == pytest.approx(best_b)
    assert float(cost[rows, cols].sum()) == pytest.approx(best_sum)


@pytest.mark.parametrize("shape", [(9, 12), (14, 14), (30, 22), (60, 90)])
def test_bottleneck_matching_large_is_optimal(shape):
    """Larger sizes take other code paths (augmenting paths, scipy); check the certificate:
    the matching reaches b, and no full matching exists using only links cheaper than b."""
    rng = np.random.default_rng(sum(shape))
    cost = rng.random(shape)
    rows, cols, b = bottleneck_matching(cost)
    _check_matching(cost, rows, cols, b)
    small = cost.T if shape[0] > shape[1] else cost
    match = maximum_bipartite_matching(csr_matrix(small < b), perm_type="column")
    assert np.count_nonzero(match >= 0) < min(shape)


def test_best_tour_is_optimal():
    rng = np.random.default_rng(3)
    for s in (2, 5, 7, 10):
        a = rng.random((s, s))
        cost = a + a.T
        np.fill_diagonal(cost, 0.0)
        order, total = best_tour(cost)
        assert order[0] == 0 and sorted(order) == list(range(s))
        assert total == pytest.approx(sum(cost[order[i], order[(i + 1) % s]] for i in range(s)))
        if s <= 8:
            brute = min(
                sum(cost[p[i], p[(i + 1) % s]] for i in range(s))
                for p in ([0, *q] for q in itertools.permutations(range(1, s)))
            )
            assert total == pytest.approx(brute)
    # beyond Held-Karp: a heuristic tour, still a valid closed tour with the right cost
    a = rng.random((16, 16))
    cost = a + a.T
    order, total = best_tour(cost)
    assert sorted(order) == list(range(16)) and order[0] == 0
    assert total == pytest.approx(sum(cost[order[i], order[(i + 1) % 16]] for i in range(16)))


def _problem(spec: str = "gcp20-current-free", **kw):
    return build_problem(load_cluster(spec), Workload(**kw))


def _is_allocation(problem, stages) -> bool:
    return [len(s) for s in stages] == problem.stage_sizes and sorted(x for s in stages for x in s) == list(range(problem.n))


def test_allocation_is_valid_and_deterministic():
    p = _problem()
    a = allocate(p, seed=1)
    assert _is_allocation(p, a)
    assert allocate(p, seed=1) == a
    # the stage order is the cheapest tour: listing order scores as well as the best order
    assert allocation_fitness(p, a, ordered=True) == pytest.approx(allocation_fitness(p, a))


def test_allocation_beats_random_allocations():
    p = build_problem(preset_cluster("gcp-2025", "geo-distributed", 20), Workload())
    ours = allocation_fitness(p, allocate(p, seed=0))
    rng = np.random.default_rng(0)
    randoms = [allocation_fitness(p, random_allocation(p, rng)) for _ in range(200)]
    assert all(_is_allocation(p, random_allocation(p, rng)) for _ in range(5))
    assert ours < min(randoms)
    assert ours < 0.8 * float(np.median(randoms))


def test_bad_link_is_kept_out_of_stages_on_larger_clusters():
    """gcp-2025 has a 132 s NL-London link; 100 nodes place 8-9 nodes at each of them."""
    p = build_problem(preset_cluster("gcp-2025", "geo-distributed", 100), Workload())
    stages = allocate(p, seed=0)
    assert _is_allocation(p, stages)
    t = p.transfer_s
    worst = max(float(np.max(t[np.ix_(s, s)])) for s in stages)
    assert worst < 10.0


def test_fixed_allocation_is_kept():
    p = _problem("gcp20-current")
    assert allocate(p, seed=5) == p.cluster.stages


def test_slow_nodes_are_not_data_nodes():
    n = 20
    rng = np.random.default_rng(0)
    t = rng.uniform(0.5, 3.0, size=(n, n))
    t = (t + t.T) / 2
    forward = np.full(n, 2.0)
    fast = [1, 4, 7, 11, 15]
    forward[fast] = 1.0
    c = cluster_from_dict({"transfer_s": t.tolist(), "forward_s": forward.tolist()})
    p = build_problem(c, Workload())
    assert p.stage_sizes[0] == 5
    assert sorted(data_node_candidates(p)) == fast
    assert sorted(allocate(p, seed=0)[0]) == fast
    # more fast nodes than data slots: the data nodes come from the fast ones
    forward[[2, 9]] = 1.0
    c = cluster_from_dict({"transfer_s": t.tolist(), "forward_s": forward.tolist()})
    p = build_problem(c, Workload())
    assert set(allocate(p, seed=0)[0]) <= set(np.flatnonzero(forward == 1.0).tolist())


def test_small_memory_nodes_are_not_data_nodes():
    n = 12
    t = np.ones((n, n))
    memory = [3] * n
    memory[0] = memory[5] = 1  # a data node with 1 slot runs its 6 microbatches one by one
    c = cluster_from_dict({"transfer_s": t.tolist(), "memory": memory})
    p = build_problem(c, Workload())
    data = allocate(p, seed=0)[0]
    assert 0 not in data and 5 not in data


def test_thousand_nodes():
    """All-distinct link costs (points in a plane) are the slow case for the matchings (timed in
    ``benchmarks/allocation.py``)."""
    rng = np.random.default_rng(0)
    pts = rng.random((1000, 2)) * 10
    t = np.sqrt(((pts[:, None] - pts[None]) ** 2).sum(-1)) + 0.35
    forward = rng.choice([1.0, 2.0], size=1000)
    p = build_problem(cluster_from_dict({"transfer_s": t.tolist(), "forward_s": forward.tolist()}), Workload())
    stages = allocate(p, seed=0)
    assert _is_allocation(p, stages)
    assert np.all(forward[stages[0]] == 1.0)  # 500 fast nodes for 250 data slots
    assert allocation_fitness(p, stages) < allocation_fitness(p, random_allocation(p, rng))


def test_time_limit_cuts_the_search(fake_clock):
    p = build_problem(preset_cluster("gcp-2025", "geo-distributed", 300), Workload())
    stages = allocate(p, seed=0, time_limit_s=0.05)
    assert fake_clock.readings < 1000  # stopped at the limit, not by the budget
    assert _is_allocation(p, stages)


@pytest.mark.parametrize("s", [6, 9, 12, 15])
def test_tour_keeps_unequal_stage_sizes_in_place(s):
    rng = np.random.default_rng(s)
    a = rng.random((s, s))
    cost = a + a.T
    slots = [4] + [3] * (s // 2) + [2] * (s - 1 - s // 2)
    groups = [slots[0], *rng.permutation(slots[1:]).tolist()]
    order, total = best_tour(cost, groups, slots)
    assert [groups[g] for g in order] == slots
    assert total == pytest.approx(sum(cost[order[i], order[(i + 1) % s]] for i in range(s)))
    if s <= 9:  # exact by enumeration; Held-Karp (used from 10 stages) must agree
        brute = min(
            sum(cost[p[i], p[(i + 1) % s]] for i in range(s))
            for p in ([0, *q] for q in itertools.permutations(range(1, s)))
            if [groups[g] for g in p] == slots
        )
        assert total == pytest.approx(brute)
        hk_order, hk_total = _held_karp(cost, np.array(groups), np.array(slots))
        assert hk_total == pytest.approx(brute)
        assert [groups[g] for g in hk_order] == slots


def test_one_pattern_of_sizes_with_new_costs_each_time_gets_each_costs_best_tour():
    # the fitting orders are built once per pattern of sizes; the costs are new every call
    rng = np.random.default_rng(7)
    slots = [4, 3, 3, 3, 3, 3, 2, 2]
    for _ in range(30):
        groups = [slots[0], *rng.permutation(slots[1:]).tolist()]
        a = np.round(rng.random((8, 8)), 1)  # rounded: ties between tours
        cost = a + a.T
        order, total = best_tour(cost, groups, slots)
        assert [groups[g] for g in order] == slots
        assert total == pytest.approx(sum(cost[order[i], order[(i + 1) % 8]] for i in range(8)))
        brute = min(
            sum(cost[p[i], p[(i + 1) % 8]] for i in range(8))
            for p in ([0, *q] for q in itertools.permutations(range(1, 8)))
            if [groups[g] for g in p] == slots
        )
        assert total == pytest.approx(brute)


def test_allocation_with_explicit_unequal_sizes():
    p = build_problem(preset_cluster("aws-2022", "geo-distributed", 20), Workload(stage_sizes=(5, 4, 3, 3, 3, 2)))
    stages = allocate(p, seed=0)
    assert [len(s) for s in stages] == [5, 4, 3, 3, 3, 2]
    assert _is_allocation(p, stages)



def _some_dealing_carries(caps: list[int], sizes: list[int], need: int) -> bool:
    """Brute force: can nodes with these caps be dealt into stages of these sizes, each summing
    to at least ``need``?"""
    def deal(left: tuple[int, ...], k: int) -> bool:
        if k == len(sizes):
            return not left
        return any(sum(group) >= need and deal(tuple(c for i, c in enumerate(left) if i not in idx), k + 1)
                   for idx in itertools.combinations(range(len(left)), sizes[k])
                   for group in [[left[i] for i in idx]])
    return deal(tuple(caps), 0)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(6, 11), s=st.integers(3, 5), m=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_stages_of_slow_nodes_are_dealt_again_until_the_tc1_caps_carry_every_visit(n, s, m, seed):
    # L = S: every microbatch visits every stage, so each stage must take D*m visits. Dealing the
    # slowest nodes into one stage leaves it short; the repair deals them again whenever any
    # dealing carries the visits (checked by brute force), and leaves a feasible one alone.
    from skippipe.planner.allocation.stage_caps import balance_stage_caps
    from skippipe.planner.routing.sequences import stage_cap_sums
    from skippipe.planner.stage_orders import sequence_quotas, stage_sequences

    n = max(n, 2 * s)
    forward = np.random.default_rng(seed).uniform(0.5, 2.0, size=n)
    cluster = cluster_from_dict({"transfer_s": np.full((n, n), 0.4).tolist(), "forward_s": forward.tolist()})
    problem = build_problem(cluster, Workload(num_stages=s, path_length=s, microbatches_per_data_node=m, n_layers=s))
    sizes = problem.stage_sizes
    by_speed = [int(x) for x in np.argsort(forward)]  # fastest first: the last stage gets the slowest
    stages = [sorted(by_speed[sum(sizes[:k]):sum(sizes[:k + 1])]) for k in range(len(sizes))]
    seqs = stage_sequences(s, s, problem.workload.max_swaps, problem.workload.max_jump)
    total = sizes[0] * m
    caps = problem.load_caps(stages)
    fixed = balance_stage_caps(problem, stages)
    assert [len(x) for x in fixed] == [len(x) for x in stages]
    assert sorted(x for group in fixed for x in group) == list(range(n))
    carries = sequence_quotas(seqs, stage_cap_sums(problem.load_caps(fixed), fixed), total) is not None
    if sequence_quotas(seqs, stage_cap_sums(caps, stages), total) is not None:
        assert fixed == stages  # a feasible allocation is left alone
    elif _some_dealing_carries([caps[x] for g in stages[1:] for x in g], list(sizes[1:]), total):
        assert fixed[0] == stages[0] and carries  # the same data nodes, dealt again
    else:
        # no dealing of these nodes carries: other data nodes (slower ones traded in), or as it was
        assert fixed == stages or (fixed[0] != stages[0] and carries)


def test_a_tc1_refusal_names_the_short_stages_and_their_fix():
    # 8 even nodes, L = S = 5: the sizes 2,2,2,1,1 (the default before it made sure of its caps)
    # give every non-data node a cap of 10 visits, and a one-node stage cannot take the 14
    # microbatches that all pass it
    from skippipe.errors import UserError
    from skippipe.planner.methods import make_plan

    cluster = cluster_from_dict({"transfer_s": np.full((8, 8), 0.4).tolist(), "forward_s": [1.0] * 8})
    workload = Workload(num_stages=5, path_length=5, microbatches_per_data_node=7, n_layers=10, stage_sizes=[2, 2, 2, 1, 1])
    with pytest.raises(UserError) as refused:
        make_plan("skippipe", build_problem(cluster, workload))
    message = str(refused.value)
    assert "[20, 20, 10, 10]" in message and "give stage(s) 3, 4 more nodes" in message and "\n" not in message
    # the fix it names: stages 3 and 4 get as many nodes as the others (here one each, with 4
    # data nodes), which is what the default sizes are now
    fixed = Workload(num_stages=5, path_length=5, microbatches_per_data_node=7, n_layers=10)
    assert build_problem(cluster, fixed).stage_sizes == [4, 1, 1, 1, 1]
    assert make_plan("skippipe", build_problem(cluster, fixed)).predicted_makespan_s > 0
    # one node a stage (N = S) and L = S - 1, two very slow nodes: whichever node is the data
    # node, the others' TC1 caps cannot carry the 24 visits (each microbatch skips one stage);
    # no stage has a node to give, so the fix is the path length, the stages or the cluster
    cluster = cluster_from_dict({"transfer_s": np.full((6, 6), 0.4).tolist(), "forward_s": [1.0, 40, 20, 2, 1.5, 1.0]})
    workload = Workload(num_stages=6, path_length=5, microbatches_per_data_node=6, n_layers=6, stage_sizes=[1] * 6)
    with pytest.raises(UserError) as refused:
        make_plan("skippipe", build_problem(cluster, workload))
    message = str(refused.value)
    assert "every stage has one node: use a shorter path_length" in message and "more nodes (workload" not in message


def test_fast_data_nodes_are_traded_when_no_dealing_carries_the_visits():
    # sweep case 63's speeds: 12 nodes, S = L = 9 (one data node, five one-node stages that each
    # take all 5 microbatches). With the fastest node as the data node only four others get a
    # cap of 5, so no dealing carries the visits; trading it for the slowest node leaves five
    from skippipe.planner.allocation.stage_caps import balance_stage_caps
    from skippipe.planner.methods import make_plan
    from skippipe.planner.routing.sequences import stage_cap_sums
    from skippipe.planner.stage_orders import sequence_quotas, stage_sequences

    speed = [0.44, 1.03, 0.53, 0.81, 0.66, 0.73, 0.69, 0.41, 1.23, 1.49, 1.01, 1.29]
    cluster = cluster_from_dict({"transfer_s": np.full((12, 12), 0.4).tolist(), "forward_s": [1 / v for v in speed]})
    workload = Workload(num_stages=9, path_length=9, microbatches_per_data_node=5, max_jump=1, max_swaps=0, n_layers=27)
    problem = build_problem(cluster, workload)
    assert problem.stage_sizes == [1, 2, 2, 2, 1, 1, 1, 1, 1]
    stages = [[9], [0, 7], [2, 4], [5, 6], [1], [3], [8], [10], [11]]
    seqs = stage_sequences(9, 9, 0, 1)
    assert sequence_quotas(seqs, stage_cap_sums(problem.load_caps(stages), stages), 5) is None
    fixed = balance_stage_caps(problem, stages)
    assert fixed[0] == [7]  # node 9 (1.49) traded for node 7 (0.41)
    assert sequence_quotas(seqs, stage_cap_sums(problem.load_caps(fixed), fixed), 5) is not None
    assert plan_violations(make_plan("skippipe-no-tc2", problem, seed=0)) == []


@pytest.mark.parametrize("s", [3, 4, 5, 7, 8, 9])
def test_held_karp_agrees_with_enumeration_with_ties_and_sizes(s):
    # costs on a coarse grid (many ties) and mixed group sizes: Held-Karp's tour has the
    # enumerated optimum's cost and puts a group of the right size at every position
    rng = np.random.default_rng(100 + s)
    for _ in range(20):
        a = np.round(rng.random((s, s)) * 3)
        cost = a + a.T
        slots = [4] + sorted(rng.integers(2, 4, s - 1).tolist())
        groups = [slots[0], *rng.permutation(slots[1:]).tolist()]
        brute = min(
            sum(cost[p[i], p[(i + 1) % s]] for i in range(s))
            for p in ([0, *q] for q in itertools.permutations(range(1, s)))
            if [groups[g] for g in p] == slots
        )
        order, total = _held_karp(cost, np.array(groups), np.array(slots))
        assert total == pytest.approx(brute)
        assert sorted(order) == list(range(s)) and [groups[g] for g in order] == slots
        assert total == pytest.approx(sum(cost[order[i], order[(i + 1) % s]] for i in range(s)))
