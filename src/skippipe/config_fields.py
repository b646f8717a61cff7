"""Shared by every config loader (cluster, workload, model, training, runs): reading a JSON or
TOML file, unknown keys, and scalar values typed like their defaults, each failing with one
clear line."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from skippipe.errors import UserError


def read_config_file(
    path: str | Path, default_format: str = "json", error: type[UserError] = UserError, what: str = "file"
) -> dict[str, Any]:
    """A JSON or TOML file as a dict: ``.toml`` / ``.json`` by extension, else ``default_format``."""
    p = Path(path)
    if not p.is_file():
        raise error(f"{p}: no such {what}")
    suffix = p.suffix.lower()
    fmt = "toml" if suffix == ".toml" else "json" if suffix == ".json" else default_format
    try:
        text = p.read_text()
        data = tomllib.loads(text) if fmt == "toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise error(f"{p}: not valid {fmt.upper()}: {exc}") from None
    except UnicodeDecodeError:
        raise error(f"{p}: not a text file") from None
    if not isinstance(data, dict):
        raise error(f"{p}: expected a table/object at the top level")
    return data


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
