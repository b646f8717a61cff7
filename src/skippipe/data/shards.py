"""Flat binary token shards with a small JSON index (the nanoGPT convention), read memory-mapped.

A prepared dataset is a folder::

    index.json             {"format": "skippipe-tokens", "version": 1, "dtype": "uint16",
                            "vocab_size": 50257, "eot_id": 50256, "tokenizer": "tokenizer.json",
                            "splits": {"train": {"shards": [{"file": "train-000000.bin", "tokens": N,
                                        "sha256": ...}], "tokens": N, "documents": D}, "val": {...}}, ...}
    tokenizer.json         the tokenizer (absent for the byte tokenizer: "tokenizer": "bytes")
    train-000000.bin ...   token ids, little-endian uint16 (vocabulary <= 65,536) or uint32, documents
    val-000000.bin ...     joined by the end-of-text id

``ShardWriter`` appends tokens and starts a new shard every ``shard_tokens`` tokens; each shard
is written to a temporary name and renamed when complete, and ``index.json`` is written last,
so a folder with an index is complete. ``TokenShards`` presents the shards of one split as one
read-only token array: ``len``, slices and integer-array indexing (what ``batches.windows``
uses), backed by ``numpy.memmap``, so a corpus of many GB costs no RAM. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from skippipe.errors import DataError
from skippipe.fileio import atomic_write_text, file_sha256, read_json

INDEX = "index.json"
FORMAT = "skippipe-tokens"
VERSION = 1
DEFAULT_SHARD_TOKENS = 1 << 27  # 128 M tokens: 256 MB of uint16 per shard


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


@dataclass
class ShardWriter:
    """Appends token ids of one split to ``PREFIX-NNNNNN.bin`` files in ``folder``."""

    folder: Path
    prefix: str
    dtype: np.dtype
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    shards: list[dict[str, Any]] = field(default_factory=list)
    documents: int = 0
    _fh: Any = None
    _tmp: Path | None = None
    _count: int = 0
    _hash: Any = None

    def _open(self) -> None:
        name = f"{self.prefix}-{len(self.shards):06d}.bin"
        self._tmp = self.folder / f".{name}.{os.getpid()}.tmp"
        self._fh = open(self._tmp, "wb")
        self._count = 0
        self._hash = hashlib.sha256()

    def _close(self) -> None:
        if self._fh is None:
            return
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        name = f"{self.prefix}-{len(self.shards):06d}.bin"
        assert self._tmp is not None
        os.replace(self._tmp, self.folder / name)
        self.shards.append({"file": name, "tokens": self._count, "sha256": self._hash.hexdigest()})
        self._fh, self._tmp = None, None

    def write(self, ids: np.ndarray | list[int]) -> None:
        arr = np.asarray(ids, dtype=self.dtype)
        while arr.size:
            if self._fh is None:
                self._open()
            room = self.shard_tokens - self._count
            part, arr = arr[:room], arr[room:]
            data = part.tobytes()
            self._fh.write(data)
            self._hash.update(data)
            self._count += len(part)
            if self._count >= self.shard_tokens:
                self._close()

    def finish(self) -> dict[str, Any]:
        self._close()
        return {"shards": self.shards, "tokens": sum(s["tokens"] for s in self.shards), "documents": self.documents}

    def abort(self) -> None:
        """Remove every file this writer wrote (finished shards too): nothing half-written stays."""
        if self._fh is not None:
            self._fh.close()
        if self._tmp is not None and self._tmp.exists():
            self._tmp.unlink()
        for shard in self.shards:
            (self.folder / shard["file"]).unlink(missing_ok=True)
        self.shards.clear()


class TokenShards:
    """The shards of one split as one read-only token array (memory-mapped)."""

    def __init__(self, files: list[Path], dtype: np.dtype):
        self.files = files
        self.maps = [np.memmap(f, dtype=dtype, mode="r") for f in files if f.stat().st_size > 0]
        sizes = [len(m) for m in self.maps]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.dtype = dtype

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return self[np.arange(start, stop, step)]
            return self._range(start, stop)
        idx = np.asarray(key, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"token index outside 0..{len(self) - 1}")
        if len(self.maps) == 1:
            return np.asarray(self.maps[0][idx])
        shard = np.searchsorted(self.offsets, idx, side="right") - 1
        out = np.empty(idx.shape, dtype=self.dtype)
        for s in np.unique(shard):
            sel = shard == s
            out[sel] = self.maps[s][idx[sel] - self.offsets[s]]
        return out

    def _range(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.empty(0, dtype=self.dtype)
        parts = []
        for s, m in enumerate(self.maps):
            lo, hi = max(start, int(self.offsets[s])), min(stop, int(self.offsets[s + 1]))
            if lo < hi:
                parts.append(np.asarray(m[lo - self.offsets[s] : hi - self.offsets[s]]))
        return np.concatenate(parts)


def write_index(folder: Path, index: dict[str, Any]) -> None:
    atomic_write_text(folder / INDEX, json.dumps({"format": FORMAT, "version": VERSION, **index}, indent=1) + "\n")


def read_index(folder: str | Path) -> dict[str, Any]:
    p = Path(folder)
    f = p / INDEX
    if not f.is_file():
        raise DataError(f"{p}: not a prepared dataset (no {INDEX}; make one with `skippipe prepare`)")
    index = read_json(f, DataError, "token index")
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise DataError(f"{f}: not a skippipe token index")
    if index.get("version") != VERSION:
        raise DataError(f"{f}: version {index.get('version')} is not supported (expected {VERSION})")
    return index


def open_split(folder: str | Path, split: str, check: bool = False) -> TokenShards:
    """The memory-mapped tokens of ``split`` ("train" or "val"); sizes are always checked, the
    sha256 of every shard only with ``check``."""
    p = Path(folder)
    index = read_index(p)
    info = index.get("splits", {}).get(split)
    if not info:
        raise DataError(f"{p / INDEX}: no {split!r} split")
    dtype = np.dtype(index["dtype"])
    files = []
    for s in info["shards"]:
        f = p / s["file"]
        if not f.is_file():
            raise DataError(f"{p}: shard {s['file']} is missing")
        if f.stat().st_size != s["tokens"] * dtype.itemsize:
            raise DataError(f"{p}: shard {s['file']} has {f.stat().st_size} bytes, the index says {s['tokens']} tokens")
        if check and file_sha256(f) != s["sha256"]:
            raise DataError(f"{p}: shard {s['file']} is corrupt (sha256 does not match the index)")
        files.append(f)
    return TokenShards(files, dtype)
