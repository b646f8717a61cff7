"""Argument types shared by the commands: numbers are checked where they are parsed, so a bad
flag is argparse's one line (exit 2) before any work."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from skippipe.limits import INT_LIMIT


def int_in(low: int, high: int = INT_LIMIT) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low:,} to {high:,}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def fraction(text: str) -> float:
    """An argparse type: a number strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value
