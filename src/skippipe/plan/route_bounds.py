"""How soon a data node can finish its microbatches: the estimate the scheduler plans with.

``trip_floor`` sharpens the memory floor of ``skippipe.bounds``. With m microbatches, k = min(M, m)
activation slots and round trips of at least R seconds (R includes the data node's own forward,
loss and backward), the m-th (last) injection needs a free slot, so at least m - k microbatches
have finished before it. Each of those runs its final backward (B seconds) on the data node, no
sooner than R - B after time 0; so do the injections k+1 .. m-1, which wait for a finished
microbatch. The data node does these one at a time with its gaps, then the last microbatch
still needs a whole round trip:

    finish >= (R - B) + (m - k) (B + op_gap) + (m - k - 1) (F + inject_gap) + R

(and, when m <= k, the m injections alone: (m - 1)(F + inject_gap) + R). The memory floor
``ceil(m/k) R + (ceil(m/k) - 1) op_gap`` is the other term of the maximum. With the reference's
m = 6, M = 3 this is what the last data node of the shipped instance reaches exactly (33.05 s,
against a memory floor of 30.41 s).
"""

from __future__ import annotations

import math

import numpy as np

from skippipe.bounds import round_trip_chain


def trip_floor(round_trip: float, forward: float, backward: float, m: int, slots: int, inject_gap: float, op_gap: float) -> float:
    """Least finish time of a data node (see the module text)."""
    if m <= 0:
        return 0.0
    k = max(1, min(int(slots), m))
    if m <= k:
        return (m - 1) * (forward + inject_gap) + round_trip
    rounds = math.ceil(m / k)
    memory = rounds * round_trip + (rounds - 1) * op_gap
    serial = (round_trip - backward) + (m - k) * (backward + op_gap) + (m - k - 1) * (forward + inject_gap) + round_trip
    return max(memory, serial)


def data_node_floor(problem, stages: list[list[int]]) -> float:  # noqa: ANN001
    """The largest ``trip_floor`` over the data nodes of an allocation, each with its fastest
    valid round trip: no plan on this allocation finishes sooner."""
    w = problem.workload
    costs = problem.costs()
    chain = round_trip_chain(stages, costs, w.path_length, w.max_swaps, w.max_jump)
    f = np.asarray(problem.forward_s, dtype=float)
    cm = problem.cost_model
    best = 0.0
    for d in stages[0]:
        own = float(f[d]) * (1.0 + cm.loss_factor + cm.backward_factor)
        trip = own + chain[d]
        best = max(best, trip_floor(trip, float(f[d]), float(f[d]) * cm.backward_factor,
                                    w.microbatches_per_data_node, int(problem.memory[d]), cm.inject_gap_s, cm.op_gap_s))
    return best
