"""Hypothesis strategies shared by the scheduler tests: small generated clusters with uneven
compute (and memory) and a workload whose path rules bind; and fixed problems several test
files use."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import strategies as st

from skippipe.cluster import cluster_from_dict
from skippipe.cluster_gen import random_global_cluster, single_site_cluster
from skippipe.errors import UserError
from skippipe.planner import floors
from skippipe.planner.methods import make_plan, with_allocation
from skippipe.planner.problem import Problem, build_problem
from skippipe.workload import Workload, least_max_jump


@st.composite
def generated_problems(draw, stages: tuple[int, int] = (3, 6), max_path: int = 4, extra_nodes: int = 3,
                       max_nodes: int = 16, single_site_memory: bool = True, sites: bool = False):
    """A problem on a random global cluster (some links broken) or a single site, speeds
    0.5–2x, memory 1–4 (on a single site only with ``single_site_memory``); with ``sites`` the
    global cluster may be 2-3 sites instead of one per node, with up to 40 % of links broken."""
    s = draw(st.integers(*stages))
    shortest = next(L for L in range(2, s + 1) if least_max_jump(s, L) <= 4)  # the default max_jump reaches stage S-1
    L = draw(st.integers(shortest, max(shortest, min(s, max_path))))
    n = draw(st.integers(s + extra_nodes, max_nodes))
    seed = draw(st.integers(0, 10_000))
    if draw(st.booleans()):
        places = draw(st.sampled_from([None, 2, 3])) if sites else None
        broken = draw(st.sampled_from([0, 0.1, 0.4] if sites else [0, 0.1]))
        cluster = random_global_cluster(n, seed=seed, sites=places, speed=(0.5, 2.0), memory=(1, 4), broken=broken)
    elif single_site_memory:
        cluster = single_site_cluster(n, seed=seed, speed=(0.5, 2.0), memory=(1, 4))
    else:
        cluster = single_site_cluster(n, seed=seed, speed=(0.5, 2.0))
    wl = Workload(num_stages=s, path_length=L, microbatches_per_data_node=draw(st.integers(1, 6)), n_layers=4 * s)
    return build_problem(cluster, wl)


def random_allocation(problem, rng) -> list[list[int]]:
    """A random allocation of the problem's nodes to stages of its stage sizes (``rng``: numpy)."""
    order = [int(x) for x in rng.permutation(problem.n)]
    stages, at = [], 0
    for size in problem.stage_sizes:
        stages.append(sorted(order[at:at + size]))
        at += size
    return stages


def dealings(nodes: list[int], sizes: list[int]):
    """Every split of ``nodes`` into ordered groups of ``sizes`` (each group sorted)."""
    if not sizes:
        yield []
        return
    for first in itertools.combinations(nodes, sizes[0]):
        left = [x for x in nodes if x not in first]
        for tail in dealings(left, sizes[1:]):
            yield [sorted(first), *tail]


def makespan_on(problem, stages: list[list[int]], method: str) -> float | None:
    """Seconds per iteration of ``method`` on the allocation ``stages``; None where it cannot plan
    there (no valid path, no routing under the caps, a memory deadlock)."""
    try:
        return make_plan(method, with_allocation(problem, stages), seed=0).predicted_makespan_s
    except UserError:
        return None


def plan_makespans(problem, methods: tuple[str, ...], draws: int) -> list[float]:
    """Seconds per iteration of skippipe and skippipe-no-tc2 on the problem, then of ``methods``
    on ``draws`` random allocations (those where a method cannot plan left out)."""
    made = [make_plan(method, problem, seed=0).predicted_makespan_s for method in ("skippipe-no-tc2", "skippipe")]
    rng = np.random.default_rng(0)
    for _ in range(draws):
        stages = random_allocation(problem, rng)
        made += [v for v in (makespan_on(problem, stages, method) for method in methods) if v is not None]
    return made


def floors_switched_off(monkeypatch, *names: str) -> None:
    """Switch off the floors ``names`` of ``skippipe.planner.floors`` (each then returns the
    value it is given)."""
    for name in names:
        monkeypatch.setattr(floors, name, lambda problem, trip_floors, at_least: at_least)


def floor_and_without(problem, monkeypatch, *names: str):
    """(the floor over every allocation of ``problem``, its value with the floors ``names``
    switched off: ``floors_switched_off``)."""
    floor = floors.free_allocation_floor(problem)
    floors_switched_off(monkeypatch, *names)
    return floor, floors.free_allocation_floor(problem).value


def check_below_a_plan(value: float, problem, method: str, seed: int) -> None:
    """A floor ``value`` is at most the makespan of ``method`` on a random allocation (``seed``)
    of ``problem``, where it can plan there (a valid path, routing under the caps, no memory
    deadlock: else there is nothing to bound)."""
    plan = makespan_on(problem, random_allocation(problem, np.random.default_rng(seed)), method)
    if plan is not None:
        assert value <= plan + 1e-6


def islands_the_caps_cannot_carry():
    """Two islands (links of 200 s between them), every path through every stage (S = L = 3):
    the split gives the 3-node island one node per stage, and with speeds 10, 1 and 0.1
    whichever is its data node, one of the other two has a TC1 cap of 1 for its 2
    microbatches (``LoadCapsTooSmall``); the whole cluster can be routed."""
    transfer = np.full((10, 10), 200.0)
    transfer[:3, :3] = transfer[3:, 3:] = 0.05
    cluster = cluster_from_dict({"transfer_s": transfer.tolist(), "forward_s": [0.1, 1.0, 10.0] + [1.0] * 7})
    return build_problem(cluster, Workload(num_stages=3, path_length=3, microbatches_per_data_node=2, max_swaps=0,
                                           n_layers=3))


def half_broken_problem(n: int, seed: int, stages: int, length: int, m: int, swaps: int, jump: int,
                        memory: int = 1) -> Problem:
    """A random global cluster of ``n`` nodes, one site each, speeds 0.5-2x, 1..``memory``
    slots, half its links broken (they only trickle), with this workload."""
    cluster = random_global_cluster(n, seed=seed, speed=(0.5, 2.0), memory=(1, memory), broken=0.5)
    workload = Workload(num_stages=stages, path_length=length, microbatches_per_data_node=m, n_layers=3 * stages,
                        max_jump=jump, max_swaps=swaps)
    return build_problem(cluster, workload)
