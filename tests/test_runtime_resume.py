"""--resume continues a run with exactly the losses and weights of an uninterrupted run."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from runtime_fixtures import seven_node_plan, write_config
from skippipe.cli import main
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_resume_gives_the_losses_of_an_uninterrupted_run(tmp_path):
    plan = seven_node_plan()
    steps = 4
    whole = write_config(tmp_path / "whole", plan, steps=steps)
    parts = write_config(tmp_path / "parts", plan, steps=steps, run={"checkpoint_every": 1, "keep_checkpoints": 2})

    assert main(["train", str(whole), "--no-progress"]) == 0
    assert main(["train", str(parts), "--until", "2", "--no-progress"]) == 0
    run = tmp_path / "parts" / "run"
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-000001", "step-000002"]
    # a second start without --resume is refused, the run folder stays as it is
    assert main(["train", str(parts), "--no-progress"]) == 2
    assert main(["train", str(parts), "--resume", "--no-progress"]) == 0

    a = [r["loss"] for r in read_metrics(tmp_path / "whole" / "run")]
    b = [r["loss"] for r in read_metrics(run)]
    assert [r["iteration"] for r in read_metrics(run)] == [1, 2, 3, 4]
    assert b == a  # bit for bit: same data, same order of sums, same optimizer state
    last_a = ckpt.latest(tmp_path / "whole" / "run")
    last_b = ckpt.latest(run)
    assert last_b.name == "step-000004" and len(ckpt.list_checkpoints(run)) == 2  # older ones pruned
    assert json.loads((last_b / "manifest.json").read_text())["losses"] == a
    for s in range(plan.num_stages):
        for name in (f"stage-{s}.safetensors", f"stage-{s}.optim.safetensors"):
            wa, wb = load_file(last_a / name), load_file(last_b / name)
            assert all((wa[k] == wb[k]).all() for k in wa), name
