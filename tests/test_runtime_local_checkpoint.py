"""Real workers with ``[run] checkpoint_storage = "local"``: gather gives the shared checkpoint, and
--resume from the local folders gives the losses of a shared-storage resume, bit for bit."""

from __future__ import annotations

import shutil

import pytest

from runtime_fixtures import same_checkpoint, seven_node_plan, write_config
from skippipe.cli import main
from skippipe.model.checkpoint import load_checkpoint, load_model
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime import local_checkpoint as L
from skippipe.runtime.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_local_checkpoints_gather_and_resume_like_shared_ones(tmp_path, capsys):
    plan = seven_node_plan()
    run = {"checkpoint_every": 1, "keep_checkpoints": 2}
    shared = write_config(tmp_path / "shared", plan, steps=4, run=run)
    local = write_config(tmp_path / "local", plan, steps=4, run={**run, "checkpoint_storage": "local"})
    assert main(["train", str(shared), "--until", "2", "--no-progress"]) == 0
    assert main(["train", str(local), "--until", "2", "--no-progress"]) == 0
    lrun, srun = tmp_path / "local" / "run", tmp_path / "shared" / "run"
    assert not (lrun / "checkpoints").exists()  # nothing in the shared layout
    owners = sorted(p.name for p in (lrun / "local").iterdir())
    assert owners == ["node-000", "node-002", "node-004", "node-005"]  # the first node of each stage, no replica
    for name in owners:  # each writer only its own stage (node 0 also the run metadata), the newest two steps
        steps = sorted(p.name for p in (lrun / "local" / name / "checkpoints").iterdir())
        assert steps == ["step-000001", "step-000002"]

    # gather from per-machine copies: the same checkpoint as the shared run's, readable by eval/export
    copies = []
    for name in owners:
        shutil.copytree(lrun / "local" / name, tmp_path / "copies" / name / name)
        copies.append(str(tmp_path / "copies" / name))
    out = tmp_path / "gathered"
    assert main(["checkpoint", "gather", *copies, "--out", str(out), "--no-progress"]) == 0
    same_checkpoint(ckpt.step_dir(srun, 2), out)
    load_model(load_checkpoint(out))
    capsys.readouterr()
    assert main(["eval", str(out), "--samples", "2"]) == 0
    assert "perplexity" in capsys.readouterr().out.lower()

    # the last stage's node lost its step 2: resume agrees on step 1, the newest step every writer holds
    shutil.rmtree(L.node_checkpoints(lrun / "local", 5) / "step-000002")
    assert main(["train", str(shared), "--resume", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["train", str(local), "--resume", "--no-progress"]) == 0
    said = capsys.readouterr()
    assert "from step 1 to step 4" in said.out + said.err
    a = [r["loss"] for r in read_metrics(srun)]
    b = [r["loss"] for r in read_metrics(lrun)]
    assert [r["iteration"] for r in read_metrics(lrun)] == [1, 2, 3, 4]
    assert b == a  # bit for bit, though the local run went back to step 1
    log = (lrun / "logs" / "node-001.log").read_text()
    assert "resumed from local step 1 (joined: received stage state" in log and "from node 0" in log  # from its owner
    assert "resumed from local step 1, stage 2 from" in (lrun / "logs" / "node-004.log").read_text()  # alone: its disk

    out4 = tmp_path / "gathered-4"
    assert main(["checkpoint", "gather", str(lrun / "local"), "--out", str(out4), "--no-progress"]) == 0
    assert ckpt.verify(out4, plan).losses == a
    same_checkpoint(ckpt.step_dir(srun, 4), out4)  # weights and AdamW state as the shared resume left them

    # the gathered folder in the run's checkpoints/: --resume with shared storage reads it as is
    shutil.copytree(out4, ckpt.step_dir(lrun, 4))
    write_config(tmp_path / "local", plan, steps=5, run=run)  # the same run, storage "shared" now
    assert main(["train", str(local), "--resume", "--no-progress"]) == 0
    assert main(["train", str(shared), "--resume", "--steps", "5", "--no-progress"]) == 0
    assert [r["loss"] for r in read_metrics(lrun)] == [r["loss"] for r in read_metrics(srun)]
    assert len(read_metrics(lrun)) == 5
    write_config(tmp_path / "local", plan, steps=4, run={**run, "checkpoint_storage": "local"})

    # a stage file broken on its node's disk: every worker stops with one line, exit code 2
    f = L.node_checkpoints(lrun / "local", 4) / "step-000004" / "stage-2.safetensors"
    data = bytearray(f.read_bytes())
    data[300] ^= 1
    f.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["train", str(local), "--resume", "--steps", "6", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "stage-2.safetensors: sha256 does not match its manifest" in err and err.count("\n") == 1
