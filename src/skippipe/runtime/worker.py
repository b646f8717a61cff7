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

Errors: a bad input is a ``UserError`` (exit 2); a lost peer or a timeout is a
``TransportError`` (exit 3); the message names this node.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from skippipe.errors import UserError
from skippipe.fileio import atomic_write_text
from skippipe.planfile import Plan
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime.accumulate import OrderedGradAccumulator
from skippipe.runtime.emulation import Emulation
from skippipe.runtime.process_group import Groups
from skippipe.runtime.schedule import NodeSchedule, expected_messages, hops, node_work
from skippipe.runtime.transport import BACKWARD, FORWARD, Message, Transport, TransportError
from skippipe.train import grads as G
from skippipe.train.ops import Saved, backward_op, forward_op, loss_op
from skippipe.train.optim import lr_at, make_optimizer, set_lr


@dataclass
class IterationStats:
    iteration: int  # 1-based count of completed iterations
    loss: float
    lr: float
    grad_norm: float
    iter_s: float  # barrier to optimizer step done (real seconds)
    makespan_s: float  # barrier to the last backward on any data node (real seconds)
    samples: int


@dataclass
class WorkerSetup:
    """Everything a worker needs, resolved before the loop starts."""

    plan: Plan
    node: int
    groups: Groups
    train_cfg: Any  # skippipe.train.config.TrainConfig
    model_cfg: Any  # skippipe.model.config.ModelConfig
    device: torch.device
    emulation: Emulation
    policy: str
    timeout_s: float
    deterministic: bool
    run_dir: Path
    tokens: np.ndarray | None  # the training token array (data nodes only)
    tokenizer: Any = None  # written into checkpoints by rank 0
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    metrics: Any = None  # MetricsWriter on rank 0
    log_every: int = 1
    timeline_iteration: int = -1  # 1-based iteration whose timeline is kept whatever happens (-1: none)
    timeline: list[dict[str, Any]] = field(default_factory=list)


class Worker:
    def __init__(self, setup: WorkerSetup) -> None:
        from skippipe.model.llama import build_stage

        self.s = setup
        plan = setup.plan
        self.node = setup.node
        self.stage_index = plan.stage_of()[self.node]
        self.stage = build_stage(setup.model_cfg, plan.layers[self.stage_index], first=self.stage_index == 0).to(setup.device)
        self.optimizer = make_optimizer(self.stage, setup.train_cfg)
        self.divisor = G.grad_divisor(plan, self.stage_index, setup.train_cfg.grad_divisor)
        self.own, self.visiting = node_work(plan, self.node)
        self.hops = {mb.id: hops(mb, self.node) for mb in self.own + self.visiting}
        self.n_messages = expected_messages(plan, self.node)
        self.scale = setup.emulation.time_scale if setup.emulation.enabled else 1.0
        self.seq_len = setup.train_cfg.tokens_per_sample(setup.model_cfg)
        self.own_ids = {mb.id for mb in self.own}
        self.accumulator = OrderedGradAccumulator(self.stage, [mb.id for mb in self.own + self.visiting]) if setup.deterministic else None
        self.mb_rank = {mb.id: r for r, mb in enumerate(sorted(plan.microbatches, key=lambda m: m.id))}
        self.losses_so_far: list[float] = []  # every iteration's loss since step 0 (for checkpoints)
        self.transport = Transport(
            rank=self.node,
            header_group=setup.groups.header,
            payload_group=setup.groups.payload,
            device=setup.device,
            timeout_s=setup.timeout_s,
            delay=lambda dst: setup.emulation.link_delay_s(self.node, dst),
        )

    # ------------------------------------------------------------------ one iteration
    def _batch(self, mb_id: int, iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
        from skippipe.data.batches import microbatch_starts, windows

        cfg = self.s.train_cfg
        assert self.s.tokens is not None
        starts = microbatch_starts(
            self.s.plan, mb_id, iteration, len(self.s.tokens), self.seq_len, cfg.samples_per_microbatch,
            seed=cfg.seed, sharding=cfg.sharding,
        )
        x, y = windows(self.s.tokens, starts, self.seq_len)
        return torch.from_numpy(x).to(self.s.device), torch.from_numpy(y).to(self.s.device)

    def iteration(self, it: int) -> IterationStats:
        """Run iteration ``it`` (0-based) of the plan on this node, then step."""
        sched = NodeSchedule(self.s.plan, self.node, self.s.policy)
        if self.accumulator is not None:
            self.accumulator.reset()
        self.transport.expect(self.n_messages)
        dist.barrier(group=self.s.groups.world)
        t0, t0_wall = time.monotonic(), time.time()
        inputs: dict[tuple[str, int], torch.Tensor] = {}
        saved: dict[int, Saved] = {}
        targets: dict[int, torch.Tensor] = {}
        losses: dict[int, float] = {}
        record = self.s.timeline.append

        def plan_now() -> float:
            return (time.monotonic() - t0) / self.scale

        def take(msg: Message) -> None:
            if msg.iteration != it:
                raise TransportError(f"got a message of iteration {msg.iteration} from node {msg.src} during iteration {it}")
            kind = sched.message_kind(msg.mb, msg.direction == BACKWARD)
            inputs[(kind, msg.mb)] = msg.tensor
            sched.arrived(kind, msg.mb, (msg.arrived_at - t0_wall) / self.scale)
            record({"it": it, "type": "transfer", "src": msg.src, "dst": self.node, "mb": msg.mb,
                    "dir": "F" if msg.direction == FORWARD else "B",
                    "start": msg.sent_at - t0_wall, "end": msg.arrived_at - t0_wall})

        try:
            last_backward = self._serve(it, sched, take, inputs, saved, targets, losses, plan_now, t0_wall)
        except TransportError as exc:
            raise TransportError(f"{exc} in iteration {it + 1}; node {self.node} was waiting for {self._missing(sched, inputs)}") from None
        self.transport.flush()
        return self._step(it, losses, last_backward, t0)

    def _backward(self, mb: int, fn, last: bool):  # noqa: ANN001, ANN202
        """Run a backward; in deterministic mode its gradients are added in microbatch order."""
        if self.accumulator is None:
            return fn()
        return self.accumulator.capture(mb, fn, last)

    def _missing(self, sched: NodeSchedule, inputs: dict[tuple[str, int], torch.Tensor]) -> str:
        """The messages this node still expects, e.g. 'activations of microbatch 3 from node 5'."""
        out = []
        for mb in self.own:
            h = self.hops[mb.id]
            if h.prev is None:
                continue
            if sched.has_done("F", mb.id) and not sched.has_done("L", mb.id) and ("L", mb.id) not in inputs:
                out.append(f"activations of microbatch {mb.id} from node {h.prev}")
            elif sched.has_done("L", mb.id) and not sched.has_done("B", mb.id) and ("B", mb.id) not in inputs:
                out.append(f"the gradient of microbatch {mb.id} from node {h.next}")
        for mb in self.visiting:
            h = self.hops[mb.id]
            if not sched.has_done("F", mb.id) and ("F", mb.id) not in inputs:
                out.append(f"activations of microbatch {mb.id} from node {h.prev}")
            elif sched.has_done("F", mb.id) and not sched.has_done("B", mb.id) and ("B", mb.id) not in inputs:
                out.append(f"the gradient of microbatch {mb.id} from node {h.next}")
        if not out:
            return "nothing (its own work was done)"
        more = f" and {len(out) - 3} more" if len(out) > 3 else ""
        return ", ".join(out[:3]) + more

    def _serve(self, it, sched, take, inputs, saved, targets, losses, plan_now, t0_wall) -> float:  # noqa: ANN001
        """Serve this node's operations of iteration ``it``; returns the last stage-0 backward's end."""
        record = self.s.timeline.append
        last_backward = 0.0
        while not sched.done:
            while (msg := self.transport.get(0.0)) is not None:
                take(msg)
            now = plan_now()
            op = sched.next_op(now)
            if op is None:
                release = sched.next_release(now)
                wait = None if release is None else (release - now) * self.scale
                waited_from = time.time()
                msg = self.transport.get(wait)
                if msg is not None:
                    take(msg)
                record({"it": it, "type": "wait", "node": self.node, "start": waited_from - t0_wall, "end": time.time() - t0_wall})
                continue
            kind, mb = op
            injection = kind == "F" and mb in self.own_ids
            sched.started(kind, mb)
            started, started_wall = time.monotonic(), time.time()
            hop = self.hops[mb]
            outbox: list[tuple[int, Message]] = []  # sent once the operation has lasted its modelled time
            local: list[str] = []  # operations this one enables on this node (empty paths)
            if kind == "F":
                if injection:
                    x, targets[mb] = self._batch(mb, it)
                else:
                    x = inputs.pop(("F", mb))
                saved[mb] = forward_op(self.stage, x)
                out = saved[mb].output.detach()
                if hop.next is None:  # empty path: the activations stay here for the loss
                    inputs[("L", mb)] = out
                    local.append("L")
                else:
                    outbox.append((hop.next, Message(it, mb, FORWARD, out)))
            elif kind == "L":
                h, y = inputs.pop(("L", mb)), targets.pop(mb)
                losses[mb], grad = self._backward(mb, lambda: loss_op(self.stage, h, y), last=False)
                if hop.prev is None:
                    inputs[("B", mb)] = grad
                    local.append("B")
                else:
                    outbox.append((hop.prev, Message(it, mb, BACKWARD, grad)))
            else:  # B
                sv, g_out = saved.pop(mb), inputs.pop(("B", mb))
                grad_in = self._backward(mb, lambda: backward_op(sv, g_out), last=True)
                if grad_in is not None:
                    outbox.append((hop.prev, Message(it, mb, BACKWARD, grad_in)))
            self.s.emulation.pad_op(self.node, kind, started)
            for dst, m in outbox:
                self.transport.send(dst, m)
            for k in local:
                sched.arrived(k, mb, plan_now())
            ended = time.time()
            sched.finished(kind, mb, plan_now())
            record({"it": it, "type": "op", "node": self.node, "kind": kind, "mb": mb,
                    "start": started_wall - t0_wall, "end": ended - t0_wall})
            if kind == "B" and self.stage_index == 0:
                last_backward = ended - t0_wall
            self.s.emulation.pad_gap(injection)
        return last_backward

    # ------------------------------------------------------------------ end of iteration
    def _step(self, it: int, losses: dict[int, float], last_backward: float, t0: float) -> IterationStats:
        g = self.s.groups
        plan = self.s.plan
        flat = G.flat_grads(self.stage)
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
        # node, zeros elsewhere: exact) and each stage's |g_s|^2 (from its first node only)
        S, M = plan.num_stages, len(plan.microbatches)
        vec = torch.zeros(M + S, dtype=torch.float64)
        for mb, value in losses.items():
            vec[self.mb_rank[mb]] = value
        if g.stage_ranks and plan.stages[self.stage_index][0] == self.node:
            vec[M + self.stage_index] = G.stage_sq_norm(self.stage)
        dist.all_reduce(vec, op=dist.ReduceOp.SUM, group=g.world)
        span = torch.tensor([last_backward], dtype=torch.float64)
        dist.all_reduce(span, op=dist.ReduceOp.MAX, group=g.world)
        norm, factor = G.clip_coefficient(vec[M:].tolist(), self.s.train_cfg.grad_clip)
        G.scale_grads(self.stage, factor)
        lr = lr_at(it, self.s.train_cfg)
        set_lr(self.optimizer, lr)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss = float(np.mean(vec[:M].tolist()))  # the reference executor's mean, in id order
        samples = len(plan.microbatches) * self.s.train_cfg.samples_per_microbatch
        return IterationStats(
            iteration=it + 1, loss=loss, lr=lr, grad_norm=norm, iter_s=time.monotonic() - t0,
            makespan_s=float(span[0]), samples=samples,
        )

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, step: int, keep: int) -> None:
        """All ranks call this; see ``checkpoint.py`` for the protocol."""
        g = self.s.groups
        if self.node == 0:
            ckpt.begin(self.s.run_dir, step)
        dist.barrier(group=g.world)
        folder = ckpt.partial_dir(self.s.run_dir, step)
        if g.stage_ranks[0] == self.node:
            ckpt.save_stage(folder, self.stage_index, self.stage, self.optimizer)
        dist.barrier(group=g.world)
        if self.node == 0:
            from skippipe.model.checkpoint import write_checkpoint_meta

            def meta(folder: Path) -> None:
                write_checkpoint_meta(
                    folder, self.s.model_cfg, step, self.s.plan.layers, train=self.s.train_cfg.to_dict(),
                    plan=self.s.plan, tokenizer=self.s.tokenizer,
                )

            ckpt.commit(self.s.run_dir, step, self.s.plan, self.losses_so_far, keep, write_meta=meta)
        dist.barrier(group=g.world)

    def load_checkpoint(self, folder: Path) -> None:
        ckpt.load_stage(folder, self.stage_index, self.stage, self.optimizer)
        self.stage.to(self.s.device)

    # ------------------------------------------------------------------ the loop
    def run(self, start: int, stop: int, until: int | None = None) -> list[IterationStats]:
        """Iterations ``start..stop-1``; ``until`` stops early (a checkpoint is written there)."""
        out: list[IterationStats] = []
        end = stop if until is None else min(stop, until)
        every = self.s.checkpoint_every
        for it in range(start, end):
            cpu0 = time.process_time()
            stats = self.iteration(it)
            self.s.timeline.append({"it": it, "type": "iteration", "node": self.node, "cpu_s": time.process_time() - cpu0,
                                    "iter_s": stats.iter_s, "makespan_s": stats.makespan_s})
            out.append(stats)
            self._prune_timeline(it)
            self.losses_so_far.append(stats.loss)
            if self.node == 0 and self.s.metrics is not None and (stats.iteration % self.s.log_every == 0 or stats.iteration == end):
                self.s.metrics.write({
                    "iteration": stats.iteration, "loss": stats.loss, "lr": stats.lr, "grad_norm": stats.grad_norm,
                    "iter_s": stats.iter_s, "makespan_s": stats.makespan_s,
                    "makespan_plan_s": stats.makespan_s / self.scale, "samples": stats.samples,
                    "samples_per_s": stats.samples / stats.iter_s, "time": time.time(),
                })
            if every >= 0 and ((every and stats.iteration % every == 0) or stats.iteration == end):
                self.save_checkpoint(stats.iteration, self.s.keep_checkpoints)
        self.transport.close()
        return out

    def _prune_timeline(self, it: int, keep: int = 5) -> None:
        """Keep the detailed records of the last ``keep`` iterations (and of the one asked for
        in ``[run] timeline_iteration``); per-iteration summaries are always kept."""
        wanted = self.s.timeline_iteration - 1
        self.s.timeline[:] = [
            r for r in self.s.timeline if r["type"] == "iteration" or r["it"] > it - keep or r["it"] == wanted
        ]

    def write_timeline(self) -> None:
        path = self.s.run_dir / "timeline" / f"node-{self.node:03d}.json"
        data = {"node": self.node, "stage": self.stage_index, "time_scale": self.scale, "records": self.s.timeline}
        atomic_write_text(path, json.dumps(data) + "\n")


def check_plan_fits(plan: Plan, world_size: int, n_layers: int) -> None:
    """The plan must have one node per worker and cover exactly the model's layers."""
    if plan.n_nodes != world_size:
        raise UserError(f"the plan has {plan.n_nodes} nodes but {world_size} workers were started (one worker per plan node)")
    covered = sum(len(ls) for ls in plan.layers)
    if covered != n_layers:
        raise UserError(f"the plan's stages hold {covered} layers but the model has {n_layers}")
