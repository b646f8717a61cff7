"""The stage orders the path rules allow, and how many microbatches each can take.

A microbatch's path after its data node is an order of ``path_length - 1`` distinct stages of
1..S-1 (CC2/CC3: adjacent swaps only, at most ``max_swaps``, no visit more than ``max_jump``
stages past the highest reached; ``planfile.path_rule_violation``). The stages' TC1 caps bound
how many microbatches each order can take; ``sequence_quotas`` splits them. Both sit below
``planner.problem``, which chooses the stage sizes with them. Where the orders number thousands,
``routing_orders`` gives the routings a spread of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TypeVar

import numpy as np

from skippipe.errors import WorkloadError
from skippipe.limits import MAX_STAGE_ORDERS
from skippipe.planfile import path_rule_violation

T = TypeVar("T")


def count_stage_orders(num_stages: int, path_length: int, max_swaps: int, max_jump: int,
                       limit: int | None = None) -> int:
    """How many stage orders ``stage_sequences`` would list, counted without listing them (20
    stages with L = 12 allow 379,432), or the first count above ``limit`` once it is passed.

    The orders are counted visit by visit, by state: the frontier, whether the stage just below
    it is still free for a swap, and the swaps made. Only states that can still reach L - 1
    visits are kept, so each kept state leads to at least one order, the orders so far never
    number more than the final count, and the count stops as soon as they pass ``limit``."""
    k = path_length - 1
    states: dict[tuple[int, bool, int], int] = {(0, False, 0): 1}
    for step in range(k):
        left = k - step - 1  # visits after this one
        grown: dict[tuple[int, bool, int], int] = {}
        for (frontier, below_free, swaps), count in states.items():
            nexts = [(s, s >= frontier + 2, swaps) for s in range(frontier + 1, min(num_stages - 1, frontier + max_jump) + 1)]
            if below_free and swaps < max_swaps:
                nexts.append((frontier, False, swaps + 1))
            for state in nexts:
                if _reachable_from(state, num_stages, max_swaps) >= left:
                    grown[state] = grown.get(state, 0) + count
        states = grown
        total = sum(states.values())
        if limit is not None and total > limit:
            return total
    return sum(states.values())


def _reachable_from(state: tuple[int, bool, int], num_stages: int, max_swaps: int) -> int:
    """How many more stages an order in ``state`` (frontier, stage below it free, swaps made) could
    still visit: every stage above the frontier, and the one just below it where a swap is left."""
    frontier, below_free, swaps = state
    return num_stages - 1 - frontier + int(below_free and swaps < max_swaps)


def check_stage_orders(num_stages: int, path_length: int, max_swaps: int, max_jump: int) -> None:
    """A ``WorkloadError`` where the path rules allow more stage orders than ``MAX_STAGE_ORDERS``."""
    count = count_stage_orders(num_stages, path_length, max_swaps, max_jump, limit=MAX_STAGE_ORDERS)
    if count > MAX_STAGE_ORDERS:
        raise WorkloadError(
            f"S={num_stages}, L={path_length}, max_swaps={max_swaps} and max_jump={max_jump} allow more than "
            f"{MAX_STAGE_ORDERS:,} stage orders, the most the planner takes: lower max_jump or max_swaps, or choose "
            f"a path length nearer 2 or S", where="workload", key="path_length")


# above this many stage orders ``skippipe``'s own routings take a spread of them (``routing_orders``);
# the ``skippipe-no-tc2`` routing, the floors, the plan checks and the allocation keep every order.
# S <= 9 allows at most 256.
ROUTING_ORDERS = 300


def routing_orders(
    stage_caps: list[int], total: int, path_length: int, max_swaps: int, max_jump: int
) -> tuple[tuple[int, ...], ...]:
    """The stage orders the routing searches take for ``total`` microbatches on stages with
    these TC1 cap sums: ``spread_orders``, or every order where the caps cannot carry them on
    the spread alone."""
    every = stage_sequences(len(stage_caps), path_length, max_swaps, max_jump)
    kept = spread_orders(len(stage_caps), path_length, max_swaps, max_jump)
    if len(kept) < len(every) and sequence_quotas(kept, stage_caps, total) is None:
        return every
    return kept


@lru_cache(maxsize=64)
def spread_orders(num_stages: int, path_length: int, max_swaps: int, max_jump: int) -> tuple[tuple[int, ...], ...]:
    """Every stage order up to ``ROUTING_ORDERS``; beyond, that many: the orders without a swap
    first, each kind spread evenly over its sorted list (the routing's time grew with the
    orders: 5,664 orders, S = 14, L = 8, planned in 23 s on 40 nodes)."""
    every = stage_sequences(num_stages, path_length, max_swaps, max_jump)
    if len(every) <= ROUTING_ORDERS:
        return every
    plain: list[tuple[int, ...]] = []
    swapped: list[tuple[int, ...]] = []
    for seq in every:
        (plain if all(a < b for a, b in zip(seq, seq[1:])) else swapped).append(seq)
    kept = _spread(plain, ROUTING_ORDERS)
    kept += _spread(swapped, ROUTING_ORDERS - len(kept))
    return tuple(sorted(kept))


def _spread(items: Sequence[T], count: int) -> list[T]:
    """``count`` of ``items`` (all where they are fewer), evenly spaced over the list."""
    if count >= len(items):
        return list(items)
    return [items[i * len(items) // count] for i in range(count)] if count > 0 else []


@lru_cache(maxsize=64)
def stage_sequences(num_stages: int, path_length: int, max_swaps: int, max_jump: int) -> tuple[tuple[int, ...], ...]:
    """Every stage order after stage 0 allowed by CC2/CC3: ``path_length - 1`` distinct stages
    of 1..S-1, adjacent swaps only, at most ``max_swaps`` of them, jumps of at most ``max_jump``."""
    k = path_length - 1
    out: list[tuple[int, ...]] = []

    def grow(prefix: list[int]) -> None:
        if len(prefix) == k:
            out.append(tuple(prefix))
            return
        if _reachable(prefix, num_stages, max_swaps) < k - len(prefix):
            return  # too few stages left to finish (a stage skipped below the frontier stays skipped)
        for s in range(1, num_stages):
            if s in prefix:
                continue
            if path_rule_violation([*prefix, s], max_swaps, max_jump) is None:
                grow([*prefix, s])

    grow([])
    return tuple(out)


def _reachable(prefix: list[int], num_stages: int, max_swaps: int) -> int:
    """``_reachable_from`` the state that ``prefix`` leaves."""
    frontier = max(prefix, default=0)
    swaps = sum(1 for i, s in enumerate(prefix) if s < max(prefix[:i], default=0))
    below = frontier - 1
    return _reachable_from((frontier, below >= 1 and below not in prefix, swaps), num_stages, max_swaps)


def sequence_quotas(
    sequences: tuple[tuple[int, ...], ...], stage_caps: list[int], total: int
) -> dict[tuple[int, ...], int] | None:
    """How many microbatches take each stage sequence so that no stage exceeds its capacity
    (an integer program, solved exactly by HiGHS); None when no split exists."""
    found = _quotas(tuple(map(tuple, sequences)), tuple(int(c) for c in stage_caps), int(total))
    return None if found is None else dict(found)


# the planner asks the same question again (the same allocation from several candidates): with
# thousands of orders one programme takes 0.5-1.3 s (5,664 orders, S = 14, L = 8, 40 nodes)
@lru_cache(maxsize=256)
def _quotas(
    sequences: tuple[tuple[int, ...], ...], stage_caps: tuple[int, ...], total: int
) -> tuple[tuple[tuple[int, ...], int], ...] | None:
    """``sequence_quotas``' answer, kept."""
    from scipy.optimize import LinearConstraint, linprog, milp

    k = len(sequences)
    if k == 0:
        return None
    a = np.zeros((len(stage_caps) + 1, k))
    for j, seq in enumerate(sequences):
        for s in seq:
            a[s, j] = 1.0
        a[-1, j] = 1.0
    lower = np.concatenate([np.full(len(stage_caps), -np.inf), [total]])
    upper = np.concatenate([np.asarray(stage_caps, dtype=float), [total]])
    columns = np.arange(k)
    if k > ROUTING_ORDERS:  # HiGHS's MIP over thousands of orders took 0.4-0.6 s a split, 1.2-3.5 s to find none
        relaxed = linprog(np.zeros(k), A_ub=a[:-1], b_ub=upper[:-1], A_eq=a[-1:], b_eq=[total], bounds=(0, total),
                          method="highs")
        if relaxed.status == 2:
            return None  # not even the linear relaxation has a split
        if relaxed.x is not None:  # first over its orders and a spread of the others
            columns = np.union1d(np.flatnonzero(relaxed.x > 1e-9), _spread(range(k), ROUTING_ORDERS))
    for cols in ([columns, np.arange(k)] if len(columns) < k else [columns]):
        res = milp(c=np.zeros(len(cols)), constraints=LinearConstraint(a[:, cols], lower, upper),
                   integrality=np.ones(len(cols)), bounds=(0, total))
        if res.success and res.x is not None:
            return tuple((sequences[j], int(round(x))) for j, x in zip(cols, res.x) if round(x) > 0)
    return None
