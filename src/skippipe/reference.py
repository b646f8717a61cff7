"""The two SkipPipe reference instances, turned into our plans (torch-free).

``shipped`` is ``skippipe-gcp20-schedule.json`` (shipped with the authors' code, forward 0.44 s),
``current`` is ``skippipe-gcp20-head-schedule.json`` (their current code, forward 1.76 s). Both
are copied into ``skippipe/resources/reference/``; their networks and allocations are the example
clusters ``gcp20-shipped`` and ``gcp20-current``.

How the reference turns a file into simulated microbatches (DESIGN §3), reproduced here:

- skip methods (``ca`` = SkipPipe, ``nonca`` = without TC2, ``random``): with ``a`` agents per
  data node, agent i belongs to data node ``partitions[0][i // a]`` with slot ``k = i % a``; it
  yields two microbatches (d = 0, 1) per copy and ``max(1, 3 // a)`` copies; copy c, index d is
  released at ``d * 2.5 + c * 1.0 + k * w``; the d = 1 microbatch waits (``after``) for the
  d = 0 one of its copy to finish its backward.
- ``full`` (DT-FM): the first ``|P1|`` data nodes inject through chain j = column j of
  ``partitions[1:]``; 9 microbatches per chain in 3 slots of 3, released at ``d * 0.1``, a later
  one in a slot waiting for the first of its slot. ``full30`` sends 10 per chain the same way
  (30 in all, the samples of the skip methods).

Replayed plans carry ``max_load = None``: the reference's paths break our TC1 caps (see
``rule_breaks``), so the caps are not enforced for them.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from importlib import resources
from typing import Any

from skippipe.cluster import load_cluster
from skippipe.errors import UserError
from skippipe.planfile import Microbatch, Plan, plan_violations
from skippipe.planner.problem import Problem, build_problem
from skippipe.workload import Workload

INSTANCES: dict[str, dict[str, Any]] = {
    "shipped": {"file": "skippipe-gcp20-schedule.json", "cluster": "gcp20-shipped", "forward_s": 0.44},
    "current": {"file": "skippipe-gcp20-head-schedule.json", "cluster": "gcp20-current", "forward_s": 1.76},
}
SKIP_METHODS = {"ca": "ca-paths", "nonca": "non-ca-paths", "random": "random-paths"}
FIGURE_KEYS = {
    "full": "baseline-expected-time",
    "random": "random-expected-time",
    "nonca": "nonca-expected-time",
    "ca": "ca-expected-time",
}
METHOD_TITLES = {
    "full": "full pipeline (DT-FM)",
    "full30": "full pipeline, 10 per chain",
    "random": "random skipping (DT-FM skip)",
    "nonca": "SkipPipe without TC2",
    "ca": "SkipPipe",
}
METHODS = ("full", "full30", "random", "nonca", "ca")
# reference figures that are not valid iteration times (microbatches lost in their simulator)
INVALID_FIGURES = {("current", "random"): "lost 2 of 30 microbatches in the reference simulator"}


def _check(instance: str, method: str | None = None) -> None:
    if instance not in INSTANCES:
        raise UserError(f"unknown reference instance {instance!r} (known: {', '.join(INSTANCES)})")
    if method is not None and method not in METHODS:
        raise UserError(f"unknown reference method {method!r} (known: {', '.join(METHODS)})")


@cache
def _load(instance: str) -> str:
    _check(instance)
    name = INSTANCES[instance]["file"]
    return resources.files("skippipe").joinpath(f"resources/reference/{name}").read_text()


def load_reference(instance: str) -> dict[str, Any]:
    """The raw reference file (a fresh copy)."""
    return json.loads(_load(instance))


def reference_figure(instance: str, method: str) -> float | None:
    """The reference simulator's seconds per iteration for a method (None: not in the file)."""
    _check(instance, method)
    key = FIGURE_KEYS.get(method)
    doc = load_reference(instance)
    return None if key is None or key not in doc else float(doc[key])


def reference_problem(instance: str) -> Problem:
    """Cluster (the example file) + the reference workload, allocation fixed to ``partitions``."""
    _check(instance)
    cluster = load_cluster(INSTANCES[instance]["cluster"])
    doc = load_reference(instance)
    sizes = tuple(len(s) for s in doc["partitions"])
    workload = Workload(num_stages=len(sizes), path_length=4, microbatches_per_data_node=6,
                        memory=int(doc["memory"]), stage_sizes=sizes)
    return build_problem(cluster, workload)


def reference_stages(instance: str) -> list[list[int]]:
    return [list(map(int, s)) for s in load_reference(instance)["partitions"]]


def _agent_paths(doc: dict[str, Any], key: str) -> dict[int, list[int]]:
    """agent -> nodes visited after its data node, from the agent's {node: next node} map."""
    out = {}
    for agent, hops in doc[key].items():
        nxt = {int(a): int(b) for a, b in hops.items()}
        targets = set(nxt.values())
        start = next(a for a in nxt if a not in targets)
        path, cur = [], start
        while cur in nxt:
            cur = nxt[cur]
            path.append(cur)
        out[int(agent)] = path
    return out


def _skip_microbatches(doc: dict[str, Any], key: str, w: float) -> list[Microbatch]:
    data = doc["partitions"][0]
    paths = _agent_paths(doc, key)
    per_node = len(paths) // len(data)
    copies = max(1, 3 // per_node)
    mbs: list[Microbatch] = []
    for agent in sorted(paths):
        node, slot = data[agent // per_node], agent % per_node
        for c in range(copies):
            first = len(mbs)
            for d in range(2):
                mbs.append(
                    Microbatch(
                        id=len(mbs), data_node=node, path=list(paths[agent]),
                        release_s=d * 2.5 + c * 1.0 + slot * w, after=first if d else None,
                    )
                )
    return mbs


def _full_microbatches(doc: dict[str, Any], per_chain: int) -> list[Microbatch]:
    parts = doc["partitions"]
    mbs: list[Microbatch] = []
    for j, node in enumerate(parts[0][: len(parts[1])]):
        chain = [parts[s][j] for s in range(1, len(parts))]
        firsts: dict[int, int] = {}
        for i in range(per_chain):
            slot, d = i % 3, i // 3
            if per_chain == 9:  # the reference's loop order: slot outer, d inner
                slot, d = divmod(i, 3)
            mbs.append(
                Microbatch(id=len(mbs), data_node=node, path=list(chain), release_s=round(d * 0.1, 10),
                           after=firsts.get(slot))
            )
            firsts.setdefault(slot, mbs[-1].id)
    return mbs


def reference_plan(instance: str, method: str) -> Plan:
    """Replay one of the reference's methods as a plan (TC1 caps off, see ``rule_breaks``)."""
    _check(instance, method)
    doc = load_reference(instance)
    problem = reference_problem(instance)
    w = INSTANCES[instance]["forward_s"]
    stages = reference_stages(instance)
    if method in SKIP_METHODS:
        mbs = _skip_microbatches(doc, SKIP_METHODS[method], w)
        path_length = 4
    else:
        mbs = _full_microbatches(doc, 9 if method == "full" else 10)
        path_length = len(stages)
    figure = reference_figure(instance, method)
    meta = {"reference": instance, "reference_method": method}
    if figure is not None:
        meta["reference_s"] = figure
    plan = problem.make_plan(stages, mbs, method=f"reference-{method}", seed=None, path_length=path_length, meta=meta)
    plan.constraints = replace(plan.constraints, max_load=None)
    return plan


def rule_breaks(plan: Plan, problem: Problem) -> list[str]:
    """The rules a replayed plan breaks once our TC1 caps (``problem.load_caps``) are on.

    The caps are those of a skip plan (L = ``problem.workload.path_length``); full-pipeline
    plans are checked against the path rules only.
    """
    full = plan.constraints.path_length == len(plan.stages) and plan.constraints.path_length != problem.workload.path_length
    caps = None if full else problem.load_caps(plan.stages)
    capped = replace(plan, constraints=replace(plan.constraints, max_load=caps))
    out = plan_violations(capped)
    # the reference plans with "agents" (one route each, standing for several microbatches);
    # more agents on a node than it has memory slots is allowed there, not in TC1's spirit
    routes: dict[int, set[tuple[int, ...]]] = {}
    for mb in plan.microbatches:
        for x in mb.path:
            routes.setdefault(x, set()).add((mb.data_node, *mb.path))
    for x in sorted(routes):
        if len(routes[x]) > plan.memory[x]:
            out.append(f"node {x} is on {len(routes[x])} distinct routes, more than its memory {plan.memory[x]}")
    return out
