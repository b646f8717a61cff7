"""A brand-new node joins a running job (``[runtime] join``), in the launcher.

At the iteration boundary the event names, the launcher drains the workers as for a rejoin
(``adapt.py``), and ``join_new_node`` makes the plan for one more node: it gets the next
original id no node of the run ever had, the costs of node ``like`` (``planner.grow.add_node``),
and a stage — the one named, or the one whose extra replica gives the shortest simulated
makespan after its paths are planned again with the stage allocation fixed
(``planner.grow.choose_stage``). The next round starts with it as a joiner
(``$SKIPPIPE_JOINERS``): it takes its stage's weights and AdamW state from a peer over
``torch.distributed`` (``rejoin.py``), not from disk. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from skippipe.errors import UserError
from skippipe.planfile import Plan, load_plan
from skippipe.planner.grow import choose_stage
from skippipe.planner.replan import replan, with_transfer
from skippipe.planner.shrink import original_nodes

FIRST_PLAN = "plan-first.json"  # under RUN/elastic (adapt.FIRST_PLAN)


def next_node_id(run_dir: Path, plan: Plan) -> int:
    """An original node id no node of this run ever had."""
    first = load_plan(run_dir / "elastic" / FIRST_PLAN)
    elastic = plan.meta.get("elastic") if isinstance(plan.meta.get("elastic"), dict) else {}
    used = [first.n_nodes - 1, *original_nodes(plan), *(int(x) for x in elastic.get("lost", []))]
    return max(used) + 1


def join_new_node(run_dir: Path, base: Plan, event: Any, transfer: np.ndarray, method: str,
                  seed: int) -> tuple[Plan, int, dict[int, float]]:
    """The plan with the new node, its original id, and the simulated makespan per candidate stage."""
    running = original_nodes(base)
    if int(event.like) not in running:
        raise UserError(f"[runtime] join: node {event.like} (like) is not running")
    like = running.index(int(event.like))
    new_id = next_node_id(run_dir, base)

    def plan_again(p: Plan) -> Plan:
        if p.frozen_stages:  # the planner plans whole pipelines: with a frozen stage the dealt-out paths stay
            return p
        return replan(p, p.costs.transfer_s, method=method, seed=seed, fixed_stages=True)

    stage = None if event.stage is None else int(event.stage)
    grown, _, figures = choose_stage(with_transfer(base, transfer), like, new_id, stage, plan_again)
    return grown, new_id, figures
