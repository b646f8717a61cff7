"""Floors the scheduler plans with, and a load-aware floor over every allocation.

``trip_floor`` (defined in ``skippipe.bounds``) is the least finish time of a data node with m
microbatches, M slots and round trips of at least R: the larger of the memory floor and the
data-node floor (its final backwards and injections run one at a time). ``allocation_data_node_floor``
is its largest value over the data nodes of an allocation, each with its fastest valid round
trip. With the reference's m = 6, M = 3 the last data node of the shipped instance reaches it
exactly (33.05 s, against a memory floor of 30.41 s).

``free_allocation_floor`` bounds every plan of a problem whose allocation is ours to choose,
counting the TC1 loads. For a set D of data nodes (every set of the stage-0 size is tried),
``set_floor.SetFloor`` gives its floor (see its module text): each data node's own floor over
its fastest round trips, the slow round trip that the TC1 caps force (the cheap nodes cannot
take every visit), how many dear trips they force on the data nodes' slots, both again with
the round trips kept off D's other data nodes, and those dear trips with each data node's own
work between them (``dear_schedule``; the sets raised best first).
The floor of the problem is the least over D.
Where the sets and paths are few (``ROUTED_SETS``, ``routed_floor.MAX_PATHS``), the sets with
the least floors are raised by routing their visits under the TC1 caps
(``routed_floor.routed_set_floor``), up to ``ROUTED_SOLVES`` integer programmes (``ROUTED_WORK``
variables in all).
When the paths are too many to enumerate the fastest round trips are solved exactly instead
(``cycle_trips``: up to 4 other nodes, up to 130-215 nodes), or, beyond that, bounded from
below (``cycle_trips.window_walks`` up to a few hundred nodes, and
``relaxed_floors.relaxed_round_trips``); when the sets are too many the set-free floor is
used (the stage-0 size-th smallest data-node floor), and the result is never below the
capacity floor (``relaxed_floors.capacity_floor``: the visits must fit on the other nodes),
so the floor scales to 1,000 nodes. Two linear programmes over every allocation raise it
last: ``slot_time_floor`` (round trips and visits must fit the activation slots' time) and,
up to ``neighbour_floor.MAX_NODES``, ``neighbour_floor`` (each data node's round trips, with
who visits whom, must fit its own slots); then ``slot_energy_floor`` (the visits' slots over
every stretch of time, where a data node's microbatches are out at once).
It is exact reasoning on relaxed round trips, so it is valid for every allocation, path choice
and processing order the simulator runs. On the current-code reference network it is 55.81 s:
remote nodes (Australia) must carry 6 microbatches each, no data node can both run its own
trips fast and take one through Australia (54.60 s), and the data nodes whose microbatches go
far run their own work between those trips (``dear_schedule``).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from dataclasses import dataclass

import numpy as np

from skippipe.bounds import DataNodeLoad, data_node_floor, data_node_floor_reaches, trip_floor
from skippipe.cluster import Cluster
from skippipe.costs import CostModel
from skippipe.errors import UserError
from skippipe.planfile import Plan
from skippipe.planner.cycle_trips import solvable, trip_terms
from skippipe.planner.dear_schedule import RESOLUTION_S
from skippipe.planner.neighbour_floor import neighbour_floor
from skippipe.planner.problem import Problem, build_problem
from skippipe.planner.relaxed_floors import (
    capacity_floor,
    relaxed_lags,
    relaxed_round_trips,
    round_trip_terms,
    tuple_lag_parts,
)
from skippipe.planner.routed_floor import MAX_PATHS, path_count, routed_set_floor
from skippipe.planner.set_floor import SetFloor, closed_floor, solved_floor
from skippipe.planner.set_trips import SetTrips
from skippipe.planner.slot_energy_floor import slot_energy_floor
from skippipe.planner.slot_time_floor import slot_time_floor
from skippipe.workload import workload_from_dict

ROUTED_SETS = 20_000  # data-node sets ranked for the routed floor at most
ROUTED_SOLVES = 8  # routing programmes solved at most, the least-floor sets first (0.05-0.7 s each)
ROUTED_WORK = 12_000  # and their variables (paths x data nodes) summed at most

__all__ = ["trip_floor", "allocation_data_node_floor", "allocation_floor_reaches", "free_allocation_floor",
           "plan_free_floor", "keeps_cluster_caps", "FreeFloor"]


def allocation_data_node_floor(problem: Problem, stages: list[list[int]]) -> float:
    """``skippipe.bounds.data_node_floor`` of an allocation of this problem, with the problem's
    memory and microbatch counts: no plan on this allocation finishes sooner."""
    return data_node_floor(DataNodeLoad.of(stages, problem.costs(), list(problem.memory), problem.workload))


def allocation_floor_reaches(problem: Problem, stages: list[list[int]], value: float) -> bool:
    """Whether ``allocation_data_node_floor`` is at least ``value`` (``bounds.data_node_floor_reaches``)."""
    return data_node_floor_reaches(DataNodeLoad.of(stages, problem.costs(), list(problem.memory), problem.workload), value)


@dataclass
class FreeFloor:
    value: float  # no plan on any allocation finishes sooner
    data_nodes: tuple[int, ...]  # a data-node set attaining it
    exhaustive: bool  # every data-node set was tried (else: the weaker, set-free floor)
    exact_trips: bool = True  # round trips enumerated (else: solved_trips or relaxed lower bounds)
    capacity_s: float = 0.0  # the capacity floor (already counted in value)
    solved_trips: bool = False  # not enumerated, but the fastest ones solved exactly (``cycle_trips``)
    slot_time_s: float = 0.0  # the slot-time floor (``slot_time_floor``, already counted in value)
    neighbour_s: float = 0.0  # the neighbour floor (``neighbour_floor``, already counted in value)
    slot_energy_s: float = 0.0  # the slot-energy floor (``slot_energy_floor``, already counted in value)


def _round_trips(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Over L-1 distinct other nodes in any order: R0[d], the fastest round trip of d;
    RA[d, x], the fastest one that visits x (inf on the diagonal); and the least time a
    microbatch of d is away before its loss (hops out, forwards, the hop back) and after it
    (hops and backwards back)."""
    return _enumerated_trips(problem, keep=False)[:4]


def _enumerated_trips(
    problem: Problem, keep: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, SetTrips | None]:
    """``_round_trips`` and, with ``keep``, every data node's tuples kept for ``SetTrips`` (one pass)."""
    n = problem.n
    trips = SetTrips() if keep else None
    hops = problem.workload.path_length - 1
    edge, visit, own, gaps = round_trip_terms(problem)
    r0 = np.full(n, math.inf)
    ra = np.full((n, n), math.inf)
    out, back = np.full(n, math.inf), np.full(n, math.inf)
    if hops <= 0:
        return own + gaps, ra, np.zeros(n), np.zeros(n), trips
    t = np.asarray(problem.transfer_s, dtype=float)
    tuples = np.array(list(itertools.permutations(range(n), hops)), dtype=int)  # P x hops
    inner = visit[tuples].sum(axis=1) + sum(edge[tuples[:, i], tuples[:, i + 1]] for i in range(hops - 1))
    inner_out, inner_back = tuple_lag_parts(problem, tuples)
    for d in range(n):
        ok = ~(tuples == d).any(axis=1)
        tup = tuples[ok]
        if not len(tup):
            continue
        first, last = tup[:, 0], tup[:, -1]
        cost = own[d] + np.maximum(inner[ok] + edge[d, first] + edge[last, d], gaps)
        r0[d] = float(cost.min())
        for i in range(hops):
            np.minimum.at(ra[d], tup[:, i], cost)
        outs = t[d, first] + inner_out[ok] + t[last, d]
        backs = t[d, last] + inner_back[ok] + t[first, d]
        out[d], back[d] = float(outs.min()), float(backs.min())
        if trips is not None:
            trips.add(d, tup, cost, outs, backs)
    return r0, ra, out, back, trips


def _serial_floors(problem: Problem, tf: np.ndarray, out: np.ndarray, back: np.ndarray, nodes) -> None:
    """Raise ``tf[d]`` to ``serial_trip_floor`` (the data node's own schedule solved) for ``nodes``."""
    for d in nodes:
        tf[d] = max(tf[d], solved_floor(problem, d, float(out[d]), float(back[d])))


def _set_free(problem: Problem, tf: np.ndarray, out: np.ndarray, back: np.ndarray) -> None:
    """Raise ``tf`` by the serial floor where it decides the stage-0 size-th smallest value:
    nodes are raised in the order of their closed-form floors until the D-th smallest raised
    value is no more than the next node's closed form (a raised value is never lower)."""
    D = int(problem.stage_sizes[0])
    order = np.argsort(tf, kind="stable")
    for i, d in enumerate(order):
        if i >= D and np.sort(tf[order[:i]])[D - 1] <= tf[d]:
            return
        _serial_floors(problem, tf, out, back, [int(d)])


def free_allocation_floor(problem: Problem, max_sets: int = 200_000, max_tuples: int = 2_000_000) -> FreeFloor:
    """The load-aware floor over every allocation of ``problem`` (see the module text).

    Tries every data-node set when there are at most ``max_sets``; otherwise uses the set-free
    floor (the stage-0 size-th smallest data node floor), which is weaker but valid. Round trips
    are enumerated up to ``max_tuples`` paths and bounded from below beyond. The result is never
    below ``capacity_floor``.
    """
    n = problem.n
    D = int(problem.stage_sizes[0])
    hops = problem.workload.path_length - 1
    if D > n:
        raise UserError(f"free_allocation_floor: {D} data nodes but only {n} nodes")
    exact = n * math.perm(n - 1, max(0, hops)) <= max_tuples
    solved = not exact and solvable(problem)  # the round trips solved instead (``cycle_trips``)
    if math.comb(n, D) > max_sets or hops <= 0:
        tf, _, _, out, back, _ = _trip_floors(problem, exact, keep=False)
        _set_free(problem, tf, out, back)
        order = np.argsort(tf, kind="stable")
        cap = capacity_floor(problem, tf)
        value, slot_time, neighbour, energy = _programme_floors(problem, tf, max(cap, float(tf[order[D - 1]])))
        return FreeFloor(value, tuple(int(x) for x in order[:D]), False, exact, cap, solved_trips=solved,
                         slot_time_s=slot_time, neighbour_s=neighbour, slot_energy_s=energy)
    sets = set_floors(problem, exact)
    cap = capacity_floor(problem, sets.tf)
    sets.at_least = cap
    if 0 < path_count(problem) <= MAX_PATHS and math.comb(n, D) <= ROUTED_SETS:
        best = _routed(problem, sets)
    else:
        best = _least_set(sets, D, cap)
        if (best[1] and best[0] > cap and math.comb(n, D) <= ROUTED_SETS
                and sets.dear_schedules(best[1], best[0]) > best[0]):
            best = _routed(problem, sets, routing=False)  # the dear schedules raise the least set
    value, slot_time, neighbour, energy = _programme_floors(problem, sets.tf, max(cap, best[0]))
    return FreeFloor(value, tuple(int(x) for x in best[1]), True, exact, cap, solved_trips=solved,
                     slot_time_s=slot_time, neighbour_s=neighbour, slot_energy_s=energy)


def _least_set(sets: SetFloor, D: int, cap: float) -> tuple[float, tuple[int, ...]]:
    """The least floor over the data-node sets of size D without the dear schedules, and a set
    attaining it (stops at the capacity floor ``cap``, which decides then)."""
    best: tuple[float, tuple[int, ...]] = (math.inf, ())
    by_floor = [int(x) for x in np.argsort(sets.tf, kind="stable")]  # low floors first: a low best early
    for chosen in itertools.combinations(by_floor, D):
        data = tuple(sorted(chosen))
        val = sets.value(data, best[0], schedules=False)
        if val < best[0]:
            best = (val, data)
        if best[0] <= cap:
            break  # the capacity floor decides
    return best


def _programme_floors(problem: Problem, tf: np.ndarray, value: float) -> tuple[float, float, float, float]:
    """(the floor, the slot-time floor, the neighbour floor, the slot-energy floor): ``value``
    raised by the two linear programmes and the slot-energy floor, each at the value so far."""
    slot_time = slot_time_floor(problem, tf, value)
    neighbour = neighbour_floor(problem, tf, max(value, slot_time))
    energy = slot_energy_floor(problem, tf, max(value, slot_time, neighbour))
    return max(value, slot_time, neighbour, energy), slot_time, neighbour, energy


def set_floors(problem: Problem, exact: bool = True) -> SetFloor:
    """The floor of each data-node set (``set_floor.SetFloor``), with the round trips
    enumerated (``exact``) or bounded from below (no set then keeps its trips off the others)."""
    tf, r0, ra, out, back, set_trips = _trip_floors(problem, exact)
    _serial_floors(problem, tf, out, back, range(problem.n))
    return SetFloor(problem, tf, r0, ra, set_trips)


def _trip_floors(
    problem: Problem, exact: bool, keep: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, SetTrips | None]:
    """(tf, R0, RA, time out, time back, SetTrips or None): every node's closed-form floor as a
    data node and what it was made from (the sorted round trips only when ``keep``)."""
    set_trips: SetTrips | None = None
    if exact:
        r0, ra, out, back, set_trips = _enumerated_trips(problem, keep)
    else:
        (r0, ra), (out, back) = relaxed_round_trips(problem), relaxed_lags(problem)
        solved = trip_terms(problem)  # exact up to 4 hops and 130-215 nodes, a sharper bound beyond
        if solved is not None:
            r0, out, back = (np.maximum(a, b) for a, b in zip((r0, out, back), solved))
            ra = np.maximum(ra, r0[:, None])  # a round trip through x is a round trip
    tf = np.array([closed_floor(problem, d, float(r0[d])) for d in range(problem.n)])
    return tf, r0, ra, out, back, set_trips


def _routed(problem: Problem, sets: SetFloor, routing: bool = True) -> tuple[float, tuple[int, ...]]:
    """The least floor over the data-node sets, best first: the set with the least floor so far
    is raised by ``SetFloor.dear`` (the dear trips it must take), then by ``SetFloor.apart``
    (round trips off the other data nodes), then by ``SetFloor.dear_schedules`` (the data
    nodes' own schedules with those trips) and, with ``routing``, by
    ``routed_floor.routed_set_floor`` (at most ``ROUTED_SOLVES`` programmes of ``ROUTED_WORK``
    variables in all), and is the answer once it cannot be raised further (every other set's
    floor is at least as high). The dear schedules of a set are searched only up to the least
    floor of a set raised through every step (a set at least that high cannot be the answer),
    and once their budget is spent they raise nothing: the sets raised so far keep their floors."""
    D = int(problem.stage_sizes[0])
    # (floor, -steps, set): among equal floors the most raised set comes first
    heap = [(sets.spread(data), 0, data) for data in itertools.combinations(range(problem.n), D)]
    heapq.heapify(heap)
    solves = min(ROUTED_SOLVES, ROUTED_WORK // path_count(problem)) if routing else 0
    least_raised = math.inf  # the least floor of a set raised through every step so far
    while heap:
        val, step, data = heapq.heappop(heap)
        if step == 0:
            heapq.heappush(heap, (max(val, sets.dear(data)), -1, data))
        elif step == -1 and sets.set_trips is not None:
            heapq.heappush(heap, (max(val, sets.apart(data)), -2, data))
        elif step > -3:
            val = max(val, sets.dear_schedules(data, val, least_raised + 2 * RESOLUTION_S))
            if solves <= 0:
                least_raised = min(least_raised, val)
            heapq.heappush(heap, (val, -3, data))
        elif step == -3 and solves > 0:
            solves -= 1
            val = max(val, routed_set_floor(problem, data, sets.tf))
            least_raised = min(least_raised, val)
            heapq.heappush(heap, (val, -4, data))
        else:
            return val, data
    return math.inf, ()


def plan_free_floor(plan: Plan) -> FreeFloor | None:
    """``free_allocation_floor`` for the cluster, costs and workload a plan file carries (its
    stage sizes kept); None when the file records no workload, or when its TC1 caps are looser
    than the cluster's somewhere (a plan of islands, each with its own caps: the floor counts
    the cluster's)."""
    if not plan.workload:
        return None
    w = dataclasses.replace(workload_from_dict(dict(plan.workload), where="plan workload"),
                            stage_sizes=tuple(len(s) for s in plan.stages))
    c = plan.costs
    cluster = Cluster(name="plan", n=plan.n_nodes, transfer_s=np.array(c.transfer_s, dtype=float),
                      forward_s=np.array(c.forward_s, dtype=float), memory=np.array(plan.memory, dtype=int))
    cm = CostModel(backward_factor=c.backward_factor, loss_factor=c.loss_factor, inject_gap_s=c.inject_gap_s,
                   op_gap_s=c.op_gap_s)
    problem = build_problem(cluster, w, cm)
    return free_allocation_floor(problem) if keeps_cluster_caps(plan, problem) else None


def keeps_cluster_caps(plan: Plan, problem: Problem) -> bool:
    """Whether no TC1 cap of ``plan`` is looser than the cluster's (``Problem.load_caps``), which
    the floor over every allocation counts: a plan of islands has each island's caps instead
    (``routing.decompose``), and may be quicker than that floor."""
    caps = plan.constraints.max_load
    return caps is None or all(c <= r for c, r in zip(caps, problem.load_caps(plan.stages)))
