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
from typing import Any

from skippipe.planfile import Plan
from skippipe.planner.problem import Problem
from skippipe.planner.routing.pool import WorkerPool
from skippipe.planner.routing.schedule import plan_skippipe


class GroupPlanner(WorkerPool):
    """``plan_skippipe`` on batches of groups (``plan``), in worker processes where that is
    allowed (see ``pool``), else here; a context manager that shuts its workers down."""

    def plan(
        self, subs: list[Problem], fail_fast: bool = False, submitted: Callable[[], None] | None = None, **kwargs: Any
    ) -> list[Plan]:
        """``plan_skippipe(sub, **kwargs)`` for every group, in order (handed out largest first);
        the first group's error, in order, is raised. A single group is planned here unless the
        workers are running. ``fail_fast``: for a caller that only asks whether every group can
        be planned (it gives the batch up on any ``UserError``): the first error to arrive is
        raised at once and the workers still planning are stopped, with whatever else they ran
        (the next call forks new ones). ``submitted()``, where given, is called once the batch
        is handed out (work the caller queues behind it)."""
        if self._pool is None and len(subs) < 2:
            if submitted is not None:
                submitted()
            return [plan_skippipe(sub, **kwargs) for sub in subs]
        largest_first = sorted(range(len(subs)), key=lambda i: -subs[i].n)  # the last to finish are small
        pending = {i: self.submit(plan_skippipe, subs[i], **kwargs) for i in largest_first}
        if submitted is not None:
            submitted()
        if fail_fast:
            self.raise_first_error([p.future for p in pending.values()])
        return [pending[i].result() for i in range(len(subs))]
