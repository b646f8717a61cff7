"""Which samples each microbatch gets: a pure function of (seed, iteration, microbatch), so any
node (and the reference executor) computes the same tokens without coordination.

A sample is a window of ``seq_len + 1`` consecutive training tokens (inputs and shifted
targets). Microbatch ``rank`` = its position in the plan's microbatches sorted by id.

- ``sharding="stream"`` (default): window starts come from a generator seeded by
  ``(seed, iteration, rank)`` over the whole training array. Two plans with the same number of
  microbatches see exactly the same samples per iteration, whatever their data nodes are (this
  is what the convergence experiment needs: full pipeline and SkipPipe get identical data).
- ``sharding="node"``: data node ``d`` (position ``j`` in stage 0) draws only from part ``j``
  of ``len(stage 0)`` contiguous shards of the training array.

``sampling="epoch"`` (the default for a prepared dataset) reads every window once per epoch
instead of drawing starts at random (``skippipe.data.stream``).
"""

from __future__ import annotations

import numpy as np

from skippipe.data.corpora import shard_bounds
from skippipe.planfile import Plan


def microbatch_ranks(plan: Plan) -> dict[int, int]:
    return {mb.id: r for r, mb in enumerate(sorted(plan.microbatches, key=lambda m: m.id))}


def sample_starts(
    n_tokens: int, seq_len: int, samples: int, seed: int, iteration: int, rank: int,
    shard: tuple[int, int] | None = None,
) -> np.ndarray:
    lo, hi = shard if shard is not None else (0, n_tokens)
    top = hi - seq_len - 1  # last allowed start, exclusive bound below
    if top <= lo:
        raise ValueError(f"{hi - lo} tokens cannot hold a sample of {seq_len + 1} tokens")
    rng = np.random.default_rng([seed, iteration, rank])
    return lo + rng.integers(0, top - lo, size=samples)


def microbatch_starts(
    plan: Plan, mb_id: int, iteration: int, n_tokens: int, seq_len: int, samples: int,
    seed: int = 0, sharding: str = "stream", sampling: str = "random",
) -> np.ndarray:
    if sampling == "epoch":  # every window once per epoch (skippipe.data.stream)
        from skippipe.data.stream import epoch_starts

        return epoch_starts(plan, mb_id, iteration, n_tokens, seq_len, samples, seed, sharding)
    rank = microbatch_ranks(plan)[mb_id]
    shard = None
    if sharding == "node":
        mb = plan.microbatch(mb_id)
        data = plan.stages[0]
        shard = shard_bounds(n_tokens, data.index(mb.data_node), len(data))
    elif sharding != "stream":
        raise ValueError(f"unknown sharding {sharding!r}")
    return sample_starts(n_tokens, seq_len, samples, seed, iteration, rank, shard)


def windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), each (len(starts), seq_len) int64."""
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    w = tokens[idx].astype(np.int64)
    return w[:, :-1], w[:, 1:]


def validation_starts(n_tokens: int, seq_len: int, count: int) -> np.ndarray:
    """``count`` windows spread evenly over the validation array (every document's tail)."""
    top = n_tokens - seq_len - 1
    if top < 0:
        raise ValueError(f"validation text of {n_tokens} tokens is shorter than one sample")
    return np.linspace(0, top, num=count).astype(np.int64)
