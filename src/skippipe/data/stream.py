"""Epoch sampling: every window of the training tokens once per epoch, in a shuffled order that
is a pure function of ``(seed, epoch)``; the ``sampling = "epoch"`` mode of ``batches``.

The training tokens are cut into ``W = (n_tokens - 1) // seq_len`` non-overlapping windows of
``seq_len + 1`` tokens (input and shifted target; neighbours share one token). Samples are
numbered in the order the run consumes them:

- ``sharding = "stream"``: sample ``g = (iteration * M + rank) * spm + i`` of one global stream
  (M microbatches per iteration, ``rank`` = the microbatch's position by id, ``spm`` samples
  per microbatch, ``i < spm``), so all data nodes together read every window once per epoch,
  each its own share;
- ``sharding = "node"``: data node j (position in stage 0, of D) owns windows
  ``[W j / D, W (j+1) / D)`` and numbers its own samples ``g = (iteration * m_j + r) * spm + i``
  (``m_j`` its microbatches per iteration, ``r`` the microbatch's position among them): a node
  only ever touches its part of the data, which is all a machine of its own needs on disk.

Sample ``g`` is window ``perm_e(g mod W)`` of epoch ``e = g // W``, ``perm_e`` a keyed Feistel
permutation (O(1) memory: no shuffled index of a many-GB corpus is ever held). Because ``g``
depends only on the iteration, a resumed run continues with the next samples of the stream,
exactly those an uninterrupted run would have read. Torch-free.
"""

from __future__ import annotations

import numpy as np

from skippipe.data.corpora import shard_bounds
from skippipe.planfile import Plan

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _key(*parts: int) -> np.uint64:
    k = np.array([0x9E3779B97F4A7C15], dtype=np.uint64)
    for p in parts:
        with np.errstate(over="ignore"):
            k = _mix(k ^ np.uint64(p & 0xFFFFFFFFFFFFFFFF))
    return k[0]


def permute(idx: np.ndarray, n: int, key: np.uint64, rounds: int = 4) -> np.ndarray:
    """A bijection of [0, n) applied to ``idx`` (a keyed Feistel network with cycle walking)."""
    idx = np.asarray(idx, dtype=np.uint64)
    if n <= 1:
        return idx.astype(np.int64)
    bits = max(2, int(n - 1).bit_length())
    bits += bits % 2
    half = bits // 2
    low = np.uint64((1 << half) - 1)

    def once(x: np.ndarray) -> np.ndarray:
        left, right = x >> np.uint64(half), x & low
        for r in range(rounds):
            with np.errstate(over="ignore"):
                f = _mix(right ^ _mix(np.full_like(right, key) + np.uint64(r))) & low
            left, right = right, left ^ f
        return (left << np.uint64(half)) | right

    out = once(idx)
    todo = out >= np.uint64(n)
    while todo.any():  # cycle walking: at most a few rounds, the domain is < 4 n
        out[todo] = once(out[todo])
        todo = out >= np.uint64(n)
    return out.astype(np.int64)


def sample_windows(first: int, count: int, n_windows: int, seed: int) -> np.ndarray:
    """Window numbers of samples ``first .. first + count - 1`` of the epoch stream."""
    if n_windows < 1:
        raise ValueError("no window fits in the training tokens")
    g = np.arange(first, first + count, dtype=np.int64)
    epoch, pos = g // n_windows, g % n_windows
    out = np.empty(count, dtype=np.int64)
    for e in np.unique(epoch):
        sel = epoch == e
        out[sel] = permute(pos[sel], n_windows, _key(seed, int(e)))
    return out


def epoch_starts(
    plan: Plan, mb_id: int, iteration: int, n_tokens: int, seq_len: int, samples: int, seed: int = 0,
    sharding: str = "stream",
) -> np.ndarray:
    """Token starts of microbatch ``mb_id``'s samples in ``iteration`` (see the module doc)."""
    n_windows = (n_tokens - 1) // seq_len
    if n_windows < 1:
        raise ValueError(f"{n_tokens} tokens cannot hold a sample of {seq_len + 1} tokens")
    ordered = sorted(plan.microbatches, key=lambda m: m.id)
    if sharding == "stream":
        rank = next(r for r, mb in enumerate(ordered) if mb.id == mb_id)
        first = (iteration * len(ordered) + rank) * samples
        return sample_windows(first, samples, n_windows, seed) * seq_len
    if sharding != "node":
        raise ValueError(f"unknown sharding {sharding!r}")
    data_node = plan.microbatch(mb_id).data_node
    mine = [mb.id for mb in ordered if mb.data_node == data_node]
    j = plan.stages[0].index(data_node)
    lo, hi = shard_bounds(n_windows, j, len(plan.stages[0]))
    if hi <= lo:
        raise ValueError(f"data node {data_node} gets no window of the training tokens")
    first = (iteration * len(mine) + mine.index(mb_id)) * samples
    return (lo + sample_windows(first, samples, hi - lo, seed * 1_000_003 + j)) * seq_len
