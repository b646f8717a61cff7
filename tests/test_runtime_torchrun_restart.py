"""Under ``torchrun --max-restarts``: a worker killed mid-run, torchrun starts the group again and
the workers resume from the last checkpoint by themselves (``runtime/torchrun_restart.py``)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime_fixtures import seven_node_plan, write_config
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime.metrics import read_metrics
from skippipe.runtime.torchrun_restart import restart_count, resume_on_restart


def test_only_a_restarted_group_with_a_shared_checkpoint_resumes_by_itself():
    assert restart_count({}) == 0 and restart_count({"TORCHELASTIC_RESTART_COUNT": "2"}) == 2
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "x"}) == 0
    first, again = {"TORCHELASTIC_RESTART_COUNT": "0"}, {"TORCHELASTIC_RESTART_COUNT": "1"}
    assert not resume_on_restart(False, first, True, True)  # the first start: only --resume resumes
    assert resume_on_restart(True, first, True, True)
    assert resume_on_restart(False, again, True, True)
    assert not resume_on_restart(False, again, False, True)  # failed before the first checkpoint: from 0
    assert not resume_on_restart(False, again, True, False)  # local checkpoints: not by itself


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.slow
def test_a_killed_worker_under_torchrun_max_restarts_resumes_from_the_checkpoint(tmp_path):
    steps = 6
    cfg = write_config(tmp_path, seven_node_plan(), steps=steps, run={"checkpoint_every": 2},
                       runtime={"emulate": True, "time_scale": 0.05})
    assert subprocess.run([sys.executable, "-m", "skippipe.cli", "train", str(cfg), "--plan-only"],
                          capture_output=True).returncode == 0
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK", "WORLD_SIZE"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "7", "--max-restarts", "1",
         "--monitor-interval", "0.5", "-m", "skippipe.cli", "worker", str(run / "config.json"), "--run-dir", str(run)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        deadline = time.monotonic() + 300
        while not any(int(r["iteration"]) >= 3 for r in read_metrics(run)):
            assert time.monotonic() < deadline and proc.poll() is None, "the run ended before the kill"
            time.sleep(0.05)
        workers = _children(proc.pid)
        assert len(workers) == 7
        os.kill(workers[3], signal.SIGKILL)  # a worker torchrun started (ours, by its pid)
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, "\n".join(x for x in err.splitlines() if "skippipe" in x.lower() or "error" in x.lower())[-4000:]
    assert "torchrun restart 1: resuming from the last checkpoint" in err
    recs = read_metrics(run)
    assert [r["iteration"] for r in recs] == list(range(1, steps + 1))  # the redone iterations once each
    assert all(math.isfinite(r["loss"]) for r in recs) and recs[-1]["loss"] < recs[0]["loss"]
    assert json.loads((ckpt.latest(run) / "manifest.json").read_text())["step"] == steps
