"""Token arrays per domain and split, cached in the run folder; training batches and evaluation windows.

``prepare_data(cfg, run_dir)`` is called once per run: it splits every domain, trains the BPE on
the training split of the *training* domains only (held-out domains and every validation and
test text stay unseen; the BPE itself is cached in the project's tokenizer cache), encodes the
splits that are used (training domains: all three; held-out domains: validation and test) and
writes ``RUN/data/<domain>.npz`` plus ``RUN/data/manifest.json`` (written last, atomically).
A later call with the same data settings reads them back.

Documents are joined with the end-of-text token. Batches are a pure function of
(seed, step), so a resumed job sees exactly the batches it would have seen.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from skippipe.data.dataset import join_documents
from skippipe.data.tokenizer import BPETokenizer, ByteTokenizer, Tokenizer, cached_bpe
from skippipe.errors import UserError
from skippipe.fileio import atomic_write, atomic_write_text
from skippipe.hdee.config import HDEEConfig
from skippipe.hdee.domains import load_split

SPLITS = ("train", "val", "test")


@dataclass
class DomainTokens:
    name: str
    role: str  # "train" or "eval"
    splits: dict[str, np.ndarray]  # split -> int32 token ids (held-out domains have no "train")
    bytes_per_token: dict[str, float]  # UTF-8 bytes per token of each split (for bits per byte)


@dataclass
class RunData:
    tokenizer: Tokenizer
    domains: dict[str, DomainTokens]
    digest: str  # sha256 over every token array: a job's data identity

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def _data_settings(cfg: HDEEConfig) -> dict:
    keep = ("tokenizer", "vocab_size", "val_fraction", "test_fraction", "split_salt")
    return {"data": {k: getattr(cfg.data, k) for k in keep}, "domains": [asdict(d) for d in cfg.domains]}


def _load_cached(folder: Path, settings: dict) -> RunData | None:
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return None
    try:
        meta = json.loads(manifest.read_text())
    except json.JSONDecodeError:
        return None
    if meta.get("settings") != settings:
        return None
    tok = BPETokenizer.from_file(folder / "tokenizer.json") if meta["tokenizer"] == "bpe" else ByteTokenizer()
    domains = {}
    for name, info in meta["domains"].items():
        with np.load(folder / f"{name}.npz") as z:
            splits = {s: z[s] for s in z.files}
        domains[name] = DomainTokens(name, info["role"], splits, info["bytes_per_token"])
    return RunData(tok, domains, meta["digest"])


def prepare_data(cfg: HDEEConfig, run_dir: str | Path, log: Callable[[str], None] = print) -> RunData:
    folder = Path(run_dir) / "data"
    settings = _data_settings(cfg)
    cached = _load_cached(folder, settings)
    if cached is not None:
        return cached
    d = cfg.data
    splits = {spec.name: load_split(spec, d.val_fraction, d.test_fraction, d.split_salt) for spec in cfg.domains}
    for spec in cfg.domains:
        s = splits[spec.name]
        mb = [sum(len(x.text) for x in part) / 1e6 for part in (s.train, s.val, s.test)]
        held = " (held out: its training split is not used)" if spec.role == "eval" else ""
        log(f"domain {spec.name} ({spec.source}): {len(s.train)} / {len(s.val)} / {len(s.test)} documents, "
            f"{mb[0]:.2f} / {mb[1]:.2f} / {mb[2]:.2f} MB train / val / test{held}")
    if d.tokenizer == "bytes":
        tok: Tokenizer = ByteTokenizer()
    else:
        texts = [doc.text for spec in cfg.train_domains for doc in splits[spec.name].train]
        h = hashlib.sha256()
        for spec in cfg.train_domains:
            for doc in splits[spec.name].train:
                h.update(f"{doc.name}:{len(doc.text)};".encode())
        fingerprint = f"hdee-{h.hexdigest()[:16]}"
        log(f"tokenizer: byte-level BPE, {d.vocab_size} tokens, trained on {len(texts)} training documents (cached)")
        tok = cached_bpe(texts, d.vocab_size, fingerprint, d.cache_dir or None)
    digest = hashlib.sha256()
    domains: dict[str, DomainTokens] = {}
    for spec in cfg.domains:
        used = SPLITS if spec.role == "train" else ("val", "test")
        arrays, bpt = {}, {}
        for split in used:
            docs = splits[spec.name].part(split)
            arrays[split] = join_documents(tok, [doc.text for doc in docs])
            n_bytes = sum(len(doc.text.encode("utf-8")) for doc in docs)
            bpt[split] = n_bytes / max(1, len(arrays[split]))
            digest.update(f"{spec.name}/{split}:".encode())
            digest.update(arrays[split].tobytes())
        domains[spec.name] = DomainTokens(spec.name, spec.role, arrays, bpt)
        atomic_write(folder / f"{spec.name}.npz", lambda tmp, a=arrays: _savez(tmp, a))
    if isinstance(tok, BPETokenizer):
        tok.save(folder / "tokenizer.json")
    meta = {
        "settings": settings,
        "tokenizer": tok.kind,
        "vocab_size": tok.vocab_size,
        "digest": digest.hexdigest(),
        "domains": {
            n: {"role": x.role, "tokens": {s: len(a) for s, a in x.splits.items()}, "bytes_per_token": x.bytes_per_token}
            for n, x in domains.items()
        },
    }
    atomic_write_text(folder / "manifest.json", json.dumps(meta, indent=1) + "\n")
    return RunData(tok, domains, meta["digest"])


def load_run_data(run_dir: str | Path) -> RunData:
    """The data a finished ``prepare_data`` left in the run folder (for eval and generate)."""
    folder = Path(run_dir) / "data"
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        raise UserError(f"{run_dir}: no data/manifest.json; run `skippipe hdee train` first")
    data = _load_cached(folder, json.loads(manifest.read_text())["settings"])
    assert data is not None
    return data


def load_run_tokenizer(run_dir: str | Path) -> Tokenizer:
    folder = Path(run_dir) / "data"
    if not (folder / "manifest.json").is_file():
        raise UserError(f"{run_dir}: no data/manifest.json; run `skippipe hdee train` first")
    kind = json.loads((folder / "manifest.json").read_text())["tokenizer"]
    return BPETokenizer.from_file(folder / "tokenizer.json") if kind == "bpe" else ByteTokenizer()


def _savez(path: str, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def sample_windows(
    sources: list[np.ndarray], batch_size: int, seq_len: int, seed: int, step: int
) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of ``batch_size`` random windows, each from one source chosen uniformly
    (a balanced mixture when there are several); a pure function of (seed, step)."""
    rng = np.random.default_rng([seed, step])
    which = rng.integers(0, len(sources), size=batch_size)
    rows = []
    for k in which:
        tokens = sources[int(k)]
        top = len(tokens) - seq_len - 1
        if top < 1:
            raise UserError(f"a training split of {len(tokens)} tokens is shorter than one window of {seq_len + 1}")
        start = int(rng.integers(0, top))
        rows.append(tokens[start : start + seq_len + 1])
    w = np.stack(rows).astype(np.int64)
    return w[:, :-1], w[:, 1:]


def eval_windows(tokens: np.ndarray, seq_len: int, count: int) -> np.ndarray:
    """Up to ``count`` non-overlapping windows of ``seq_len + 1`` tokens, spread evenly over the
    split: shape (n, seq_len + 1)."""
    fit = len(tokens) // (seq_len + 1)
    if fit < 1:
        raise UserError(f"a split of {len(tokens)} tokens is shorter than one window of {seq_len + 1}")
    n = min(count, fit)
    slots = np.floor(np.arange(n) * fit / n).astype(np.int64) if n < fit else np.arange(n)
    idx = slots[:, None] * (seq_len + 1) + np.arange(seq_len + 1)[None, :]
    return tokens[idx].astype(np.int64)


def bits_per_byte(nats_per_token: float, bytes_per_token: float) -> float:
    return nats_per_token / math.log(2) / bytes_per_token
