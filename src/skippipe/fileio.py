"""Atomic file writes: a temporary file in the same folder, fsync, then rename.

A reader never sees a half-written file, and a failed write leaves the old file as it was.
Also the names of checkpoint step folders (``step_folder_name``, ``step_folders``), which the
run's, the nodes' own and the HDEE jobs' checkpoints share.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from skippipe.errors import OutputError, UserError

_STEP_FOLDER = re.compile(r"^step-(\d{6,})$")


def step_folder_name(step: int) -> str:
    """The name of a checkpoint folder after ``step`` steps: ``step-000042`` (six digits at least,
    so that the names sort as the steps do)."""
    return f"step-{step:06d}"


def step_folders(root: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of the folders directly in ``root`` named by ``step_folder_name``, oldest
    first (none where ``root`` is not a folder)."""
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_FOLDER.match(p.name)))


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` to fill a temporary file, then move it over ``path``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """A folder filled in a scratch folder (``.NAME.partial-*``, beside the nearest existing parent)
    and moved into place when the block ends without error; on any error the scratch folder is
    removed and ``path`` is as it was. Into an existing non-empty folder the files move one by one."""
    p = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{p.name}.partial-", dir=_nearest_existing(p.absolute())))
    try:
        yield tmp
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_dir() and any(p.iterdir()):
            for f in sorted(tmp.iterdir()):
                os.replace(f, p / f.name)
            tmp.rmdir()
        else:
            if p.is_dir():
                p.rmdir()
            os.replace(tmp, p)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _nearest_existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_writable(path: str | Path, what: str = "output file") -> Path:
    """Refuse, before any work, an output file that could not be written: a folder in its place,
    a parent that is a file, or a folder without write permission (``OutputError``)."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{p}: is a folder; give a file name for the {what}")
    base = _nearest_existing(p.parent.absolute())
    if not base.is_dir():
        raise OutputError(f"{p}: cannot create the {what}: {base} is not a folder")
    _probe(p, base, what)
    return p


def check_writable_dir(path: str | Path, what: str = "output folder") -> Path:
    """Refuse, before any work, an output folder that could not be created or written."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{p}: is a file; give a folder for the {what}")
    base = _nearest_existing(p.absolute())
    if not base.is_dir():
        raise OutputError(f"{p}: cannot create the {what}: {base} is not a folder")
    _probe(p, base, what)
    return p


def _probe(p: Path, base: Path, what: str) -> None:
    """Create and remove a scratch file in ``base``: permissions, read-only or pseudo file systems."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".skippipe-probe.", dir=base)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise OutputError(f"{p}: cannot create the {what} in {base}: {exc.strerror}") from None


def read_text_file(p: Path, fail: Callable[[str], Exception], what: str = "file") -> str:
    """The UTF-8 text of a file another program may have written; every way it cannot be read
    (missing, a folder, no permission or an I/O error, not UTF-8) is one ``fail(problem)``."""
    if p.is_dir():
        raise fail(f"a folder, not a {what}")
    if not p.is_file():
        raise fail(f"no such {what}")
    try:
        return p.read_text(encoding="utf-8")
    except OSError as exc:
        raise fail(f"cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise fail("not a text file (not UTF-8)") from None


def read_json(path: str | Path, error: Callable[[str], Exception], what: str = "file", label: str | None = None) -> object:
    """A JSON document read from a file another program may have written; every way it can be
    unreadable (``read_text_file``'s, not JSON, a number too long, nested too deeply) is one
    ``error(f"{label}: {problem}")``; ``label`` defaults to the path."""
    p = Path(path)
    label = str(p) if label is None else label
    text = read_text_file(p, lambda problem: error(f"{label}: {problem}"), what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{label}: not valid JSON ({exc})") from None
    except ValueError:  # an integer of more than 4300 digits
        raise error(f"{label}: not valid JSON (a number is too long)") from None
    except RecursionError:
        raise error(f"{label}: not valid JSON (nested too deeply)") from None


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def name_inside(folder: str | Path, name: object, what: str = "file") -> Path:
    """``folder / name`` for a plain file name read from a file we did not write ourselves (a
    checkpoint's config or manifest): no absolute path, no folder part, no ``..`` (``UserError``)."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise UserError(f"{folder}: {what} name {name!r} is not a plain file name inside the folder")
    return Path(folder) / name
