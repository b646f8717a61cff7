"""The valid stage orders as one small graph: shared beginnings and shared endings merged.

The flow programme of ``routing.slow_links`` sends each microbatch along a valid stage order
(CC2/CC3, ``stage_orders.stage_sequences``). One copy of the stages per order makes it large:
185 orders of 4 stages (S = 9, L = 5, two swaps) give 1,321 arcs per data node on a 12-node
cluster. The orders are words of one length over the stages, so they form a finite language,
and its minimal automaton (a directed acyclic word graph) has one state per distinct set of
endings: orders that begin alike share their first states, orders that end alike their last
ones. The same 185 orders need 27 states and 173 arcs per data node there.

``order_graph(seqs)``: state 0 is the start, ``final`` the one state every order ends in;
``steps`` lists each transition (state, stage, next state); ``depth`` is a state's distance
from the start (the same along every path: every order has the same length). The orders read
along the graph from the start to ``final`` are exactly ``seqs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class OrderGraph:
    steps: tuple[tuple[int, int, int], ...]  # (state, stage, next state), states in order of depth
    depth: tuple[int, ...]  # per state
    final: int

    @property
    def states(self) -> int:
        return len(self.depth)

    def entering(self) -> tuple[frozenset[int], ...]:
        """Per state, the stages of the transitions that enter it (empty for the start)."""
        into: list[set[int]] = [set() for _ in self.depth]
        for _, stage, nxt in self.steps:
            into[nxt].add(stage)
        return tuple(frozenset(s) for s in into)

    def orders(self) -> tuple[tuple[int, ...], ...]:
        """Every stage order the graph spells, sorted (for tests)."""
        out: list[tuple[int, ...]] = []

        def walk(state: int, prefix: tuple[int, ...]) -> None:
            if state == self.final:
                out.append(prefix)
            for q, stage, nxt in self.steps:
                if q == state:
                    walk(nxt, (*prefix, stage))

        walk(0, ())
        return tuple(sorted(out))


@lru_cache(maxsize=64)
def order_graph(seqs: tuple[tuple[int, ...], ...]) -> OrderGraph:
    """The minimal graph of the stage orders ``seqs`` (all of one length, at least one)."""
    ids: dict[frozenset[tuple[int, int]], int] = {frozenset(): 0}  # endings' key -> provisional id
    out_of: dict[int, frozenset[tuple[int, int]]] = {0: frozenset()}

    def merged(endings: frozenset[tuple[int, ...]]) -> int:
        """The provisional id of the state whose endings are ``endings`` (0: the empty ending)."""
        if endings == frozenset({()}):
            return 0
        by_stage: dict[int, set[tuple[int, ...]]] = {}
        for word in endings:
            by_stage.setdefault(word[0], set()).add(word[1:])
        key = frozenset((stage, merged(frozenset(rest))) for stage, rest in by_stage.items())
        if key not in ids:
            ids[key] = len(ids)
            out_of[ids[key]] = key
        return ids[key]

    root = merged(frozenset(seqs))
    # renumber from the start, depth by depth, so that state 0 is the start
    number = {root: 0}
    depth = [0]
    layer = [root]
    while layer:
        nxt_layer = []
        for q in layer:
            for _, child in sorted(out_of[q]):
                if child not in number:
                    number[child] = len(number)
                    depth.append(depth[number[q]] + 1)
                    nxt_layer.append(child)
        layer = nxt_layer
    steps = tuple(sorted((number[q], stage, number[child]) for q in number for stage, child in out_of[q]))
    return OrderGraph(steps, tuple(depth), number[0])  # the state of the empty ending
