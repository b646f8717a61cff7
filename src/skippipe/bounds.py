"""Lower bounds on the iteration time of a plan (torch-free).

compute bound
    A node performs its operations one at a time with a gap after each, so no plan finishes
    before its busiest node has done all its work: sum of its operation times plus the gaps
    between them.

memory floor (depends only on the allocation, not on the paths)
    A data node with m microbatches and M activation slots holds a slot per microbatch from its
    injection until its last backward; with at most M in flight, some ceil(m/M) of them run back
    to back, each injected no sooner than ``op_gap_s`` after the previous one's last backward.
    Each such round trip takes at least the data node's own work (F, L, B) plus the fastest
    valid route through L-1 later stages (path rules CC2/CC3): every hop forward and back and
    every forward and backward on the way; or, if longer, the gaps the data node keeps between
    its F, L and B. The largest value over the data nodes bounds every plan on that allocation.

data-node floor (sharper; also only the allocation)
    The data node does its own work one operation at a time. With m microbatches, k = min(M, m)
    slots and round trips of at least R (as above; F, B: its own forward and backward), the
    last injection needs a free slot, so m - k microbatches have run their final backward on the
    data node before it (each starting no sooner than R - B), and so have the injections k+1 ..
    m-1 (each waits for a freed slot); then the last microbatch needs a whole round trip:
    ``(R - B) + (m - k)(B + op_gap) + (m - k - 1)(F + inject_gap) + R`` (with m <= k: the m
    injections, ``(m - 1)(F + inject_gap) + R``). This holds for any processing order: a fixed
    order cannot inject without a free slot, and the gaps follow every operation.
    Sharper still, ``serial_floor.serial_trip_floor`` solves the data node's own schedule (its
    injections, losses and final backwards, one at a time, with the fastest path's time out
    before and after the loss between them) exactly; the floor is the larger of the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b

import numpy as np

from skippipe.planfile import Costs, Plan
from skippipe.serial_floor import serial_trip_floor_above, serial_trip_reaches
from skippipe.workload import PipelineShape

_CACHE: dict[bytes, float] = {}
_CACHE_SIZE = 256


@dataclass(frozen=True)
class DataNodeLoad:
    """What the memory and data-node floors of an allocation read: the allocation, the costs,
    the activation slots (one count, or one per node), the microbatches (one count per data
    node, or a count by data node) and the path rules."""

    stages: Sequence[Sequence[int]]
    costs: Costs
    memory: int | Sequence[int]
    microbatches: int | Mapping[int, int]
    path_length: int
    max_swaps: int
    max_jump: int

    @classmethod
    def of(cls, stages: Sequence[Sequence[int]], costs: Costs, memory: int | Sequence[int],
           shape: PipelineShape) -> DataNodeLoad:
        """The load of ``stages`` under a pipeline shape (its microbatches and path rules)."""
        return cls(stages, costs, memory, shape.microbatches_per_data_node, shape.path_length, shape.max_swaps,
                   shape.max_jump)


def _node_load(plan: Plan) -> tuple[list[float], list[int], list[float]]:
    """Per node: summed operation time, number of operations, summed gaps after them."""
    c = plan.costs
    fwd = np.asarray(c.forward_s, dtype=float)
    n = plan.n_nodes
    f_count = [0] * n  # forwards (incl. injections)
    inject = [0] * n
    loss = [0] * n
    for mb in plan.microbatches:
        inject[mb.data_node] += 1
        loss[mb.data_node] += 1
        for x in mb.path:
            f_count[x] += 1
    work, count, gaps = [], [], []
    for x in range(n):
        k = f_count[x] + inject[x]  # forwards == backwards
        work.append(float(fwd[x] * (k * c.visit_factor + loss[x] * c.op_factor("L"))))
        count.append(2 * k + loss[x])
        gaps.append(inject[x] * c.inject_gap_s + (2 * k + loss[x] - inject[x]) * c.op_gap_s)
    return work, count, gaps


def compute_bound(plan: Plan) -> float:
    """The busiest node's compute time, plus the gaps it must keep between its operations."""
    work, count, gaps = _node_load(plan)
    g_max = max(plan.costs.inject_gap_s, plan.costs.op_gap_s)
    best = 0.0
    for w, k, g in zip(work, count, gaps):
        if k:
            best = max(best, w + max(0.0, g - g_max))
    return best


def _stage_moves(num_stages: int, max_jump: int):
    """Successor states of the CC3 walk over stages.

    A state is (stage, frontier, swap_open): swap_open says whether frontier - 1 is still
    unvisited (a swap may go there). Yields (state, next_state, is_swap) for every state.
    """

    def succ(state):
        s, f, open_ = state
        for t in range(f + 1, min(num_stages - 1, f + max_jump) + 1):
            yield (t, t, t - 1 > f), False
        if open_ and s == f:
            yield (f - 1, f, False), True

    return succ


def round_trip_chain(
    stages: Sequence[Sequence[int]], costs: Costs, path_length: int, max_swaps: int, max_jump: int
) -> dict[int, float]:
    """Per data node: the least hop + path-compute time of a valid round trip.

    Minimised over every stage sequence the path rules allow and every choice of nodes in those
    stages: hops out and back (i -> j and j -> i) plus forward and backward on each path node.
    """
    T = np.asarray(costs.transfer_s, dtype=float)
    visit = np.asarray(costs.forward_s, dtype=float) * costs.visit_factor
    both = T + T.T
    return _cheapest_walk(stages, both + visit[None, :], both, path_length, max_swaps, max_jump)


def round_trip_lags(
    stages: Sequence[Sequence[int]], costs: Costs, path_length: int, max_swaps: int, max_jump: int
) -> tuple[dict[int, float], dict[int, float]]:
    """Per data node: the least time a microbatch is away between its injection and its loss
    (hops out, forwards on the path, the hop back) and between its loss and its final backward
    (hops and backwards back), each over every valid path (the two may come from different
    paths: each is a floor on its own)."""
    T = np.asarray(costs.transfer_s, dtype=float)
    fwd = np.asarray(costs.forward_s, dtype=float)
    out = _cheapest_walk(stages, T + fwd[None, :], T, path_length, max_swaps, max_jump)
    back = _cheapest_walk(stages, T.T + fwd[None, :] * costs.op_factor("B"), T.T, path_length, max_swaps, max_jump)
    return out, back


def _cheapest_walk(
    stages: Sequence[Sequence[int]], step_cost: np.ndarray, close_cost: np.ndarray,
    path_length: int, max_swaps: int, max_jump: int,
) -> dict[int, float]:
    """Per data node d: the least ``step_cost[d, x1] + step_cost[x1, x2] + ... + close_cost[xh, d]``
    over every valid path x1..xh (every stage sequence the path rules allow, every node choice)."""
    data = list(stages[0])
    S = len(stages)
    hops = path_length - 1
    if hops <= 0:
        return {d: 0.0 for d in data}
    members = [np.asarray(s, dtype=int) for s in stages]
    W = step_cost
    d_idx = np.asarray(data, dtype=int)
    succ = _stage_moves(S, max_jump)

    # frontier of the walk: (stage, frontier, swap_open, swaps) -> D x |stage| least cost
    layer: dict[tuple[int, int, bool, int], np.ndarray] = {}
    for (t, f, open_), _ in succ((0, 0, False)):
        layer[(t, f, open_, 0)] = W[np.ix_(d_idx, members[t])]
    for _ in range(hops - 1):
        nxt: dict[tuple[int, int, bool, int], np.ndarray] = {}
        for (s, f, open_, k), dist in layer.items():
            for (t, f2, open2), is_swap in succ((s, f, open_)):
                k2 = k + is_swap
                if k2 > max_swaps:
                    continue
                step = W[np.ix_(members[s], members[t])]  # |s| x |t|
                cand = _min_plus(dist, step)
                key = (t, f2, open2, k2)
                nxt[key] = cand if key not in nxt else np.minimum(nxt[key], cand)
        layer = nxt
    best = np.full(len(data), math.inf)
    for (s, _f, _o, _k), dist in layer.items():
        back = close_cost[np.ix_(members[s], d_idx)].T  # D x |s|: last node -> data node
        best = np.minimum(best, (dist + back).min(axis=1))
    return {d: float(b) for d, b in zip(data, best)}


def _min_plus(dist: np.ndarray, step: np.ndarray) -> np.ndarray:
    """(D x a) min-plus (a x b) -> D x b."""
    D, a = dist.shape
    if a <= 16 or D * a * step.shape[1] <= 200_000:
        return (dist[:, :, None] + step[None, :, :]).min(axis=1)
    out = dist[:, 0, None] + step[0][None, :]
    for u in range(1, a):  # accumulate over the middle index: D x b work per step, no a x b x D array
        np.minimum(out, dist[:, u, None] + step[u][None, :], out=out)
    return out


def _data_node_trips(load: DataNodeLoad) -> list[tuple[int, int, int, float, float]]:
    """(data node, microbatches, activation slots, forward seconds, fastest round trip) of every
    data node that has microbatches; the round trip is inf when no valid path exists."""
    costs, memory, microbatches = load.costs, load.memory, load.microbatches
    data = list(load.stages[0])
    n = int(np.asarray(costs.forward_s).shape[0])
    mem = [int(memory)] * n if isinstance(memory, (int, np.integer)) else [int(x) for x in memory]
    if isinstance(microbatches, Mapping):
        counts = {d: int(microbatches.get(d, 0)) for d in data}
    else:
        counts = {d: int(microbatches) for d in data}
    chain = round_trip_chain(load.stages, costs, load.path_length, load.max_swaps, load.max_jump)
    fwd = np.asarray(costs.forward_s, dtype=float)
    trips = []
    for d in data:
        if counts[d] <= 0:
            continue
        f = float(fwd[d])
        own = f * costs.own_factor
        trip = own + max(chain[d], costs.inject_gap_s + costs.op_gap_s)
        trips.append((d, counts[d], max(1, mem[d]), f, trip))
    return trips


def memory_floor(load: DataNodeLoad) -> float:
    """The memory floor of an allocation (see the module text); inf when no valid path exists."""
    floor = 0.0
    for _, m, slots, _, trip in _data_node_trips(load):
        rounds = math.ceil(m / slots)
        floor = max(floor, rounds * trip + (rounds - 1) * load.costs.op_gap_s)
    return floor


def trip_floor(round_trip: float, forward: float, backward: float, m: int, slots: int, inject_gap: float, op_gap: float) -> float:
    """Least finish time of a data node with ``m`` microbatches, ``slots`` activation slots and
    round trips of at least ``round_trip`` seconds (the larger of the memory and the data-node
    floor, see the module text)."""
    if m <= 0:
        return 0.0
    k = max(1, min(int(slots), m))
    if m <= k:
        return (m - 1) * (forward + inject_gap) + round_trip
    rounds = math.ceil(m / k)
    memory = rounds * round_trip + (rounds - 1) * op_gap
    serial = (round_trip - backward) + (m - k) * (backward + op_gap) + (m - k - 1) * (forward + inject_gap) + round_trip
    return max(memory, serial)


def trip_floors(
    round_trip: np.ndarray, forward: float, backward: float, m: int, slots: np.ndarray, inject_gap: float, op_gap: float,
) -> np.ndarray:
    """``trip_floor`` of many round trips of one data node at once, each with its own slot count
    (the same operations in the same order, so the same values bit for bit)."""
    r = np.asarray(round_trip, dtype=float)
    if m <= 0:
        return np.zeros_like(r)
    k = np.maximum(1, np.minimum(np.asarray(slots, dtype=int), m))
    rounds = -(-m // k)
    memory = rounds * r + (rounds - 1) * op_gap
    serial = (r - backward) + (m - k) * (backward + op_gap) + (m - k - 1) * (forward + inject_gap) + r
    few = (m - 1) * (forward + inject_gap) + r
    return np.where(m <= k, few, np.maximum(memory, serial))


def data_node_floor(load: DataNodeLoad) -> float:
    """The data-node floor of an allocation (see the module text; never below the memory
    floor); inf when no valid path exists. The largest of the data nodes' own terms, each the
    larger of its closed form and its own schedule solved (``serial_trip_floor``), the searches
    taken in order of the closed forms, largest first; a data node with a schedule quicker than
    the largest term so far cannot raise it and is not solved (``serial_trip_floor_above``)."""
    terms = sorted(_data_node_terms(load), key=lambda t: -t[0])
    best = max((closed for closed, _ in terms), default=0.0)
    for _, serial in terms:
        best = serial_trip_floor_above(*serial, best)
    return best


def data_node_floor_reaches(load: DataNodeLoad, value: float) -> bool:
    """Whether ``data_node_floor`` is at least ``value``, decided without solving each data
    node's own schedule to the end: the closed forms first, then the searches with ``value`` as
    their cutoff (``serial_floor.serial_trip_reaches``). With 17 microbatches per data node each
    search of ``data_node_floor`` ran into its step cap (0.15-0.2 s per data node, 1.3-2.3 s per
    allocation of 38-40 nodes) where this decided in under 10 ms."""
    terms = _data_node_terms(load)
    return (any(closed >= value for closed, _ in terms)
            or any(serial_trip_reaches(*serial, value) for _, serial in terms))


def _data_node_terms(load: DataNodeLoad) -> list[tuple[float, tuple[float, float, float, int, int, float, float, float, float]]]:
    """Per data node with microbatches: its closed-form floor (``trip_floor``) and the arguments
    of ``serial_floor.serial_trip_floor`` for its own schedule (the least times out and back)."""
    costs = load.costs
    out, back = round_trip_lags(load.stages, costs, load.path_length, load.max_swaps, load.max_jump)
    return [(trip_floor(trip, f, f * costs.op_factor("B"), m, slots, costs.inject_gap_s, costs.op_gap_s),
             (f, out[d], back[d], m, slots, costs.loss_factor, costs.backward_factor, costs.inject_gap_s, costs.op_gap_s))
            for d, m, slots, f, trip in _data_node_trips(load)]


def plan_memory_floor(plan: Plan) -> float:
    """The memory floor of the plan's allocation and microbatch counts (cached by content)."""
    return _plan_floor(plan, memory_floor)


def plan_data_node_floor(plan: Plan) -> float:
    """The data-node floor of the plan's allocation and microbatch counts (cached by content)."""
    return _plan_floor(plan, data_node_floor)


def _plan_floor(plan: Plan, floor_of: Callable[..., float]) -> float:
    counts: dict[int, int] = {}
    for mb in plan.microbatches:
        counts[mb.data_node] = counts.get(mb.data_node, 0) + 1
    c = plan.costs
    k = plan.constraints
    h = blake2b(digest_size=20)
    h.update(floor_of.__name__.encode())
    h.update(np.ascontiguousarray(c.transfer_s, dtype=float).tobytes())
    h.update(np.ascontiguousarray(c.forward_s, dtype=float).tobytes())
    h.update(
        repr(
            (plan.stages, plan.memory, sorted(counts.items()), k.path_length, k.max_swaps, k.max_jump,
             c.backward_factor, c.loss_factor, c.inject_gap_s, c.op_gap_s)
        ).encode()
    )
    key = h.digest()
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = floor_of(DataNodeLoad(plan.stages, c, plan.memory, counts, k.path_length, k.max_swaps, k.max_jump))
    return _CACHE[key]


def lower_bound(plan: Plan) -> float:
    """max(compute bound, memory floor, data-node floor) for the plan's allocation.

    The floors assume every path visits ``path_length`` stages; for a plan that breaks that
    rule only the compute bound is used.
    """
    hops = plan.constraints.path_length - 1
    if any(len(mb.path) != hops for mb in plan.microbatches):
        return compute_bound(plan)
    return max(compute_bound(plan), plan_memory_floor(plan), plan_data_node_floor(plan))
