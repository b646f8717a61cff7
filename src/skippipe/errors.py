"""User-facing errors: one clear line, exit code 2, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (a file, a flag, a config). The CLI prints it as one line."""

    exit_code = 2


class PlanError(UserError):
    """A plan file that cannot be read or breaks a rule."""


class ClusterError(UserError):
    """A cluster description that cannot be used."""


class OutputError(UserError):
    """An output path that cannot be written (checked before any work is done)."""
