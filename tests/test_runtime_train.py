"""`skippipe train` on the shipped example, end to end, and the same worker under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime_fixtures import seven_node_plan, write_config
from skippipe.model.checkpoint import load_checkpoint
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime.metrics import read_metrics

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train-tiny.toml"


def test_shipped_example_end_to_end(tmp_path):
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "skippipe.cli", "train", str(EXAMPLE), "--steps", "2", "--run-dir", str(run), "--no-progress"],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "plan: skippipe, 12 nodes in 4 stages" in out.stdout
    assert "iterations      2" in out.stdout and "simulator" in out.stdout
    recs = read_metrics(run)
    assert [r["iteration"] for r in recs] == [1, 2]
    assert all(r["loss"] > 0 and r["makespan_plan_s"] > 0 for r in recs)
    assert (run / "timeline.png").stat().st_size > 10_000
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    folder = ckpt.latest(run)
    assert folder.name == "step-000002"
    ckpt.verify(folder)
    model = load_checkpoint(folder)  # what `skippipe eval` and `skippipe export` read
    assert model.step == 2 and "lm_head.weight" in model.state_dict
    assert not list(run.rglob("*.tmp")) and not list((run / "checkpoints").glob(".*partial"))


def test_worker_runs_under_torchrun(tmp_path):
    cfg = write_config(tmp_path, seven_node_plan(), steps=2)
    cmd = [sys.executable, "-m", "skippipe.cli", "train", str(cfg), "--plan-only"]
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK", "WORLD_SIZE"))}
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "7",
         "-m", "skippipe.cli", "worker", str(run / "config.json"), "--run-dir", str(run)],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert [r["iteration"] for r in read_metrics(run)] == [1, 2]
    assert json.loads((ckpt.latest(run) / "manifest.json").read_text())["step"] == 2
