"""Paths around frozen stages: a stage with no node left (elastic recovery, ``shrink.py``).

A frozen stage keeps its layers in the plan's layout (``Plan.frozen_stages``) but no path may
visit it. ``reroute(...)`` rewrites one microbatch's stage sequence:

1. the visits to frozen stages are dropped;
2. the path is filled up to ``path_length - 1`` visits again with stages it does not visit yet,
   each time the stage whose least-loaded node carries the fewest microbatches (then the lowest
   stage), inserted first where the dropped visit was, else at the first position that obeys
   CC3;
3. CC3 is judged on the live numbering (``planfile.validate.live_index``): a frozen stage counts
   neither for ``max_jump`` nor for a swap's distance. That is the one rule relaxed, and only
   across a frozen stage; with no frozen stage the numbering is the plain one.

Torch-free.
"""

from __future__ import annotations

from skippipe.planfile.validate import live_index, path_rule_violation


def allowed(stages: list[int], live: dict[int, int], max_swaps: int, max_jump: int) -> bool:
    return path_rule_violation([live[s] for s in stages], max_swaps, max_jump) is None


def reroute(visits: list[int], frozen: set[int], num_stages: int, path_length: int, max_swaps: int, max_jump: int,
            stage_cost: dict[int, int]) -> list[int] | None:
    """The new stage sequence (after stage 0) of a path that visited ``visits``, or None when no
    sequence obeys the rules. ``stage_cost``: per live stage, the load of its least-loaded node."""
    live = live_index(num_stages, sorted(frozen))
    dropped = [k for k, s in enumerate(visits) if s in frozen]
    seq = [s for s in visits if s not in frozen]
    while len(seq) > path_length - 1:  # fewer live stages than the path length: shorten from the end
        seq.pop()
    holes = list(dropped)
    while len(seq) < path_length - 1:
        candidates = sorted((s for s in live if s != 0 and s not in seq), key=lambda s: (stage_cost[s], s))
        placed = False
        for s in candidates:
            positions = [h for h in holes if h <= len(seq)] + list(range(len(seq) + 1))
            for pos in positions:
                trial = seq[:pos] + [s] + seq[pos:]
                if allowed(trial, live, max_swaps, max_jump):
                    seq = trial
                    placed = True
                    break
            if placed:
                holes = holes[1:]
                break
        if not placed:
            return None
    return seq if allowed(seq, live, max_swaps, max_jump) else None
