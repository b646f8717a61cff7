"""One worker process per plan node: the node's stage, its part of every microbatch, the step.

Per iteration (``Worker.iteration``):

1. all workers meet at a barrier (the iteration's time zero);
2. the node serves operations one at a time (``schedule.NodeSchedule``): a data node injects
   its microbatches (embedding + stage-0 layers, at most M in flight), computes head + loss when
   the activations come back and sends the gradient back along the reverse path, and finishes
   with its own backward; any other node takes activations from any peer, keeps at most M of
   them, runs its stage forward and backward and sends each result on along the microbatch's
   path. The math is ``skippipe.train.ops``, the same as the reference executor's;
3. gradients are summed inside the stage's process group, divided by the stage's divisor
   (``skippipe.train.grads``), clipped by the global norm over all stages, and AdamW steps with
   the iteration's learning rate — exactly what the reference executor does;
4. rank 0 records the metrics; every ``checkpoint_every`` iterations the first node of each
   stage writes its stage (``checkpoint.py``).

Stopping: a stop request (SIGTERM/SIGINT, ``StopRequest``) is agreed on by all workers in the
end-of-iteration all-reduce, so every worker stops after the same iteration (and, when asked,
writes a checkpoint there first).

Errors are typed (``skippipe.errors``): ``PeerLost``, ``MessageTimeout`` (naming the nodes this
one waited for), ``BadMessage`` and ``TrainingDiverged`` (non-finite loss, norm, lr or weights).
"""

from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from skippipe.data.tokenizer import Tokenizer
from skippipe.errors import BadMessage, MessageTimeout, RunInterrupted, TrainingDiverged
from skippipe.fileio import atomic_write_text
from skippipe.model.config import ModelConfig
from skippipe.planfile import Plan
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime.accumulate import OrderedGradAccumulator
from skippipe.runtime.emulation import Emulation
from skippipe.runtime.faults import StopRequest
from skippipe.runtime.handoff import LATCH, StepSnapshot, guarded_step
from skippipe.runtime.metrics import IterationStats, MetricsWriter
from skippipe.runtime.process_group import Groups, communicating
from skippipe.runtime.saving import CheckpointWriter, save_run_checkpoint
from skippipe.runtime.schedule import NodeSchedule, awaited, describe_awaited, expected_messages, hops, node_work
from skippipe.runtime.throughput import peak_device_memory
from skippipe.runtime.timeline import prune_records
from skippipe.runtime.transport import BACKWARD, FORWARD, Message, MessageBounds, Transport
from skippipe.train import grads as G
from skippipe.train.config import TrainConfig
from skippipe.train.ops import Saved, backward_op, forward_op, loss_op
from skippipe.train.optim import lr_at, make_optimizer, set_lr

T = TypeVar("T")


@dataclass
class WorkerSetup:
    """Everything a worker needs, resolved before the loop starts."""

    plan: Plan
    node: int
    groups: Groups
    train_cfg: TrainConfig
    model_cfg: ModelConfig
    device: torch.device
    emulation: Emulation
    policy: str
    timeout_s: float
    deterministic: bool
    run_dir: Path
    tokens: np.ndarray | None  # the training token array (data nodes only)
    tokenizer: Tokenizer | None = None  # written into checkpoints by rank 0
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    metrics: MetricsWriter | None = None  # rank 0 only
    log_every: int = 1
    timeline_iteration: int = -1  # 1-based iteration whose timeline is kept whatever happens (-1: none)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    stop: StopRequest = field(default_factory=StopRequest)
    wire: str = "fp32"  # activations/gradients on the wire (skippipe.runtime.wire)
    wire_error_feedback: bool = False
    elastic: bool = False  # keep the pre-step state for recovery (``handoff.py``)
    local_checkpoints: Path | None = None  # checkpoint_storage = "local": the local root (local_checkpoint.py)


@dataclass
class _Iteration:
    """The state of one iteration on this node while it serves its operations."""

    it: int  # 0-based
    sched: NodeSchedule
    t0: float  # monotonic time of the start barrier
    t0_wall: float  # wall clock of the start barrier (messages carry wall-clock times)
    scale: float  # real seconds per plan second
    inputs: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    saved: dict[int, Saved] = field(default_factory=dict)
    targets: dict[int, torch.Tensor] = field(default_factory=dict)
    losses: dict[int, float] = field(default_factory=dict)
    last_backward: float = 0.0  # end of the last stage-0 backward, seconds since the barrier

    def plan_now(self) -> float:
        return (time.monotonic() - self.t0) / self.scale


class Worker:
    def __init__(self, setup: WorkerSetup) -> None:
        from skippipe.model.llama import build_stage

        self.s = setup
        plan = setup.plan
        self.node = setup.node
        self.stage_index = s = plan.stage_of()[self.node]
        recompute = setup.train_cfg.activation_checkpointing
        self.stage = build_stage(setup.model_cfg, plan.layers[s], s == 0, recompute).to(setup.device)
        self.optimizer = make_optimizer(self.stage, setup.train_cfg)
        self.divisor = G.grad_divisor(plan, self.stage_index, setup.train_cfg.grad_divisor)
        self.own, self.visiting = node_work(plan, self.node)
        self.hops = {mb.id: hops(mb, self.node) for mb in self.own + self.visiting}
        self.n_messages = expected_messages(plan, self.node)
        self.scale = setup.emulation.time_scale if setup.emulation.enabled else 1.0
        self.seq_len = setup.train_cfg.tokens_per_sample(setup.model_cfg)
        self.own_ids = {mb.id for mb in self.own}
        ids = [mb.id for mb in self.own + self.visiting]
        self.accumulator = OrderedGradAccumulator(self.stage, ids) if setup.deterministic else None
        self.mb_rank = {mb.id: r for r, mb in enumerate(sorted(plan.microbatches, key=lambda m: m.id))}
        self.losses_so_far: list[float] = []  # every iteration's loss since step 0 (for checkpoints)
        self.steps = 0  # optimizer steps applied to this node's state
        self.snapshot = StepSnapshot() if setup.elastic else None
        bounds = MessageBounds(
            shape=(setup.train_cfg.samples_per_microbatch, self.seq_len, setup.model_cfg.d_model), microbatches=frozenset(ids),
        )
        with LATCH.local_step():  # it starts its sender thread: a signal must not cut that short (handoff.RecoveryLatch)
            self.transport = Transport(
                rank=self.node,
                header_group=setup.groups.header,
                payload_group=setup.groups.payload,
                device=setup.device,
                timeout_s=setup.timeout_s,
                delay=lambda dst: setup.emulation.link_delay_s(self.node, dst),
                bounds=bounds, wire=setup.wire, error_feedback=setup.wire_error_feedback, links=setup.groups.links,
            )

    # ------------------------------------------------------------------ one iteration
    def _batch(self, mb_id: int, iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
        from skippipe.data.batches import microbatch_starts, windows

        cfg = self.s.train_cfg
        assert self.s.tokens is not None
        starts = microbatch_starts(
            self.s.plan, mb_id, iteration, len(self.s.tokens), self.seq_len, cfg.samples_per_microbatch,
            seed=cfg.seed, sharding=cfg.sharding, sampling=cfg.resolved_sampling(),
        )
        x, y = windows(self.s.tokens, starts, self.seq_len)
        return torch.from_numpy(x).to(self.s.device), torch.from_numpy(y).to(self.s.device)

    def iteration(self, it: int) -> IterationStats:
        """Run iteration ``it`` (0-based) of the plan on this node, then step."""
        sched = NodeSchedule(self.s.plan, self.node, self.s.policy)
        self.s.emulation = self.s.emulation.at_iteration(it + 1)  # link events due by now
        if self.accumulator is not None:
            self.accumulator.reset()
        with LATCH.local_step():  # it starts the receiver thread: a signal must not cut that short
            self.transport.expect(self.n_messages)
        with communicating(f"the barrier that starts iteration {it + 1}", self.s.timeout_s):
            dist.barrier(group=self.s.groups.world)
        state = _Iteration(it=it, sched=sched, t0=time.monotonic(), t0_wall=time.time(), scale=self.scale)
        try:
            self._serve(state)
        except MessageTimeout as exc:
            missing = self._missing(state)
            peers = tuple(sorted({node for _, node in missing})) or exc.peers
            detail = f"{exc.detail} in iteration {it + 1}; node {self.node} was waiting for {describe_awaited(missing)}"
            raise MessageTimeout(peers, exc.waited_s, detail) from None
        self.transport.flush()
        return self._step(state)

    def _backward(self, mb: int, fn: Callable[[], T], last: bool) -> T:
        """Run a backward; in deterministic mode its gradients are added in microbatch order."""
        if self.accumulator is None:
            return fn()
        return self.accumulator.capture(mb, fn, last)

    def _missing(self, state: _Iteration) -> list[tuple[str, int]]:
        """The messages this node still expects: (what, from which node)."""
        return awaited(self.own, self.visiting, self.hops, state.sched, set(state.inputs))

    def _take(self, state: _Iteration, msg: Message) -> None:
        """File a received message; ``BadMessage`` for one this node does not expect from its sender."""
        backward = msg.direction == BACKWARD
        if msg.iteration != state.it:
            raise BadMessage(msg.src, f"a message of iteration {msg.iteration + 1} during iteration {state.it + 1}")
        hop = self.hops[msg.mb]
        expected = hop.next if backward else hop.prev
        kind = state.sched.message_kind(msg.mb, backward)
        if msg.src != expected or (kind, msg.mb) in state.inputs or state.sched.has_done(kind, msg.mb):
            what = "gradient" if backward else "activations"
            raise BadMessage(msg.src, f"{what} of microbatch {msg.mb}, which this node expects from node {expected}, once")
        state.inputs[(kind, msg.mb)] = msg.tensor
        state.sched.arrived(kind, msg.mb, (msg.arrived_at - state.t0_wall) / self.scale)
        self.s.timeline.append({"it": state.it, "type": "transfer", "src": msg.src, "dst": self.node, "mb": msg.mb,
                                "dir": "F" if msg.direction == FORWARD else "B",
                                "start": msg.sent_at - state.t0_wall, "end": msg.arrived_at - state.t0_wall})

    def _serve(self, state: _Iteration) -> None:
        """Serve this node's operations of one iteration, one at a time."""
        sched = state.sched
        while not sched.done:
            while (msg := self.transport.get(0.0)) is not None:
                self._take(state, msg)
            now = state.plan_now()
            op = sched.next_op(now)
            if op is None:
                release = sched.next_release(now)
                wait = None if release is None else (release - now) * self.scale
                waited_from = time.time()
                msg = self.transport.get(wait)
                if msg is not None:
                    self._take(state, msg)
                self.s.timeline.append({"it": state.it, "type": "wait", "node": self.node,
                                        "start": waited_from - state.t0_wall, "end": time.time() - state.t0_wall})
                continue
            self._run_op(state, *op)

    def _run_op(self, state: _Iteration, kind: str, mb: int) -> None:
        """One operation (F, L or B of microbatch ``mb``), padded to its modelled time under
        emulation; its results are sent on or stay here for the next local operation."""
        sched, inputs = state.sched, state.inputs
        injection = kind == "F" and mb in self.own_ids
        sched.started(kind, mb)
        started, started_wall = time.monotonic(), time.time()
        hop = self.hops[mb]
        outbox: list[tuple[int, Message]] = []  # sent once the operation has lasted its modelled time
        local: list[str] = []  # operations this one enables on this node (empty paths)
        if kind == "F":
            if injection:
                x, state.targets[mb] = self._batch(mb, state.it)
            else:
                x = inputs.pop(("F", mb))
            state.saved[mb] = forward_op(self.stage, x, self.s.train_cfg.precision)
            out = state.saved[mb].output.detach()
            if hop.next is None:  # empty path: the activations stay here for the loss
                inputs[("L", mb)] = out
                local.append("L")
            else:
                outbox.append((hop.next, Message(state.it, mb, FORWARD, out)))
        elif kind == "L":
            h, y = inputs.pop(("L", mb)), state.targets.pop(mb)
            state.losses[mb], grad = self._backward(mb, lambda: loss_op(self.stage, h, y, self.s.train_cfg.precision), last=False)
            if hop.prev is None:
                inputs[("B", mb)] = grad
                local.append("B")
            else:
                outbox.append((hop.prev, Message(state.it, mb, BACKWARD, grad)))
        else:  # B
            sv, g_out = state.saved.pop(mb), inputs.pop(("B", mb))
            grad_in = self._backward(mb, lambda: backward_op(sv, g_out), last=True)
            if grad_in is not None and hop.prev is not None:
                outbox.append((hop.prev, Message(state.it, mb, BACKWARD, grad_in)))
        self.s.emulation.pad_op(self.node, kind, started)
        for dst, m in outbox:
            self.transport.send(dst, m)
        for k in local:
            sched.arrived(k, mb, state.plan_now())
        ended = time.time()
        sched.finished(kind, mb, state.plan_now())
        self.s.timeline.append({"it": state.it, "type": "op", "node": self.node, "kind": kind, "mb": mb,
                                "start": started_wall - state.t0_wall, "end": ended - state.t0_wall})
        if kind == "B" and self.stage_index == 0:
            state.last_backward = ended - state.t0_wall
        self.s.emulation.pad_gap(injection)

    # ------------------------------------------------------------------ end of iteration
    def _step(self, state: _Iteration) -> IterationStats:
        g, plan, it = self.s.groups, self.s.plan, state.it
        flat, fault = G.flat_grads(self.stage), ("grad_sync", it + 1)  # a test's fault point (faultpoint.py)
        with communicating(f"the gradient sum of stage {self.stage_index} in iteration {it + 1}", self.s.timeout_s, fault):
            if g.stage is not None:
                if self.s.deterministic:  # sum in the stage's node order, as the reference executor does
                    parts = [torch.empty_like(flat) for _ in g.stage_ranks]
                    dist.all_gather(parts, flat, group=g.stage)
                    nodes = plan.stages[self.stage_index]
                    flat = parts[g.stage_ranks.index(nodes[0])].clone()
                    for node in nodes[1:]:
                        flat += parts[g.stage_ranks.index(node)]
                else:
                    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=g.stage)
        if self.divisor > 0:
            flat /= self.divisor
        else:
            flat.zero_()
        G.set_flat_grads(self.stage, flat)
        # one float64 vector summed over the world: every microbatch's loss (each from its data
        # node, zeros elsewhere: exact), each stage's |g_s|^2 (from its first node only), and
        # whether any worker was asked to stop (so that all stop after the same iteration)
        S, M = plan.num_stages, len(plan.microbatches)
        vec = torch.zeros(M + S + 1, dtype=torch.float64)
        for mb, value in state.losses.items():
            vec[self.mb_rank[mb]] = value
        if g.stage_ranks and plan.stages[self.stage_index][0] == self.node:
            vec[M + self.stage_index] = G.stage_sq_norm(self.stage)
        vec[M + S] = 1.0 if self.s.stop.signum is not None else 0.0
        span = torch.tensor([state.last_backward, peak_device_memory(self.s.device)], dtype=torch.float64)
        # a drain that arrives from here on waits until the step is applied (handoff.RecoveryLatch)
        with LATCH.local_step():
            with communicating(f"the loss and norm sum of iteration {it + 1}", self.s.timeout_s):
                dist.all_reduce(vec, op=dist.ReduceOp.SUM, group=g.world)
                dist.all_reduce(span, op=dist.ReduceOp.MAX, group=g.world)
            loss = float(np.mean(vec[:M].tolist()))  # the reference executor's mean, in id order
            norm, factor = G.clip_coefficient(vec[M : M + S].tolist(), self.s.train_cfg.grad_clip)
            lr = lr_at(it, self.s.train_cfg)
            # every worker holds the same values: all stop here together, before the step
            for what, value in (("loss", loss), ("gradient norm", norm), ("learning rate", lr)):
                if not math.isfinite(value):
                    raise TrainingDiverged(it + 1, what, value)
            G.scale_grads(self.stage, factor)
            set_lr(self.optimizer, lr)
            guarded_step(self.stage, self.optimizer, self.snapshot, it)
            self.steps = it + 1
            self.losses_so_far.append(loss)  # with the step: a hand-over of step it + 1 carries its loss
            self.optimizer.zero_grad(set_to_none=True)
            samples = len(plan.microbatches) * self.s.train_cfg.samples_per_microbatch
            return IterationStats(
                iteration=it + 1, loss=loss, lr=lr, grad_norm=norm, iter_s=time.monotonic() - state.t0,
                makespan_s=float(span[0]), samples=samples, stop=float(vec[M + S]) > 0, peak_memory_bytes=int(span[1]),
            )

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, step: int, keep: int) -> None:
        """All ranks call this (``saving.save_run_checkpoint``); non-finite weights are never written."""
        s = self.s
        w = CheckpointWriter(s.run_dir, s.plan, self.node, s.groups, s.timeout_s, s.model_cfg, s.train_cfg, s.tokenizer,
                             s.local_checkpoints)
        save_run_checkpoint(w, self.stage_index, self.stage, self.optimizer, step, self.losses_so_far, keep)

    def load_checkpoint(self, folder: Path) -> None:
        ckpt.load_stage(folder, self.stage_index, self.stage, self.optimizer)
        self.stage.to(self.s.device)

    # ------------------------------------------------------------------ the loop
    def run(self, start: int, stop: int, until: int | None = None) -> list[IterationStats]:
        """Iterations ``start..stop-1``; ``until`` stops early (a checkpoint is written there).
        A stop request ends the loop after the iteration all workers agree on (with a
        checkpoint there when asked) by raising ``RunInterrupted``."""
        out: list[IterationStats] = []
        end = stop if until is None else min(stop, until)
        every = self.s.checkpoint_every
        self.steps = start
        for it in range(start, end):
            cpu0 = time.process_time()
            stats = self.iteration(it)
            self.s.timeline.append({"it": it, "type": "iteration", "node": self.node, "cpu_s": time.process_time() - cpu0,
                                    "iter_s": stats.iter_s, "makespan_s": stats.makespan_s})
            out.append(stats)
            prune_records(self.s.timeline, it, self.s.timeline_iteration - 1)
            last = stats.iteration == end
            if self.s.metrics is not None and (stats.iteration % self.s.log_every == 0 or last or stats.stop):
                self.s.metrics.write(stats.record(self.scale))
            saved = False
            if every >= 0 and ((every and stats.iteration % every == 0) or last):
                self.save_checkpoint(stats.iteration, self.s.keep_checkpoints)
                saved = True
            if stats.stop and not last:
                if self.s.stop.checkpoint and not saved:
                    self.save_checkpoint(stats.iteration, self.s.keep_checkpoints)
                    saved = True
                signum = self.s.stop.signum or signal.SIGTERM
                where = f"; checkpoint of step {stats.iteration} written" if saved else ""
                raise RunInterrupted(signum, f"stopped after iteration {stats.iteration}{where}",
                                     checkpoint_step=stats.iteration if saved else None)
        self.transport.close()
        return out

    def write_timeline(self) -> None:
        path = self.s.run_dir / "timeline" / f"node-{self.node:03d}.json"
        data = {"node": self.node, "stage": self.stage_index, "time_scale": self.scale, "records": self.s.timeline}
        atomic_write_text(path, json.dumps(data) + "\n")
