"""Checks shared by every config loader (cluster, workload, model, training, runs): unknown
keys and scalar values typed like their defaults, each failing with one clear line."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from skippipe.errors import UserError


def reject_unknown_keys(
    data: dict[str, Any], known: Iterable[str], where: str, error: type[UserError] = UserError
) -> None:
    known = set(known)
    unknown = sorted(set(data) - known)
    if unknown:
        raise error(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")


def value_like(default: Any, value: Any, key: str, where: str) -> Any:
    """``value`` checked against the type of ``default`` (bool, int, float; anything else:
    a string); ints are accepted for floats and returned as floats."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise UserError(f"{where}: {key} must be true or false, got {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: {key} must be an integer, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where}: {key} must be a number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise UserError(f"{where}: {key} must be a string, got {value!r}")
    return value
