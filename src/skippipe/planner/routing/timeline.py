"""One node's timeline in a timetable routing (``routing.timetable``): its reserved operations
and the activation-slot holds of the microbatches it serves."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field


@dataclass
class Timeline:
    """One node's reserved operations: sorted starts, busy-until (end plus the gap after), the
    operation tokens, and the activation-slot holds ``[forward start, backward start)``, sorted by
    their starts (a hold covering a time started at most the longest hold before it: with many
    microbatches a node holds hundreds, and only those few are looked at)."""

    starts: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    tokens: list[tuple[str, int]] = field(default_factory=list)
    holds: list[tuple[float, float]] = field(default_factory=list)
    longest: float = 0.0  # the longest hold

    def earliest(self, ready: float, dur: float, gap: float) -> float:
        """Earliest start >= ready of an operation that fits, with its gap, between reservations."""
        starts, busy = self.starts, self.busy
        i = bisect.bisect_right(starts, ready)
        t = ready
        if i and busy[i - 1] > t:
            t = busy[i - 1]
        n = len(starts)
        while i < n:
            if t + dur + gap <= starts[i] + 1e-12:
                return t
            if busy[i] > t:
                t = busy[i]
            i += 1
        return t

    def earliest_forward(self, ready: float, dur: float, gap: float, slots: int) -> float:
        """``earliest``, also with one of ``slots`` activation slots free at the start."""
        t = ready
        slots = max(1, slots)
        while True:
            t = self.earliest(t, dur, gap)
            if len(self.holds) < slots:  # fewer holds in all than slots: one is free
                return t
            count, first_end = self._covered(t)
            if count < slots:
                return t
            t = first_end

    def hold_fits(self, start: float, end: float, slots: int) -> bool:
        """Whether a hold ``[start, end)`` keeps every forward on the node within ``slots``."""
        return all(1 + self._covered(p)[0] <= slots for p in (start, *(a for a, _ in self._inside(start, end))))

    def overlapping_ends(self, start: float, end: float) -> list[float]:
        """The ends of the holds that overlap ``[start, end)``: those covering ``start`` and those
        starting inside."""
        return self._covering(start) + [b for _, b in self._inside(start, end)]

    def _inside(self, start: float, end: float) -> list[tuple[float, float]]:
        """The holds that start strictly between ``start`` and ``end``."""
        return self.holds[bisect.bisect_right(self.holds, (start, math.inf)):bisect.bisect_left(self.holds, (end, -math.inf))]

    def hold(self, start: float, end: float) -> None:
        """Record an activation-slot hold ``[start, end)``."""
        bisect.insort(self.holds, (start, end))
        self.longest = max(self.longest, end - start)

    def _covering(self, t: float) -> list[float]:
        """The ends of the holds that cover ``t`` (start <= t < end), in no particular order."""
        ends = []
        j = bisect.bisect_right(self.holds, (t, math.inf))  # the holds that start by t come before j
        low = t - self.longest - 1e-9 * max(1.0, abs(t))  # a hold starting before it ended by t
        while j > 0 and self.holds[j - 1][0] >= low:
            j -= 1
            if t < self.holds[j][1]:
                ends.append(self.holds[j][1])
        return ends

    def _covered(self, t: float) -> tuple[int, float]:
        """How many holds cover ``t`` and the first of their ends (``_covering`` without the list:
        the timetable asks this millions of times)."""
        holds = self.holds
        count, first_end = 0, math.inf
        j = bisect.bisect_right(holds, (t, math.inf))
        low = t - self.longest - 1e-9 * max(1.0, abs(t))
        while j > 0 and holds[j - 1][0] >= low:
            j -= 1
            end = holds[j][1]
            if t < end:
                count += 1
                if end < first_end:
                    first_end = end
        return count, first_end

    def copy(self) -> Timeline:
        return Timeline(list(self.starts), list(self.busy), list(self.tokens), list(self.holds), self.longest)

    def reserve(self, start: float, dur: float, gap: float, token: tuple[str, int]) -> None:
        i = bisect.bisect_right(self.starts, start)
        self.starts.insert(i, start)
        self.busy.insert(i, start + dur + gap)
        self.tokens.insert(i, token)
