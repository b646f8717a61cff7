"""The data node's own schedule, solved exactly: a sharper data-node floor (torch-free).

A data node d runs, for each of its m microbatches, three operations of its own: the injection
``F`` (then ``inject_gap``), the loss ``L`` and the final backward ``B`` (each then ``op_gap``),
one at a time. Between them the microbatch is away: its loss cannot start before ``out_lag``
after its injection ends (the hops out, the forwards on its path, the hop back), its final
backward not before ``back_lag`` after its loss ends (the hops and backwards back). A
microbatch holds one of d's k = min(M, m) activation slots from its injection to its final
backward. Every plan's microbatches obey this with lags at least the fastest valid path's
forward part and backward part (waiting only lengthens them), so the least finish of this
one-machine problem is a floor on every plan of the allocation.

``bounds.trip_floor`` bounds the same problem in closed form but leaves the losses out and
assumes the final backwards and injections can run back to back. ``serial_trip_floor`` solves
it: depth-first over the order of the 3m operations, each started as early as it can
(a semi-active schedule: the finish only grows when an operation starts later). The
microbatches are alike, so injections, losses and backwards may be taken first in, first
out: if a schedule pairs an earlier loss slot with a later injection, swapping the two
microbatches' losses keeps every lag (the earlier slot already met the later injection), and
the slots in use at any time (injections started minus backwards started) do not depend on
which microbatch is which. Branches whose lower bound (the machine's remaining work, and the
lags still to run for the next microbatch of each kind) reaches the best finish found are cut.

The search stops after ``MAX_EXPANSIONS`` steps (deterministic, no clock) and then returns
``None``: the caller keeps the closed form, which is always valid.
"""

from __future__ import annotations

import math
from functools import lru_cache

MAX_EXPANSIONS = 60_000  # search steps per data node at most (m = 6 takes at most a few thousand)


@lru_cache(maxsize=4096)
def serial_trip_floor(
    forward: float, out_lag: float, back_lag: float, m: int, slots: int,
    loss_factor: float, backward_factor: float, inject_gap: float, op_gap: float,
) -> float | None:
    """Least finish of the data node's own operations (see the module text); None when the
    search needs more than ``MAX_EXPANSIONS`` steps or a lag is not finite."""
    if m <= 0:
        return 0.0
    if not (math.isfinite(out_lag) and math.isfinite(back_lag)):
        return None
    k = max(1, min(int(slots), m))
    f, loss, bwd = forward, loss_factor * forward, backward_factor * forward
    step_f, step_l, step_b = f + inject_gap, loss + op_gap, bwd + op_gap
    after_f = f + out_lag + loss + back_lag + bwd  # injection start -> its final backward's end
    after_l = loss + back_lag + bwd  # loss start -> final backward's end
    inject = [0.0] * m  # start of each microbatch's injection (first in, first out)
    losses = [0.0] * m  # start of each microbatch's loss
    best = math.inf
    expansions = 0

    def search(n_f: int, n_l: int, n_b: int, free: float, finish: float) -> None:
        nonlocal best, expansions
        expansions += 1
        if expansions > MAX_EXPANSIONS:
            return
        if n_b == m:
            best = min(best, finish)
            return
        bound = max(finish, free + (m - n_f) * step_f + (m - n_l) * step_l + (m - n_b) * step_b - op_gap)
        if n_f < m:
            bound = max(bound, free + (m - n_f - 1) * step_f + after_f)
        if n_f > n_l:
            bound = max(bound, inject[n_l] + after_f)
        if n_l > n_b:
            bound = max(bound, losses[n_b] + after_l)
        if bound >= best - 1e-12:
            return
        if n_l > n_b:  # the oldest microbatch back from its trip runs its final backward
            start = max(free, losses[n_b] + loss + back_lag)
            search(n_f, n_l, n_b + 1, start + step_b, max(finish, start + bwd))
        if n_f > n_l:  # the oldest one out runs its loss
            start = max(free, inject[n_l] + f + out_lag)
            losses[n_l] = start
            search(n_f, n_l + 1, n_b, start + step_l, finish)
        if n_f < m and n_f - n_b < k:  # a new injection, into a free slot
            inject[n_f] = free
            search(n_f + 1, n_l, n_b, free + step_f, finish)

    search(0, 0, 0, 0.0, 0.0)
    if expansions > MAX_EXPANSIONS or not math.isfinite(best):
        return None
    return best
