"""The stage orders the path rules allow, and how many microbatches each can take.

A microbatch's path after its data node is an order of ``path_length - 1`` distinct stages of
1..S-1 (CC2/CC3: adjacent swaps only, at most ``max_swaps``, no visit more than ``max_jump``
stages past the highest reached; ``planfile.path_rule_violation``). The stages' TC1 caps bound
how many microbatches each order can take; ``sequence_quotas`` splits them. Both sit below
``planner.problem``, which chooses the stage sizes with them.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from skippipe.planfile import path_rule_violation


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
        for s in range(1, num_stages):
            if s in prefix:
                continue
            if path_rule_violation([*prefix, s], max_swaps, max_jump) is None:
                grow([*prefix, s])

    grow([])
    return tuple(out)


def sequence_quotas(
    sequences: tuple[tuple[int, ...], ...], stage_caps: list[int], total: int
) -> dict[tuple[int, ...], int] | None:
    """How many microbatches take each stage sequence so that no stage exceeds its capacity
    (an integer program, solved exactly by HiGHS); None when no split exists."""
    from scipy.optimize import LinearConstraint, milp

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
    res = milp(c=np.zeros(k), constraints=LinearConstraint(a, lower, upper), integrality=np.ones(k),
               bounds=(0, total))
    if not res.success or res.x is None:
        return None
    return {seq: int(round(x)) for seq, x in zip(sequences, res.x) if round(x) > 0}
