"""Elastic recovery, real processes: SIGKILL a node mid-run and the run goes on with the others."""

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
from safetensors.torch import load_file

from runtime_fixtures import seven_node_plan, write_config
from skippipe.planfile import load_plan
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime import runfolder

pytestmark = pytest.mark.slow

ELASTIC = {"emulate": True, "time_scale": 0.05, "timeout_s": 20.0, "on_failure": "continue"}


def _train(cfg: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "skippipe.cli", "train", str(cfg), "--no-progress", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_after(proc: subprocess.Popen, run: Path, kills: list[tuple[int, int]]) -> tuple[str, str]:
    """For each (iteration, original node): once a record of that iteration is in, SIGKILL the
    worker that runs the node now; then wait for the run to end."""
    try:
        for after, node in kills:
            deadline = time.monotonic() + 180
            while True:
                assert time.monotonic() < deadline and proc.poll() is None, "the run ended before the kill"
                metrics = run / "metrics.jsonl"
                recs = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
                if recs and recs[-1]["iteration"] >= after and (run / "logs" / "workers.json").is_file():
                    plan = load_plan(run / "plan.json")
                    orig = plan.meta.get("elastic", {}).get("original_nodes") or list(range(plan.n_nodes))
                    pids = json.loads((run / "logs" / "workers.json").read_text())["workers"]
                    os.kill(pids[str(orig.index(node))], signal.SIGKILL)
                    break
                time.sleep(0.05)
        return proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _losses(run: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def _check_completed(run: Path, steps: int, n_failures: int) -> dict:
    report = json.loads((run / "failures.json").read_text())
    assert report["finished"] and len(report["failures"]) == n_failures
    losses = _losses(run)
    assert len(losses) == steps and all(math.isfinite(x) for x in losses)
    assert sum(losses[-2:]) < sum(losses[:2])  # still learning
    final = ckpt.latest(run)
    assert final is not None and final.name == f"step-{steps:06d}"
    ckpt.verify(final, load_plan(run / "plan.json"))  # complete, checksums, the final plan
    for f in report["failures"]:
        for key in ("detect_s", "drain_s", "replan_s", "restart_s", "makespan_sim_before_s", "makespan_sim_after_s"):
            assert f[key] is not None and f[key] >= 0
    return report


def _stage_tensors(folder: Path, stages: int) -> dict[str, dict]:
    out = {}
    for s in range(stages):
        for name in ckpt.stage_files(s):
            out[name] = load_file(folder / name)
    return out


def _assert_same(a: dict[str, dict], b: dict[str, dict]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].keys() == b[name].keys(), name
        for key in a[name]:
            assert a[name][key].equal(b[name][key]), f"{name}: {key}"


def test_killing_a_replica_node_continues_and_matches_a_clean_restart(tmp_path):
    steps = 8
    cfg = write_config(tmp_path / "elastic", seven_node_plan(), steps=steps, runtime=ELASTIC, run={"keep_checkpoints": 5})
    run = tmp_path / "elastic" / "run"
    proc = _train(cfg)
    out, err = _kill_after(proc, run, [(2, 3)])  # node 3: stage 1 keeps node 2
    assert proc.returncode == 0, err
    report = _check_completed(run, steps, 1)
    fail = report["failures"][0]
    assert fail["node"] == 3 and fail["kind"] == "crash" and fail["nodes_left"] == 6
    assert "failure         node 3 (crash)" in out
    step = fail["recovery_step"]
    new_plan = load_plan(run / "plan.json")
    assert new_plan.stages == [[0, 1], [2], [3], [4, 5]]
    # the state training went on from is the one a clean run has after `step` iterations: no
    # half-applied update, and the survivor of stage 1 held exactly what node 3 held
    clean_cfg = write_config(tmp_path / "clean", seven_node_plan(), steps=steps, runtime={"time_scale": 0.05})
    clean = _train(clean_cfg, "--until", str(step))
    _, clean_err = clean.communicate(timeout=240)
    assert clean.returncode == 0, clean_err
    clean_ckpt = ckpt.step_dir(tmp_path / "clean" / "run", step)
    _assert_same(_stage_tensors(ckpt.step_dir(run, step), 4), _stage_tensors(clean_ckpt, 4))
    # ... and the run's end equals that clean state continued along the survivors' plan
    resumed_dir = tmp_path / "resumed"
    resumed_cfg = write_config(resumed_dir, new_plan, steps=steps, runtime={"time_scale": 0.05})
    runfolder.claim(resumed_dir / "run")
    ckpt.begin(resumed_dir / "run", step)
    for s in range(4):
        for name in ckpt.stage_files(s):
            (ckpt.partial_dir(resumed_dir / "run", step) / name).write_bytes((clean_ckpt / name).read_bytes())
    ckpt.commit(resumed_dir / "run", step, new_plan, ckpt.verify(clean_ckpt).losses, keep=2)
    resumed = _train(resumed_cfg, "--resume")
    _, resumed_err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, resumed_err
    _assert_same(_stage_tensors(ckpt.step_dir(run, steps), 4), _stage_tensors(ckpt.step_dir(resumed_dir / "run", steps), 4))
    assert _losses(run)[step:] == _losses(resumed_dir / "run")
    assert ckpt.verify(ckpt.step_dir(run, steps)).losses == ckpt.verify(ckpt.step_dir(resumed_dir / "run", steps)).losses


def test_killing_a_data_node_moves_its_microbatches(tmp_path):
    steps = 7
    cfg = write_config(tmp_path, seven_node_plan(), steps=steps, runtime=ELASTIC)
    proc = _train(cfg)
    _, err = _kill_after(proc, tmp_path / "run", [(2, 1)])
    assert proc.returncode == 0, err
    report = _check_completed(tmp_path / "run", steps, 1)
    assert report["failures"][0]["node"] == 1
    plan = load_plan(tmp_path / "run" / "plan.json")
    assert plan.stages[0] == [0] and len(plan.microbatches) == 6  # the microbatch total stays
    assert {mb.data_node for mb in plan.microbatches} == {0}


def test_two_failures_in_one_run(tmp_path):
    steps = 9
    cfg = write_config(tmp_path, seven_node_plan(), steps=steps, runtime={**ELASTIC, "max_failures": 2})
    proc = _train(cfg)
    _, err = _kill_after(proc, tmp_path / "run", [(2, 3), (5, 6)])
    assert proc.returncode == 0, err
    report = _check_completed(tmp_path / "run", steps, 2)
    assert [f["node"] for f in report["failures"]] == [3, 6]
    assert [f["nodes_left"] for f in report["failures"]] == [6, 5]
    assert load_plan(tmp_path / "run" / "plan.json").meta["elastic"]["original_nodes"] == [0, 1, 2, 4, 5]


def test_losing_the_last_node_of_a_stage_stops_with_one_line(tmp_path):
    cfg = write_config(tmp_path, seven_node_plan(), steps=8, runtime=ELASTIC)
    proc = _train(cfg)
    _, err = _kill_after(proc, tmp_path / "run", [(2, 4)])  # node 4 is stage 2's only node
    assert proc.returncode == 3
    lines = [x for x in err.splitlines() if "error" in x]
    assert lines[-1].startswith("skippipe train: error: node 4 died (killed by SIGKILL)")
    assert "stage 2 has no node left (its nodes [4] failed)" in lines[-1]
    assert "Traceback" not in err
    for folder in ckpt.list_checkpoints(tmp_path / "run"):
        ckpt.verify(folder)
