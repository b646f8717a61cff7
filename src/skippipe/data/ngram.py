"""Count-based baselines for a token stream: the unigram and bigram perplexity of validation
tokens under models counted on training tokens.

A language model is only worth something once it is clearly better than these two; the
experiments report them next to every validation perplexity.

- unigram: add-one counts over the vocabulary, so every token has a probability.
- bigram: ``lam * P(next | prev) + (1 - lam) * P_unigram(next)`` (Jelinek-Mercer interpolation;
  a previous token never seen in training falls back to the unigram). ``lam`` is chosen on a
  held-out tail of the *training* tokens (never on the validation tokens) from a fixed grid, and
  the counts are then taken again over all training tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LAMBDA_GRID = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)
HELD_OUT_FRACTION = 0.05


@dataclass(frozen=True)
class NgramBaselines:
    unigram_ppl: float
    bigram_ppl: float
    bigram_lambda: float  # interpolation weight chosen on held-out training tokens
    train_tokens: int
    val_tokens: int

    def to_dict(self) -> dict[str, float | int]:
        return {"unigram_ppl": self.unigram_ppl, "bigram_ppl": self.bigram_ppl, "bigram_lambda": self.bigram_lambda,
                "train_tokens": self.train_tokens, "val_tokens": self.val_tokens}


class BigramCounts:
    """Unigram and bigram counts of one token array (``vocab_size`` x ``vocab_size`` pairs)."""

    def __init__(self, tokens: np.ndarray, vocab_size: int):
        t = np.asarray(tokens, dtype=np.int64)
        if t.size < 2:
            raise ValueError("a bigram model needs at least two training tokens")
        if t.min() < 0 or t.max() >= vocab_size:
            raise ValueError(f"token ids must lie in [0, {vocab_size})")
        self.vocab_size = vocab_size
        uni = np.bincount(t, minlength=vocab_size).astype(np.float64) + 1.0
        self.unigram = uni / uni.sum()
        self.pairs = np.bincount(t[:-1] * vocab_size + t[1:], minlength=vocab_size * vocab_size).reshape(vocab_size, vocab_size)
        self.rows = self.pairs.sum(axis=1)

    def unigram_nll(self, tokens: np.ndarray) -> float:
        """Mean negative log-likelihood (nats per token) of ``tokens`` under the unigram."""
        return float(-np.log(self.unigram[np.asarray(tokens, dtype=np.int64)]).mean())

    def bigram_nll(self, tokens: np.ndarray, lam: float) -> float:
        """Mean negative log-likelihood of ``tokens[1:]`` given their predecessors."""
        t = np.asarray(tokens, dtype=np.int64)
        prev, nxt = t[:-1], t[1:]
        seen = self.rows[prev]
        p_unigram = self.unigram[nxt]
        p_bigram = self.pairs[prev, nxt] / np.maximum(seen, 1)
        p = np.where(seen > 0, lam * p_bigram + (1.0 - lam) * p_unigram, p_unigram)  # unseen predecessor: unigram
        return float(-np.log(p).mean())


def ngram_baselines(train: np.ndarray, val: np.ndarray, vocab_size: int) -> NgramBaselines:
    """Unigram and bigram perplexity of ``val`` with counts from ``train`` (see the module text)."""
    train = np.asarray(train)
    cut = int(len(train) * (1.0 - HELD_OUT_FRACTION))
    if cut < 2 or len(train) - cut < 2:
        raise ValueError("too few training tokens to hold out a tail for choosing the interpolation weight")
    fit = BigramCounts(train[:cut], vocab_size)
    lam = min(LAMBDA_GRID, key=lambda x: fit.bigram_nll(train[cut:], x))
    counts = BigramCounts(train, vocab_size)
    return NgramBaselines(
        unigram_ppl=float(np.exp(counts.unigram_nll(val))),
        bigram_ppl=float(np.exp(counts.bigram_nll(val, lam))),
        bigram_lambda=lam,
        train_tokens=int(len(train)),
        val_tokens=int(len(val)),
    )
