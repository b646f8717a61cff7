"""Atomic file writes: a temporary file in the same folder, fsync, then rename.

A reader never sees a half-written file, and a failed write leaves the old file as it was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from skippipe.errors import OutputError, UserError


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


def name_inside(folder: str | Path, name: object, what: str = "file") -> Path:
    """``folder / name`` for a plain file name read from a file we did not write ourselves (a
    checkpoint's config or manifest): no absolute path, no folder part, no ``..`` (``UserError``)."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise UserError(f"{folder}: {what} name {name!r} is not a plain file name inside the folder")
    return Path(folder) / name
