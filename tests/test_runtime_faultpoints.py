"""Elastic recovery from a worker killed at an exact moment (``$SKIPPIPE_FAULT``,
``runtime/faultpoint.py``): inside the gradient sync and halfway through a checkpoint write.
Recovery must be consistent: no half-applied update (the state training goes on from equals a
clean run's after the same number of steps, tensor for tensor) and no half-written checkpoint
(the last finished one stays readable; the partial folder is never listed)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from runtime_fixtures import seven_node_plan, write_config
from skippipe.planfile import load_plan
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime.faultpoint import FAULT_ENV
from test_runtime_elastic import ELASTIC, _assert_same, _stage_tensors

pytestmark = pytest.mark.slow


def _train(cfg, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skippipe.cli", "train", str(cfg), "--no-progress", *extra],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("point", "node", "step", "recovery"), [
    ("grad_sync", 3, 3, 2),  # node 3 dies entering stage 1's gradient sum of iteration 3: nobody steps 3
    ("checkpoint_write", 2, 4, 4),  # node 2 dies after writing stage 1 into the partial checkpoint of step 4
])
def test_a_worker_killed_at_a_fault_point_recovers_consistently(tmp_path, point, node, step, recovery):
    steps = 6
    run_cfg = {"checkpoint_every": 2, "keep_checkpoints": 10}
    cfg = write_config(tmp_path / "elastic", seven_node_plan(), steps=steps, runtime=ELASTIC, run=run_cfg)
    run = tmp_path / "elastic" / "run"
    res = _train(cfg, env={FAULT_ENV: f"{node}:{point}:{step}"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    report = json.loads((run / "failures.json").read_text())
    assert report["finished"] and len(report["failures"]) == 1
    fail = report["failures"][0]
    assert fail["node"] == node and fail["kind"] == "crash" and fail["recovery_step"] == recovery
    handed = sorted(p.parent.name for p in (run / "elastic" / "round-0").glob("node-*/handoff.json"))
    assert handed == [f"node-{n:03d}" for n in range(7) if n != node]  # every survivor handed over, the killed node nothing
    losses = [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == steps and all(math.isfinite(x) for x in losses)
    # no half-written checkpoint: every listed one verifies, the last finished before the fault is there
    listed = ckpt.list_checkpoints(run)
    assert [p.name for p in listed] == [f"step-{s:06d}" for s in (2, 4, 6)]
    for folder in listed:
        ckpt.verify(folder)
    assert not list((run / "checkpoints").glob(".*partial"))
    ckpt.verify(ckpt.step_dir(run, steps), load_plan(run / "plan.json"))
    # no half-applied update: the state training went on from is a clean run's after `recovery` steps
    clean_cfg = write_config(tmp_path / "clean", seven_node_plan(), steps=steps, runtime={"time_scale": 0.05})
    clean = _train(clean_cfg, "--until", str(recovery))
    assert clean.returncode == 0, clean.stderr[-3000:]
    clean_ckpt = ckpt.step_dir(tmp_path / "clean" / "run", recovery)
    _assert_same(_stage_tensors(ckpt.step_dir(run, recovery), 4), _stage_tensors(clean_ckpt, 4))
    assert ckpt.verify(ckpt.step_dir(run, recovery)).losses == ckpt.verify(clean_ckpt).losses
