"""Memory-ordered variants of an allocation: candidates of ``plan_skippipe`` when memory is uneven.

Paths visit stages in increasing order (up to ``max_swaps`` adjacent swaps), and a visit holds
one of the node's activation slots from its forward to its backward there: for the rest of
the round trip at the first position of a path, for one hop out and back and the loss at the
last. A node with one slot in stage 1 serves its visits one round trip at a time, and all the
microbatches that pass through it queue behind each other. ``memory_ordered`` keeps the data
nodes and the stage sizes of an allocation and deals the other nodes to the stages in the
order of a key, so that the nodes with few slots sit at the end of the paths, where a visit
holds its slot shortly. Two keys (``KEYS``):

- ``"per-visit"``: slots per share of the visits, most first. The TC1 caps give a node visits
  in proportion to its speed, so memory x forward time is the slot count per expected visit;
  a fast node with few slots goes late, a slow one with many early;
- ``"slots"``: slots, most first; among nodes with as many slots the slower one first (it
  carries fewer visits, so it holds its slots less often).

Where the dealing leaves a stage whose TC1 caps cannot carry its visits, the fewest nodes are
moved again (``stage_caps.balance_stage_caps``). The network is not considered; every variant
is scored by the simulator like every other candidate.
"""

from __future__ import annotations

import numpy as np

from skippipe.planner.allocation.stage_caps import balance_stage_caps
from skippipe.planner.problem import Problem

KEYS = ("per-visit", "slots")


def memory_ordered(problem: Problem, stages: list[list[int]], key: str = "per-visit") -> list[list[int]] | None:
    """``stages`` with the nodes outside stage 0 dealt to stages 1.. in the order of ``key``
    (see the module text); None when that changes nothing or memory is the same on every such
    node."""
    mem = np.asarray(problem.memory, dtype=int)
    fwd = np.asarray(problem.forward_s, dtype=float)
    rest = [int(x) for s in stages[1:] for x in s]
    if len({int(mem[x]) for x in rest}) <= 1:
        return None
    if key == "per-visit":
        rest.sort(key=lambda x: (-float(mem[x]) * float(fwd[x]), x))
    elif key == "slots":
        rest.sort(key=lambda x: (-int(mem[x]), -float(fwd[x]), x))
    else:
        raise ValueError(f"unknown memory order key {key!r} (known: {', '.join(KEYS)})")
    out = [sorted(int(x) for x in stages[0])]
    start = 0
    for s in stages[1:]:
        out.append(sorted(rest[start : start + len(s)]))
        start += len(s)
    out = balance_stage_caps(problem, out)  # the caps must still carry every stage's visits
    if [sorted(int(x) for x in s) for s in stages] == out:
        return None
    return out
