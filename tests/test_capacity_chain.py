"""``Capacity.chain`` (prefix-shared dynamic programme, whole-stage blocks for singleton classes)
gives exactly ``cheapest_chain`` over the current representatives, as capacity is used up, and
``Capacity.floor`` is never above it."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.cluster_gen import random_global_cluster
from skippipe.planner.problem import build_problem
from skippipe.planner.routing.assign import Capacity
from skippipe.planner.routing.sequences import RouteCosts, cheapest_chain, node_classes
from skippipe.planner.stage_orders import stage_sequences
from skippipe.workload import Workload


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), classes_alike=st.booleans(), rounds=st.booleans())
def test_chain_equals_cheapest_chain_on_the_representatives(seed: int, classes_alike: bool, rounds: bool) -> None:
    # with few sites and even compute many nodes share a class (representatives); with one site
    # per node and uneven compute every class is a single node (whole stages)
    n = 24
    cluster = (random_global_cluster(n, seed, sites=4, memory=(1, 2)) if classes_alike
               else random_global_cluster(n, seed, speed=(0.5, 2.0), memory=(1, 3)))
    problem = build_problem(cluster, Workload(num_stages=6, path_length=4))
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    sizes = problem.stage_sizes
    stages = [sorted(int(x) for x in order[sum(sizes[:s]):sum(sizes[:s + 1])]) for s in range(len(sizes))]
    caps = [int(c) for c in rng.integers(1, 4, size=n)]
    rc = RouteCosts.from_problem(problem)
    cap = Capacity(stages, caps, node_classes(problem.transfer_s, problem.forward_s, problem.memory))
    cap.round_cap = np.asarray(problem.memory, dtype=int)
    seqs = stage_sequences(len(stages), 4, 1, 4)
    for _ in range(40):
        d = int(stages[0][int(rng.integers(len(stages[0])))])
        r = int(rng.integers(2)) if rounds else None
        cap.use_round(r)
        for seq in seqs:
            got = cap.chain(rc, d, seq)
            want = cheapest_chain(rc, d, [cap.reps(s) for s in seq])
            assert got[1] == want[1]
            assert got[0] == want[0] or (np.isinf(got[0]) and np.isinf(want[0]))
            # the uncapped floor that lets the greedy skip a search is never above a capped path
            assert cap.floor(rc, d, seqs) <= got[0]
        seq = seqs[int(rng.integers(len(seqs)))]
        cost, path = cap.chain(rc, d, seq)
        if path:
            cap.take(path, r)
