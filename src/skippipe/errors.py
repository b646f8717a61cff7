"""User-facing errors: one clear line, exit code 2, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (a file, a flag, a config). The CLI prints it as one line."""

    exit_code = 2


class PlanError(UserError):
    """A plan file that cannot be read or breaks a rule."""


class ConfigError(UserError):
    """A config file or value that cannot be used, as one line ``WHERE: PROBLEM``.

    ``where`` names the file and table (``small.toml [workload]``), or the kind of config
    (``workload``) for a value built in code; ``key`` is the offending key (``None``: the file or
    table as a whole); ``problem`` is the message without its place.
    """

    def __init__(self, problem: str, where: str = "", key: str | None = None) -> None:
        self.problem = " ".join(problem.splitlines())
        self.where = " ".join(where.splitlines())
        self.key = key
        super().__init__(f"{self.where}: {self.problem}" if self.where else self.problem)


class ClusterError(ConfigError):
    """A cluster description that cannot be used."""


class OutputError(UserError):
    """An output path that cannot be written (checked before any work is done)."""


class WorkloadError(ConfigError):
    """A workload (file, flags or ``[plan]`` pipeline shape) that cannot be used."""


class DataError(UserError):
    """Input text, a tokenizer or a prepared token dataset that cannot be used."""
