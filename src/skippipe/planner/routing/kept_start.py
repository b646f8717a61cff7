"""A start of ``plan_skippipe`` kept for a later plan of the same problem (``KeptStart``).

Where ``decompose`` probes the islands of a cluster (a plan with a small budget) and then plans
the split it keeps in full, both plans of an island build the same start: the allocation of
the user's seed and the candidate routings on it (``schedule._start``) depend on the problem,
the seed and the kind of start, not on the budget, which they are only charged to. On a
40-node cluster of two islands with 17 microbatches per data node the start was most of each
probe (3.9 of 4.0 s on the 22-node island) and was built again for the island's plan. So a
probe hands its start back, as built, before its search changed any candidate, and the plan
goes on from it: the same plan, without the second start. The evaluators are not kept: they
only cache simulations, and a fresh one scores the same.

A start may also be kept before its slow candidates are built (``complete`` False: the quick
part of ``schedule.quick_plan``, for the groups of a large cluster that are searched only where
they could be the slowest, ``lazy_groups``): the plan then builds the rest of it, the same
start as built in one go.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from skippipe.planner.problem import Problem
from skippipe.planner.routing.candidates import Candidate, Dealt
from skippipe.planner.routing.evaluate import Evaluator
from skippipe.planner.routing.search import SearchLimits


@dataclass(frozen=True)
class KeptStart:
    """The first start of a ``plan_skippipe`` call under no time limit: its allocation seed,
    kind (``thorough``), allocation, candidates as built (their stages shared as in the start:
    the evaluators are keyed by them), the simulations it charged to the budget, the
    estimated CPU of its searches around slow links, the memory dealings it computed and
    whether it is complete (else only its quick part, see the module text)."""

    seed: int
    thorough: bool
    stages: list[list[int]]
    cands: list[Candidate]
    spent: int
    slow_link_s: float
    dealt: Dealt = field(default_factory=dict)
    complete: bool = True

    @staticmethod
    def of(seed: int, thorough: bool, stages: list[list[int]], cands: list[Candidate], spent: int,
           slow_link_s: float, dealt: Dealt | None = None, complete: bool = True) -> KeptStart:
        """A copy of a start's parts (one deep copy, so that candidates sharing an allocation still share it)."""
        stages, cands, dealt = copy.deepcopy((stages, cands, dealt or {}))
        return KeptStart(seed, thorough, stages, cands, spent, slow_link_s, dealt, complete)

    def fits(self, seed: int, thorough: bool) -> bool:
        """Whether this start is the one a call with ``seed`` and ``thorough`` would build."""
        return self.seed == seed and self.thorough == thorough

    def restored(self, problem: Problem, budget: int, deadline: float | None
                 ) -> tuple[list[list[int]], list[Candidate], dict[int, Evaluator], SearchLimits, Dealt]:
        """A fresh copy of the allocation and candidates, an evaluator per allocation (by ``id``,
        as ``schedule._start`` keys them), the budget with the start's charge spent and a copy of
        the memory dealings."""
        stages, cands, dealt = copy.deepcopy((self.stages, self.cands, self.dealt))
        evaluators: dict[int, Evaluator] = {}
        for cand in cands:
            if id(cand.stages) not in evaluators:
                evaluators[id(cand.stages)] = Evaluator(problem, cand.stages)
        return stages, cands, evaluators, SearchLimits(budget=budget, deadline=deadline, spent=self.spent), dealt
