"""Elastic recovery in the launcher: keep training when a node dies or goes silent.

With ``[runtime] on_failure = "continue"`` the local launcher runs the job in rounds. In round K
every worker knows ``$SKIPPIPE_HANDOFF_DIR = RUN/elastic/round-K`` and keeps its pre-step state
(``handoff.py``). When a node fails (its typed verdict, ``faults.RECOVERABLE``):

1. the launcher kills it (a silent node is still running) and waits until every survivor has
   handed its stage state over (current state and pre-step snapshot) and exited (``NodeLost``);
2. the recovery step R is the smallest step count among the survivors, which each holds;
3. the plan is recomputed for the survivors (``planner.shrink``); a non-data stage with no node
   left is frozen: its weights come from the newest valid checkpoint (``frozen.py``); with no
   checkpoint, or no data node left, the run stops (``StageLost``, exit 3);
4. the first survivor of each stage that holds step R gives its files to a regular checkpoint
   ``checkpoints/step-R`` written for the new plan (``checkpoint.commit``: atomic, verified); a
   frozen stage's files come from the frozen store;
5. round K+1 starts the survivors as fresh processes with the new plan, resuming from step R.

Every failure is reported in ``RUN/failures.json`` (``Failure``). Torch-free.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from skippipe.errors import NodeLost, StageLost
from skippipe.fileio import atomic_write_text, step_folder_name
from skippipe.planfile import Plan, save_plan
from skippipe.planner.shrink import original_nodes, shrink_plan
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime import frozen as F
from skippipe.runtime import runfolder
from skippipe.runtime.metrics import read_metrics

REPORT = "failures.json"


@dataclass
class Handoff:
    node: int  # the node id in the round's plan
    stage: int
    steps: list[int]  # step counts handed over (current state, pre-step snapshot)
    losses: list[float]
    folder: Path

    def files(self, step: int) -> Path:
        return self.folder / step_folder_name(step)


@dataclass
class Failure:
    node: int  # original node id (the run's first plan)
    node_in_round: int
    kind: str  # faults.FaultKind value
    message: str
    round: int
    iteration: int  # the iteration in progress on the most advanced survivor (1-based)
    recovery_step: int  # the step training went on from (the iteration after it was redone)
    nodes_left: int
    seen_at: float  # wall clock: the launcher saw a worker end
    decided_at: float  # the failed node named
    drained_at: float  # every survivor handed over and exited
    replanned_at: float  # new plan and recovery checkpoint written
    detect_s: float  # seen -> named
    drain_s: float  # named -> survivors' state handed over
    replan_s: float  # handed over -> new plan + checkpoint
    restart_s: float | None = None  # new round started -> its first iteration done (filled at the end)
    makespan_sim_before_s: float | None = None  # simulator, plan seconds
    makespan_sim_after_s: float | None = None
    makespan_before_s: float | None = None  # measured mean, plan seconds (the round's first iteration left out)
    makespan_after_s: float | None = None
    iter_before_s: float | None = None  # measured mean real seconds per iteration
    iter_after_s: float | None = None
    restarted_at: float | None = None
    frozen: dict[int, int] | None = None  # stages frozen by this failure -> the checkpoint step of their weights
    # original ids of the other nodes that ended during the drain without handing over their
    # state (``ended_in_drain``): left out of the new plan with the failed one
    also_lost: list[int] = field(default_factory=list)


def read_handoffs(folder: Path) -> dict[int, Handoff]:
    """The complete handoffs (``handoff.json`` written last) under a round's folder, by node."""
    out: dict[int, Handoff] = {}
    for doc_file in sorted(folder.glob("node-*/handoff.json")):
        try:
            doc = json.loads(doc_file.read_text())
            h = Handoff(int(doc["node"]), int(doc["stage"]), [int(x) for x in doc["steps"]],
                        [float(x) for x in doc["losses"]], doc_file.parent)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if h.steps:
            out[h.node] = h
    return out


def ended_in_drain(plan: Plan, handoffs: dict[int, Handoff], failed: int | None = None) -> list[int]:
    """The nodes of the round's ``plan`` (original ids) other than ``failed`` (an id in the
    round's plan) that handed over no state: they ended during the drain (a crash, a kill), and
    the next plan leaves them out with it, so the run's records name them."""
    orig = original_nodes(plan)
    return [orig[n] for n in range(plan.n_nodes) if n not in handoffs and n != failed]


def recovery_step(handoffs: dict[int, Handoff]) -> int:
    """R: the smallest step count any survivor holds as its newest state. Every survivor holds R
    (workers' step counts differ by at most one: they meet at every iteration's barrier)."""
    return min(max(h.steps) for h in handoffs.values())


def sources(plan: Plan, handoffs: dict[int, Handoff], step: int, frozen: set[int]) -> dict[int, Handoff]:
    """Per stage not in ``frozen``, the first node (plan order) that handed over ``step``;
    ``StageLost`` if none did."""
    out: dict[int, Handoff] = {}
    for s, nodes in enumerate(plan.stages):
        if s in frozen:
            continue
        have = [handoffs[n] for n in sorted(nodes) if n in handoffs and step in handoffs[n].steps]
        if not have:
            orig = original_nodes(plan)
            raise StageLost(s, [orig[n] for n in nodes], f"no survivor handed over step {step}")
        out[s] = have[0]
    return out


def write_recovery_checkpoint(run_dir: Path, plan: Plan, new_plan: Plan, handoffs: dict[int, Handoff], step: int, keep: int,
                              write_meta: Callable[[Path, Plan, int], None]) -> Path:
    """``checkpoints/step-R`` for ``new_plan`` from the survivors' files (atomic, verified on
    resume); the stages frozen in either plan from the frozen store."""
    frozen = set(plan.frozen_stages) | set(new_plan.frozen_stages)
    src = sources(plan, handoffs, step, frozen)
    runfolder.clean_partials(run_dir)
    tmp = ckpt.begin(run_dir, step)
    for s, h in src.items():
        for name in ckpt.stage_files(s):
            shutil.copyfile(h.files(step) / name, tmp / name)
    for s in sorted(frozen):
        for name in ckpt.stage_files(s):
            shutil.copyfile(F.store(run_dir) / name, tmp / name)
    losses = next(h.losses[:step] for h in handoffs.values() if len(h.losses) >= step)
    return ckpt.commit(run_dir, step, new_plan, losses, keep, write_meta=lambda folder: write_meta(folder, new_plan, step))


def recover(run_dir: Path, plan: Plan, lost: NodeLost, round_index: int, keep: int,
            write_meta: Callable[[Path, Plan, int], None]) -> tuple[Plan, Failure]:
    """After ``NodeLost`` in round ``round_index``: the new plan (saved as ``RUN/plan.json``),
    the recovery checkpoint, and the failure's record."""
    keep_logs(run_dir, round_index)
    handoffs = read_handoffs(round_dir(run_dir, round_index))
    assert lost.node is not None
    gone = {lost.node} | {n for n in range(plan.n_nodes) if n not in handoffs}
    new_plan, _ = shrink_plan(plan, gone)
    frozen: dict[int, int] | None = None
    if set(new_plan.frozen_stages) - set(plan.frozen_stages):
        orig = original_nodes(plan)
        steps = F.freeze(run_dir, new_plan.frozen_stages, plan.frozen_stages,
                         {s: [orig[n] for n in plan.stages[s]] for s in new_plan.frozen_stages})
        frozen = {s: v for s, v in steps.items() if s not in plan.frozen_stages}
    step = recovery_step(handoffs)
    write_recovery_checkpoint(run_dir, plan, new_plan, handoffs, step, keep, write_meta)
    save_plan(new_plan, run_dir / "plan.json")
    save_plan(new_plan, run_dir / "elastic" / f"plan-round-{round_index + 1}.json")
    from skippipe.sim import simulate

    before, after = simulate(plan, bound=False), simulate(new_plan, bound=False)
    now = time.time()
    fail = Failure(
        node=original_nodes(plan)[lost.node], node_in_round=lost.node, kind=lost.kind, message=str(lost), round=round_index,
        iteration=max(max(h.steps) for h in handoffs.values()) + 1, recovery_step=step, nodes_left=new_plan.n_nodes,
        seen_at=lost.seen_at, decided_at=lost.decided_at, drained_at=lost.drained_at, replanned_at=now,
        detect_s=lost.decided_at - lost.seen_at, drain_s=lost.drained_at - lost.decided_at, replan_s=now - lost.drained_at,
        makespan_sim_before_s=before.makespan_s if before.finished else None,
        makespan_sim_after_s=after.makespan_s if after.finished else None, frozen=frozen,
        also_lost=ended_in_drain(plan, handoffs, lost.node),
    )
    return new_plan, fail


def keep_logs(run_dir: Path, index: int) -> None:
    """Move the round's worker logs and statuses to ``elastic/round-K/logs`` (the next round
    writes its own under ``logs/``)."""
    dest = round_dir(run_dir, index) / "logs"
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted((run_dir / "logs").glob("node-*")):
        f.replace(dest / f.name)


def round_dir(run_dir: Path, index: int) -> Path:
    return run_dir / "elastic" / f"round-{index}"


def fresh_round_dir(run_dir: Path, index: int) -> Path:
    """An empty handoff folder for round ``index`` (one left by an earlier run is replaced)."""
    folder = round_dir(run_dir, index)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def measure(run_dir: Path, failures: list[Failure], start_step: int, other_rounds: list[int] | None = None) -> None:
    """Fill in the measured figures of every failure from ``metrics.jsonl``: mean makespan and
    iteration time of the rounds before and after (each round's first iteration left out, it
    pays for the start), and the restart time (new round started -> its first iteration done).
    ``other_rounds``: the steps other rounds started from (re-plans, rejoins), which end a window."""
    recs = read_metrics(run_dir)
    end = max((int(r["iteration"]) for r in recs), default=0)
    cuts = sorted({start_step, end, *(f.recovery_step for f in failures), *(other_rounds or [])})

    def window(lo: int, hi: int) -> list[dict[str, Any]]:
        return [r for r in recs if lo + 1 < int(r["iteration"]) <= hi]

    def around(step: int) -> tuple[int, int]:
        k = cuts.index(step)
        return cuts[max(k - 1, 0)], cuts[min(k + 1, len(cuts) - 1)]

    for f in failures:
        lo, hi = around(f.recovery_step)
        pre, post = window(lo, f.recovery_step), window(f.recovery_step, hi)
        f.makespan_before_s, f.iter_before_s = _means(pre)
        f.makespan_after_s, f.iter_after_s = _means(post)
        first = [r for r in recs if int(r["iteration"]) == f.recovery_step + 1]
        if first and f.restarted_at is not None:
            f.restart_s = float(first[0]["time"]) - f.restarted_at


def _means(recs: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    if not recs:
        return None, None
    return (sum(float(r["makespan_plan_s"]) for r in recs) / len(recs), sum(float(r["iter_s"]) for r in recs) / len(recs))


def write_report(run_dir: Path, failures: list[Failure], finished: bool) -> Path:
    path = run_dir / REPORT
    doc = {"finished": finished, "failures": [asdict(f) for f in failures]}
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    return path


def read_report(run_dir: Path) -> list[dict[str, Any]]:
    try:
        doc = json.loads((run_dir / REPORT).read_text())
    except (OSError, ValueError):
        return []
    return list(doc.get("failures", [])) if isinstance(doc, dict) else []


def format_failures(failures: list[Failure]) -> list[str]:
    """Summary lines, one per failure."""
    out = []
    for f in failures:
        sim = ""
        if f.makespan_sim_before_s is not None and f.makespan_sim_after_s is not None:
            sim = f", simulated makespan {f.makespan_sim_before_s:.2f} -> {f.makespan_sim_after_s:.2f} s"
        meas = ""
        if f.makespan_before_s is not None and f.makespan_after_s is not None:
            meas = f", measured {f.makespan_before_s:.2f} -> {f.makespan_after_s:.2f} s"
        restart = f"{f.restart_s:.1f}" if f.restart_s is not None else "?"
        out.append(f"failure         node {f.node} ({f.kind}) in iteration {f.iteration}: {f.nodes_left} nodes went on from "
                   f"step {f.recovery_step}; detect {f.detect_s:.1f} s, drain {f.drain_s:.1f} s, re-plan {f.replan_s:.2f} s, "
                   f"restart {restart} s{sim}{meas}")
        if f.also_lost:
            out.append(f"also lost       nodes {f.also_lost} (ended during the drain without a handoff: "
                       "left out of the new plan)")
        for stage, step in sorted((f.frozen or {}).items()):
            out.append(f"frozen          stage {stage}: no node left; every path skips it, its weights stay those of the "
                       f"checkpoint of step {step}")
    return out
