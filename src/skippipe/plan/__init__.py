"""Planning: plan files, validation, node->stage allocation, baselines and path scheduling."""

from skippipe.plan.model import Constraints, Costs, Microbatch, Plan, load_plan, save_plan

__all__ = ["Constraints", "Costs", "Microbatch", "Plan", "load_plan", "save_plan"]
