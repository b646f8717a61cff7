"""Signals and the run folder lock, with real processes: a killed launcher leaves no worker
behind (both start methods), SIGTERM stops cleanly with a final checkpoint when asked, and a
second run in the same folder is refused while the first one runs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from runtime_fixtures import write_config
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime.runfolder import RunLock
from toy_plans import full_plan

pytestmark = pytest.mark.slow


def _two_node_config(folder: Path, start_method: str, steps: int = 400) -> Path:
    plan = full_plan(num_stages=2, chains=1, m=2, n_layers=4, samples=2, d_model=32, ctx=16)
    runtime = {"emulate": True, "time_scale": 0.02, "timeout_s": 30.0, "start_method": start_method}
    return write_config(folder, plan, steps=steps, runtime=runtime)


def _start(cfg: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "skippipe.cli", "train", str(cfg), "--no-progress", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _wait_training(proc: subprocess.Popen[str], run: Path, records: int = 2) -> dict[int, int]:
    """Wait until the run has written ``records`` metrics records; the worker pids, as the
    launcher wrote them."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        metrics, pids = run / "metrics.jsonl", run / "logs" / "workers.json"
        if pids.is_file() and metrics.is_file() and len(metrics.read_text().splitlines()) >= records:
            return {int(k): int(v) for k, v in json.loads(pids.read_text())["workers"].items()}
        time.sleep(0.2)
    proc.kill()
    out, err = proc.communicate()
    pytest.fail(f"the run did not start: {err[-2000:]}")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie of a process that is not ours counts as gone, once every thread of it is gone too:
    # a leader shows "Z" while its other threads still exit, holding its descriptors (the lock)
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        return all((t / "stat").read_text().split(")")[-1].split()[0] in ("Z", "X") for t in tasks)
    except OSError:  # a thread went while we looked: look again
        return False


def _wait_gone(pids: list[int], limit_s: float = 60) -> list[int]:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if not _gone(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in pids if not _gone(p)]


@pytest.mark.parametrize("start_method", ["forkserver", "exec"])
def test_a_killed_launcher_leaves_no_worker_and_no_lock(tmp_path, start_method):
    cfg = _two_node_config(tmp_path, start_method)
    run = tmp_path / "run"
    proc = _start(cfg)
    pids = _wait_training(proc, run)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    left = _wait_gone(list(pids.values()))
    for pid in left:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert left == []
    for node in pids:  # each stopped because it saw the launcher go, not by some later error
        status = json.loads((run / "logs" / f"node-{node:03d}.status.json").read_text())
        assert status["kind"] == "launcher_gone"
    with RunLock(run):  # the kernel released the lock with the last process
        pass


def test_sigterm_stops_cleanly_with_a_final_checkpoint_and_a_second_run_is_refused(tmp_path):
    cfg = _two_node_config(tmp_path, "forkserver")
    run = tmp_path / "run"
    proc = _start(cfg, "--checkpoint-on-stop")
    try:
        pids = _wait_training(proc, run)
        second = subprocess.run(
            [sys.executable, "-m", "skippipe.cli", "train", str(cfg), "--resume", "--no-progress"],
            capture_output=True, text=True, timeout=120,
        )
        assert second.returncode == 2
        busy = f"{run} is in use by another skippipe run (pid {proc.pid}); wait for it to end or stop it first"
        assert second.stderr.strip().splitlines() == [f"skippipe train: error: {busy}"]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    last = err.strip().splitlines()[-1]
    assert last.startswith("skippipe train: error: stopped by SIGTERM; checkpoint of step ")
    step = int(last.split("checkpoint of step ")[1].split()[0])
    folder = ckpt.latest(run)
    assert folder is not None and folder.name == f"step-{step:06d}"
    assert ckpt.verify(folder).step == step
    assert _wait_gone(list(pids.values())) == []
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["iteration"] == step  # every worker stopped after the same iteration
    assert all(json.loads((run / "logs" / f"node-{n:03d}.status.json").read_text())["checkpoint_step"] == step for n in pids)


def test_sigterm_without_checkpoint_on_stop_writes_none(tmp_path):
    cfg = _two_node_config(tmp_path, "forkserver")
    run = tmp_path / "run"
    proc = _start(cfg)
    try:
        pids = _wait_training(proc, run)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    assert err.strip().splitlines()[-1] == "skippipe train: error: stopped by SIGTERM; no checkpoint written on the way out"
    assert ckpt.latest(run) is None
    assert _wait_gone(list(pids.values())) == []


def test_diverged_training_stops_with_one_line_and_no_non_finite_checkpoint(tmp_path):
    from safetensors.torch import load_file

    plan = full_plan(num_stages=2, chains=1, m=2, n_layers=4, samples=2, d_model=32, ctx=16)
    cfg = write_config(tmp_path, plan, steps=6, train={"lr": 1e12}, run={"checkpoint_every": 1, "keep_checkpoints": 10})
    out = subprocess.run([sys.executable, "-m", "skippipe.cli", "train", str(cfg), "--no-progress"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 3
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in out.stderr
    assert re.fullmatch(r"skippipe train: error: training diverged at iteration (\d+): the (loss|gradient norm) is (nan|inf); "
                        r"stopped without writing it to a checkpoint", errors[0])
    run = tmp_path / "run"
    diverged_at = int(re.search(r"iteration (\d+)", errors[0]).group(1))
    written = ckpt.list_checkpoints(run)
    assert [ckpt.verify(f).step for f in written] == list(range(1, diverged_at))
    for folder in written:
        for file in folder.glob("stage-*.safetensors"):
            assert all(bool(torch.isfinite(t).all()) for t in load_file(file).values())
    # resuming it with another model is refused, naming the key, before any worker starts
    data = json.loads(cfg.read_text())
    data["model"]["ctx"] = 32
    cfg.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, "-m", "skippipe.cli", "train", str(cfg), "--resume", "--no-progress"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"skippipe train: error: --resume: [model] ctx is 32 now but 16 in {run / 'config.json'}; "
        "resume with the run's setting or start over with --fresh"
    ]
