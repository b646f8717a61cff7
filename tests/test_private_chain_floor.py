"""``benchmarks/private_chain_floor.py``: the exact cover finds the best split, and it is a floor."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from bench_scripts import load_benchmark
from skippipe.cluster_gen import random_global_cluster
from skippipe.planfile import Microbatch
from skippipe.planner.problem import Problem, build_problem
from skippipe.sim import simulate
from skippipe.workload import Workload


def _problem(seed: int, m: int, memory: int) -> Problem:
    # 6 nodes, S = L = 3: two data nodes, each with a private pair (N = D x L)
    cluster = random_global_cluster(6, seed=seed, speed=(0.5, 2.0), memory=(1, memory), broken=0.2)
    return build_problem(cluster, Workload(num_stages=3, path_length=3, microbatches_per_data_node=m, n_layers=9,
                                           max_swaps=0))


def _splits(n: int):
    """Every split of the nodes into two groups of a data node and an ordered pair."""
    for data in itertools.combinations(range(n), 2):
        rest = [x for x in range(n) if x not in data]
        for first in itertools.permutations(rest, 2):
            pair0 = first
            others = [x for x in rest if x not in first]
            for pair1 in itertools.permutations(others):
                yield ((data[0], pair0), (data[1], tuple(pair1)))


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 5_000), m=st.integers(1, 4), memory=st.integers(1, 3))
def test_the_floor_is_the_best_split_and_no_private_plan_beats_it(seed, m, memory):
    bench = load_benchmark("private_chain_floor")
    problem = _problem(seed, m, memory)
    assert list(problem.stage_sizes) == [2, 2, 2]
    floors = bench.group_floors(problem)
    value, split = bench.private_chain_floor(problem)
    # the exact cover agrees with every split tried by hand
    best = min(max(floors[d, tuple(sorted(pair))] for d, pair in s) for s in _splits(problem.n))
    assert value == best
    assert sorted(x for d, others in split for x in (d, *others)) == list(range(problem.n))
    assert max(floors[g] for g in split) == value
    # every private-chain plan (each data node's microbatches along its own pair) is no quicker
    for s in itertools.islice(_splits(problem.n), 0, None, 7):
        stages = [[d for d, _ in s], [pair[0] for _, pair in s], [pair[1] for _, pair in s]]
        mbs = [Microbatch(id=k * m + i, data_node=d, path=list(pair)) for k, (d, pair) in enumerate(s) for i in range(m)]
        plan = problem.make_plan(stages, mbs, method="private", seed=0)
        makespan = simulate(plan, record=False, bound=False).makespan_s
        assert makespan >= max(floors[d, tuple(sorted(pair))] for d, pair in s) - 1e-9
