"""Run folders: whose they are, and one run in each at a time.

- ``.skippipe-run`` (``MARKER``): written into every run folder that ``skippipe train`` makes or
  uses. A folder is ours when it holds it. ``--fresh`` deletes only the project's outputs
  (``RUN_OUTPUTS``) and only in a folder that is ours; a folder that holds any of those names
  but no marker is refused as a whole (nothing in it deleted or overwritten).
- ``.skippipe.lock`` (``LOCK``, empty): ``skippipe train`` holds an exclusive ``flock`` on it for the
  whole run, and its workers inherit the lock, so the folder stays locked until the last of them
  is gone. The kernel releases the lock when the processes end however they end (even SIGKILL):
  a crashed run never leaves the folder stuck. A second run in the folder gets ``RunLocked``.
- Stale ``checkpoints/.step-NNNNNN.partial`` folders (a run stopped while writing a checkpoint)
  are removed when a run starts; readers ignore them anyway (``checkpoint.list_checkpoints``).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path
from types import TracebackType

from skippipe.errors import RunFolderError, RunLocked
from skippipe.fileio import atomic_write_text

MARKER = ".skippipe-run"
LOCK = ".skippipe.lock"
RUN_OUTPUTS = ("checkpoints", "local", "timeline", "tensorboard", "logs", "metrics.jsonl", "timeline.png", "plan.json",
               "config.json")
_PARTIAL_PREFIX, _PARTIAL_SUFFIX = ".step-", ".partial"


def is_ours(run_dir: Path) -> bool:
    return (run_dir / MARKER).is_file()


def foreign_outputs(run_dir: Path) -> list[str]:
    """The project's output names that a folder without the marker already holds."""
    if not run_dir.is_dir() or is_ours(run_dir):
        return []
    return [name for name in RUN_OUTPUTS if (run_dir / name).exists() or (run_dir / name).is_symlink()]


def claim(run_dir: Path) -> None:
    """Make ``run_dir`` ours (create it, write the marker), or refuse a folder that is not."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunFolderError(f"{run_dir}: is not a folder; give another --run-dir")
    clash = foreign_outputs(run_dir)
    if clash:
        raise RunFolderError(
            f"{run_dir} is not a skippipe run folder (no {MARKER} file) but holds {', '.join(clash)}; "
            "nothing was deleted or overwritten: choose another --run-dir"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    if not is_ours(run_dir):
        atomic_write_text(run_dir / MARKER, json.dumps({"format": "skippipe-run", "version": 1}) + "\n")


def delete_outputs(run_dir: Path) -> list[str]:
    """``--fresh``: delete the project's outputs in a folder that is ours; returns their names."""
    if not run_dir.exists():
        return []
    if not is_ours(run_dir):
        raise RunFolderError(f"--fresh: {run_dir} is not a skippipe run folder (no {MARKER} file); nothing was deleted")
    gone = []
    for name in RUN_OUTPUTS:
        p = run_dir / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        else:
            continue
        gone.append(name)
    return gone


def clean_partials(run_dir: Path) -> list[Path]:
    """Remove stale ``.step-NNNNNN.partial`` checkpoint folders of a run folder that is ours."""
    root = run_dir / "checkpoints"
    if not is_ours(run_dir) or not root.is_dir():
        return []
    stale = [
        p for p in root.iterdir()
        if p.is_dir() and not p.is_symlink() and p.name.startswith(_PARTIAL_PREFIX) and p.name.endswith(_PARTIAL_SUFFIX)
        and p.name[len(_PARTIAL_PREFIX):-len(_PARTIAL_SUFFIX)].isdigit()
    ]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


class RunLock:
    """An exclusive ``flock`` on ``RUN/.skippipe.lock`` (the holder's pid is read from ``/proc/locks``).

    ``fd`` may be handed to worker processes: they then share the lock, which lasts until the
    last holder is gone."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LOCK
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_pid(fd)
            os.close(fd)
            raise RunLocked(str(self.run_dir), holder) from None
        self.fd = fd  # the file itself is never written: taking the lock changes nothing in the folder
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # the lock goes with the last open copy of this descriptor
            self.fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def _holder_pid(fd: int) -> int | None:
    """The process that took the ``flock`` on ``fd``'s file (Linux ``/proc/locks``), if known."""
    try:
        st = os.fstat(fd)
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == dev and parts[4].isdigit():
            return int(parts[4])
    return None


def lock_run_folder(run_dir: Path) -> RunLock:
    """Claim ``run_dir`` (``claim``) and lock it; use as ``with lock_run_folder(d) as lock:``."""
    claim(run_dir)
    return RunLock(run_dir)
