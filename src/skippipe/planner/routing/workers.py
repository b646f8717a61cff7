"""Groups planned side by side: ``GroupPlanner``, the worker processes of ``pool`` for the group
searches of ``plan_skippipe``.

Where ``skippipe`` plans a cluster in groups (``decompose``, ``site_groups``), each group is a
search of its own, independent of the others, and from 24 to 200 nodes the groups are planned
beside the search over the whole cluster. ``GroupPlanner.plan`` hands a batch of groups, and
``GroupPlanner.submit`` the whole cluster's search, to the workers (``pool.planning_workers``).
A plan is a function of its group and its arguments alone, so the plans, and the merged plan,
are the same whatever the count of workers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from skippipe.planfile import Plan
from skippipe.planner.problem import Problem
from skippipe.planner.routing import schedule
from skippipe.planner.routing.budget import default_budget
from skippipe.planner.routing.kept_start import KeptStart
from skippipe.planner.routing.pool import WorkerPool
from skippipe.planner.routing.schedule import plan_skippipe

T = TypeVar("T")


class GroupPlanner(WorkerPool):
    """``plan_skippipe`` on batches of groups (``plan``, ``probe``, ``quick``), in worker processes where
    that is allowed (see ``pool``), else here; a context manager that shuts its workers down."""

    def plan(
        self, subs: list[Problem], fail_fast: bool = False, submitted: Callable[[], None] | None = None,
        starts: list[KeptStart | None] | None = None, **kwargs: Any,
    ) -> list[Plan]:
        """``plan_skippipe(sub, **kwargs)`` for every group, in order (handed out largest first);
        the first group's error, in order, is raised. A single group is planned here unless the
        workers are running. ``fail_fast``: for a caller that only asks whether every group can
        be planned (it gives the batch up on any ``UserError``): the first error to arrive is
        raised at once and the workers still planning are stopped, with whatever else they ran
        (the next call forks new ones). ``submitted()``, where given, is called once the batch
        is handed out (work the caller queues behind it). ``starts``: per group, a start kept
        from its probe (``probe``) or None."""
        kept = starts or [None] * len(subs)
        return self._batch(plan_skippipe, subs, [{"kept": k} for k in kept], fail_fast, submitted, kwargs)

    def probe(
        self, subs: list[Problem], fail_fast: bool = False, submitted: Callable[[], None] | None = None, **kwargs: Any
    ) -> list[tuple[Plan, KeptStart | None]]:
        """As ``plan``, each plan with its first start (``kept_start.KeptStart``; None under a
        time limit), for the group's later plan."""
        return self._batch(probe_skippipe, subs, [{}] * len(subs), fail_fast, submitted, kwargs)

    def quick(self, subs: list[Problem], **kwargs: Any) -> list[tuple[Plan, KeptStart]]:
        """``quick_plan(sub, **kwargs)`` for every group, in order (handed out as ``plan`` does)."""
        return self._batch(quick_plan, subs, [{}] * len(subs), False, None, kwargs)

    def _batch(self, work: Callable[..., T], subs: list[Problem], own: list[dict[str, Any]], fail_fast: bool,
               submitted: Callable[[], None] | None, kwargs: dict[str, Any]) -> list[T]:
        if self._pool is None and len(subs) < 2:
            if submitted is not None:
                submitted()
            return [work(sub, **mine, **kwargs) for sub, mine in zip(subs, own)]
        largest_first = sorted(range(len(subs)), key=lambda i: -subs[i].n)  # the last to finish are small
        pending = {i: self.submit(work, subs[i], **own[i], **kwargs) for i in largest_first}
        if submitted is not None:
            submitted()
        if fail_fast:
            self.raise_first_error([p.future for p in pending.values()])
        return [pending[i].result() for i in range(len(subs))]


def probe_skippipe(problem: Problem, **kwargs: Any) -> tuple[Plan, KeptStart | None]:
    """``plan_skippipe(problem, **kwargs)`` and its first start (None under a time limit)."""
    kept: list[KeptStart] = []
    plan = plan_skippipe(problem, on_start=kept.append, **kwargs)
    return plan, (kept[0] if kept else None)


def quick_plan(problem: Problem, seed: int = 0, budget: int | None = None, thorough: bool = True
               ) -> tuple[Plan, KeptStart]:
    """The quickest candidate of a start's quick part (``schedule.quick_start``) as a plan, not
    searched (meta ``quick``), and that part kept (``KeptStart``, not complete): ``plan_skippipe`` with
    it as ``kept`` builds the rest of the start and makes the plan it would make without it.
    Its makespan is at least that plan's: the search starts from these candidates too."""
    budget = budget if budget is not None else default_budget(problem)
    start = schedule.quick_start(problem, seed, budget, None, None, thorough)
    best = min(start.cands, key=lambda c: c.score.key())
    plan = schedule.build_plan(problem, best.stages, best.routes, "skippipe", seed, best.orders,
                               {"candidate": best.name, "quick": True, "allocation_seed": seed})
    kept = KeptStart.of(seed, thorough, start.stages, start.cands, start.limits.spent, 0.0, start.dealt, complete=False)
    return plan, kept
