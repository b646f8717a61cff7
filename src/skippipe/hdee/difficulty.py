"""Domain difficulty as a score z in [-1, 1] per training domain (the budget turns it into sizes
and steps, see ``skippipe.hdee.budget``).

- ``manual``: the config's guess, easy -1 / moderate 0 / hard +1 (the paper's method).
- ``seed-loss``: the seed model's loss on the domain's validation split in nats per *byte*
  (tokenizer-independent): a domain the mixture model predicts worse is harder.
- ``probe``: a short probe run per domain (size M, ``probe_steps`` steps, branched from the seed
  model when there is one); the score is how much the training loss still fell over the last
  half of the probe, relative to its level: a domain still learning fast gains most from compute.

Measured raw scores are centred on their mean and divided by the largest distance from it, so the
most extreme domain gets +-1 and the ordering, not the unit, decides. Torch-free.
"""

from __future__ import annotations

import math

import numpy as np

from skippipe.errors import UserError

LEVEL_SCORE = {"easy": -1.0, "moderate": 0.0, "hard": 1.0}


def manual_scores(levels: dict[str, str]) -> dict[str, float]:
    return {d: LEVEL_SCORE[level] for d, level in levels.items()}


def normalise(raw: dict[str, float]) -> dict[str, float]:
    """(s - mean) / max |s - mean|, all zero when the domains tie."""
    values = np.array(list(raw.values()), dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise UserError(f"difficulty scores must be finite, got {raw}")
    centred = values - values.mean()
    top = np.abs(centred).max()
    z = centred / top if top > 1e-12 else np.zeros_like(centred)
    return {d: float(v) for d, v in zip(raw, z)}


def seed_loss_raw(val_loss: dict[str, float], bytes_per_token: dict[str, float]) -> dict[str, float]:
    """Nats per byte of the seed model on each domain's validation split."""
    return {d: val_loss[d] / bytes_per_token[d] for d in val_loss}


def probe_raw(curves: dict[str, list[float]]) -> dict[str, float]:
    """Relative fall of the training loss from the third to the last quarter of each probe."""
    out = {}
    for d, losses in curves.items():
        n = len(losses)
        if n < 8:
            raise UserError(f"probe of {d}: {n} steps are too few to read a learning curve (need 8)")
        third = float(np.mean(losses[n // 2 : 3 * n // 4]))
        last = float(np.mean(losses[3 * n // 4 :]))
        out[d] = (third - last) / third if third > 0 and math.isfinite(third) else 0.0
    return out
