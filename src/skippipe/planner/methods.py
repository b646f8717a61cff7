"""The planning methods by name, and ``make_plan``: plan, simulate, record the prediction.

``METHODS`` maps a method name to ``planner(problem, seed, time_limit_s) -> Plan``:

- ``full``             DT-FM full pipeline (``baselines.full_plan``)
- ``random``           random skipping under CC1-CC3 and TC1 (``baselines.random_plan``)
- ``naive``            index-order stages, least-loaded stage sets and nodes (``baselines.naive_plan``)
- ``skippipe-no-tc2``  SkipPipe paths without collision awareness (``routing.schedule.plan_no_tc2``)
- ``skippipe``         SkipPipe with collision-aware paths (``routing.schedule.plan_skippipe``; clusters
                       in parts: ``routing.decompose``, ``routing.site_groups``; small clusters
                       also on their best-ranked allocations: ``routing.every_allocation``)

Torch-free.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable

from skippipe.errors import UserError
from skippipe.planfile import Plan, check_plan
from skippipe.planner.allocation import allocate
from skippipe.planner.baselines import full_plan, naive_plan, random_plan
from skippipe.planner.problem import Problem
from skippipe.planner.routing.decompose import plan_in_groups
from skippipe.planner.routing.every_allocation import ranked_allocations, ranked_budget
from skippipe.planner.routing.schedule import plan_no_tc2, plan_skippipe, quickest
from skippipe.planner.routing.site_groups import plan_whole_or_grouped
from skippipe.sim import SimResult, simulate

Planner = Callable[[Problem, int, "float | None"], Plan]

# a random draw can deadlock under tight memory (two swapped paths waiting on each other's
# node); the random method then draws again with the next sub-seed, this many times at most
RANDOM_DRAWS = 8


def _full(problem: Problem, seed: int, time_limit_s: float | None) -> Plan:
    return full_plan(problem, stages=_stages(problem, seed, time_limit_s), seed=seed)


def _random(problem: Problem, seed: int, time_limit_s: float | None) -> Plan:
    return _random_on(problem, _stages(problem, seed, time_limit_s), seed)


def _random_on(problem: Problem, stages: list[list[int]], seed: int) -> Plan:
    plan = random_plan(problem, stages=stages, seed=seed)
    for draw in range(1, RANDOM_DRAWS):
        if _simulate(plan, bound=False).finished:
            break
        plan = random_plan(problem, stages=stages, seed=seed * RANDOM_DRAWS + draw)
        plan.seed = seed
        plan.meta["draw"] = draw
    return plan


def _naive(problem: Problem, seed: int, time_limit_s: float | None) -> Plan:
    return naive_plan(problem, seed=seed)


def _stages(problem: Problem, seed: int, time_limit_s: float | None) -> list[list[int]]:
    return allocate(problem, seed=seed, time_limit_s=time_limit_s)


def _no_tc2(problem: Problem, seed: int, time_limit_s: float | None) -> Plan:
    return plan_no_tc2(problem, seed=seed, time_limit_s=time_limit_s)


def _skippipe(problem: Problem, seed: int, time_limit_s: float | None) -> Plan:
    fallbacks = functools.partial(_fallbacks, problem, seed=seed)  # it pickles: a worker may run the search
    split = plan_in_groups(problem, seed, time_limit_s, fallbacks)  # islands, large clusters of sites
    plan = split if split is not None else plan_whole_or_grouped(problem, seed, time_limit_s, fallbacks)
    budget = ranked_budget(problem) if time_limit_s is None else None
    if budget is not None:  # a small cluster: its best-ranked allocations too
        others = [("every allocation", plan_skippipe(with_allocation(problem, stages), seed=seed, budget=budget))
                  for stages in ranked_allocations(problem)]
        plan = quickest(plan, others)
    return plan


def _fallbacks(problem: Problem, stages: list[list[int]], *, seed: int) -> list[tuple[str, Plan]]:
    """skippipe's safety net: the naive plan and the random plan on skippipe's allocation (the
    ``random`` method's plan for the same seed), simulated; those that finish."""
    out: list[tuple[str, Plan]] = []
    makers: list[tuple[str, Callable[[], Plan]]] = [
        ("naive", lambda: naive_plan(problem, seed=seed)),
        ("random", lambda: _random_on(problem, stages, seed)),
    ]
    for name, make in makers:
        try:
            plan = make()
        except UserError:
            continue
        result = _simulate(plan, bound=False)
        if result.finished:
            plan.predicted_makespan_s = float(result.makespan_s)
            out.append((name, plan))
    return out


METHODS: dict[str, Planner] = {
    "full": _full,
    "random": _random,
    "naive": _naive,
    "skippipe-no-tc2": _no_tc2,
    "skippipe": _skippipe,
}


def method_names() -> list[str]:
    return list(METHODS)


def with_allocation(problem: Problem, stages: list[list[int]]) -> Problem:
    """The same problem with the node -> stage allocation fixed to ``stages`` (every method
    then plans on it, as with a cluster file that names its stages)."""
    cluster = dataclasses.replace(problem.cluster, stages=[list(map(int, s)) for s in stages])
    return dataclasses.replace(problem, cluster=cluster, stage_sizes=[len(s) for s in stages])


def _simulate(plan: Plan, bound: bool = True) -> SimResult:
    """The plan simulated without records; ``bound=False`` skips its lower bound (a candidate
    that may not be kept: the floors cost up to a second at 1,000 nodes)."""
    return simulate(plan, record=False, bound=bound)


def make_plan(method: str, problem: Problem, seed: int = 0, time_limit_s: float | None = None) -> Plan:
    """Plan with ``method``, check the plan, simulate it and store ``predicted_makespan_s``,
    ``lower_bound_s`` and the planning time (``meta.planning_s``). A plan that cannot finish
    every microbatch in simulation (memory deadlock) is an error."""
    if method not in METHODS:
        raise UserError(f"unknown method {method!r} (known: {', '.join(METHODS)})")
    if time_limit_s is not None and not time_limit_s > 0:
        raise UserError(f"time limit must be > 0 seconds, got {time_limit_s}")
    start = time.perf_counter()
    plan = METHODS[method](problem, seed, time_limit_s)
    planning_s = time.perf_counter() - start
    check_plan(plan, where=f"{method} plan")
    result = _simulate(plan)
    if not result.finished:
        memory = sorted(set(plan.memory))
        mem = str(memory[0]) if len(memory) == 1 else f"{memory[0]}..{memory[-1]}"
        raise UserError(
            f"memory too small to make a {method} plan: with {mem} activation slot(s) per node, "
            f"{len(result.unfinished)} of {len(plan.microbatches)} microbatches never finish in simulation "
            f"(memory deadlock); give more memory or fewer swaps (--max-swaps 0)"
        )
    plan.predicted_makespan_s = float(result.makespan_s)
    plan.lower_bound_s = float(result.lower_bound_s) if math.isfinite(result.lower_bound_s) else None
    plan.meta["planning_s"] = round(planning_s, 3)
    return plan
