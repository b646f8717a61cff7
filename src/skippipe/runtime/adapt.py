"""Re-plan on drift in the launcher: a new plan for the same nodes when the links change.

With ``[runtime] on_failure = "continue"`` and ``replan_on_drift = true``, the launcher's
``DriftMonitor`` (``drift.py``) watches every iteration's measured makespan. When it drifts from
the plan's prediction (``drift_threshold``, ``drift_window`` iterations in a row), the launcher:

1. drains every worker as for a node failure (``launch.py``: ``RECOVERY_SIGNAL``, each hands its
   stage state over under ``RUN/elastic/round-K``, ``handoff.py``) — the elastic handoff path;
2. takes the costs the workers measured (``measured_costs.py``): each worker wrote its timeline
   records beside its handoff; the hop time of every link that carried a message and the
   forward/backward time of every node, medians over the last ``drift_window`` iterations all
   nodes finished, replace the plan's figures; links and nodes not observed keep the plan's
   (never the emulator's). Under emulation the link events due by the iteration to be redone
   (``[runtime] emulate_events``) are "folded" into the emulated network
   (``plan.meta["emulation"]["network"]``, the ground truth the emulator keeps reproducing, and
   ``["folded"]``: not applied again) — the planner does not see them, only their effect on
   the measured hops;
3. plans again on them (``planner.replan``: the same nodes, the same layer partition, the new
   plan kept only if it simulates faster than the old plan on the new costs);
4. writes the recovery checkpoint ``checkpoints/step-R`` for the new plan from the handed-over
   state (R: the step every worker holds) and restarts the workers with it;
5. points the drift monitor at the new plan's prediction.

A rejoin (``[runtime] rejoin``: a failed node starts again) goes the same way: at the next
iteration boundary the workers are drained, the plan is recomputed with the node back in its
stage (``grow_plan``: the first plan restricted to the nodes now running, its paths planned
again with the stage allocation fixed) and the next round starts with one more worker, told
(``$SKIPPIPE_JOINERS``) to take its stage's state from a peer (``rejoin.py``), not from disk.

Every re-plan and rejoin is reported in ``RUN/replans.json`` (``Replan``). Torch-free.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from skippipe.errors import DrainRequested
from skippipe.fileio import atomic_write_text
from skippipe.planfile import Plan, load_plan, save_plan
from skippipe.planner.replan import replan, with_transfer
from skippipe.planner.shrink import original_nodes, shrink_plan
from skippipe.runtime import elastic as E
from skippipe.runtime import measured_costs as MC
from skippipe.runtime.config import JoinEvent
from skippipe.runtime.drift import DriftEvent
from skippipe.runtime.emulation import changed_transfer, folded_events, link_changes, network_costs, with_network
from skippipe.runtime.frozen import thaw
from skippipe.runtime.join import join_new_node
from skippipe.sim import simulate

REPORT = "replans.json"
JOINERS_ENV = "SKIPPIPE_JOINERS"  # the joining nodes of a round (its plan's ids, comma-separated)


@dataclass
class Replan:
    reason: str
    round: int
    iteration: int  # the iteration in progress when the workers were drained (1-based)
    recovery_step: int  # training went on from this step with the new plan
    requested_at: float  # wall clock: the drift was seen (the launcher asked for the drain)
    drained_at: float
    replanned_at: float
    drain_s: float
    replan_s: float  # drained -> new plan + checkpoint written
    folded_events: list[int]  # [runtime] emulate_events now in the plan's costs
    makespan_sim_old_s: float | None  # the old plan on the new costs (simulator, plan seconds)
    makespan_sim_new_s: float | None  # the new plan on the new costs
    new_paths: bool  # False: the planner found nothing faster, the old paths were kept
    stages_before: list[list[int]]  # original node ids
    stages_after: list[list[int]]
    joined: int | None = None  # a rejoin: the node that came back (original id)
    nodes: int = 0  # nodes in the new plan
    restarted_at: float | None = None
    restart_s: float | None = None  # new round started -> its first iteration done
    stage_choice: dict[int, float] | None = None  # a new node: simulated makespan per stage it could join
    costs: str = "emulated"  # what the new plan's costs are: "measured" (a drift) or "emulated" (rejoin, join)
    measured: str = ""  # a drift: what was measured (measured_costs.describe)
    # original ids of the nodes that ended during the drain without handing over their state
    # (``elastic.ended_in_drain``): left out of the new plan
    lost: list[int] = field(default_factory=list)


FIRST_PLAN = "plan-first.json"  # under RUN/elastic: the run's first plan, with every node


class RejoinWatch:
    """Which ``[runtime] rejoin`` events are due: a node not in the current plan whose iteration
    has come (the boundary before it); and which ``[runtime] join`` events (a brand-new node,
    ``join.py``) are due: their iteration has come and their ``like`` node runs."""

    def __init__(self, events: Sequence[Any], joins: Sequence[Any] = ()) -> None:
        self.left = [(int(e.iteration), int(e.node)) for e in events]
        self.joins = list(joins)

    def waiting(self) -> bool:
        return bool(self.left or self.joins)

    def request(self, done_iterations: int, plan: Plan) -> DrainRequested | None:
        """The drain request for the next rejoin or join that is due, if any."""
        node = self.due(done_iterations, plan)
        if node is not None:
            return DrainRequested(f"node {node} rejoins after iteration {done_iterations}", node)
        running = set(original_nodes(plan))
        for k, e in enumerate(self.joins):
            if done_iterations + 1 >= int(e.iteration) and int(e.like) in running:
                del self.joins[k]
                return DrainRequested(f"a new node joins after iteration {done_iterations}", e)
        return None

    def due(self, done_iterations: int, plan: Plan) -> int | None:
        """The original id of a node to bring back now, if any."""
        running = set(original_nodes(plan))
        for k, (iteration, node) in enumerate(self.left):
            if done_iterations + 1 >= iteration and node not in running:
                del self.left[k]
                return node
        return None


def grow_plan(first: Plan, plan: Plan, node: int, events: Sequence[object], iteration: int, method: str,
              seed: int) -> Plan:
    """The plan for the nodes of ``plan`` plus original node ``node``, back in its first stage."""
    keep = set(original_nodes(plan)) | {node}
    base, _ = shrink_plan(first, {n for n in range(first.n_nodes) if n not in keep})
    base.meta = {**base.meta, "emulation": dict(plan.meta.get("emulation") or {})}
    transfer, folded = fold_due(base, events, iteration)
    # a stage still frozen: the planner plans whole pipelines, so the shrunk first plan's paths are kept
    grown = with_transfer(base, transfer) if base.frozen_stages else replan(base, transfer, method=method, seed=seed,
                                                                             fixed_stages=True)
    emu = grown.meta.get("emulation") or {}
    grown.meta = {**grown.meta, "emulation": {**emu, "folded": sorted(set(folded_events(base)) | set(folded))}}
    return grown


def _original_stages(plan: Plan) -> list[list[int]]:
    orig = original_nodes(plan)
    return [[orig[n] for n in nodes] for nodes in plan.stages]


def fold_due(plan: Plan, events: Sequence[object], iteration: int) -> tuple[Any, list[int]]:
    """The emulated network's hop times (``network_costs``) with the link events due by
    ``iteration`` applied, and their indices."""
    due = [c for c in link_changes(plan, events) if c.iteration <= iteration]
    return changed_transfer(network_costs(plan).transfer_s, due, iteration), [c.index for c in due]


def measured_plan(run_dir: Path, round_index: int, plan: Plan, window: int, since: int = 0) -> tuple[Plan, str]:
    """``plan`` with the costs its workers measured in round ``round_index`` from iteration ``since``
    (0-based) on (``measured_costs.py``)."""
    m = MC.measure(MC.load_measurements(E.round_dir(run_dir, round_index)), window, since)
    transfer, forward = MC.measured_costs(plan.costs.transfer_s, plan.costs.forward_s, plan.costs.backward_factor, m)
    out = with_transfer(plan, transfer)
    out.costs = replace(out.costs, forward_s=forward)
    return out, MC.describe(m, plan.costs.transfer_s, transfer)


def replan_after_drain(run_dir: Path, plan: Plan, request: DrainRequested, round_index: int, keep: int,
                       write_meta: Callable[[Path, Plan, int], None], events: Sequence[object], method: str,
                       seed: int, window: int = 3) -> tuple[Plan, Replan]:
    """After ``request`` drained round ``round_index``: the new plan (``RUN/plan.json``), the
    recovery checkpoint for it, and the re-plan's record."""
    E.keep_logs(run_dir, round_index)
    handoffs = E.read_handoffs(E.round_dir(run_dir, round_index))
    step = E.recovery_step(handoffs)
    in_progress = max(max(h.steps) for h in handoffs.values()) + 1
    missing = {n for n in range(plan.n_nodes) if n not in handoffs}
    base = shrink_plan(plan, missing)[0] if missing else plan
    transfer, folded = fold_due(base, events, step + 1)
    truth = replace(network_costs(base), transfer_s=transfer)  # what the emulator reproduces from now on
    old_on_new = with_transfer(base, transfer)
    joiner = request.payload if isinstance(request.payload, int) else None
    stage_choice: dict[int, float] | None = None
    drift = joiner is None and not isinstance(request.payload, JoinEvent)
    seen = ""
    if drift:  # the planner sees what the workers measured, not the emulator's events
        # the drift's window, 0-based like the workers' records (a DriftEvent's iteration is 1-based)
        since = request.payload.iteration - window if isinstance(request.payload, DriftEvent) else 0
        old_on_new, seen = measured_plan(run_dir, round_index, base, window, since)
    if isinstance(request.payload, JoinEvent):
        new_plan, joiner, stage_choice = join_new_node(run_dir, base, request.payload, transfer, method, seed)
    elif joiner is not None:
        first = load_plan(run_dir / "elastic" / FIRST_PLAN)
        new_plan = grow_plan(first, base, joiner, events, step + 1, method, seed)
    elif base.frozen_stages:  # the planner plans whole pipelines: with a frozen stage the paths are kept
        new_plan = old_on_new
    else:
        new_plan = replan(old_on_new, old_on_new.costs.transfer_s, method=method, seed=seed)
    emu = dict(plan.meta.get("emulation") or {}) if isinstance(plan.meta.get("emulation"), dict) else {}
    done = set(folded_events(new_plan)) | set(folded_events(plan)) | set(folded)
    emu = {**emu, "folded": sorted(done)}
    if drift:  # the plan's costs are estimates now: the emulator keeps the truth apart
        emu = with_network(emu, original_nodes(base), truth)
    elif "network" in emu:  # a rejoin or join planned on the emulated network: it is the truth
        emu = with_network(emu, original_nodes(new_plan), new_plan.costs)
    new_plan.meta = {**new_plan.meta, "emulation": emu}
    E.write_recovery_checkpoint(run_dir, plan, new_plan, handoffs, step, keep, write_meta)
    thaw(run_dir, new_plan)  # a node rejoined a frozen stage: it restores it from that checkpoint
    save_plan(new_plan, run_dir / "plan.json")
    save_plan(new_plan, run_dir / "elastic" / f"plan-round-{round_index + 1}.json")
    sim_old, sim_new = simulate(old_on_new, bound=False), simulate(new_plan, bound=False)
    now = time.time()
    record = Replan(
        reason=request.reason, round=round_index, iteration=in_progress, recovery_step=step,
        requested_at=request.requested_at, drained_at=request.drained_at, replanned_at=now,
        drain_s=request.drained_at - request.requested_at, replan_s=now - request.drained_at, folded_events=folded,
        makespan_sim_old_s=sim_old.makespan_s if sim_old.finished else None,
        makespan_sim_new_s=sim_new.makespan_s if sim_new.finished else None,
        new_paths=not (new_plan.stages == base.stages and new_plan.microbatches == base.microbatches),
        joined=joiner, nodes=new_plan.n_nodes, stage_choice=stage_choice, costs="measured" if drift else "emulated",
        measured=seen, lost=E.ended_in_drain(plan, handoffs),
        stages_before=_original_stages(plan), stages_after=_original_stages(new_plan),
    )
    tqdm.write(announce(record), file=sys.stderr)  # the one line at the re-plan (the drift had its own)
    return new_plan, record


def announce(r: Replan) -> str:
    """The line printed when the launcher re-plans (drift), or a node rejoins or joins."""
    kind = "join" if r.stage_choice else "rejoin" if r.joined is not None else "re-plan"
    new = f"{r.makespan_sim_new_s:.2f}" if r.makespan_sim_new_s is not None else "?"
    old = f"{r.makespan_sim_old_s:.2f}" if r.makespan_sim_old_s is not None else "?"
    lost = f"; lost during the drain (no handoff), left out: {r.lost}" if r.lost else ""
    return (f"{kind}: {r.reason}; going on from step {r.recovery_step} with stages {r.stages_after} "
            f"(simulated makespan {old} -> {new} s){lost}")


def measure(run_dir: Path, replans: list[Replan]) -> None:
    """Fill in each re-plan's restart time (new round started -> its first iteration done)."""
    from skippipe.runtime.metrics import read_metrics

    recs = read_metrics(run_dir)
    for r in replans:
        first = [x for x in recs if int(x["iteration"]) == r.recovery_step + 1]
        if first and r.restarted_at is not None:
            r.restart_s = float(first[0]["time"]) - r.restarted_at


def write_report(run_dir: Path, replans: list[Replan]) -> Path:
    path = run_dir / REPORT
    atomic_write_text(path, json.dumps({"replans": [asdict(r) for r in replans]}, indent=1) + "\n")
    return path


def format_replans(replans: list[Replan]) -> list[str]:
    out = []
    for r in replans:
        old = f"{r.makespan_sim_old_s:.2f}" if r.makespan_sim_old_s is not None else "?"
        new = f"{r.makespan_sim_new_s:.2f}" if r.makespan_sim_new_s is not None else "?"
        restart = f"{r.restart_s:.1f}" if r.restart_s is not None else "?"
        what = "rejoin          " if r.joined is not None else "re-plan         "
        if r.stage_choice:
            into = next(k for k, nodes in enumerate(r.stages_after) if r.joined in nodes)
            figs = ", ".join(f"{k}: {v:.2f}" for k, v in sorted(r.stage_choice.items()))
            what = f"join            new node {r.joined} into stage {into} (simulated makespan if it joins stage {figs} s); "
        out.append(f"{what}{r.reason}; in iteration {r.iteration}, went on from step {r.recovery_step} "
                   f"with stages {r.stages_after}: simulated makespan on the new costs {old} -> {new} s; "
                   f"drain {r.drain_s:.1f} s, re-plan {r.replan_s:.2f} s, restart {restart} s")
        if r.lost:
            out.append(f"also lost       nodes {r.lost} (ended during the drain without a handoff: left out of the new plan)")
    return out
