"""A worker's side of a rejoin: a node that starts again gets its stage's state from a peer.

The launcher names the joining nodes (this round's plan ids) in ``$SKIPPIPE_JOINERS``. Every
other worker resumes from the round's recovery checkpoint as after a failure; a joiner reads
nothing from disk:

1. ``share_position``: the first non-joining rank broadcasts the step to start from and the
   loss history (``torch.distributed.broadcast_object_list`` on the world group);
2. ``share_stage_state``: in each stage group that holds a joiner, the stage's first
   non-joining node broadcasts its weights and optimizer state (``broadcast_object_list`` on the
   stage group: the tensors are pickled, so the joiner holds them bit for bit).

Replicas of a stage then hold identical state, as the consistency rule asks (``handoff.py``).
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from skippipe.runtime.adapt import JOINERS_ENV


def joiners() -> set[int]:
    """The joining nodes of this round (empty: none)."""
    value = os.environ.get(JOINERS_ENV, "")
    return {int(x) for x in value.split(",") if x.strip()}


def _source(ranks: list[int], joining: set[int]) -> int:
    return min(r for r in ranks if r not in joining)


def share_position(start: int, losses: list[float], joining: set[int]) -> tuple[int, list[float]]:
    """The step to start from and the losses so far, as the first non-joining rank has them."""
    src = _source(list(range(dist.get_world_size())), joining)
    box: list[Any] = [(start, list(losses)) if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    got_start, got_losses = box[0]
    return int(got_start), [float(x) for x in got_losses]


def share_stage_state(stage: torch.nn.Module, optimizer: torch.optim.Optimizer, group: Any, ranks: list[int],
                      joining: set[int]) -> str | None:
    """Weights and optimizer state from the stage's first non-joining node to its joiners; a
    line for the log on a joiner or on the source, else None."""
    if group is None or not joining & set(ranks):
        return None
    src, me = _source(ranks, joining), dist.get_rank()
    t0 = time.monotonic()
    box: list[Any] = [None]
    if me == src:
        box = [{"params": [p.detach().cpu() for p in stage.parameters()], "optim": optimizer.state_dict()}]
    dist.broadcast_object_list(box, src=src, group=group)
    if me not in joining:
        if me != src:
            return None
        return (f"sent stage state to joining node(s) {sorted(joining & set(ranks))} in {time.monotonic() - t0:.2f} s "
                f"(digest {state_digest(stage, optimizer)})")
    state = box[0]
    with torch.no_grad():
        for p, value in zip(stage.parameters(), state["params"]):
            p.copy_(value.to(p.device))
    optimizer.load_state_dict(state["optim"])
    n_bytes = sum(t.numel() * t.element_size() for t in state["params"])
    return (f"joined: received stage state ({n_bytes / 1e6:.2f} MB of weights + optimizer state) from node {src} "
            f"in {time.monotonic() - t0:.2f} s, not from disk (digest {state_digest(stage, optimizer)})")


def state_digest(stage: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """sha256 (first 16 hex digits) of the stage's weights and AdamW moments, bit for bit."""
    h = hashlib.sha256()
    tensors = [p.detach() for p in stage.parameters()]
    for per_param in optimizer.state_dict()["state"].values():
        tensors += [v for _, v in sorted(per_param.items()) if isinstance(v, torch.Tensor)]
    for t in tensors:
        h.update(t.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
