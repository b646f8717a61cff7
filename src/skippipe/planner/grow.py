"""A brand-new node (one the run's first plan did not have) joins a running plan.

``add_node(plan, like, stage, new_id)`` extends the plan's cluster by one node (costs: those of
node ``like`` of the plan, the stand-in for the new node's own measurements: its forward time,
memory and load cap, and its hop times to every node; its hop to ``like`` is ``like``'s own
diagonal entry) placed in ``stage``. The stage's visits are dealt out again over its nodes, new
one included (each visit, in microbatch id order, to the node with the fewest so far), so every
path keeps its stage sequence and the new node carries its share. ``plan.meta["elastic"]
["original_nodes"]`` gets ``new_id``.

``choose_stage`` plans each candidate (``replan`` with the stage allocation fixed; kept if it
simulates faster than the dealt-out paths) and returns the stage whose extra replica gives the
shortest simulated makespan, with every candidate's figure. Stage 0 (data nodes) and frozen
stages are not candidates. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from skippipe.errors import UserError
from skippipe.planfile import Constraints, Microbatch, Plan, check_plan
from skippipe.planner.shrink import original_nodes
from skippipe.sim import simulate


def add_node(plan: Plan, like: int, stage: int, new_id: int) -> Plan:
    """``plan`` with one more node, a copy of node ``like`` (this plan's id), in ``stage``."""
    if not 0 < stage < plan.num_stages or stage in plan.frozen_stages:
        raise UserError(f"a new node can join stages 1..{plan.num_stages - 1} that are not frozen, not stage {stage}")
    n = plan.n_nodes
    t = np.asarray(plan.costs.transfer_s, dtype=float)
    grown = np.zeros((n + 1, n + 1))
    grown[:n, :n] = t
    grown[n, :n], grown[:n, n] = t[like, :], t[:, like]
    grown[n, n], grown[n, like], grown[like, n] = t[like, like], t[like, like], t[like, like]
    costs = replace(plan.costs, transfer_s=grown, forward_s=np.append(np.asarray(plan.costs.forward_s, dtype=float),
                                                                      float(plan.costs.forward_s[like])))
    stages = [list(nodes) for nodes in plan.stages]
    stages[stage].append(n)
    members = set(stages[stage])
    load = dict.fromkeys(stages[stage], 0)
    mbs = []
    for mb in sorted(plan.microbatches, key=lambda m: m.id):
        path = []
        for node in mb.path:
            if node in members:
                node = min(stages[stage], key=lambda o: (load[o], o))
                load[node] += 1
            path.append(node)
        mbs.append(Microbatch(mb.id, mb.data_node, path, release_s=mb.release_s, after=mb.after))
    c = plan.constraints
    max_load = None if c.max_load is None else [*c.max_load, int(c.max_load[like])]
    elastic = plan.meta.get("elastic") if isinstance(plan.meta.get("elastic"), dict) else {}
    meta = {**plan.meta, "elastic": {**elastic, "original_nodes": [*original_nodes(plan), new_id],
                                     "lost": list(elastic.get("lost", []))}}
    out = replace(plan, stages=stages, memory=[*plan.memory, plan.memory[like]], costs=costs, microbatches=mbs,
                  constraints=Constraints(c.path_length, c.max_swaps, c.max_jump, max_load), processing_order=None,
                  nodes=None if plan.nodes is None else [*plan.nodes, {**plan.nodes[like], "id": n}], meta=meta,
                  predicted_makespan_s=None, lower_bound_s=None, frozen_stages=list(plan.frozen_stages))
    check_plan(out, "the plan with the new node")
    return out


def choose_stage(plan: Plan, like: int, new_id: int, stage: int | None,
                 plan_again: Callable[[Plan], Plan]) -> tuple[Plan, int, dict[int, float]]:
    """The plan with the new node in ``stage`` (or, when None, in the candidate stage with the
    shortest simulated makespan), that stage, and each candidate's simulated makespan."""
    candidates = [stage] if stage is not None else [s for s in range(1, plan.num_stages) if s not in plan.frozen_stages]
    best: tuple[float, int, Plan] | None = None
    figures: dict[int, float] = {}
    for s in candidates:
        grown = plan_again(add_node(plan, like, s, new_id))
        res = simulate(grown, bound=False)
        span = float(res.makespan_s) if res.finished else float("inf")
        figures[s] = span
        if best is None or span < best[0]:
            best = (span, s, grown)
    if best is None:
        raise UserError("a new node cannot join: the plan has no stage it could join")
    return best[2], best[1], figures
