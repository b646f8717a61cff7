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
(a semi-active schedule: the finish only grows when an operation starts later), the
operation that can start earliest tried first (then a good schedule comes early and cuts the
rest: with 6 microbatches 60-160 steps where final backwards first, then losses, took about
1,500). The
microbatches are alike, so injections, losses and backwards may be taken first in, first
out: if a schedule pairs an earlier loss slot with a later injection, swapping the two
microbatches' losses keeps every lag (the earlier slot already met the later injection), and
the slots in use at any time (injections started minus backwards started) do not depend on
which microbatch is which. Branches whose lower bound (the machine's remaining work, and the
lags still to run for the next microbatch of each kind) reaches the best finish found are cut.

``kinds_schedule`` is that search with several kinds of microbatches, each with its own lags
(``planner.dear_schedule`` gives it the kinds that dear trips force); each kind is taken first
in, first out, and a state is cut where one with the same operations done was reached with
every time no later. With one kind that cut was left out until 2026-12-02 (it saved 1 % of the
steps and doubled the time of m = 6 when final backwards were tried first); with the earliest
operation first it is as quick at m = 6 (the suite's floors: the same values, 24,125 steps
instead of 28,520) and it is what lets m = 17 finish: 113 of 164 searches of heavy-workload
floors finished within the cap instead of 52, in 3.4 instead of 6.7 million steps. A one-kind
search that only asks whether the floor is below a cutoff (``serial_trip_reaches``, the
hold-balanced dealing's gate in ``routing.candidates``) is left without the cut: with it,
that gate decided at 17 microbatches where it had run into the cap (and let the dealing be
built), and 2 of 30 heavy-workload plans (``benchmarks/planning_time_heavy.py``) came out
2.6-2.7 % slower without the dealing.
``serial_trip_floor`` is its one-kind case. The search stops after ``MAX_EXPANSIONS`` steps
(deterministic, no clock) and then returns ``None``: the caller keeps the closed form, which is
always valid. A step's bound runs over the microbatches, so above ``STEP_MICROBATCHES`` of them
a step counts m / ``STEP_MICROBATCHES`` steps: the caps bound the work, not the steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import lru_cache

MAX_EXPANSIONS = 60_000  # search steps of ``serial_trip_floor`` at most (m = 6 takes at most a few thousand)
# search steps of ``serial_trip_below`` at most: its first schedule comes after 3m of them
BELOW_STEPS = 5_000
MAX_STEPS = 30_000  # search steps of one ``kinds_schedule`` at most, by default
MAX_KEPT_STATES = 12  # states kept per set of operations done, to cut later states they dominate
# up to this many microbatches a search step counts one step, above it m / this many: a step's
# bound sorts the slot releases of every microbatch not yet back. With 24 microbatches on the
# 20-node gcp-2025 geo-distributed cluster every search of its floor ran into its cap (18 of
# 60,000 steps, 20 of 30,000) and with 96 they took 29 of the floor's 35 s (4.5 s since, the same
# floor; 12.6 s with 1,000)
STEP_MICROBATCHES = 12

Kind = tuple[int, float, float]  # (microbatches, least time out, least time back)
Node = tuple[float, float, int, int, int]  # a search state: machine free, finish, F, L and B done


@lru_cache(maxsize=4096)
def serial_trip_floor(
    forward: float, out_lag: float, back_lag: float, m: int, slots: int,
    loss_factor: float, backward_factor: float, inject_gap: float, op_gap: float,
) -> float | None:
    """Least finish of the data node's own operations when every microbatch is away for
    ``out_lag`` and ``back_lag`` (one kind of ``kinds_schedule``); None when the search needs
    more than ``MAX_EXPANSIONS`` steps or a lag is not finite."""
    value, steps = kinds_schedule(forward, [(m, out_lag, back_lag)], slots, loss_factor, backward_factor,
                                  inject_gap, op_gap, max_steps=MAX_EXPANSIONS)
    return None if steps > MAX_EXPANSIONS or not math.isfinite(value) else value


@lru_cache(maxsize=4096)
def serial_trip_below(
    forward: float, out_lag: float, back_lag: float, m: int, slots: int,
    loss_factor: float, backward_factor: float, inject_gap: float, op_gap: float, value: float,
) -> bool:
    """Whether a schedule of the data node's own operations (those of ``serial_trip_floor``)
    finishes before ``value``, found within ``BELOW_STEPS`` search steps: True proves
    ``serial_trip_floor`` below ``value`` (or None); False proves nothing. A maximum over data
    nodes skips the searches of those that cannot raise it (``bounds.data_node_floor``): with
    17 microbatches per data node each such search ran into its step cap."""
    found, steps = kinds_schedule(forward, [(m, out_lag, back_lag)], slots, loss_factor, backward_factor,
                                  inject_gap, op_gap, cutoff=value, max_steps=BELOW_STEPS, first_below=True,
                                  dominance=True)
    return steps <= BELOW_STEPS and found < value


def serial_trip_floor_above(
    forward: float, out_lag: float, back_lag: float, m: int, slots: int,
    loss_factor: float, backward_factor: float, inject_gap: float, op_gap: float, value: float,
) -> float:
    """max(``value``, ``serial_trip_floor`` or 0): a maximum over data nodes raised by one more,
    without its search where ``serial_trip_below`` finds a schedule quicker than ``value``."""
    args = (forward, out_lag, back_lag, m, slots, loss_factor, backward_factor, inject_gap, op_gap)
    if serial_trip_below(*args, value):
        return value
    return max(value, serial_trip_floor(*args) or 0.0)


def serial_trip_reaches(
    forward: float, out_lag: float, back_lag: float, m: int, slots: int,
    loss_factor: float, backward_factor: float, inject_gap: float, op_gap: float, value: float,
) -> bool:
    """Whether ``serial_trip_floor`` with these arguments is at least ``value``, decided by the
    search with ``value`` as its cutoff, stopped at its first schedule below it (where the
    floor is far below, a few hundred steps instead of the search's ``MAX_EXPANSIONS``);
    False where that search needs more than ``MAX_EXPANSIONS`` steps, as the floor is then
    not known (``serial_trip_floor`` gives None). A schedule below ``value`` found first with
    the dominated states cut (``serial_trip_below``) answers False at once: that search,
    without the cut, would find one too or stop at its cap (with 17 microbatches it often ran
    the whole cap to answer False)."""
    if serial_trip_below(forward, out_lag, back_lag, m, slots, loss_factor, backward_factor, inject_gap, op_gap, value):
        return False
    found, steps = kinds_schedule(forward, [(m, out_lag, back_lag)], slots, loss_factor, backward_factor,
                                  inject_gap, op_gap, cutoff=value, max_steps=MAX_EXPANSIONS, first_below=True)
    return steps <= MAX_EXPANSIONS and found >= value


def kinds_schedule(
    forward: float, kinds: list[Kind], slots: int, loss_factor: float, backward_factor: float,
    inject_gap: float, op_gap: float, cutoff: float = math.inf, max_steps: int = MAX_STEPS,
    first_below: bool = False, dominance: bool | None = None,
) -> tuple[float, int]:
    """(a lower bound on the least finish of the data node's own operations, search steps).

    The bound is exact when below ``cutoff``; otherwise it is at least ``cutoff`` or, where the
    search needs more than ``max_steps`` steps, the root's bound. Steps are counted as the module
    text says (each m / ``STEP_MICROBATCHES`` above that many microbatches). inf where a kind with
    microbatches has an infinite lag (no such trip). With ``first_below`` the search stops at
    the first schedule that finishes before ``cutoff`` and gives that finish (then an upper
    bound, below ``cutoff``). ``dominance``: whether states dominated by one reached before
    are cut; by default all but a one-kind ``first_below`` search cut them (see the module text)."""
    merged: dict[tuple[float, float], int] = {}
    for c, o, b in kinds:  # kinds with the same lags are one kind (first in, first out within it)
        if c > 0:
            merged[(o, b)] = merged.get((o, b), 0) + c
    kinds = [(c, o, b) for (o, b), c in merged.items()]
    m = sum(c for c, _, _ in kinds)
    if m == 0:
        return 0.0, 0
    if any(not (math.isfinite(o) and math.isfinite(b)) for _, o, b in kinds):
        return math.inf, 0
    K = len(kinds)
    weight = max(m, STEP_MICROBATCHES)  # one step counts weight / STEP_MICROBATCHES steps
    work_cap = max_steps * STEP_MICROBATCHES
    k = max(1, min(int(slots), m))
    f, loss, bwd = forward, loss_factor * forward, backward_factor * forward
    step_f, step_l, step_b = f + inject_gap, loss + op_gap, bwd + op_gap
    count = [c for c, _, _ in kinds]
    out_lag = [o for _, o, _ in kinds]
    back_lag = [b for _, _, b in kinds]
    after_f = [f + o + loss + b + bwd for _, o, b in kinds]  # injection start -> its final backward's end
    after_l = [loss + b + bwd for _, _, b in kinds]  # loss start -> its final backward's end
    least_release = f + min(o for _, o, _ in kinds) + loss + min(b for _, _, b in kinds)  # injection -> slot free
    inject = [[0.0] * c for c in count]
    losses = [[0.0] * c for c in count]
    n_f, n_l, n_b = [0] * K, [0] * K, [0] * K
    best = cutoff
    steps = 0

    rel_loss = [loss + b for b in back_lag]  # loss start -> its final backward may start
    rel_inject = [f + o + loss + b for o, b in zip(out_lag, back_lag)]  # injection start -> the same
    kind_range = range(K)

    def bound(free: float, finish: float, done_f: int, done_l: int, done_b: int) -> float:
        value = free + (m - done_f) * step_f + (m - done_l) * step_l + (m - done_b) * step_b - op_gap
        if finish > value:
            value = finish
        least = math.inf  # the least trip of a microbatch not yet injected
        for i in kind_range:
            nf, nl, nb = n_f[i], n_l[i], n_b[i]
            if nf < count[i] and after_f[i] < least:
                least = after_f[i]
            if nf > nl and inject[i][nl] + after_f[i] > value:
                value = inject[i][nl] + after_f[i]
            if nl > nb and losses[i][nb] + after_l[i] > value:
                value = losses[i][nb] + after_l[i]
        if done_f < m and free + (m - done_f - 1) * step_f + least > value:
            value = free + (m - done_f - 1) * step_f + least
        need = m - k - done_b  # slots the last injection waits for (those out now and k free)
        if need > 0:  # freed by final backwards, one at a time, no sooner than their trips allow
            left = m - done_f
            releases = [free + t * step_f + least_release for t in range(left)]
            for i in kind_range:
                releases += [x + rel_loss[i] for x in losses[i][n_b[i]:n_l[i]]]
                releases += [x + rel_inject[i] for x in inject[i][n_l[i]:n_f[i]]]
            releases.sort()
            freed = free - step_b
            for j in range(need):
                freed = max(releases[j], freed + step_b)
            # before it the machine runs the other injections, those backwards and their losses
            work = free + (left - 1) * step_f + need * step_b + max(0, need - (done_l - done_b)) * step_l
            value = max(value, max(work, freed + step_b) + least)
        return value

    seen: dict[tuple, list[tuple[float, ...]]] = {}
    # one kind asked only "is it below the cutoff?" keeps its search as before the cut (see the module text)
    cut_dominated = K > 1 or not first_below if dominance is None else dominance

    def dominated(free: float, finish: float) -> bool:
        """Has a state with the same operations done been reached with every time no later (the
        machine free, the finish, each microbatch out's injection or loss)? Then this one cannot
        finish sooner. Otherwise it is recorded."""
        key = (*n_f, *n_l, *n_b)
        times = [free, finish]
        for i in range(K):
            times += inject[i][n_l[i]:n_f[i]]
            times += losses[i][n_b[i]:n_l[i]]
        stored = seen.setdefault(key, [])
        for other in stored:
            for a, b in zip(other, times):
                if a > b + 1e-12:
                    break
            else:
                return True
        if len(stored) < MAX_KEPT_STATES:
            stored.append(tuple(times))
        return False

    def expand(free: float, finish: float, done_f: int, done_l: int, done_b: int) -> Iterator[Node]:
        """One search step at a state: yields its children, each with its operation applied to
        the per-kind state (undone when the child's subtree is done)."""
        nonlocal best, steps
        steps += 1
        if steps * weight > work_cap or (first_below and best < cutoff):
            return
        if done_b == m:
            best = min(best, finish)
            return
        if bound(free, finish, done_f, done_l, done_b) >= best - 1e-12 or (cut_dominated and dominated(free, finish)):
            return
        # the operations that may run next, earliest start first (a good schedule comes early, and
        # cuts the rest); ties: final backwards, then losses, then injections
        ready = []
        for i in range(K):  # the oldest microbatch of a kind back from its trip runs its final backward
            if n_l[i] > n_b[i]:
                ready.append((max(free, losses[i][n_b[i]] + loss + back_lag[i]), 0, i))
        for i in range(K):  # the oldest one of a kind out runs its loss
            if n_f[i] > n_l[i]:
                ready.append((max(free, inject[i][n_l[i]] + f + out_lag[i]), 1, i))
        if done_f - done_b < k:  # a new injection, into a free slot
            for i in range(K):
                if n_f[i] < count[i]:
                    ready.append((free, 2, i))
        ready.sort()
        for start, op, i in ready:
            if op == 0:
                n_b[i] += 1
                yield start + step_b, max(finish, start + bwd), done_f, done_l, done_b + 1
                n_b[i] -= 1
            elif op == 1:
                losses[i][n_l[i]] = start
                n_l[i] += 1
                yield start + step_l, finish, done_f, done_l + 1, done_b
                n_l[i] -= 1
            else:
                inject[i][n_f[i]] = start
                n_f[i] += 1
                yield start + step_f, finish, done_f + 1, done_l, done_b
                n_f[i] -= 1

    root = bound(0.0, 0.0, 0, 0, 0)
    # depth first with a stack of its own, not Python's: a schedule is 3m operations deep
    stack = [expand(0.0, 0.0, 0, 0, 0)]
    while stack:
        child = next(stack[-1], None)
        if child is None:
            stack.pop()
        else:
            stack.append(expand(*child))
    counted = steps * weight // STEP_MICROBATCHES
    if steps * weight > work_cap:
        return min(root, cutoff), max(counted, max_steps + 1)
    return best, counted
