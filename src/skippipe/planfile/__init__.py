"""The plan file: the contract between planner, simulator and runtime.

``format`` holds the data model (stages, layers, memory, constraints, costs, microbatches and their
paths, processing orders), ``validate`` the path rules CC1-CC3 and the TC1 load caps, ``io`` the
atomic, validated load and save. Nothing here imports the planner, the simulator or torch.
"""

from skippipe.planfile.format import OP_KINDS, PLAN_FORMAT, PLAN_VERSION, Constraints, Costs, Microbatch, Plan, parse_op
from skippipe.planfile.io import load_plan, save_plan
from skippipe.planfile.validate import check_plan, path_rule_violation, plan_violations

__all__ = [
    "OP_KINDS",
    "PLAN_FORMAT",
    "PLAN_VERSION",
    "Constraints",
    "Costs",
    "Microbatch",
    "Plan",
    "check_plan",
    "load_plan",
    "parse_op",
    "path_rule_violation",
    "plan_violations",
    "save_plan",
]
