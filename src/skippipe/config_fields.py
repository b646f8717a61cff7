"""One typed reader for every config (cluster, workload, model, training, runs).

``read_dataclass(cls, data, where)`` turns a table from a JSON or TOML file into the frozen
dataclass ``cls``, driven by its fields' type hints:

- ``bool``, ``int``, ``float``, ``str``, ``Literal[...]`` (choices), ``X | None``, ``X | list[X]``;
- ``list[X]`` and ``tuple[X, ...]`` of any of these (matrices are ``list[list[float]]``);
- ``dict[str, Any]`` (a table passed on as is, read by its own reader later);
- a nested dataclass: a table of its own (``[run]``), or, with ``metadata={"inline": True}``,
  keys of the enclosing table (``[plan] num_stages`` fills ``PlanSection.shape``).

It is strict: a bool is never a number and a number never a bool, ``1.5`` is not an int,
strings are never numbers, floats are finite, numbers, strings and lists are bounded (the limits
are in ``skippipe.limits``), unknown keys are refused. Field-level bounds are declared once in
``dataclasses.field(metadata=...)``:

- ``"min"`` / ``"max"`` (inclusive), ``"gt"`` / ``"lt"`` (exclusive), applied to every number of
  the field (every entry of a matrix);
- ``"min_len"`` / ``"max_len"``: the fewest / most entries of every list of the field;
- ``"finite": False``: the field takes NaN, infinities and floats beyond ``FLOAT_LIMIT``.

``check_fields(obj)``, called from each config's ``__post_init__``, applies the same checks to
values built in code; ``__post_init__`` then keeps only the rules between fields, raising
``invalid(obj, key, problem)``. Every failure is a ``ConfigError`` (the class's ``config_error``,
e.g. ``WorkloadError``, or the ``error`` class given, e.g. ``ClusterError``) whose message is one
line naming the place and the key.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from skippipe.errors import ConfigError
from skippipe.fileio import read_text_file
from skippipe.limits import FLOAT_INT_BITS, FLOAT_LIMIT, INT_LIMIT, MAX_CHARS, MAX_ITEMS

T = TypeVar("T")

SHOWN_CHARS = 40  # of a string quoted in a message

Metadata = Mapping[str, Any]


# ------------------------------------------------------------------------------ files


def read_config_file(
    path: str | Path, default_format: str = "json", error: type[ConfigError] = ConfigError, what: str = "file"
) -> dict[str, Any]:
    """A JSON or TOML file as a dict: ``.toml`` / ``.json`` by extension, else ``default_format``."""
    p = Path(path)
    text = read_text_file(p, lambda problem: error(problem, where=str(p)), what)
    suffix = p.suffix.lower()
    fmt = "toml" if suffix == ".toml" else "json" if suffix == ".json" else default_format
    try:
        data = tomllib.loads(text) if fmt == "toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise error(f"not valid {fmt.upper()}: {exc}", where=str(p)) from None
    except ValueError:  # an integer of more than 4300 digits
        raise error(f"not valid {fmt.upper()}: a number is too long", where=str(p)) from None
    except RecursionError:
        raise error(f"not valid {fmt.upper()}: nested too deeply", where=str(p)) from None
    if not isinstance(data, dict):
        raise error("expected a table/object at the top level", where=str(p))
    declared = data.get("format")
    if isinstance(declared, str):  # config files have no "format": this one is another kind (a plan file ...)
        raise error(f"a {declared} file, not a {what}", where=str(p))
    return data


# ------------------------------------------------------------------------------ reading


def read_dataclass(
    cls: type[T],
    data: Any,
    where: str,
    *,
    base: T | None = None,
    error: type[ConfigError] | None = None,
    other_keys: Iterable[str] = (),
) -> T:
    """``cls`` from the table ``data``: keys given replace those of ``base`` (default: the
    class defaults). ``other_keys`` are keys the caller has read itself (they count as known).
    Errors are ``error``, else the class's ``config_error``, else ``ConfigError``."""
    error = error or error_class(cls)
    if not isinstance(data, dict):
        raise error(f"must be a table, got {show(data)}", where=where)
    known = [*known_keys(cls), *other_keys]
    unknown = [key for key in data if key not in known]
    if unknown:
        noun = "table" if _all_tables(cls) else "key"
        names = ", ".join(_key_name(key) for key in unknown)
        raise error(f"unknown {noun}(s) {names} (known: {', '.join(sorted(known))})", where=where, key=str(unknown[0]))
    kwargs: dict[str, Any] = {}
    for f, hint in _fields(cls):
        inner_base = getattr(base, f.name) if base is not None else _default(f)
        if f.metadata.get("inline"):
            sub = {key: data[key] for key in known_keys(hint) if key in data}
            if sub:
                kwargs[f.name] = read_dataclass(hint, sub, where, base=inner_base, error=error)
        elif f.name in data:
            value = data[f.name]
            if dataclasses.is_dataclass(hint):
                kwargs[f.name] = read_dataclass(hint, value, f"{where} [{f.name}]", base=inner_base, error=error)
            else:
                kwargs[f.name] = read_value(hint, value, f.name, f.metadata, where, error)
    try:
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    except ConfigError as exc:  # a rule between fields, raised by __post_init__ with the class's label
        if exc.where != getattr(cls, "config_label", None):
            raise
        raise error(exc.problem, where=where, key=exc.key) from None


def read_value(hint: Any, value: Any, key: str, meta: Metadata, where: str, error: type[ConfigError]) -> Any:
    """``value`` checked against the type ``hint`` and the bounds in ``meta``, in its stored form
    (a tuple for ``tuple[...]``, a float for ``float``)."""

    def fail(problem: str) -> ConfigError:
        return error(problem, where=where, key=key.split("[")[0])

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        chosen = _choose(options, value)
        if chosen is None:
            raise fail(f"{key} must be {describe(hint)}, got {show(value)}")
        return read_value(chosen, value, key, meta, where, error)
    if origin is Literal:
        if not any(type(value) is type(choice) and value == choice for choice in args):
            raise fail(f"{key} must be one of {', '.join(repr(c) for c in args)}, got {show(value)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise fail(f"{key} must be {describe(hint)}, got {show(value)}")
        most = min(meta.get("max_len", MAX_ITEMS), MAX_ITEMS)
        if len(value) > most:
            raise fail(f"{key} has {len(value)} entries, more than the limit of {most}")
        if len(value) < meta.get("min_len", 0):
            entries = "entry" if meta["min_len"] == 1 else "entries"
            raise fail(f"{key} needs at least {meta['min_len']} {entries}, got {len(value)}")
        items = [read_value(args[0], v, f"{key}[{i}]", meta, where, error) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or hint is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise fail(f"{key} must be a table, got {show(value)}")
        return dict(value)
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        return read_dataclass(hint, value, f"{where} [{key}]", error=error)
    if hint is bool:
        if not isinstance(value, bool):
            raise fail(f"{key} must be true or false, got {show(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail(f"{key} must be an integer, got {show(value)}")
        if abs(value) > INT_LIMIT:
            raise fail(f"{key} is too large: {show(value)} (the limit is 2**31)")
        _check_bounds(value, key, meta, fail, integer=True)
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail(f"{key} must be a number, got {show(value)}")
        if isinstance(value, int):
            if value.bit_length() > FLOAT_INT_BITS:
                raise fail(f"{key} is too large: {show(value)}")
            value = float(value)
        if meta.get("finite", True) and not math.isfinite(value):
            raise fail(f"{key} must be a finite number, got {show(value)}")
        if meta.get("finite", True) and abs(value) > FLOAT_LIMIT:
            raise fail(f"{key} is too large: {show(value)} (the limit is {FLOAT_LIMIT:g})")
        _check_bounds(value, key, meta, fail, integer=False)
        return value
    if hint is str:
        if not isinstance(value, str):
            raise fail(f"{key} must be a string, got {show(value)}")
        if len(value) > MAX_CHARS:
            raise fail(f"{key} is too long: {len(value)} characters, more than the limit of {MAX_CHARS}")
        return value
    raise TypeError(f"config fields cannot be of type {hint!r}")  # a programming error, not the user's


def check_fields(obj: Any) -> None:
    """The checks of ``read_dataclass`` on a dataclass built in code (call it from ``__post_init__``)."""
    cls = type(obj)
    label = getattr(cls, "config_label", cls.__name__)
    for f, hint in _fields(cls):
        read_value(hint, getattr(obj, f.name), f.name, f.metadata, label, error_class(cls))


def invalid(obj: Any, key: str | None, problem: str) -> ConfigError:
    """The error for a rule between fields of ``obj``; ``read_dataclass`` puts it in its file."""
    cls = type(obj)
    return error_class(cls)(problem, where=getattr(cls, "config_label", cls.__name__), key=key)


def error_class(cls: type) -> type[ConfigError]:
    """The error type of a config class: its ``config_error`` class variable, else ``ConfigError``."""
    return getattr(cls, "config_error", ConfigError)


def to_table(obj: Any) -> Any:
    """A dataclass as the table ``read_dataclass`` reads back: inline fields merged, tuples as
    lists, ``None`` values left out (TOML has no null)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            value = to_table(getattr(obj, f.name))
            if f.metadata.get("inline"):
                out.update(value)
            elif value is not None:
                out[f.name] = value
        return out
    if isinstance(obj, dict):
        return {k: to_table(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, (list, tuple)):
        return [to_table(v) for v in obj]
    return obj


def known_keys(cls: type) -> list[str]:
    """The keys of ``cls``'s table: its fields, an inline field's own keys in its place."""
    keys: list[str] = []
    for f, hint in _fields(cls):
        keys.extend(known_keys(hint) if f.metadata.get("inline") else [f.name])
    return keys


# ------------------------------------------------------------------------------ helpers


@cache
def _fields(cls: type) -> tuple[tuple[dataclasses.Field, Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(cls) if f.init)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _all_tables(cls: type) -> bool:
    return all(
        dataclasses.is_dataclass(hint) or typing.get_origin(hint) is dict for f, hint in _fields(cls)
    ) and not any(f.metadata.get("inline") for f, _ in _fields(cls))


def _choose(options: list[Any], value: Any) -> Any:
    """The member of a union that ``value`` is meant for: a list for a list, else a scalar."""
    if len(options) == 1:
        return options[0]
    is_list = isinstance(value, (list, tuple))
    for option in options:
        if (typing.get_origin(option) in (list, tuple)) == is_list:
            return option
    return None


def _check_bounds(value: float, key: str, meta: Metadata, fail: Any, integer: bool) -> None:
    low, high = meta.get("min"), meta.get("max")
    if low is not None and value < low:
        if integer and low == 1:
            raise fail(f"{key} must be a positive integer, got {show(value)}")
        if low == 0:
            raise fail(f"{key} must not be negative, got {show(value)}")
        raise fail(f"{key} must be at least {low}, got {show(value)}")
    if high is not None and value > high:
        raise fail(f"{key} must be at most {high}, got {show(value)}")
    if "gt" in meta and not value > meta["gt"]:
        raise fail(f"{key} must be > {meta['gt']}, got {show(value)}")
    if "lt" in meta and not value < meta["lt"]:
        raise fail(f"{key} must be < {meta['lt']}, got {show(value)}")


def describe(hint: Any) -> str:
    """``hint`` in words, for messages."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args if a is not type(None))
    if origin in (list, tuple):
        return "a list"
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in args)
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(hint, "a table")


def show(value: Any) -> str:
    """``value`` for a one-line message, short whatever its size."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 64 else f"an integer of {value.bit_length()} bits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        text = repr(value[:SHOWN_CHARS])
        return text if len(value) <= SHOWN_CHARS else text[:-1] + "...'"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


def _key_name(key: Any) -> str:
    text = str(key)
    plain = isinstance(key, str) and text.isprintable() and " " not in text and len(text) <= SHOWN_CHARS
    return text if plain else show(key)
