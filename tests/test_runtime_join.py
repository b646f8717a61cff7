"""A brand-new node joins a running job (``[runtime] join``), real processes."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from runtime_fixtures import seven_node_plan, write_config
from skippipe.planfile import load_plan
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime import timeline

pytestmark = pytest.mark.slow


def test_a_new_node_joins_the_stage_that_shortens_the_makespan_most(tmp_path):
    steps = 7
    rt = {"emulate": True, "time_scale": 0.05, "timeout_s": 20.0, "on_failure": "continue",
          "join": [{"iteration": 4, "like": 4}]}
    cfg = write_config(tmp_path, seven_node_plan(), steps=steps, runtime=rt)
    run = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "skippipe.cli", "train", str(cfg), "--no-progress"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    print(res.stdout)
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in recs] == list(range(1, steps + 1))
    assert all(math.isfinite(r["loss"]) for r in recs) and recs[-1]["loss"] < recs[0]["loss"]
    [join] = json.loads((run / "replans.json").read_text())["replans"]
    assert join["joined"] == 7 and join["nodes"] == 8 and join["recovery_step"] >= 3
    figures = {int(k): v for k, v in join["stage_choice"].items()}
    assert sorted(figures) == [1, 2, 3]  # every non-data stage was tried
    final = load_plan(run / "plan.json")
    assert final.meta["elastic"]["original_nodes"] == list(range(8))
    chosen = final.stage_of()[7]
    assert figures[chosen] == min(figures.values())
    assert join["makespan_sim_new_s"] == pytest.approx(figures[chosen])
    assert any(line.startswith(f"join            new node 7 into stage {chosen} (simulated makespan if it joins stage 1: ")
               for line in res.stdout.splitlines())
    # it got its stage's state from a peer over torch.distributed, bit for bit, and read no checkpoint
    joiner_log = (run / "logs" / "node-007.log").read_text()
    got = [line for line in joiner_log.splitlines() if "joined: received stage state" in line]
    source = min(n for n in final.stages[chosen] if n != 7)
    sent = [line for line in (run / "logs" / f"node-{source:03d}.log").read_text().splitlines()
            if "sent stage state to joining node(s) [7]" in line]
    assert len(got) == 1 and len(sent) == 1
    assert got[0].split("digest ")[1] == sent[0].split("digest ")[1]
    # the timeline shows it working in the last iteration, and the final checkpoint is whole
    records, _ = timeline.load_timeline(run)
    last = max(timeline.iterations(records))
    assert any(r["type"] == "op" and r["node"] == 7 and r["it"] == last for r in records)
    ckpt.verify(ckpt.step_dir(run, steps), final)
