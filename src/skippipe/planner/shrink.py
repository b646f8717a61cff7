"""The plan for the nodes left after a failure (elastic recovery, ``runtime/elastic.py``).

``shrink_plan(plan, lost)`` restricts the plan's cluster to the surviving nodes and renumbers
them in their old order (``kept[new] = old``). Each stage keeps its layers and its other nodes:

- a lost non-data node's visits move to the other nodes of its stage, each visit to the node
  with the fewest microbatches so far (then the lowest id): the paths keep their stage sequence;
- a lost data node's microbatches move to the other data nodes, each to the one that owns the
  fewest so far: microbatch ids, and so the microbatch total and the data each one reads
  (``data.batches``: by microbatch rank and iteration) stay the same;
- costs (transfer and forward times) are the old ones restricted to the survivors; release times
  and ``after`` dependencies stay; a ``processing_order`` is dropped (it was for other nodes);
  per-node caps grow where a node now carries more (``max_load``).

A non-data stage with no node left is **frozen** (``Plan.frozen_stages``): it keeps its layers
but no path visits it; each path that visited it is filled up again with other stages
(``planner.frozen.reroute``: CC3 counted over the live stages, the one relaxation). When fewer
live stages than ``path_length`` remain, the path length shrinks to their number. Stage 0 with
no node left raises ``StageLost`` (the data nodes hold the embedding, the head and the data).
Torch-free.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from skippipe.errors import StageLost
from skippipe.planfile import Constraints, Microbatch, Plan, check_plan
from skippipe.planner.frozen import reroute


def original_nodes(plan: Plan) -> list[int]:
    """The node ids of the run's first plan, per node of this one (a plan never shrunk: identity)."""
    kept = plan.meta.get("elastic", {}).get("original_nodes") if isinstance(plan.meta.get("elastic"), dict) else None
    return [int(x) for x in kept] if kept else list(range(plan.n_nodes))


def shrink_plan(plan: Plan, lost: set[int]) -> tuple[Plan, list[int]]:
    """The plan without the nodes in ``lost``, and ``kept`` (new node id -> old node id)."""
    orig = original_nodes(plan)
    if all(n in lost for n in plan.stages[0]):
        raise StageLost(0, [orig[n] for n in plan.stages[0]], "the data nodes hold the embedding, the head and the data")
    newly = [s for s, nodes in enumerate(plan.stages) if nodes and all(n in lost for n in nodes)]
    frozen = sorted(set(plan.frozen_stages) | set(newly))
    c = plan.constraints
    path_length = min(c.path_length, plan.num_stages - len(frozen))
    kept = [n for n in range(plan.n_nodes) if n not in lost]
    new_id = {old: new for new, old in enumerate(kept)}
    stage_of = plan.stage_of()
    load = {n: 0 for n in kept}
    owned = {n: 0 for n in plan.stages[0] if n not in lost}
    for mb in plan.microbatches:
        if mb.data_node in owned:
            owned[mb.data_node] += 1
        for n in mb.path:
            if n in load:
                load[n] += 1
    mbs: list[Microbatch] = []
    for mb in sorted(plan.microbatches, key=lambda m: m.id):
        data = mb.data_node
        if data in lost:
            data = min(owned, key=lambda n: (owned[n], n))
            owned[data] += 1
        old_path = mb.path
        if newly or len(old_path) != path_length - 1:
            old_path = _around_frozen(plan, mb, frozen, path_length, lost, load)
        path = []
        for n in old_path:
            if n in lost:
                others = [o for o in plan.stages[stage_of[n]] if o not in lost]
                n = min(others, key=lambda o: (load[o], o))
                load[n] += 1
            path.append(new_id[n])
        mbs.append(Microbatch(mb.id, new_id[data], path, release_s=mb.release_s, after=mb.after))
    idx = np.array(kept, dtype=int)
    costs = replace(plan.costs, transfer_s=np.asarray(plan.costs.transfer_s)[np.ix_(idx, idx)],
                    forward_s=np.asarray(plan.costs.forward_s)[idx])
    max_load = None
    if c.max_load is not None:
        max_load = [int(c.max_load[old]) for old in kept]
    constraints = Constraints(path_length=path_length, max_swaps=c.max_swaps, max_jump=c.max_jump, max_load=max_load)
    lost_before = plan.meta.get("elastic", {}).get("lost", []) if isinstance(plan.meta.get("elastic"), dict) else []
    meta = {**plan.meta, "elastic": {"original_nodes": [orig[n] for n in kept],
                                     "lost": [*lost_before, *sorted(orig[n] for n in lost)]}}
    out = Plan(
        stages=[[new_id[n] for n in nodes if n not in lost] for nodes in plan.stages],
        layers=[list(ls) for ls in plan.layers], memory=[plan.memory[n] for n in kept], constraints=constraints,
        costs=costs, microbatches=mbs, method=plan.method, seed=plan.seed, processing_order=None,
        workload=plan.workload, model=plan.model, meta=meta,
        nodes=None if plan.nodes is None else [{**plan.nodes[old], "id": new} for new, old in enumerate(kept)],
        frozen_stages=frozen,
    )
    if out.constraints.max_load is not None:
        load_now = out.load_per_node()
        out.constraints.max_load = [max(cap, have) for cap, have in zip(out.constraints.max_load, load_now)]
    check_plan(out, "the plan for the surviving nodes")
    return out, kept


def _around_frozen(plan: Plan, mb: Microbatch, frozen: list[int], path_length: int, lost: set[int],
                   load: dict[int, int]) -> list[int]:
    """``mb``'s path (old node ids) with its visits to frozen stages replaced by visits to other
    stages, each to that stage's least-loaded surviving node (``load`` is updated)."""
    stage_of = plan.stage_of()
    alive = {s: [n for n in nodes if n not in lost] for s, nodes in enumerate(plan.stages)}
    cost = {s: min(load[n] for n in nodes) for s, nodes in alive.items() if nodes}
    visits = [stage_of[n] for n in mb.path]
    seq = reroute(visits, set(frozen), plan.num_stages, path_length, plan.constraints.max_swaps, plan.constraints.max_jump,
                  cost)
    if seq is None:
        stage = min(set(visits) & set(frozen), default=frozen[0])
        raise StageLost(stage, [], f"no path for microbatch {mb.id} avoids the frozen stages {frozen} within the path rules")
    old = {stage_of[n]: n for n in mb.path}
    out = []
    for s in seq:
        if s in old:
            out.append(old[s])
        else:
            node = min(alive[s], key=lambda n: (load[n], n))
            load[node] += 1
            out.append(node)
    return out
