"""Small hand-made plans for single-process tests (and the experiments' ``--plans toy``; by
default the experiments in ``benchmarks/`` use the real planners): no timing optimisation,
only the structure that matters for learning (which stages each microbatch visits, in which
order).

- ``skip_plan``: stage 0 of ``stage_sizes[0]`` data nodes with ``m`` microbatches each; every
  microbatch visits L-1 of the S-1 other stages. The (S-1 choose L-1) stage subsets are dealt
  out in a seeded random order, round robin, so every stage is visited equally often; within a
  stage, the least-loaded node takes the visit (TC1 balance). With ``swap_fraction`` > 0, that
  share of the microbatches whose subset holds two adjacent stages visits them in swapped order
  (CC3, one swap of distance 1).
- ``full_plan``: the full pipeline (DT-FM): ``chains`` parallel chains, one node per stage
  each; data node j sends all its microbatches through chain j, visiting every stage in order.

Both go through ``Problem.make_plan`` on a preset cluster, so they carry real costs and pass
``check_plan``.
"""

from __future__ import annotations

import itertools

import numpy as np

from skippipe.cluster import preset_cluster
from skippipe.planfile import Microbatch, Plan, check_plan
from skippipe.planner.problem import build_problem
from skippipe.workload import Workload


def _problem(stage_sizes: list[int], path_length: int, m: int, n_layers: int, samples: int, d_model: int, ctx: int):
    n = sum(stage_sizes)
    w = Workload(
        num_stages=len(stage_sizes), path_length=path_length, microbatches_per_data_node=m,
        samples_per_microbatch=samples, n_layers=n_layers, d_model=d_model, ctx=ctx,
        stage_sizes=tuple(stage_sizes),
    )
    return build_problem(preset_cluster("gcp-2025", "geo-distributed", n), w)


def consecutive_stages(stage_sizes: list[int]) -> list[list[int]]:
    """Stages of the given sizes over node ids 0, 1, 2, ... in order."""
    out, start = [], 0
    for size in stage_sizes:
        out.append(list(range(start, start + size)))
        start += size
    return out


def skip_plan(
    stage_sizes: list[int], path_length: int, m: int, n_layers: int, seed: int = 0, swap_fraction: float = 0.0,
    samples: int = 4, d_model: int = 128, ctx: int = 128,
) -> Plan:
    problem = _problem(stage_sizes, path_length, m, n_layers, samples, d_model, ctx)
    stages = consecutive_stages(stage_sizes)
    S = len(stages)
    rng = np.random.default_rng(seed)
    subsets = list(itertools.combinations(range(1, S), path_length - 1))
    order = [subsets[i] for i in rng.permutation(len(subsets))]
    load = {node: 0 for s in stages[1:] for node in s}
    mbs = []
    data = stages[0]
    for k in range(len(data) * m):
        data_node = data[k % len(data)]
        visit = list(order[k % len(order)])
        pairs = [i for i in range(len(visit) - 1) if visit[i + 1] == visit[i] + 1]
        if pairs and rng.random() < swap_fraction:
            i = pairs[int(rng.integers(len(pairs)))]
            visit[i], visit[i + 1] = visit[i + 1], visit[i]
        path = []
        for s in visit:
            node = min(stages[s], key=lambda n: (load[n], n))
            load[node] += 1
            path.append(node)
        mbs.append(Microbatch(id=k, data_node=data_node, path=path))
    plan = problem.make_plan(stages, mbs, method="toy-skip", seed=seed, meta={"swap_fraction": swap_fraction})
    check_plan(plan)
    return plan


def full_plan(
    num_stages: int, chains: int, m: int, n_layers: int, samples: int = 4, d_model: int = 128, ctx: int = 128,
) -> Plan:
    sizes = [chains] * num_stages
    problem = _problem(sizes, num_stages, m, n_layers, samples, d_model, ctx)
    stages = consecutive_stages(sizes)
    mbs = []
    for k in range(chains * m):
        j = k % chains
        mbs.append(Microbatch(id=k, data_node=stages[0][j], path=[stages[s][j] for s in range(1, num_stages)]))
    plan = problem.make_plan(stages, mbs, method="toy-full", seed=0, max_swaps=0)
    check_plan(plan)
    return plan
