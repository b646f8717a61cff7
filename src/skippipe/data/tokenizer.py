"""Tokenizers: a byte-level BPE trained on the corpus with Hugging Face ``tokenizers`` (cached
on disk and reused), and raw bytes (vocabulary 256) as a dependency-free fallback.

Both map text to ids and back losslessly. The BPE's 256 byte symbols are its initial
alphabet, so any text encodes; an end-of-text token separates documents.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from skippipe.errors import UserError
from skippipe.fileio import atomic_write_text

EOT = "<|endoftext|>"


def default_cache_dir() -> Path:
    env = os.environ.get("SKIPPIPE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "skippipe"


class Tokenizer(Protocol):
    kind: str

    @property
    def vocab_size(self) -> int: ...

    @property
    def eot_id(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; id 256 ends a document."""

    kind = "bytes"

    @property
    def vocab_size(self) -> int:
        return 257

    @property
    def eot_id(self) -> int:
        return 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class BPETokenizer:
    """A trained byte-level BPE (``tokenizers.Tokenizer``) behind the ``Tokenizer`` protocol."""

    kind = "bpe"

    def __init__(self, tok: object, path: Path | None = None):
        self.tok = tok
        self.path = path

    @property
    def vocab_size(self) -> int:
        return int(self.tok.get_vocab_size())  # type: ignore[attr-defined]

    @property
    def eot_id(self) -> int:
        return int(self.tok.token_to_id(EOT))  # type: ignore[attr-defined]

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text).ids)  # type: ignore[attr-defined]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self.tok.encode_batch(texts)]  # type: ignore[attr-defined]

    def decode(self, ids: Iterable[int]) -> str:
        return str(self.tok.decode(list(ids)))  # type: ignore[attr-defined]

    @classmethod
    def from_file(cls, path: str | Path) -> BPETokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        p = Path(path)
        try:
            return cls(HFTokenizer.from_file(str(p)), p)
        except Exception as exc:  # tokenizers raises plain Exceptions
            raise UserError(f"{p}: not a tokenizer file ({exc})") from None

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, self.tok.to_str())  # type: ignore[attr-defined]


def train_bpe(texts: list[str], vocab_size: int) -> BPETokenizer:
    """Train a byte-level BPE on ``texts`` (deterministic for the same texts and size)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(tok)


def bpe_cache_path(cache_dir: Path, fingerprint: str, vocab_size: int) -> Path:
    return cache_dir / f"bpe-{fingerprint}-{vocab_size}.json"


def cached_bpe(texts: list[str], vocab_size: int, fingerprint: str, cache_dir: str | Path | None = None) -> BPETokenizer:
    """The BPE for this corpus fingerprint and size: read from the cache, or trained and stored."""
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = bpe_cache_path(folder, fingerprint, vocab_size)
    if path.is_file():
        return BPETokenizer.from_file(path)
    tok = train_bpe(texts, vocab_size)
    tok.save(path)
    tok.path = path
    return tok

