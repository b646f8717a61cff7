"""Plan validation: structure, the path rules CC1-CC3, TC1 load caps, layers and order.

``plan_violations`` lists every problem as one readable line; ``check_plan`` raises a
``PlanError`` naming the first (and how many more there are).
"""

from __future__ import annotations

from collections import Counter

from skippipe.errors import PlanError
from skippipe.planfile.format import Plan, parse_op

# the one-line reason a version-1 plan file whose paths break the version-2 jump rule is refused
OLD_JUMP_MEANING = "written under the old max_jump meaning (stages skipped); re-plan it"


def path_rule_violation(stages_visited: list[int], max_swaps: int, max_jump: int) -> str | None:
    """CC3 on a microbatch's stage sequence after stage 0 (stage 0 is the implicit start).

    frontier = highest stage reached so far. A stage above the frontier may be at most
    ``max_jump`` stages past it (``s - frontier <= max_jump``: with the default 4 at most 3
    stages are skipped at once, and with 6 stages 0 -> 5 is forbidden); a stage below it is a
    swap and must be exactly frontier - 1 (distance 1); at most ``max_swaps`` swaps. Returns a
    reason, or None when the sequence is allowed.
    """
    frontier = 0
    swaps = 0
    seen = {0}
    for s in stages_visited:
        if s in seen:
            return f"visits stage {s} twice"
        seen.add(s)
        if s > frontier:
            if s - frontier > max_jump:
                return f"jumps from stage {frontier} to {s}, {s - frontier} > max_jump={max_jump} stages past the frontier"
            frontier = s
        else:
            if frontier - s != 1:
                return f"goes back from frontier stage {frontier} to stage {s} (swap distance {frontier - s} > 1)"
            swaps += 1
            if swaps > max_swaps:
                return f"makes {swaps} swaps > max_swaps={max_swaps}"
    return None


def live_index(num_stages: int, frozen: list[int]) -> dict[int, int]:
    """Stage -> its position among the stages that are not frozen. CC3 distances (jumps and
    swaps) are measured in these positions: a frozen stage is skipped by every path and counts
    neither for ``max_jump`` nor for a swap's distance (the model runs as if it were not there)."""
    skipped = set(frozen)
    live = [s for s in range(num_stages) if s not in skipped]
    return {s: k for k, s in enumerate(live)}


def plan_violations(plan: Plan) -> list[str]:
    out: list[str] = []
    n = plan.n_nodes
    S = plan.num_stages
    c = plan.constraints

    # ---- stages and layers
    if S < 1:
        return ["plan has no stages"]
    seen: dict[int, int] = {}
    frozen = set(plan.frozen_stages)
    for s in sorted(frozen):
        if not 0 < s < S:
            out.append(f"frozen stage {s} is not a stage of 1..{S - 1} (stage 0, the data nodes, cannot be frozen)")
        elif plan.stages[s]:
            out.append(f"frozen stage {s} still names nodes {plan.stages[s]}")
    for s, nodes in enumerate(plan.stages):
        if not nodes and s not in frozen:
            out.append(f"stage {s} has no nodes")
        for node in nodes:
            if not 0 <= node < n:
                out.append(f"stage {s} names node {node}, but nodes are 0..{n - 1}")
            elif node in seen:
                out.append(f"node {node} is in stage {seen[node]} and stage {s}")
            else:
                seen[node] = s
    if len(plan.layers) != S:
        out.append(f"layers lists {len(plan.layers)} stages but there are {S} stages")
    all_layers = [layer for ls in plan.layers for layer in ls]
    counts = Counter(all_layers)
    dup = sorted(k for k, v in counts.items() if v > 1)
    if dup:
        out.append(f"layer(s) {dup[:5]} belong to more than one stage")
    if all_layers and sorted(counts) != list(range(len(counts))):
        out.append(f"layers must be 0..{len(counts) - 1} with none missing, got {sorted(counts)[:10]}...")
    for s, ls in enumerate(plan.layers):
        if not ls:
            out.append(f"stage {s} holds no layers")
    if plan.model and "n_layers" in plan.model and len(counts) != plan.model["n_layers"]:
        out.append(f"layers cover {len(counts)} layers but the model has {plan.model['n_layers']}")

    # ---- memory, constraints
    if len(plan.memory) != n:
        out.append(f"memory has {len(plan.memory)} entries for {n} nodes")
    for node, m in enumerate(plan.memory):
        if m < 1:
            out.append(f"node {node} has memory {m}; every node needs at least 1 slot")
            break
    if not 1 <= c.path_length <= S - len(frozen):
        out.append(f"path_length L={c.path_length} must be between 1 and the number of stages S={S}"
                   + (f" less the {len(frozen)} frozen" if frozen else ""))
    if c.max_swaps < 0 or c.max_jump < 0:
        out.append("max_swaps and max_jump must be >= 0")
    costs = plan.costs
    if costs.backward_factor <= 0 or costs.loss_factor <= 0:
        out.append("backward_factor and loss_factor must be > 0")
    if costs.inject_gap_s < 0 or costs.op_gap_s < 0:
        out.append("inject_gap_s and op_gap_s must be >= 0")
    if out:
        return out  # the rest relies on a sane skeleton

    # ---- microbatches: CC1-CC3
    stage_of = plan.stage_of()
    data_nodes = set(plan.stages[0])
    ids = Counter(mb.id for mb in plan.microbatches)
    for mb_id, k in ids.items():
        if k > 1:
            out.append(f"microbatch id {mb_id} is used {k} times")
    if not plan.microbatches:
        out.append("plan has no microbatches")
    live = live_index(S, plan.frozen_stages)
    for mb in plan.microbatches:
        w = f"microbatch {mb.id}"
        if mb.data_node not in data_nodes:
            out.append(f"{w}: data node {mb.data_node} is not in stage 0 (CC1)")
            continue
        if mb.release_s < 0:
            out.append(f"{w}: release_s must be >= 0")
        if len(mb.path) != c.path_length - 1:
            out.append(
                f"{w}: visits {len(mb.path) + 1} stages (stage 0 included) but path_length is {c.path_length} (CC2)"
            )
        bad_nodes = [node for node in mb.path if node not in stage_of]
        if bad_nodes:
            out.append(f"{w}: path node(s) {bad_nodes} belong to no stage")
            continue
        visited = [stage_of[node] for node in mb.path]
        if 0 in visited:
            out.append(f"{w}: path runs stage 0 again (CC1/CC2: stage 0 only on its own data node)")
            continue
        reason = path_rule_violation([live[s] for s in visited], c.max_swaps, c.max_jump)
        if reason and frozen:
            reason += f" (counted over the stages not frozen, {sorted(live)})"
        if reason and plan.version < 2 and reason.startswith("jumps from"):
            out.append(f"{OLD_JUMP_MEANING} ({w}: stage order {[0, *visited]} {reason})")
        elif reason:
            out.append(f"{w}: stage order {[0, *visited]} {reason} (CC2/CC3)")
        if mb.after is not None and mb.after not in ids:
            out.append(f"{w}: after={mb.after} names no microbatch")
    if out:
        return out
    # 'after' must not form a cycle
    after = {mb.id: mb.after for mb in plan.microbatches}
    for start in after:
        steps, cur = 0, after[start]
        while cur is not None and steps <= len(after):
            if cur == start:
                out.append(f"microbatch {start}: 'after' dependencies form a cycle")
                break
            cur, steps = after[cur], steps + 1

    # ---- TC1 load caps
    if c.max_load is not None:
        load = plan.load_per_node()
        for node in range(n):
            if load[node] > c.max_load[node]:
                out.append(f"node {node} handles {load[node]} microbatches, above its cap max_load={c.max_load[node]} (TC1)")

    # ---- processing order covers exactly each node's operations
    if plan.processing_order is not None:
        expected: dict[int, Counter[str]] = {node: Counter() for node in range(n)}
        for mb in plan.microbatches:
            for op in ("F", "L", "B"):
                expected[mb.data_node][f"{op}{mb.id}"] += 1
            for node in mb.path:
                expected[node][f"F{mb.id}"] += 1
                expected[node][f"B{mb.id}"] += 1
        for node, ops in plan.processing_order.items():
            if not 0 <= node < n:
                out.append(f"processing_order names node {node}, but nodes are 0..{n - 1}")
                continue
            try:
                parsed = [parse_op(token) for token in ops]
            except PlanError as exc:
                out.append(f"processing_order[{node}]: {exc}")
                continue
            if Counter(ops) != expected[node]:
                missing = sorted((expected[node] - Counter(ops)).elements())
                extra = sorted((Counter(ops) - expected[node]).elements())
                out.append(f"processing_order[{node}] does not match its operations (missing {missing[:4]}, extra {extra[:4]})")
            last: dict[tuple[str, int], int] = {}  # (kind, microbatch) -> its last place in the order
            for i, op in enumerate(parsed):
                last[op] = i
            for mb_id in {mb_id for _, mb_id in parsed}:
                if ("F", mb_id) in last and ("B", mb_id) in last and last["F", mb_id] > last["B", mb_id]:
                    out.append(f"processing_order[{node}]: B{mb_id} comes before F{mb_id}")
    return out


def check_plan(plan: Plan, where: str = "plan") -> None:
    problems = plan_violations(plan)
    old = [p for p in problems if p.startswith(OLD_JUMP_MEANING)]
    if old:
        raise PlanError(f"{where}: {old[0]}")
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise PlanError(f"{where}: {problems[0]}{more}")
