"""The ``skippipe`` command. Each sub-command lives in ``skippipe/commands/<name>.py`` and
provides ``add_arguments(parser)`` and ``run(args) -> int``; modules are imported only when
their command runs, so planning commands never import torch.

Every user-facing error is one line on stderr and a non-zero exit code (``SkipPipeError.exit_code``:
2 bad input, 3 a failed run, 128 + N a run stopped by signal N; 1 an unexpected error), never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
from typing import NoReturn

from skippipe.errors import MissingPackage, SkipPipeError

COMMANDS: list[tuple[str, str]] = [
    ("prepare", "tokenize your text files / JSON Lines into token shards for training"),
    ("plan", "cluster + workload -> plan file"),
    ("simulate", "simulate one iteration of a plan: table, JSON, Gantt chart"),
    ("compare", "all planning methods on one cluster: table + bar chart"),
    ("train", "train along a plan with one worker process per node"),
    ("worker", "one worker process (used by `train` and by torchrun)"),
    ("eval", "validation perplexity, optionally with stages omitted"),
    ("export", "export a checkpoint to a Hugging Face LLaMA directory"),
    ("checkpoint", "gather the local checkpoint folders of a run into one checkpoint"),
    ("profile", "measure links, compute and memory of a launch's workers: a cluster file for plan"),
    ("hdee", "heterogeneous domain expert ensembles: train, eval, generate"),
]


def _available() -> list[tuple[str, str]]:
    return [(name, text) for name, text in COMMANDS if importlib.util.find_spec(f"skippipe.commands.{name}")]


class OneLineParser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (``skippipe CMD: error: ...``), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="skippipe", description="SkipPipe: plan, simulate and train partial pipelines over slow, uneven networks."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, text in _available():
        p = sub.add_parser(name, help=text, description=text)
        if name == wanted:  # import only the module of the command that runs
            importlib.import_module(f"skippipe.commands.{name}").add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error, already printed in one line (2)
        return exc.code if isinstance(exc.code, int) else 2
    if not args.command:
        parser.print_help()
        return 2
    try:
        module = importlib.import_module(f"skippipe.commands.{args.command}")
        code = int(module.run(args) or 0)
        sys.stdout.flush()  # a reader that went away is found here, not at exit
        return code
    except SkipPipeError as exc:
        return _fail(args.command, str(exc), exc.exit_code)
    except KeyboardInterrupt:
        print(f"skippipe {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # whoever read the output stopped (`| head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit must not fail again
        return 141  # 128 + SIGPIPE
    except OSError as exc:  # a file or folder the command could not read or write
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(args.command, f"{where}{exc.strerror or exc}", 2)
    except ModuleNotFoundError as exc:  # installed without an extra (torch for train) or --no-deps
        missing = missing_package(exc)
        if missing is not None:
            return _fail(args.command, str(missing), missing.exit_code)
        return _unexpected(args.command, exc)
    except (ValueError, TypeError, RecursionError, MemoryError, OverflowError) as exc:
        return _unexpected(args.command, exc)


def _unexpected(command: str, exc: Exception) -> int:
    if os.environ.get("SKIPPIPE_DEBUG"):
        raise exc
    text = " ".join(str(exc).split()) or type(exc).__name__
    return _fail(command, f"unexpected {type(exc).__name__}: {text} (SKIPPIPE_DEBUG=1 shows the traceback)", 1)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing_package(exc: ModuleNotFoundError) -> MissingPackage | None:
    """The ``MissingPackage`` error for a module that one of skippipe's requirements provides (the
    extra that brings it read from the installed package's metadata, the one source of the
    extras), or None when the missing module is not one of them (a bug, not an install)."""
    top = (exc.name or "").split(".")[0]
    if not top or top == "skippipe":
        return None
    try:
        requirements = importlib.metadata.requires("skippipe") or []
    except importlib.metadata.PackageNotFoundError:
        requirements = []
    for requirement in requirements:
        name = re.match(r"\s*([A-Za-z0-9._-]+)", requirement)
        if name is None or _normalized(name.group(1)) != _normalized(top):
            continue
        extra = re.search(r"extra\s*==\s*[\"']([^\"']+)[\"']", requirement)
        return MissingPackage(top, extra.group(1) if extra else None)
    return None


def _fail(command: str, message: str, code: int) -> int:
    """Every failure is one line on stderr and a non-zero exit code."""
    line = " ".join(message.split())
    print(f"skippipe {command}: error: {line[:2000]}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
