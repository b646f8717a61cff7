"""Order-independent gradient accumulation: bit-for-bit reproducible runs.

A node runs its microbatches in whatever order messages arrive, and float addition is not
associative, so plain ``.grad +=`` accumulation makes the last bits of the gradients depend on
network timing. In deterministic mode each operation's parameter gradients are captured
separately and added to the stage's ``.grad`` in microbatch id order — the order of the
reference executor — as soon as every lower id is in. Memory: the gradients of the microbatches
that finished out of order (at most the node's load, usually one or two).

With the stage-group sum done in node order as well (``worker.py``), a distributed step gives
the reference executor's weights bit for bit, and ``--resume`` reproduces an uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

T = TypeVar("T")


class OrderedGradAccumulator:
    def __init__(self, module: nn.Module, order: list[int]) -> None:
        self.params = list(module.parameters())
        self.order = sorted(order)
        self._next = 0
        self._pending: dict[int, list[torch.Tensor | None]] = {}
        self._complete: set[int] = set()

    def reset(self) -> None:
        if self._pending or self._next not in (0, len(self.order)):
            raise RuntimeError("gradients of the previous iteration were not all accumulated")
        self._next = 0
        self._complete.clear()

    def capture(self, mb: int, fn: Callable[[], T], last: bool) -> T:
        """Run ``fn`` (a backward) with the gradients it produces kept aside for microbatch
        ``mb``; ``last`` marks the microbatch's final operation on this node."""
        stash = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None
        try:
            out = fn()
            got = [p.grad for p in self.params]
        finally:
            for p, g in zip(self.params, stash):
                p.grad = g
        mine = self._pending.get(mb)
        if mine is None:
            self._pending[mb] = got
        else:  # a second operation of the same microbatch (loss, then backward on a data node)
            for i, g in enumerate(got):
                if g is not None:
                    mine[i] = g if mine[i] is None else mine[i] + g
        if last:
            self._complete.add(mb)
            self._flush()
        return out

    def _flush(self) -> None:
        while self._next < len(self.order) and self.order[self._next] in self._complete:
            grads = self._pending.pop(self.order[self._next])
            for p, g in zip(self.params, grads):
                if g is None:
                    continue
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad += g
            self._next += 1

    @property
    def done(self) -> bool:
        return self._next == len(self.order) and not self._pending
