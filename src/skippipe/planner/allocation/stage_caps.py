"""Stages whose TC1 caps can carry the visits the path rules send them.

A node's TC1 cap depends only on which nodes are data nodes (``Problem.load_caps``: the visits
shared in proportion to speed), so moving nodes between stages 1..S-1 changes no cap, only the
stages' sums. The allocation search scores links, not these sums; with little freedom in the
paths (L = S: every microbatch visits every stage) a stage of slow nodes can then take fewer
visits than every microbatch must pay it, and no routing exists although the same nodes, dealt
differently, would carry it.

``balance_stage_caps`` repairs such an allocation with the fewest nodes moved. One integer
program (HiGHS) chooses a stage for every node of stages 1..S-1 (each stage keeps its size) and
how many microbatches take each valid stage order (``sequence_quotas``'s split), so that every
stage's cap sum carries its visits, moving as few nodes as it can. A feasible allocation is
returned unchanged, and so is one that no dealing of these nodes can make feasible (routing then
refuses it in one line).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import LinearConstraint, milp

from skippipe.planner.problem import Problem
from skippipe.planner.routing.sequences import sequence_quotas, stage_cap_sums, stage_sequences


def balance_stage_caps(problem: Problem, stages: list[list[int]]) -> list[list[int]]:
    """``stages`` with nodes of stages 1..S-1 dealt again, fewest moved, so that the TC1 caps
    admit a routing (see the module text)."""
    w = problem.workload
    seqs = stage_sequences(len(stages), w.path_length, w.max_swaps, w.max_jump)
    total = len(stages[0]) * w.microbatches_per_data_node
    caps = problem.load_caps(stages)
    if not seqs or len(stages) < 3 or sequence_quotas(seqs, stage_cap_sums(caps, stages), total) is not None:
        return stages
    later = range(1, len(stages))
    nodes = [x for s in later for x in stages[s]]
    k, n_z = len(later), len(nodes) * len(later)
    n_vars = n_z + len(seqs)  # z[i * k + (s - 1)]: node i in stage s; then q[j]: microbatches on order j
    rows: list[np.ndarray] = []
    lower: list[float] = []
    upper: list[float] = []

    def row(lo: float, hi: float) -> np.ndarray:
        r = np.zeros(n_vars)
        rows.append(r)
        lower.append(lo)
        upper.append(hi)
        return r

    for i in range(len(nodes)):  # every node in one stage
        row(1, 1)[i * k:(i + 1) * k] = 1
    for s in later:  # every stage keeps its size, and its caps carry its visits
        in_s = [i * k + s - 1 for i in range(len(nodes))]
        row(len(stages[s]), len(stages[s]))[in_s] = 1
        carry = row(0, np.inf)
        carry[in_s] = [caps[x] for x in nodes]
        carry[[n_z + j for j, seq in enumerate(seqs) if s in seq]] = -1
    row(total, total)[n_z:] = 1
    cost = np.zeros(n_vars)
    home = {x: s for s in later for x in stages[s]}
    cost[[i * k + home[x] - 1 for i, x in enumerate(nodes)]] = -1  # keep nodes where they are
    upper_bounds = np.concatenate([np.ones(n_z), np.full(len(seqs), total)])
    res = milp(c=cost, constraints=LinearConstraint(np.array(rows), lower, upper), integrality=np.ones(n_vars),
               bounds=(np.zeros(n_vars), upper_bounds), options={"time_limit": 10.0})
    if res.x is None:
        return stages
    z = np.round(res.x[:n_z]).reshape(len(nodes), k)
    out = [sorted(stages[0])] + [sorted(x for i, x in enumerate(nodes) if z[i, s - 1] > 0.5) for s in later]
    return out if all(len(a) == len(b) for a, b in zip(out, stages)) else stages
