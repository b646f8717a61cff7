"""A stage with no node left, real processes: its only node is SIGKILLed, every path skips the
stage, its weights stay those of the last checkpoint, and a node that rejoins it restores it
from disk."""

from __future__ import annotations

import json
import math

import pytest
from safetensors.torch import load_file

from runtime_fixtures import seven_node_plan, write_config
from skippipe.planfile import load_plan
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime import timeline
from test_runtime_elastic import ELASTIC, _kill_after, _train

pytestmark = pytest.mark.slow


def _stage_sequences(plan) -> list[list[int]]:
    stage_of = plan.stage_of()
    return [[0, *(stage_of[n] for n in mb.path)] for mb in plan.microbatches]


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def test_the_only_node_of_a_stage_dies_then_rejoins(tmp_path):
    steps = 10
    rt = {**ELASTIC, "rejoin": [{"iteration": 8, "node": 4}]}
    cfg = write_config(tmp_path, seven_node_plan(), steps=steps, runtime=rt, run={"checkpoint_every": 2, "keep_checkpoints": 20})
    run = tmp_path / "run"
    proc = _train(cfg)
    out, err = _kill_after(proc, run, [(3, 4)])  # node 4 is stage 2's only node
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    losses = [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == steps and all(math.isfinite(x) for x in losses)
    assert sum(losses[-2:]) < sum(losses[:2])
    fail = json.loads((run / "failures.json").read_text())["failures"][0]
    assert fail["node"] == 4 and fail["nodes_left"] == 6
    frozen_at = int(fail["frozen"]["2"])
    # the newest checkpoint before the kill (the one of step R, if the kill cut its writing short, is not there)
    assert frozen_at % 2 == 0 and fail["recovery_step"] - 2 <= frozen_at <= fail["recovery_step"]
    line = ("frozen          stage 2: no node left; every path skips it, its weights stay those of the checkpoint of "
            f"step {frozen_at}")
    assert line in out

    first = load_plan(run / "elastic" / "plan-first.json")
    shrunk = load_plan(run / "elastic" / "plan-round-1.json")
    print("stage sequences before:", _stage_sequences(first))
    print("stage sequences after: ", _stage_sequences(shrunk), "frozen", shrunk.frozen_stages)
    assert shrunk.frozen_stages == [2] and shrunk.stages[2] == []
    assert all(2 not in seq for seq in _stage_sequences(shrunk))
    assert len(shrunk.microbatches) == len(first.microbatches)

    # while frozen, every checkpoint holds stage 2 exactly as the checkpoint of step `frozen_at`
    frozen_ref = {name: load_file(ckpt.step_dir(run, frozen_at) / name) for name in ckpt.stage_files(2)}
    join = json.loads((run / "replans.json").read_text())["replans"][0]
    assert join["joined"] == 4 and join["recovery_step"] >= 7
    during = [s for s in range(fail["recovery_step"], join["recovery_step"] + 1, 1) if ckpt.step_dir(run, s).is_dir()]
    assert fail["recovery_step"] in during and join["recovery_step"] in during
    for s in during:
        ckpt.verify(ckpt.step_dir(run, s))
        for name in ckpt.stage_files(2):
            assert _same(load_file(ckpt.step_dir(run, s) / name), frozen_ref[name]), (s, name)
    # ... while the live stages went on training
    assert not _same(load_file(ckpt.step_dir(run, join["recovery_step"]) / "stage-1.safetensors"),
                     load_file(ckpt.step_dir(run, frozen_at) / "stage-1.safetensors"))

    # the rejoined node restored stage 2 from the recovery checkpoint and trains it again
    final_plan = load_plan(run / "plan.json")
    assert final_plan.frozen_stages == [] and final_plan.stages[2] == [4]
    log = (run / "logs" / "node-004.log").read_text()
    assert "joined: stage 2 was frozen (no node held it); restored its weights" in log
    final = ckpt.verify(ckpt.step_dir(run, steps), final_plan)
    assert not _same(load_file(final.path / "stage-2.safetensors"), frozen_ref["stage-2.safetensors"])
    records, _ = timeline.load_timeline(run)
    last = max(timeline.iterations(records))
    assert any(r["type"] == "op" and r["node"] == 4 and r["it"] == last for r in records)
