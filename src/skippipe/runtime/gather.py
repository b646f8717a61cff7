"""``skippipe checkpoint gather``: join local checkpoint folders into one "shared" checkpoint. Torch-free.

The user copies the ``[run] local_checkpoint_dir`` folders (or just their ``node-NNN`` folders)
from the machines (rsync, scp) and names them all; ``gather`` picks one step (``--step``, else
the newest that holds node 0's run metadata), checks that every stage of that step is there and
that every file has the sha256 of its local manifest (hashed while copied), and writes the
checkpoint folder format of ``checkpoint_storage = "shared"`` (``checkpoint.py``: stage files,
``config.json``, ``plan.json``, tokenizer, ``manifest.json`` last), so that ``skippipe eval``,
``skippipe export`` and ``--resume`` (in ``RUN/checkpoints/``) read it unchanged. The output
folder is filled in a scratch folder and renamed: it is complete or absent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from skippipe.errors import ChecksumMismatch, LocalCheckpointError, MixedIterations, OutputError, StageMissing
from skippipe.fileio import atomic_dir, check_writable_dir, name_inside
from skippipe.planfile import load_plan
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime import local_checkpoint as L


@dataclass
class Gathered:
    path: Path
    step: int
    num_stages: int
    n_files: int
    n_bytes: int
    sources: dict[int, Path]  # stage -> the folder it was copied from


def choose_step(steps: dict[int, L.StepParts], step: int | None) -> L.StepParts:
    """The step to gather: ``step``, else the newest that has node 0's run metadata."""
    if step is None:
        with_run = sorted(s for s, p in steps.items() if p.runs)
        if not with_run:
            raise LocalCheckpointError(f"none of the folders holds node 0's run metadata ({L.RUN_MANIFEST}; steps found: "
                                       f"{sorted(steps)}): copy node-000's local checkpoint folder too")
        step = with_run[-1]
    if step not in steps:
        raise LocalCheckpointError(f"step {step} is in none of the folders given (steps found: {sorted(steps)})")
    if not steps[step].runs:
        raise LocalCheckpointError(f"step {step}: node 0's run metadata ({L.RUN_MANIFEST}) is in none of the folders given; "
                                   "copy node-000's local checkpoint folder too")
    return steps[step]


def check_complete(steps: dict[int, L.StepParts], parts: L.StepParts) -> tuple[dict, list[tuple[Path, str, str]]]:
    """The run manifest of ``parts`` and every file to copy as ``(source, name, sha256)``; one-line
    errors for a missing stage, stages of other steps or plans (mixed iterations)."""
    run_folder = parts.runs[0]
    run = L.read_manifest(run_folder / L.RUN_MANIFEST, parts.step)
    num_stages = int(run["num_stages"])
    for stage in range(num_stages):
        if stage in parts.stages:
            continue
        elsewhere = sorted(s for s, p in steps.items() if stage in p.stages)
        if elsewhere:
            raise MixedIterations(f"step {parts.step}: stage {stage} is only at step(s) {', '.join(map(str, elsewhere))} in the "
                                  "folders given (mixed iterations); copy the matching folders, or pick with --step a step "
                                  "that every stage has")
        raise StageMissing(parts.step, stage, load_plan(run_folder / "plan.json").stages[stage])
    files = [(name_inside(run_folder, n, "manifest entry"), n, d) for n, d in sorted(run["files"].items())]
    for stage in range(num_stages):
        folder = parts.stages[stage]
        m = L.read_manifest(folder / L.stage_manifest_name(stage), parts.step)
        if m.get("stage") != stage or m.get("plan_sha256") != run["plan_sha256"]:
            raise MixedIterations(f"{folder / L.stage_manifest_name(stage)}: written for another plan or stage than "
                                  f"{run_folder / L.RUN_MANIFEST} (mixed runs)")
        files += [(name_inside(folder, n, "manifest entry"), n, d) for n, d in sorted(m["files"].items())]
    for src, _, _ in files:
        if not src.is_file():
            raise LocalCheckpointError(f"{src}: is missing (its manifest lists it)")
    return run, files


def _copy_hashing(src: Path, dst: Path, advance: Callable[[int], object]) -> str:
    h = hashlib.sha256()
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        for chunk in iter(lambda: fin.read(1 << 20), b""):
            h.update(chunk)
            fout.write(chunk)
            advance(len(chunk))
    return h.hexdigest()


def gather(roots: list[Path], out: Path, step: int | None = None, progress: bool = True) -> Gathered:
    """Check and join the local checkpoint folders under ``roots`` into the checkpoint folder ``out``."""
    from tqdm import tqdm

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OutputError(f"{out}: exists and is not an empty folder; give a new folder for the checkpoint")
    check_writable_dir(out, "checkpoint folder")
    steps = L.scan(roots)
    parts = choose_step(steps, step)
    run, files = check_complete(steps, parts)
    total = sum(src.stat().st_size for src, _, _ in files)
    known: dict[str, str] = {}
    with atomic_dir(out) as tmp, tqdm(total=total, unit="B", unit_scale=True, desc="gather", disable=not progress) as bar:
        for src, name, digest in files:
            if name in known:
                raise LocalCheckpointError(f"{src}: {name} comes from two folders")
            if _copy_hashing(src, tmp / name, bar.update) != digest:
                raise ChecksumMismatch(str(src))
            known[name] = digest
        ckpt.write_manifest(tmp, parts.step, int(run["num_stages"]), str(run["plan_sha256"]), list(run["losses"]), known=known)
    info = ckpt.verify(out)
    return Gathered(out, info.step, int(run["num_stages"]), len(files) + 1, total, dict(parts.stages))
