"""``skippipe checkpoint gather ROOT... --out DIR``: join the local checkpoint folders of a run with
``[run] checkpoint_storage = "local"`` (copied from its machines) into one checkpoint folder that
``skippipe eval``, ``skippipe export`` and ``skippipe train --resume`` read (``runtime/gather.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    g = sub.add_parser("gather", help="join local checkpoint folders into one checkpoint folder",
                       description="join local checkpoint folders (node-NNN/checkpoints/step-NNNNNN) into one checkpoint folder")
    g.add_argument("roots", nargs="+", metavar="FOLDER",
                   help="local checkpoint roots as copied from the machines (holding node-NNN folders), or node-NNN folders")
    g.add_argument("--out", required=True, metavar="DIR", help="the checkpoint folder to write (new or empty), "
                   "e.g. RUN/checkpoints/step-000040 to --resume from it")
    g.add_argument("--step", type=int, metavar="N", help="the iteration to gather (default: the newest with node 0's metadata)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from skippipe.runtime.gather import gather

    got = gather([Path(r) for r in args.roots], Path(args.out), step=args.step, progress=not args.no_progress)
    print(f"gathered step {got.step}: {got.num_stages} stages, {got.n_files} files, {got.n_bytes / 1e6:.2f} MB, "
          f"sha256 checked, into {got.path}")
    for stage, folder in sorted(got.sources.items()):
        print(f"  stage {stage}: {folder}")
    return 0
