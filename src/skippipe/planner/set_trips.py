"""Round trips that keep off the other data nodes of a set.

Every node of stage 0 is a data node, and a path visits stage 0 only at its own data node
(CC2), so under any allocation whose data nodes are D a microbatch of d in D visits no other
node of D. ``floors._round_trips`` lets a round trip pass through any L-1 other nodes; where two
data nodes of a set sit next to each other (one site, one region) the fastest round trip of
each goes through the other, and the floor of that set is too low.

``SetTrips`` keeps, for every data node d, its enumerated round trips (the node tuples and the
three quantities of ``floors._round_trips``: the round trip, the time out before the loss and
the time back after it) sorted by each quantity. For a set D, the least of each over the
tuples that avoid D is the first avoiding tuple in that order: usually among the first few, so
a scan in growing blocks is quick.
"""

from __future__ import annotations

import math

import numpy as np

FIRST_BLOCK = 16  # tuples looked at first; each next block is 8 times larger


class SetTrips:
    """The enumerated round trips of every data node, sorted for scans (see the module text)."""

    def __init__(self) -> None:
        self._sorted: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}  # d -> 3 x (values, tuples)
        self._through: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (d, x) -> round trips via x

    def add(self, d: int, tuples: np.ndarray, trip: np.ndarray, out: np.ndarray, back: np.ndarray) -> None:
        """Record d's valid tuples (P x hops node ids) with their round trip, time out and time back."""
        entries = []
        for values in (trip, out, back):
            order = np.argsort(values, kind="stable")
            entries.append((values[order], tuples[order].astype(np.int32)))
        self._sorted[d] = entries

    def avoiding(self, d: int, in_set: np.ndarray) -> tuple[float, float, float]:
        """(round trip, time out, time back) of d, each the least over the tuples with no node
        where ``in_set`` is True (a boolean mask over the nodes; d itself is in no tuple);
        inf where every tuple touches the set."""
        if d not in self._sorted:
            return math.inf, math.inf, math.inf
        trip, out, back = (_first_avoiding(values, tuples, in_set) for values, tuples in self._sorted[d])
        return trip, out, back

    def avoiding_through(self, d: int, in_set: np.ndarray, x: int) -> float:
        """The fastest round trip of d through x with no node where ``in_set`` is True."""
        if d not in self._sorted:
            return math.inf
        if (d, x) not in self._through:
            values, tuples = self._sorted[d][0]
            via = (tuples == x).any(axis=1)
            self._through[(d, x)] = values[via], tuples[via]
        return _first_avoiding(*self._through[(d, x)], in_set)


def _first_avoiding(values: np.ndarray, tuples: np.ndarray, in_set: np.ndarray) -> float:
    start, size = 0, FIRST_BLOCK
    while start < len(values):
        clear = ~in_set[tuples[start:start + size]].any(axis=1)
        if clear.any():
            return float(values[start + int(clear.argmax())])
        start += size
        size *= 8
    return math.inf
