"""The groups of a large cluster searched only where they could be the slowest (``LazyGroups``).

A plan in groups (``site_groups.grouped_plan`` above ``decompose.DECOMPOSE_NODES`` nodes) is as
quick as its slowest group: the groups share no node. Searching every group in full spent most
of the planning on groups far below the slowest (global uneven, 1,000 nodes: 40 groups of
16-52 nodes, planned at 42.0-64.8 s in 89 s of CPU, the 15 largest, 26-52 nodes and 60 % of
that CPU, all at 54.6 s or less). So every group first gets the quick part of its start
(``workers.quick_plan``: its allocation, the balanced, memory-order and data-node-exchange
routings, the quickest of them unsearched; ``skippipe-no-tc2`` only where none of them is
built), and the full search
(``plan_skippipe``, going on from that part) is given only to the groups whose quick plan is
slower than every group searched so far: first the ``FIRST_SEARCHED`` slowest, then, round by
round, every group whose quick plan is slower than the slowest searched one, until none is.

The merged plan of a split is then exactly as quick as with every group searched: the slowest
searched group is searched as before, and every other group's plan (quick or searched) is no
slower, while a searched plan is never slower than its quick one (the search starts from the
same candidates). Which groups are searched depends on the plans alone, so it is the same on
every machine and with any count of workers. The moves of data nodes between groups
(``decompose.probed_rows``) read every group's makespan, so they get ``spans``: a quick plan's
scaled by the median share its searched groups kept of theirs; the splits they reach can still
differ from those of every group searched (measured in the module's history).
"""

from __future__ import annotations

from skippipe.planfile import Plan
from skippipe.planner.problem import Problem
from skippipe.planner.routing.decompose import cost_key
from skippipe.planner.routing.kept_start import KeptStart
from skippipe.planner.routing.workers import GroupPlanner

FIRST_SEARCHED = 2  # the slowest quick plans searched in the first round (a count, not the workers')


def plan_span(plan: Plan) -> float:
    """A simulated plan's makespan (0 where none was predicted)."""
    return float(plan.predicted_makespan_s or 0.0)


class LazyGroups:
    """Plans of the groups of one cluster, each group planned once by its costs
    (``decompose.cost_key``): quick, and searched where it could be the slowest (module text)."""

    def __init__(self, planner: GroupPlanner, seed: int, budget: int | None, thorough: bool) -> None:
        self.planner, self.seed, self.budget, self.thorough = planner, seed, budget, thorough
        self.quick: dict[bytes, tuple[Plan, KeptStart]] = {}  # every group planned, by its costs
        self.searched: dict[bytes, Plan] = {}

    def plans(self, subs: list[Problem]) -> list[Plan]:
        """The plan of every group of a split, in order (see the module text)."""
        by_key = {cost_key(sub): sub for sub in subs}
        fresh = [key for key in by_key if key not in self.quick]
        if fresh:
            got = self.planner.quick([by_key[key] for key in fresh], seed=self.seed, budget=self.budget,
                                     thorough=self.thorough)
            self.quick.update(zip(fresh, got))
        while todo := self._to_search(list(by_key)):
            plans = self.planner.plan([by_key[key] for key in todo], starts=[self.quick[key][1] for key in todo],
                                      seed=self.seed, budget=self.budget, thorough=self.thorough)
            self.searched.update(zip(todo, plans))
        return [self.plan(cost_key(sub)) for sub in subs]

    def spans(self, subs: list[Problem]) -> list[float]:
        """The makespans of a split's groups for moving data nodes between them: a searched
        group's own, a quick one's scaled by ``searched_share`` (an estimate: a quick plan
        overstates what its search reaches, which misled the choice of the group that takes a
        data node). The slowest stays exact: it is searched, and no estimate passes it."""
        plans, share = self.plans(subs), self.searched_share()
        return [plan_span(plan) * (share if plan.meta.get("quick", False) else 1.0) for plan in plans]

    def searched_share(self) -> float:
        """The median over the searched groups of searched / quick makespan (at most 1; 1 with none)."""
        shares = sorted(min(1.0, plan_span(plan) / plan_span(self.quick[key][0])) for key, plan in self.searched.items())
        return shares[len(shares) // 2] if shares else 1.0

    def plan(self, key: bytes) -> Plan:
        """A group's plan: searched where it was, else quick."""
        return self.searched[key] if key in self.searched else self.quick[key][0]

    def _to_search(self, keys: list[bytes]) -> list[bytes]:
        """The groups of a split to search next: with none searched the ``FIRST_SEARCHED`` slowest,
        else those slower than the slowest searched; none once the slowest is searched."""
        waiting = sorted((key for key in keys if key not in self.searched), key=lambda key: -plan_span(self.plan(key)))
        done = [plan_span(self.searched[key]) for key in keys if key in self.searched]
        if not done:
            return waiting[:FIRST_SEARCHED]
        slowest = max(done)
        return [key for key in waiting if plan_span(self.plan(key)) > slowest]
