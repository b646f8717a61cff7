"""Plan again for the same nodes on changed costs (re-plan on drift, rejoin: ``runtime/elastic.py``).

``replan(plan, transfer_s, method)`` runs the planner on the plan's own cluster — its nodes,
their forward times and memory, the workload it was made for — with the hop times
``transfer_s`` (e.g. one link measured or emulated slower). The layer partition is kept: a
running job's checkpoint is per stage, so the new plan must cut the model where the old one did.
Nodes may change stage (every node can load any stage from the stage's checkpoint files). When
the planner's allocation cuts the model differently, it plans again with the old allocation
fixed. The new plan is kept only when it simulates faster than the old plan on the new costs;
else the old plan with the new costs is returned. ``plan.meta`` (elastic node ids, emulation
events folded in) carries over. Torch-free.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from skippipe.cluster import cluster_from_dict
from skippipe.costs import CostModel
from skippipe.errors import UserError
from skippipe.planfile import Plan
from skippipe.planner.methods import make_plan, with_allocation
from skippipe.planner.problem import Problem
from skippipe.sim import simulate
from skippipe.workload import workload_from_dict


def with_transfer(plan: Plan, transfer_s: np.ndarray) -> Plan:
    """The same plan with other hop times (a copy; the planned paths are kept)."""
    costs = replace(plan.costs, transfer_s=np.array(transfer_s, dtype=float))
    return replace(plan, costs=costs, meta=dict(plan.meta), predicted_makespan_s=None, lower_bound_s=None)


def problem_of(plan: Plan, transfer_s: np.ndarray) -> Problem:
    """The planning problem of ``plan``'s cluster with hop times ``transfer_s``."""
    if plan.workload is None:
        raise UserError("the plan does not say which workload it was made for; it cannot be planned again")
    n = plan.n_nodes
    workload = workload_from_dict({**plan.workload, "stage_sizes": [len(s) for s in plan.stages]}, where="the plan's workload")
    c = plan.costs
    cluster = cluster_from_dict({"name": str(plan.meta.get("cluster", "replan")), "n": n,
                                 "transfer_s": np.asarray(transfer_s, dtype=float).tolist(),
                                 "forward_s": np.asarray(c.forward_s, dtype=float).tolist(), "memory": list(plan.memory)})
    cost_model = CostModel(hop_overhead_s=0.0, backward_factor=c.backward_factor, loss_factor=c.loss_factor,
                           inject_gap_s=c.inject_gap_s, op_gap_s=c.op_gap_s)
    return Problem(cluster=cluster, workload=workload, cost_model=cost_model, transfer_s=np.array(transfer_s, dtype=float),
                   forward_s=np.array(c.forward_s, dtype=float), memory=np.array(plan.memory, dtype=int),
                   stage_sizes=[len(s) for s in plan.stages])


def replan(plan: Plan, transfer_s: np.ndarray, method: str = "skippipe", seed: int = 0,
           time_limit_s: float | None = None, fixed_stages: bool = False) -> Plan:
    """The better of a new ``method`` plan on ``transfer_s`` and the old plan on ``transfer_s``
    (by simulated makespan); the layer partition and ``plan.meta`` are kept. ``fixed_stages``:
    every node stays in its stage (only the paths are planned again)."""
    old = with_transfer(plan, transfer_s)
    old_sim = simulate(old, bound=False)
    problem = problem_of(plan, transfer_s)
    if fixed_stages:
        problem = with_allocation(problem, plan.stages)
    new = make_plan(method, problem, seed=seed, time_limit_s=time_limit_s)
    if new.layers != plan.layers:
        new = make_plan(method, with_allocation(problem, plan.stages), seed=seed, time_limit_s=time_limit_s)
    new_sim = simulate(new, bound=False)
    if new.layers != plan.layers or not new_sim.finished or (old_sim.finished and new_sim.makespan_s >= old_sim.makespan_s):
        old.predicted_makespan_s = float(old_sim.makespan_s) if old_sim.finished else None
        return old
    new.meta = {**plan.meta, "replanned_from": plan.method, "planning_s": new.meta.get("planning_s")}
    new.nodes = plan.nodes
    return new
