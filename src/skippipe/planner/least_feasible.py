"""The least makespan a floor's programme allows, by bisection (for the programme floors)."""

from __future__ import annotations

from collections.abc import Callable

# a solver's "infeasible" is trusted only this far (the floor returned is lowered by it)
SAFETY = 1e-6


def least_feasible(feasible: Callable[[float], bool], at_least: float, rel_tol: float, first_step: float) -> float:
    """The least T >= ``at_least`` with ``feasible(T)`` (feasibility grows with T), within
    ``rel_tol`` of T and lowered by ``SAFETY``; the bracket grows from ``first_step`` x
    ``at_least``, doubling. Every T below the answer was shown infeasible, so it is a floor."""
    if feasible(at_least):
        return at_least
    lo, hi = at_least, first_step * at_least
    for _ in range(60):
        if feasible(hi):
            break
        lo, hi = hi, 2.0 * hi
    else:
        return max(at_least, lo * (1.0 - SAFETY))
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    return max(at_least, lo * (1.0 - SAFETY))
