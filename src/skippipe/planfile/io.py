"""Reading and writing plan files: JSON, validated on the way in and out, written atomically."""

from __future__ import annotations

import json
from pathlib import Path

from skippipe.errors import PlanError
from skippipe.fileio import atomic_write_text, read_json
from skippipe.planfile.format import Plan
from skippipe.planfile.validate import check_plan


def load_plan(path: str | Path, validate: bool = True) -> Plan:
    """Read and (by default) validate a plan file. Raises PlanError with a one-line message."""
    p = Path(path)
    data = read_json(p, PlanError, "plan file")
    plan = Plan.from_dict(data, where=str(p))
    if validate:
        check_plan(plan, where=str(p))
    return plan


def save_plan(plan: Plan, path: str | Path, validate: bool = True) -> None:
    """Validate (by default), then write the plan atomically."""
    if validate:
        check_plan(plan, where=str(path))
    atomic_write_text(path, json.dumps(plan.to_dict(), indent=1) + "\n")
