"""Baseline plans: the full pipeline of DT-FM (``full``), random skipping (``random``) and the
naive plan a new user would write by hand (``naive``).

``full``: fixed chains with one node per stage; every microbatch visits every stage in order.
Chains are built stage by stage with a bottleneck matching between consecutive stages (the
slowest hop as small as it can be, then the total), and closed by matching each chain to a data
node on its two data-node links. Only as many data nodes as there are chains inject (|P1| with
the usual sizes), and the D*m microbatches of all D data nodes are spread over them, so an
iteration processes as many samples as a skipping plan.

``random``: every data node sends its m microbatches along random paths that obey the path
rules (CC1-CC3) and the TC1 caps ``problem.load_caps``, ignoring the network.

``naive``: node ids in index order as stages (the first ``stage_sizes[0]`` nodes are the data
nodes, the next ``stage_sizes[1]`` stage 1, ...; a fixed allocation is kept); each microbatch,
round robin over the data nodes, takes the least-loaded stage set in increasing order (no swaps)
and the least-loaded node of each stage, within the TC1 caps.

``full`` and ``random`` allocate the nodes to stages (``allocate``) unless given ``stages``.
Torch-free.
"""

from __future__ import annotations

import numpy as np

from skippipe.errors import UserError
from skippipe.planfile import Microbatch, Plan, path_rule_violation
from skippipe.planner.allocation import allocate, bottleneck_matching
from skippipe.planner.problem import Problem
from skippipe.planner.routing.sequences import stage_cap_sums, tc1_refusal
from skippipe.planner.stage_orders import sequence_quotas


def _links(problem: Problem) -> np.ndarray:
    t = np.asarray(problem.transfer_s, dtype=float)
    return np.maximum(t, t.T)  # activations go one way, gradients the other


def _check_stages(problem: Problem, stages: list[list[int]]) -> None:
    if len(stages) != problem.num_stages:
        raise UserError(f"the allocation has {len(stages)} stages but the workload has {problem.num_stages}")
    nodes = sorted(x for s in stages for x in s)
    if nodes != list(range(problem.n)) or any(not s for s in stages):
        raise UserError(f"the allocation must put each of the {problem.n} nodes in exactly one non-empty stage")


# ------------------------------------------------------------------------------ full pipeline


def full_chains(problem: Problem, stages: list[list[int]]) -> list[list[int]]:
    """Chains [data node, stage-1 node, ..., stage-(S-1) node], as many as the smallest stage.

    Consecutive stages are joined by bottleneck matchings; a larger stage leaves the nodes the
    matching does not use idle. The chains are then matched to data nodes by the cost of the
    two hops a microbatch makes between its data node and the chain (out to stage 1, back from
    stage S-1), bottleneck first.
    """
    links = _links(problem)
    chains = [[int(x)] for x in stages[1]]
    for nodes in stages[2:]:
        ends = np.array([c[-1] for c in chains])
        rows, cols, _ = bottleneck_matching(links[ends[:, None], np.array(nodes)])
        chains = [chains[r] + [int(nodes[c])] for r, c in zip(rows, cols)]
    data = np.array(stages[0])
    first = np.array([c[0] for c in chains])
    last = np.array([c[-1] for c in chains])
    close = links[data[:, None], first[None, :]] + links[last[None, :], data[:, None]]
    rows, cols, _ = bottleneck_matching(close)
    out = [[int(data[r]), *chains[c]] for r, c in zip(rows, cols)]
    return sorted(out)


def full_plan(problem: Problem, stages: list[list[int]] | None = None, seed: int = 0) -> Plan:
    """The DT-FM full pipeline: path length S, no swaps, the same samples per iteration."""
    if stages is None:
        stages = allocate(problem, seed=seed)
    _check_stages(problem, stages)
    chains = full_chains(problem, stages)
    d, m = len(stages[0]), problem.workload.microbatches_per_data_node
    total = d * m
    per_chain = [total // len(chains) + (1 if j < total % len(chains) else 0) for j in range(len(chains))]
    mbs: list[Microbatch] = []
    load = [0] * problem.n
    for chain, count in zip(chains, per_chain):
        for _ in range(count):
            mbs.append(Microbatch(id=len(mbs), data_node=chain[0], path=list(chain[1:])))
            for node in chain:
                load[node] += 1
    return problem.make_plan(
        stages, mbs, method="full", seed=seed, path_length=len(stages), max_swaps=0, max_load=load,
        meta={"chains": chains, "injecting_data_nodes": [c[0] for c in chains]},
    )


# ------------------------------------------------------------------------------ naive plan


def index_order_stages(problem: Problem) -> list[list[int]]:
    """The fixed allocation if there is one, else node ids in index order cut into the stage sizes."""
    if problem.fixed_stages is not None:
        return [list(map(int, s)) for s in problem.fixed_stages]
    stages, start = [], 0
    for size in problem.stage_sizes:
        stages.append(list(range(start, start + size)))
        start += size
    return stages


def naive_plan(problem: Problem, stages: list[list[int]] | None = None, seed: int = 0) -> Plan:
    """The naive plan (see the module text): least-loaded stage sets and nodes, no network view.

    Load is counted relative to capacity (visits so far / TC1 caps), so a stage or node with a
    larger cap takes proportionally more; ties go to the lower stage set and the lower node id.
    When the greedy runs out of stage sets with capacity, the number of microbatches per stage
    set is fixed first (``sequence_quotas``) and the greedy runs again within those counts.
    """
    stages = index_order_stages(problem) if stages is None else stages
    _check_stages(problem, stages)
    w = problem.workload
    caps = problem.load_caps(stages)
    kinds = tuple(_valid_subsets(list(range(1, len(stages))), w.path_length - 1, w.max_jump, limit=_MAX_KINDS + 1))
    if not kinds:
        raise UserError(f"no path of L={w.path_length} stages satisfies the path rules (CC2/CC3) with S={len(stages)}")
    mbs = _naive_microbatches(problem, stages, caps, kinds, None)
    if mbs is None:
        total = len(stages[0]) * w.microbatches_per_data_node
        quota = sequence_quotas(kinds, stage_cap_sums(caps, stages), total)
        mbs = None if quota is None else _naive_microbatches(problem, stages, caps, kinds, quota)
        if mbs is None:
            raise tc1_refusal(caps, stages, total, w.path_length)
    return problem.make_plan(stages, mbs, method="naive", seed=seed)


def _naive_microbatches(
    problem: Problem, stages: list[list[int]], caps: list[int], kinds: tuple[tuple[int, ...], ...],
    quota: dict[tuple[int, ...], int] | None,
) -> list[Microbatch] | None:
    """Round robin over the data nodes: the least-loaded stage set (with quota left), then the
    least-loaded node of each of its stages; None when the greedy runs out of capacity."""
    stage_cap = [max(1, sum(caps[x] for x in s)) for s in stages]
    stage_used = [0] * len(stages)
    node_used = [0] * problem.n
    left = None if quota is None else dict(quota)
    mbs: list[Microbatch] = []
    for _ in range(problem.workload.microbatches_per_data_node):
        for d in stages[0]:
            open_kinds = [q for q in kinds if (left is None or left.get(q, 0) > 0)
                          and all(any(node_used[x] < caps[x] for x in stages[s]) for s in q)]
            if not open_kinds:
                return None
            kind = min(open_kinds, key=lambda q: (sum(stage_used[s] / stage_cap[s] for s in q), q))
            if left is not None:
                left[kind] -= 1
            path = []
            for s in kind:
                x = min((x for x in stages[s] if node_used[x] < caps[x]), key=lambda x: (node_used[x] / caps[x], x))
                node_used[x] += 1
                stage_used[s] += 1
                path.append(int(x))
            mbs.append(Microbatch(id=len(mbs), data_node=int(d), path=path))
    return mbs


# ------------------------------------------------------------------------------ random skipping


def random_plan(problem: Problem, stages: list[list[int]] | None = None, seed: int = 0) -> Plan:
    """Random paths under CC1-CC3 and the TC1 caps, ignoring the network."""
    if stages is None:
        stages = allocate(problem, seed=seed)
    _check_stages(problem, stages)
    rng = np.random.default_rng(seed)
    w = problem.workload
    caps = problem.load_caps(stages)
    owners = [d for d in stages[0] for _ in range(w.microbatches_per_data_node)]
    order = rng.permutation(len(owners))  # draw the paths in a random order of microbatches
    stage_paths = _random_stage_paths(problem, stages, caps, len(owners), rng)
    node_left = {x: caps[x] for s in stages[1:] for x in s}
    paths: list[list[int]] = [[] for _ in owners]
    for k, idx in enumerate(order):
        path = []
        for s in stage_paths[k]:
            nodes = [x for x in stages[s] if node_left[x] > 0]
            weights = np.array([node_left[x] for x in nodes], dtype=float)
            x = int(nodes[rng.choice(len(nodes), p=weights / weights.sum())])
            node_left[x] -= 1
            path.append(x)
        paths[idx] = path
    mbs = [Microbatch(id=i, data_node=int(d), path=p) for i, (d, p) in enumerate(zip(owners, paths))]
    return problem.make_plan(stages, mbs, method="random", seed=seed)


def _random_stage_paths(
    problem: Problem, stages: list[list[int]], caps: list[int], count: int, rng: np.random.Generator
) -> list[list[int]]:
    """``count`` stage sequences (stages after 0), each valid under CC2/CC3, that together
    visit every stage no more often than its nodes' caps allow.

    A random draw ignoring the caps gives target counts per set of stages; an integer program
    then finds the counts closest to the target (L1) that the caps allow, which are dealt to
    the microbatches in random order and put in random valid orders (swaps).
    """
    w = problem.workload
    hops = w.path_length - 1
    num = len(stages)
    if hops == 0:
        return [[] for _ in range(count)]
    cap = np.array([sum(caps[x] for x in stages[s]) for s in range(1, num)], dtype=float)
    kinds = list(_valid_subsets(list(range(1, num)), hops, w.max_jump, limit=_MAX_KINDS + 1))
    if not kinds:
        raise UserError(f"no path of L={w.path_length} stages satisfies the path rules (CC2/CC3) with S={num}")
    if len(kinds) > _MAX_KINDS:
        raise UserError(f"random plans support at most {_MAX_KINDS} stage sets per path; use fewer stages or a longer max_jump")
    # the target: each microbatch picks a set of stages at random, weighted by stage capacity
    weight = np.array([np.prod([cap[s - 1] for s in kind]) for kind in kinds], dtype=float)
    weight = weight / weight.sum() if weight.sum() > 0 else np.full(len(kinds), 1.0 / len(kinds))
    target = np.bincount(rng.choice(len(kinds), size=count, p=weight), minlength=len(kinds))
    counts = None
    if len(kinds) > _EXACT_KINDS:  # first among the drawn sets, a second draw of as many and a split that fits
        split = sequence_quotas(tuple(kinds), [0, *cap.astype(int).tolist()], count) or {}
        fits = np.array([j for j, kind in enumerate(kinds) if kind in split], dtype=int)
        some = np.union1d(np.flatnonzero(target), np.concatenate([rng.choice(len(kinds), size=_EXACT_KINDS, p=weight), fits]))
        counts = _closest_counts([kinds[j] for j in some], target[some], cap, count, num)
        if counts is not None:
            full = np.zeros(len(kinds), dtype=int)
            full[some] = counts
            counts = full.tolist()
    if counts is None:
        counts = _closest_counts(kinds, target, cap, count, num)
    if counts is None:
        raise UserError(
            f"the TC1 caps of stages 1..{num - 1} ({cap.astype(int).tolist()}) cannot carry {count} microbatches "
            f"visiting {hops} of them each under the path rules"
        )
    dealt = [kind for kind, k in zip(kinds, counts) for _ in range(k)]
    order = rng.permutation(len(dealt))
    return [_random_order(list(dealt[i]), w.max_swaps, w.max_jump, rng) for i in order]


_MAX_KINDS = 20_000
# above this many stage sets the closest counts are first sought among the drawn sets and a second
# draw of this many (the integer programme over all 5,115 sets of S = 16, L = 9 took 3-5 s)
_EXACT_KINDS = 1_000


def _closest_counts(
    kinds: list[tuple[int, ...]], target: np.ndarray, cap: np.ndarray, count: int, num: int
) -> list[int] | None:
    """Integer counts per stage set, summing to ``count`` within the stage capacities, with the
    least L1 distance to ``target`` (None when no counts fit)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    k = len(kinds)
    member = np.zeros((num - 1, k))
    for j, kind in enumerate(kinds):
        member[[s - 1 for s in kind], j] = 1.0
    eye = np.eye(k)
    # variables: x (counts) then d (|x - target|)
    constraints = [
        LinearConstraint(np.hstack([np.ones((1, k)), np.zeros((1, k))]), count, count),
        LinearConstraint(np.hstack([member, np.zeros((num - 1, k))]), -np.inf, cap),
        LinearConstraint(np.hstack([eye, -eye]), -np.inf, target),  # x - d <= target
        LinearConstraint(np.hstack([-eye, -eye]), -np.inf, -target),  # -x - d <= -target
    ]
    cost = np.concatenate([np.zeros(k), np.ones(k)])
    res = milp(cost, constraints=constraints, integrality=np.concatenate([np.ones(k), np.zeros(k)]),
               bounds=Bounds(0, np.inf))
    if res.status != 0 or res.x is None:
        return None
    return [int(round(v)) for v in res.x[:k]]


def _valid_subsets(stages: list[int], hops: int, max_jump: int, limit: int | None = None):
    """Ascending stage subsets whose every step goes at most max_jump stages up (depth-first)."""
    found = 0

    def rec(start: int, frontier: int, chosen: list[int]):
        nonlocal found
        if limit is not None and found >= limit:
            return
        if len(chosen) == hops:
            found += 1
            yield tuple(chosen)
            return
        for i in range(start, len(stages)):
            s = stages[i]
            if s - frontier > max_jump or len(stages) - i < hops - len(chosen):
                break  # too far, or too few stages left to finish
            yield from rec(i + 1, s, chosen + [s])

    yield from rec(0, 0, [])


def _random_order(ascending: list[int], max_swaps: int, max_jump: int, rng: np.random.Generator) -> list[int]:
    """The ascending stage list with up to ``max_swaps`` random swaps of neighbours that the
    path rules allow (each applied with probability 1/2)."""
    seq = list(ascending)
    for _ in range(max_swaps):
        if rng.random() < 0.5:
            continue
        options = []
        for i in range(len(seq) - 1):
            trial = seq[:i] + [seq[i + 1], seq[i]] + seq[i + 2 :]
            if path_rule_violation(trial, max_swaps, max_jump) is None:
                options.append(trial)
        if options:
            seq = options[int(rng.integers(len(options)))]
    return seq
