"""Bad input and faults: one clear line, a non-zero exit, no half-written files, never a hang."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime_fixtures import seven_node_plan, write_config
from skippipe.runtime import checkpoint as ckpt

pytestmark = pytest.mark.slow


def _skippipe(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "skippipe.cli", *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "error" in line]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _files(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime for p in folder.rglob("*")}


def _worker_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def test_worker_refuses_a_plan_for_another_world_size(tmp_path):
    cfg = write_config(tmp_path, seven_node_plan())
    before = _files(tmp_path)
    out = _skippipe("worker", str(cfg), env=_worker_env(0, 3, _closed_port()))
    assert out.returncode == 2
    assert "the plan has 7 nodes but WORLD_SIZE is 3" in out.stderr
    assert "Traceback" not in out.stderr
    assert _files(tmp_path) == before


def test_unreachable_rendezvous_is_one_line_and_quick(tmp_path):
    cfg = write_config(tmp_path, seven_node_plan(), runtime={"rendezvous_timeout_s": 3.0})
    out = _skippipe("worker", str(cfg), env=_worker_env(1, 7, _closed_port()))  # a hang fails at _skippipe's timeout
    assert out.returncode == 2
    lines = _error_lines(out.stderr)
    assert lines and "cannot reach the rendezvous at 127.0.0.1:" in lines[0]
    assert "Traceback" not in out.stderr


def test_train_with_a_missing_plan_file_or_bad_config(tmp_path):
    cfg = write_config(tmp_path, seven_node_plan())
    data = json.loads(cfg.read_text())
    data["plan"]["file"] = str(tmp_path / "nope.json")
    cfg.write_text(json.dumps(data))
    out = _skippipe("train", str(cfg), "--no-progress")
    assert out.returncode == 2 and "nope.json: no such plan file" in out.stderr
    data["runtime"]["time_scale"] = -1
    cfg.write_text(json.dumps(data))
    out = _skippipe("train", str(cfg), "--no-progress")
    assert out.returncode == 2 and _error_lines(out.stderr) == [
        f"skippipe train: error: {cfg} [runtime]: time_scale must be > 0, got -1.0"
    ]


def test_plan_that_does_not_cover_the_model_is_refused(tmp_path):
    cfg = write_config(tmp_path, seven_node_plan())
    data = json.loads(cfg.read_text())
    data["model"]["n_layers"] = 6
    cfg.write_text(json.dumps(data))
    out = _skippipe("train", str(cfg), "--no-progress")
    assert out.returncode == 2
    assert "the plan's stages hold 4 layers but the model has 6" in out.stderr


def test_corrupt_checkpoint_is_refused_without_touching_the_run(tmp_path):
    cfg = write_config(tmp_path, seven_node_plan(), steps=3)
    assert _skippipe("train", str(cfg), "--until", "1", "--no-progress").returncode == 0
    run = tmp_path / "run"
    folder = ckpt.latest(run)
    target = folder / "stage-2.safetensors"
    blob = bytearray(target.read_bytes())
    blob[-5] ^= 0xFF
    target.write_bytes(bytes(blob))
    before = _files(run)
    out = _skippipe("train", str(cfg), "--resume", "--no-progress")
    assert out.returncode == 2
    assert _error_lines(out.stderr) == [
        f"skippipe train: error: checkpoint {folder}: stage-2.safetensors is corrupt (sha256 does not match the manifest)"
    ]
    assert _files(run) == before
    # a checkpoint folder without its manifest (a crash before the commit) is refused too
    (folder / "manifest.json").unlink()
    out = _skippipe("train", str(cfg), "--resume", "--no-progress")
    assert out.returncode == 2 and "manifest.json is missing" in out.stderr


def _start_and_wait(tmp_path: Path, timeout_s: float) -> tuple[subprocess.Popen, dict[int, int], Path]:
    """Start `skippipe train` on the 7-node plan (emulated, long) and wait for 3 iterations."""
    cfg = write_config(
        tmp_path, seven_node_plan(), steps=500,
        runtime={"emulate": True, "time_scale": 0.05, "timeout_s": timeout_s}, run={"checkpoint_every": 2},
    )
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "skippipe.cli", "train", str(cfg), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    pids: dict[int, int] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        listed = run / "logs" / "workers.json"  # the launcher names its workers' pids
        if listed.is_file():
            pids = {int(k): int(v) for k, v in json.loads(listed.read_text())["workers"].items()}
        metrics = run / "metrics.jsonl"
        if len(pids) == 7 and metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    if len(pids) != 7:
        proc.kill()
        proc.wait()
        pytest.fail("the run did not start")
    return proc, pids, run


def _stop(proc: subprocess.Popen, pids: dict[int, int], sig: int, node: int) -> str:
    """Signal one worker and wait for the launcher's verdict (a launcher that never decides fails the test)."""
    try:
        os.kill(pids[node], sig)
        _, err = proc.communicate(timeout=300)
        return err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_worker_stops_the_run_naming_the_node(tmp_path):
    proc, pids, run = _start_and_wait(tmp_path, timeout_s=30.0)
    err = _stop(proc, pids, signal.SIGKILL, 4)
    assert proc.returncode == 3
    assert _error_lines(err)[-1].startswith("skippipe train: error: node 4 died (killed by SIGKILL)")
    for pid in pids.values():  # every worker is gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    for folder in ckpt.list_checkpoints(run):  # no half-written checkpoint under a final name
        ckpt.verify(folder)


def test_a_hung_worker_is_named_after_the_timeout(tmp_path):
    proc, pids, _ = _start_and_wait(tmp_path, timeout_s=5.0)
    err = _stop(proc, pids, signal.SIGSTOP, 4)  # frozen: alive, but silent
    assert proc.returncode == 3
    assert _error_lines(err)[-1].startswith("skippipe train: error: node 4 stopped answering (still running)")
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_plan_that_cannot_finish_is_refused_before_launch(tmp_path):
    import numpy as np

    from skippipe.planfile import Constraints, Costs, Microbatch, Plan

    deadlock = Plan(  # mb0: 0 -> 2 -> 3, mb1: 1 -> 3 -> 2; nodes 2 and 3 hold one activation each
        stages=[[0, 1], [2], [3]], layers=[[0, 1], [2], [3]], memory=[3, 3, 1, 1],
        constraints=Constraints(path_length=3, max_swaps=1, max_jump=4),
        costs=Costs(transfer_s=np.ones((4, 4)) - np.eye(4), forward_s=np.ones(4)),
        microbatches=[Microbatch(0, 0, [2, 3]), Microbatch(1, 1, [3, 2])],
    )
    cfg = write_config(tmp_path, deadlock)
    out = _skippipe("train", str(cfg), "--no-progress")
    assert out.returncode == 2
    assert _error_lines(out.stderr) == [
        "skippipe train: error: the plan cannot finish an iteration: the simulator shows microbatches 0, 1 never finish "
        "(a memory deadlock or a processing order that waits on itself); give nodes more memory or plan again"
    ]
    assert not (tmp_path / "run" / "logs").exists()  # no worker was started
