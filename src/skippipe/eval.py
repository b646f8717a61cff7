"""Validation loss and perplexity of a model, optionally with pipeline stages left out.

Stage 0 (embedding, its layers, head) can never be omitted; leaving out stage s drops its
layers from the forward pass, the residual stream goes straight on to the next stage kept.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from skippipe.data.batches import validation_starts, windows
from skippipe.errors import UserError
from skippipe.model.llama import Llama


def layer_order(stage_layers: Sequence[Sequence[int]], omit: Iterable[int] = ()) -> list[int]:
    """The layers run when the stages in ``omit`` are left out (stages in pipeline order)."""
    omit = set(omit)
    if 0 in omit:
        raise UserError("stage 0 (embedding, head and loss) cannot be omitted")
    bad = sorted(s for s in omit if not 0 <= s < len(stage_layers))
    if bad:
        raise UserError(f"cannot omit stage(s) {bad}: stages are 0..{len(stage_layers) - 1}")
    return [i for s, ls in enumerate(stage_layers) if s not in omit for i in ls]


@torch.no_grad()
def validation_loss(
    model: Llama, val_tokens: np.ndarray, seq_len: int, samples: int = 64, batch_size: int = 8,
    order: Sequence[int] | None = None,
) -> float:
    """Mean next-token cross-entropy over ``samples`` windows spread evenly over the validation text
    (on the model's device)."""
    model.eval()
    device = next(model.parameters()).device
    starts = validation_starts(len(val_tokens), seq_len, samples)
    total, count = 0.0, 0
    for i in range(0, len(starts), batch_size):
        x, y = windows(val_tokens, starts[i : i + batch_size], seq_len)
        loss = model.loss(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device), order)
        total += float(loss) * len(x)
        count += len(x)
    return total / count


@dataclass
class OmissionResult:
    omitted: int  # number of non-data stages left out
    choices: list[tuple[int, ...]]
    losses: list[float]

    @property
    def mean_loss(self) -> float:
        return float(np.mean(self.losses))

    @property
    def mean_ppl(self) -> float:
        """Mean over choices of each choice's perplexity."""
        return float(np.mean([math.exp(x) for x in self.losses]))


def omission_sweep(
    model: Llama, val_tokens: np.ndarray, stage_layers: Sequence[Sequence[int]], seq_len: int,
    samples: int = 64, batch_size: int = 8, max_omit: int | None = None, max_choices: int = 20, seed: int = 0,
    progress: bool = False,
) -> list[OmissionResult]:
    """For k = 0, 1, ... omitted non-data stages: the loss of every choice of k stages (at most
    ``max_choices`` per k, picked at random with ``seed`` when there are more)."""
    others = list(range(1, len(stage_layers)))
    top = len(others) if max_omit is None else min(max_omit, len(others))
    rng = np.random.default_rng(seed)
    per_k: list[list[tuple[int, ...]]] = []
    for k in range(top + 1):
        combos = list(itertools.combinations(others, k))
        if len(combos) > max_choices:
            pick = sorted(rng.choice(len(combos), size=max_choices, replace=False))
            combos = [combos[i] for i in pick]
        per_k.append(combos)
    bar = tqdm(total=sum(len(c) for c in per_k), desc="omission sweep", disable=not progress, leave=False)
    out = []
    for k, combos in enumerate(per_k):
        losses = []
        for c in combos:
            losses.append(validation_loss(model, val_tokens, seq_len, samples, batch_size, layer_order(stage_layers, c)))
            bar.update(1)
        out.append(OmissionResult(k, combos, losses))
    bar.close()
    return out
