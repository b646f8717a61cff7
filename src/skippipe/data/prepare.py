"""``skippipe prepare``: your text -> a tokenizer -> token shards, once (the nanoGPT convention).

Inputs are text files, folders of them (searched recursively for ``TEXT_SUFFIXES`` and
``.jsonl``; hidden files skipped) and JSON Lines files with a text field (one document per
line). A ``.json`` file given by name holds JSON Lines (as Hugging Face's ``to_json`` writes
them) or one array of records. Any of them may be gzipped (``.txt.gz``, ``.jsonl.gz``). A text
file is one document; a record is one document.

- **Split by document**, deterministic: a document goes to validation when the hash of its key
  (a text file's path relative to its input, a record's text) falls below ``val_fraction``, so
  the same document lands in the same split on every machine and in every run, and a duplicated
  record never straddles the split. A corpus of text files always gets at least one validation
  and one training document. ``split="tail"`` instead cuts the last ``val_fraction`` of every
  document (cut at a line break), the built-in corpora's rule; a single text file uses it.
- **Tokenizer**: ``"bpe"`` (a byte-level BPE trained on the training documents, the offline
  default), ``"bytes"``, ``"gpt2"`` or a ``tokenizer.json`` path (``tokenizers_hf``).
- **Output** (``shards.py``): ``train-NNNNNN.bin`` / ``val-NNNNNN.bin`` shards of uint16/uint32
  ids, documents joined by the end-of-text id, ``tokenizer.json`` and ``index.json`` (written
  last). Large text files are read in pieces cut at line breaks, so RAM stays small.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from skippipe.data.corpora import split_document
from skippipe.data.shards import DEFAULT_SHARD_TOKENS, INDEX, ShardWriter, read_index, token_dtype, write_index
from skippipe.data.tokenizer import Tokenizer, train_bpe
from skippipe.data.tokenizers_hf import resolve_tokenizer
from skippipe.errors import DataError

TEXT_SUFFIXES = (".txt", ".text", ".md", ".markdown", ".rst")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSON_SUFFIX = ".json"  # JSON Lines or an array of records, told apart by the first character
GZIP_SUFFIX = ".gz"  # any input may be gzipped: its kind is the suffix before this one
CHUNK_CHARS = 4 << 20  # big text files are read in pieces of about this many characters
BATCH_CHARS = 8 << 20  # characters encoded per encode_batch call


@dataclass(frozen=True)
class InputFile:
    path: Path
    key: str  # path relative to the input it was found under, without .gz
    jsonl: bool  # records of a text field (JSON Lines, or an array when ``array``), not a text file
    array: bool = False


@dataclass
class PrepareSummary:
    out: Path
    tokenizer: str
    vocab_size: int
    documents: dict[str, int]
    tokens: dict[str, int]
    shards: dict[str, int]
    seconds: float
    split: str

    def format(self) -> str:
        lines = [f"{'split':<6} {'documents':>10} {'tokens':>14} {'shards':>7}"]
        for s in ("train", "val"):
            lines.append(f"{s:<6} {self.documents[s]:>10,} {self.tokens[s]:>14,} {self.shards[s]:>7}")
        total = self.tokens["train"] + self.tokens["val"]
        lines.append(f"tokenizer {self.tokenizer}, vocabulary {self.vocab_size:,}; split by {self.split}")
        lines.append(f"wrote {self.out} in {self.seconds:.1f} s ({total / max(self.seconds, 1e-9):,.0f} tokens/s)")
        return "\n".join(lines)


def find_inputs(inputs: list[str | Path]) -> list[InputFile]:
    out: list[InputFile] = []
    for item in inputs:
        p = Path(item)
        if p.is_file() and _kind_suffix(p) == JSON_SUFFIX:
            out.append(InputFile(p, _key(p.name), True, _holds_an_array(p)))
        elif p.is_file():
            out.append(InputFile(p, _key(p.name), _kind_suffix(p) in JSONL_SUFFIXES))
        elif p.is_dir():
            found = sorted(
                f for f in p.rglob("*")
                if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
                and _kind_suffix(f) in TEXT_SUFFIXES + JSONL_SUFFIXES
            )
            if not found:
                raise DataError(f"{p}: no text files ({', '.join(TEXT_SUFFIXES)}) or JSON Lines files (.jsonl) in this folder")
            out += [InputFile(f, _key(str(f.relative_to(p))), _kind_suffix(f) in JSONL_SUFFIXES) for f in found]
        else:
            raise DataError(f"{p}: no such file or folder")
    if not out:
        raise DataError("prepare: no input given")
    return out


def _key(name: str) -> str:
    """The key a file's split is drawn from: its name without ``.gz``, so that compressing a
    corpus does not move its documents between the splits."""
    return name[: -len(GZIP_SUFFIX)] if name.lower().endswith(GZIP_SUFFIX) else name


def _kind_suffix(path: Path) -> str:
    """The suffix that says what a file holds: ``.jsonl`` for ``a.jsonl`` and ``a.jsonl.gz``."""
    suffixes = [x.lower() for x in path.suffixes]
    return suffixes[-2] if len(suffixes) >= 2 and suffixes[-1] == GZIP_SUFFIX else path.suffix.lower()


def _open_text(path: Path, newline: str | None = None) -> IO[str]:
    """A text file, or a gzipped one, for reading as UTF-8 (bad bytes replaced)."""
    if path.suffix.lower() == GZIP_SUFFIX:
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline=newline)
    return open(path, encoding="utf-8", errors="replace", newline=newline)


@contextmanager
def _decompressing(path: Path) -> Iterator[None]:
    """A gzipped input that is not gzip or is cut off is one line, not a traceback."""
    try:
        yield
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: cannot decompress it ({exc})") from None


def _holds_an_array(path: Path) -> bool:
    """Whether a ``.json`` input is one array of records (``[``) rather than JSON Lines (``{``)."""
    with _decompressing(path), _open_text(path) as fh:
        while (char := fh.read(1)).isspace():
            pass
    if not char or char not in "[{":
        raise DataError(f"{path}: not JSON records: a .json input holds JSON Lines (an object a line) or an array of objects")
    return char == "["


def hash_fraction(key: str) -> float:
    """A number in [0, 1) that depends only on ``key``."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64


def file_splits(files: list[InputFile], val_fraction: float) -> dict[str, str]:
    """Split of every text file by key; at least one of each when there are two or more."""
    text = [f.key for f in files if not f.jsonl]
    out = {k: ("val" if hash_fraction(k) < val_fraction else "train") for k in text}
    if len(text) >= 2:
        if "val" not in out.values():
            out[min(text, key=hash_fraction)] = "val"
        if "train" not in out.values():
            out[max(text, key=hash_fraction)] = "train"
    return out


def _read_text_pieces(path: Path) -> Iterator[str]:
    """A text file in pieces of about ``CHUNK_CHARS`` characters, each cut after a line break."""
    with _decompressing(path), _open_text(path, newline="") as fh:
        rest = ""
        while True:
            block = fh.read(CHUNK_CHARS)
            if not block:
                break
            text = rest + block
            cut = text.rfind("\n") + 1
            if cut == 0:
                rest = text
                continue
            yield text[:cut]
            rest = text[cut:]
        if rest:
            yield rest


def _jsonl_records(f: InputFile, text_field: str) -> Iterator[tuple[int, str]]:
    if f.array:
        yield from _array_records(f, text_field)
        return
    with _decompressing(f.path), _open_text(f.path) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise DataError(f"{f.path}:{n}: not valid JSON (JSON Lines hold one record a line)") from None
            yield n, _record_text(rec, text_field, f"{f.path}:{n}")


def _array_records(f: InputFile, text_field: str) -> Iterator[tuple[int, str]]:
    """The records of a ``.json`` file holding one array (read whole: such files are small)."""
    try:
        with _decompressing(f.path), _open_text(f.path) as fh:
            records = json.loads(fh.read())
    except (json.JSONDecodeError, RecursionError):
        raise DataError(f"{f.path}: not valid JSON") from None
    if not isinstance(records, list):
        raise DataError(f"{f.path}: not an array of records")
    for i, rec in enumerate(records):
        yield i, _record_text(rec, text_field, f"{f.path}: record {i}")


def _record_text(rec: Any, text_field: str, where: str) -> str:
    if not isinstance(rec, dict) or not isinstance(rec.get(text_field), str):
        raise DataError(f"{where}: no string field {text_field!r} (choose the field with --text-field)")
    return rec[text_field]


def iter_pieces(
    files: list[InputFile], val_fraction: float, split: str, text_field: str
) -> Iterator[tuple[str, str, bool, int]]:
    """(split, text, ends a document, bytes consumed) for every piece of every document."""
    splits = file_splits(files, val_fraction) if split == "document" else {}
    for f in files:
        if f.jsonl:
            for _, text in _jsonl_records(f, text_field):
                size = len(text.encode("utf-8", errors="replace")) + 1
                if split == "tail":
                    a, b = split_document(text, val_fraction)
                    yield "train", a, True, size
                    yield "val", b, True, 0
                else:
                    yield ("val" if hash_fraction(text) < val_fraction else "train"), text, True, size
        elif split == "tail":
            with _decompressing(f.path), _open_text(f.path) as fh:
                text = fh.read()
            a, b = split_document(text, val_fraction)
            yield "train", a, True, f.path.stat().st_size
            yield "val", b, True, 0
        else:
            pieces = _read_text_pieces(f.path)
            prev = next(pieces, None)
            if prev is None:
                continue
            for piece in pieces:
                yield splits[f.key], prev, False, len(prev.encode("utf-8", errors="replace"))
                prev = piece
            yield splits[f.key], prev, True, len(prev.encode("utf-8", errors="replace"))


def make_tokenizer(
    spec: str, files: list[InputFile], vocab_size: int, val_fraction: float, split: str, text_field: str,
    bpe_train_chars: int,
) -> Tokenizer:
    if spec != "bpe":
        return resolve_tokenizer(spec)

    def training_text() -> Iterator[str]:  # the training split only, so validation stays unseen
        used = 0
        for s, text, _, _ in iter_pieces(files, val_fraction, split, text_field):
            if s == "train" and text:
                yield text
                used += len(text)
                if used >= bpe_train_chars:
                    return

    return train_bpe(training_text(), vocab_size)


def prepare_dataset(
    inputs: list[str | Path], out: str | Path, tokenizer: str = "bpe", vocab_size: int = 4096,
    val_fraction: float = 0.05, split: str = "document", text_field: str = "text",
    shard_tokens: int = DEFAULT_SHARD_TOKENS, force: bool = False, progress: bool = True,
    bpe_train_chars: int = 1 << 30,
) -> PrepareSummary:
    t0 = time.monotonic()
    if not 0 < val_fraction < 0.5:
        raise DataError(f"prepare: the validation fraction must be in (0, 0.5), got {val_fraction}")
    if split not in ("document", "tail"):
        raise DataError(f"prepare: split must be 'document' or 'tail', got {split!r}")
    if shard_tokens < 1:
        raise DataError("prepare: shard size must be at least 1 token")
    files = find_inputs(inputs)
    if split == "document" and len(files) == 1 and not files[0].jsonl:
        split = "tail"  # one document: its tail is the validation text
    folder = Path(out)
    if (folder / INDEX).is_file():
        if not force:
            raise DataError(f"{folder} already holds a prepared dataset; give --force to replace it")
        old = read_index(folder)
        for info in old.get("splits", {}).values():
            for s in info.get("shards", []):
                (folder / s["file"]).unlink(missing_ok=True)
        (folder / INDEX).unlink()
    elif folder.exists() and any(folder.iterdir()):
        raise DataError(f"{folder} exists and is not empty; choose an empty or new folder")
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return _write_dataset(
            folder, files, inputs, tokenizer=tokenizer, vocab_size=vocab_size, val_fraction=val_fraction, split=split,
            text_field=text_field, shard_tokens=shard_tokens, progress=progress, bpe_train_chars=bpe_train_chars, t0=t0,
        )
    except BaseException:
        if created and not any(folder.iterdir()):
            folder.rmdir()  # made by this run and left empty by the writers' abort
        raise


def _write_dataset(
    folder: Path, files: list[InputFile], inputs: list[str | Path], *, tokenizer: str, vocab_size: int,
    val_fraction: float, split: str, text_field: str, shard_tokens: int, progress: bool, bpe_train_chars: int,
    t0: float,
) -> PrepareSummary:
    """Tokenizer, shards, then the index (last); on any failure the shards written are removed."""
    from tqdm import tqdm

    tok = make_tokenizer(tokenizer, files, vocab_size, val_fraction, split, text_field, bpe_train_chars)
    dtype = token_dtype(tok.vocab_size)
    writers = {s: ShardWriter(folder, s, dtype, shard_tokens) for s in ("train", "val")}
    gzipped = any(f.path.suffix.lower() == GZIP_SUFFIX for f in files)  # their text's size is unknown
    total = None if gzipped else sum(f.path.stat().st_size for f in files)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="prepare", disable=not progress, dynamic_ncols=True)
    batch: list[tuple[str, str, bool]] = []
    chars = 0

    def flush() -> None:
        nonlocal chars
        if not batch:
            return
        for (s, _, last), ids in zip(batch, tok.encode_batch([t for _, t, _ in batch])):
            if last:
                ids = list(ids) + [tok.eot_id]
                writers[s].documents += 1
            writers[s].write(ids)
        batch.clear()
        chars = 0

    try:
        for s, text, last, size in iter_pieces(files, val_fraction, split, text_field):
            batch.append((s, text, last))
            chars += len(text)
            bar.update(size)
            if chars >= BATCH_CHARS:
                flush()
        flush()
        result = {s: w.finish() for s, w in writers.items()}
        if result["train"]["tokens"] == 0:
            raise DataError(f"prepare: no training text in {', '.join(map(str, inputs))}")
        if result["val"]["tokens"] == 0:
            raise DataError(
                f"prepare: no document fell into the validation split (fraction {val_fraction}); raise --val-fraction"
            )
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    finally:
        bar.close()
    if getattr(tok, "kind", "") == "bytes":
        tok_entry = "bytes"
    else:
        tok.save(folder / "tokenizer.json")  # type: ignore[attr-defined]
        tok_entry = "tokenizer.json"
    index: dict[str, Any] = {
        "dtype": dtype.name, "vocab_size": tok.vocab_size, "eot_id": tok.eot_id, "tokenizer": tok_entry,
        "tokenizer_spec": tokenizer if tokenizer in ("bpe", "bytes", "gpt2") else str(Path(tokenizer).resolve()),
        "val_fraction": val_fraction, "split": split, "text_field": text_field,
        "inputs": [str(Path(i).resolve()) for i in inputs], "splits": result,
    }
    write_index(folder, index)
    return PrepareSummary(
        out=folder, tokenizer=tokenizer, vocab_size=tok.vocab_size,
        documents={s: r["documents"] for s, r in result.items()}, tokens={s: r["tokens"] for s, r in result.items()},
        shards={s: len(r["shards"]) for s, r in result.items()}, seconds=time.monotonic() - t0, split=split,
    )

