"""Re-plan on drift, real processes: one emulated link slows down mid-run, the launcher sees the
drift, plans again on the changed costs and restarts the workers with the new plan."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from runtime_fixtures import write_config
from skippipe.cluster import cluster_from_dict
from skippipe.planfile import Plan, load_plan
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.runtime.emulation import network_costs
from skippipe.sim import simulate
from skippipe.workload import Workload

pytestmark = pytest.mark.slow

EVENT_AT, LINK, FACTOR, STEPS = 4, [2, 3], 0.2, 12


def planned_seven_nodes() -> Plan:
    """The skippipe planner's plan for the 7-node test cluster (stages of 2, 2, 1, 2 nodes)."""
    n = 7
    transfer = np.random.default_rng(0).uniform(0.2, 0.6, size=(n, n))
    c = cluster_from_dict({"transfer_s": transfer.tolist(), "forward_s": [0.3, 0.3, 0.2, 0.25, 0.2, 0.3, 0.2]})
    w = Workload(num_stages=4, path_length=3, microbatches_per_data_node=3, n_layers=4, memory=2,
                 stage_sizes=(2, 2, 1, 2), d_model=32, ctx=16, samples_per_microbatch=2)
    return make_plan("skippipe", build_problem(c, w))


def replan_config(folder: Path, steps: int = STEPS, **runtime: object) -> Path:
    rt = {"emulate": True, "time_scale": 0.05, "timeout_s": 20.0, "on_failure": "continue", "replan_on_drift": True,
          "drift_threshold": 0.3, "drift_window": 2,
          "emulate_events": [{"iteration": EVENT_AT, "link": LINK, "bandwidth_factor": FACTOR}], **runtime}
    return write_config(folder, planned_seven_nodes(), steps=steps, runtime=rt)


def _run(cfg: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skippipe.cli", "train", str(cfg), "--no-progress"],
                          capture_output=True, text=True, timeout=400)


def test_a_slower_link_is_seen_as_drift_and_the_run_replans(tmp_path):
    cfg = replan_config(tmp_path)
    done = _run(cfg)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in recs] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) for r in recs)
    assert recs[-1]["loss"] < recs[0]["loss"]
    replans = json.loads((run / "replans.json").read_text())["replans"]
    folding = [r for r in replans if r["folded_events"] == [0]]
    assert len(folding) == 1, replans
    r = folding[0]
    assert r["recovery_step"] >= EVENT_AT - 1  # the drift is seen only once the link changed
    assert r["makespan_sim_new_s"] < r["makespan_sim_old_s"]  # the new plan is faster on the new costs
    assert "re-plan" in done.stdout
    # one line when a drift starts and one per re-plan, not one per window
    drift_lines = [x for x in done.stderr.splitlines() if x.startswith("drift: ")]
    replan_lines = [x for x in done.stderr.splitlines() if x.startswith("re-plan: drift at iteration")]
    assert len(replan_lines) == len(replans) and 1 <= len(drift_lines) <= len(replans) + 1, done.stderr[-3000:]
    first = load_plan(tmp_path / "plan.json")
    final = load_plan(run / "plan.json")
    assert final.meta["emulation"]["folded"] == [0]
    a, b = LINK
    # the emulator keeps reproducing the slowed link exactly (the event is folded into its network) ...
    slowed = first.costs.transfer_s[a, b] / FACTOR
    assert final.meta["emulation"]["network"]["transfer_s"][a][b] == pytest.approx(slowed)
    # ... while the planner saw what the workers measured on it: the emulated delay plus the real
    # overhead of a hop on this machine (never less than the delay), not the emulator's figure
    assert r["costs"] == "measured" and "measured" in r["measured"]
    assert slowed <= final.costs.transfer_s[a, b] <= 1.25 * slowed, (final.costs.transfer_s[a, b], slowed)
    # the iteration time moved back toward the new plan's: iterations on the slow link with the
    # old plan against those after the re-plan (each round's first iteration left out)
    slow = [x["makespan_plan_s"] for x in recs if EVENT_AT <= x["iteration"] <= r["recovery_step"]]
    after = [x["makespan_plan_s"] for x in recs if x["iteration"] > r["recovery_step"] + 1]
    assert slow and after
    assert np.mean(after) < np.mean(slow)
    # toward the new simulated optimum: the final plan simulated on the network the emulator
    # reproduces (not on the measured estimates it was planned with)
    optimum = simulate(replace(final, costs=network_costs(final)), bound=False).makespan_s
    assert abs(np.mean(after) - optimum) < abs(np.mean(slow) - optimum), (np.mean(after), np.mean(slow), optimum)


def test_a_failed_node_rejoins_with_its_stage_state_from_a_peer(tmp_path):
    from runtime_fixtures import seven_node_plan
    from test_runtime_elastic import _kill_after, _train

    rt = {"emulate": True, "time_scale": 0.05, "timeout_s": 20.0, "on_failure": "continue",
          "rejoin": [{"iteration": 6, "node": 3}]}
    cfg = write_config(tmp_path, seven_node_plan(), steps=9, runtime=rt)
    run = tmp_path / "run"
    proc = _train(cfg)
    out, err = _kill_after(proc, run, [(2, 3)])  # node 3: stage 1 keeps node 2
    assert proc.returncode == 0, err[-3000:]
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in recs] == list(range(1, 10))
    assert all(math.isfinite(r["loss"]) for r in recs) and recs[-1]["loss"] < recs[0]["loss"]
    assert len(json.loads((run / "failures.json").read_text())["failures"]) == 1
    joins = [r for r in json.loads((run / "replans.json").read_text())["replans"] if r["joined"] is not None]
    assert len(joins) == 1 and joins[0]["joined"] == 3 and joins[0]["nodes"] == 7
    assert joins[0]["recovery_step"] >= 5  # it joined at the boundary before iteration 6 (or after)
    assert "rejoin" in out
    final = load_plan(run / "plan.json")
    assert final.meta["elastic"]["original_nodes"] == list(range(7))
    assert 3 in final.stages[1]
    # the joiner got its stage's state from node 2 over torch.distributed, bit for bit, and read no checkpoint
    joiner_log = (run / "logs" / "node-003.log").read_text()
    source_log = (run / "logs" / "node-002.log").read_text()
    got = [line for line in joiner_log.splitlines() if "joined: received stage state" in line]
    sent = [line for line in source_log.splitlines() if "sent stage state to joining node(s) [3]" in line]
    assert len(got) == 1 and len(sent) == 1
    assert got[0].split("digest ")[1] == sent[0].split("digest ")[1]
    # the timeline shows it working: node 3 serves operations in the last iteration
    from skippipe.runtime import timeline

    records, _ = timeline.load_timeline(run)
    last = max(timeline.iterations(records))
    assert any(r["type"] == "op" and r["node"] == 3 and r["it"] == last for r in records)
