"""Corpus -> tokenizer -> token arrays (train, validation), cached on disk.

``load_token_data(cfg)`` is what trainers call: the first call trains the BPE (a few seconds per
MB of text) and tokenizes the corpus; later calls read both from the cache directory.
Documents are joined with the end-of-text token.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from skippipe.data.corpora import corpus_fingerprint, train_val_texts
from skippipe.data.shards import INDEX, open_split, read_index
from skippipe.data.tokenizer import BPETokenizer, ByteTokenizer, Tokenizer, bpe_cache_path, cached_bpe, default_cache_dir
from skippipe.data.tokenizers_hf import load_tokenizer_file, resolve_tokenizer, tokenizer_digest
from skippipe.errors import DataError


@dataclass
class TokenData:
    train: np.ndarray  # int32 token ids
    val: np.ndarray
    tokenizer: Tokenizer
    fingerprint: str

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def join_documents(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    """The texts' tokens, each text followed by the end-of-text token, as one int32 array."""
    out: list[int] = []
    for ids in tok.encode_batch(texts):
        out.extend(ids)
        out.append(tok.eot_id)
    return np.asarray(out, dtype=np.int32)


def load_token_data(
    corpus: tuple[str, ...] | list[str] = ("shakespeare", "bible"),
    tokenizer: str = "bpe",
    vocab_size: int = 4096,
    val_fraction: float = 0.05,
    cache_dir: str | Path | None = None,
) -> TokenData:
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    names = list(corpus)
    fp = corpus_fingerprint(names)
    texts: tuple[list[str], list[str]] | None = None

    def split() -> tuple[list[str], list[str]]:
        nonlocal texts
        if texts is None:
            texts = train_val_texts(names, val_fraction)
        return texts

    if tokenizer == "bytes":
        tok: Tokenizer = ByteTokenizer()
        key = f"bytes-{fp}-{val_fraction}"
    elif tokenizer != "bpe":  # "gpt2" or a tokenizer.json file
        tok = resolve_tokenizer(tokenizer)
        key = f"tok{tokenizer_digest(tok)}-{fp}-{val_fraction}"
    else:
        # the BPE is trained on the training split only, so validation text stays unseen
        bpe_path = bpe_cache_path(folder, f"{fp}-{val_fraction}", vocab_size)
        if bpe_path.is_file():
            tok = BPETokenizer.from_file(bpe_path)
        else:
            tok = cached_bpe(split()[0], vocab_size, f"{fp}-{val_fraction}", folder)
        key = f"bpe{vocab_size}-{fp}-{val_fraction}"
    path = folder / f"tokens-{key}.npz"
    if path.is_file():
        with np.load(path) as z:
            return TokenData(train=z["train"], val=z["val"], tokenizer=tok, fingerprint=fp)
    train_texts, val_texts = split()
    train, val = join_documents(tok, train_texts), join_documents(tok, val_texts)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, train=train, val=val)
    os.replace(tmp, path)
    return TokenData(train=train, val=val, tokenizer=tok, fingerprint=fp)


def token_data_for(cfg: object) -> TokenData:
    """``load_token_data`` with the fields of a ``TrainConfig``; a prepared dataset
    (``[train] data``, made by ``skippipe prepare``) is memory-mapped instead."""
    if getattr(cfg, "data", None):
        return load_prepared(cfg.data)  # type: ignore[attr-defined]
    return load_token_data(
        corpus=cfg.corpus, tokenizer=cfg.tokenizer, vocab_size=cfg.bpe_vocab_size(),  # type: ignore[attr-defined]
        val_fraction=cfg.val_fraction, cache_dir=cfg.cache_dir,  # type: ignore[attr-defined]
    )


def validation_tokens(
    tok: Tokenizer, corpus: tuple[str, ...] | list[str] = ("shakespeare", "bible"), val_fraction: float = 0.05
) -> np.ndarray:
    """The validation split encoded with a given tokenizer (e.g. the one saved in a checkpoint)."""
    return join_documents(tok, train_val_texts(list(corpus), val_fraction)[1])


def load_prepared(folder: str | Path, check: bool = False) -> TokenData:
    """A dataset made by ``skippipe prepare``: memory-mapped splits (``shards.TokenShards``) and
    its tokenizer; ``check`` also verifies every shard's sha256."""
    p = Path(folder)
    index = read_index(p)
    name = str(index.get("tokenizer"))
    if name != "bytes" and Path(name).name != name:
        raise DataError(f"{p / INDEX}: tokenizer {name!r} must be a file name inside the dataset folder")
    tok = ByteTokenizer() if name == "bytes" else load_tokenizer_file(p / name)
    if tok.vocab_size != index.get("vocab_size") or tok.eot_id != index.get("eot_id"):
        raise DataError(f"{p}: {name} does not match {INDEX} (vocabulary size or end-of-text id)")
    digest = hashlib.sha256(json.dumps(index["splits"], sort_keys=True).encode()).hexdigest()[:16]
    train, val = open_split(p, "train", check), open_split(p, "val", check)
    return TokenData(train=train, val=val, tokenizer=tok, fingerprint=digest)  # type: ignore[arg-type]
