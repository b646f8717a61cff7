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
from skippipe.planner.routing.kept_start import KeptStart
from skippipe.planner.routing.pool import WorkerPool
from skippipe.planner.routing.schedule import plan_skippipe

T = TypeVar("T")


class GroupPlanner(WorkerPool):
    """``plan_skippipe`` on batches of groups (``plan``, ``probe``), in worker processes where
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
