"""Reading and writing plan files: JSON, validated on the way in and out, written atomically."""

from __future__ import annotations

import json
from pathlib import Path

from skippipe.errors import PlanError
from skippipe.fileio import atomic_write_text
from skippipe.planfile.format import Plan
from skippipe.planfile.validate import check_plan


def load_plan(path: str | Path, validate: bool = True) -> Plan:
    """Read and (by default) validate a plan file. Raises PlanError with a one-line message."""
    p = Path(path)
    if not p.is_file():
        raise PlanError(f"{p}: no such plan file")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise PlanError(f"{p}: not valid JSON ({exc})") from None
    except UnicodeDecodeError:
        raise PlanError(f"{p}: not a text file") from None
    plan = Plan.from_dict(data, where=str(p))
    if validate:
        check_plan(plan, where=str(p))
    return plan


def save_plan(plan: Plan, path: str | Path, validate: bool = True) -> None:
    """Validate (by default), then write the plan atomically."""
    if validate:
        check_plan(plan, where=str(path))
    atomic_write_text(path, json.dumps(plan.to_dict(), indent=1) + "\n")
