"""Local checkpoints (``[run] checkpoint_storage = "local"``) and ``skippipe checkpoint gather``, without workers:
the node folders are written by the same functions the workers call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime_fixtures import TINY_MODEL, TINY_TRAIN, same_checkpoint, seven_node_plan
from skippipe.cli import main
from skippipe.errors import ChecksumMismatch, ConfigError, LocalCheckpointError, MixedIterations, OutputError, StageMissing
from skippipe.model.checkpoint import load_checkpoint, load_model, write_checkpoint_meta
from skippipe.model.llama import build_stage
from skippipe.planfile import Plan
from skippipe.runtime import checkpoint as ckpt
from skippipe.runtime import local_checkpoint as L
from skippipe.runtime.config import run_config_from_dict
from skippipe.runtime.gather import gather
from skippipe.train.config import train_config_from_dict
from skippipe.train.optim import make_optimizer

LOSSES = [5.5, 5.25]


def _stages(plan: Plan, step: int) -> tuple[object, object, list[tuple[torch.nn.Module, torch.optim.Optimizer]]]:
    """Every stage of the tiny model with an AdamW state after ``step`` steps on a made-up loss."""
    train = train_config_from_dict({"train": {**TINY_TRAIN, "steps": 4}, "model": TINY_MODEL})
    model = train.model_config(257)
    out = []
    for s, layers in enumerate(plan.layers):
        module = build_stage(model, layers, s == 0)
        opt = make_optimizer(module, train)
        for _ in range(step):
            opt.zero_grad()
            sum((p * p).sum() for p in module.parameters()).backward()
            opt.step()
        out.append((module, opt))
    return train, model, out


def write_local(root: Path, plan: Plan, step: int, skip_stages: tuple[int, ...] = ()) -> None:
    """What the workers write with local storage: each stage's first node its stage, node 0 the run metadata."""
    train, model, stages = _stages(plan, step)
    digest = ckpt.plan_digest(plan)
    for s, (module, opt) in enumerate(stages):
        if s in skip_stages:
            continue
        owner = min(plan.stages[s])
        folder = L.node_checkpoints(root, owner) / L.step_name(step)
        ckpt.save_stage(folder, s, module, opt)
        L.write_stage_manifest(folder, step, s, owner, digest)
    folder = L.node_checkpoints(root, 0) / L.step_name(step)
    write_checkpoint_meta(folder, model, step, plan.layers, train=train.to_dict(), plan=plan)
    L.write_run_manifest(folder, step, plan.num_stages, digest, LOSSES[:step])


def write_shared(run_dir: Path, plan: Plan, step: int) -> Path:
    """The same state written the "shared" way (``saving.save_run_checkpoint`` without the barriers)."""
    train, model, stages = _stages(plan, step)
    folder = ckpt.begin(run_dir, step)
    for s, (module, opt) in enumerate(stages):
        ckpt.save_stage(folder, s, module, opt)

    def meta(f: Path) -> None:
        write_checkpoint_meta(f, model, step, plan.layers, train=train.to_dict(), plan=plan)

    return ckpt.commit(run_dir, step, plan, LOSSES[:step], keep=2, write_meta=meta)


@pytest.fixture(scope="module")
def plan() -> Plan:
    return seven_node_plan()


def _copies(root: Path, dest: Path) -> list[Path]:
    """The node folders as a user copies them off the machines: one folder per machine."""
    import shutil

    out = []
    for node in sorted(root.iterdir()):
        target = dest / f"machine-{node.name}"
        shutil.copytree(node, target / node.name)
        out.append(target)
    return out


def test_gather_gives_the_shared_folder(tmp_path, plan, capsys):
    write_local(tmp_path / "local", plan, 2)
    shared = write_shared(tmp_path / "run", plan, 2)
    machines = _copies(tmp_path / "local", tmp_path / "copies")
    assert len(machines) == 4  # nodes 0, 2, 4, 5: the first node of each stage
    out = tmp_path / "gathered" / "step-000002"
    assert main(["checkpoint", "gather", *map(str, machines), "--out", str(out), "--no-progress"]) == 0
    assert "gathered step 2: 4 stages" in capsys.readouterr().out
    same_checkpoint(shared, out)
    info = ckpt.verify(out, plan)
    assert info.step == 2 and info.losses == LOSSES
    model = load_model(load_checkpoint(out))  # what `skippipe eval` and `skippipe export` read
    assert sum(p.numel() for p in model.parameters()) > 0


def test_a_missing_stage_is_named_with_its_node(tmp_path, plan, capsys):
    write_local(tmp_path / "local", plan, 2, skip_stages=(2,))
    out = tmp_path / "out"
    with pytest.raises(StageMissing, match="stage 2 is in none of the folders given.*node 4"):
        gather([tmp_path / "local"], out, progress=False)
    assert not out.exists()
    assert main(["checkpoint", "gather", str(tmp_path / "local"), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stage 2" in err and "Traceback" not in err


def test_mixed_iterations_are_refused_and_a_common_step_can_be_chosen(tmp_path, plan):
    root = tmp_path / "local"
    write_local(root, plan, 1)
    write_local(root, plan, 2, skip_stages=(3,))  # stage 3's node stopped before step 2
    with pytest.raises(MixedIterations, match=r"stage 3 is only at step\(s\) 1"):
        gather([root], tmp_path / "out", progress=False)
    got = gather([root], tmp_path / "out", step=1, progress=False)
    assert got.step == 1 and ckpt.verify(got.path, plan).losses == LOSSES[:1]


def test_a_manifest_of_another_step_is_mixed(tmp_path, plan):
    root = tmp_path / "local"
    write_local(root, plan, 1)
    node = L.node_checkpoints(root, 4)
    (node / L.step_name(1)).rename(node / L.step_name(2))
    with pytest.raises(MixedIterations, match="says step 1 but lies in the folder of step 2"):
        gather([root], tmp_path / "out", progress=False)


def test_a_broken_copy_is_a_hash_mismatch(tmp_path, plan):
    root = tmp_path / "local"
    write_local(root, plan, 2)
    f = L.node_checkpoints(root, 5) / L.step_name(2) / "stage-3.optim.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    out = tmp_path / "out"
    with pytest.raises(ChecksumMismatch, match="stage-3.optim.safetensors: sha256 does not match"):
        gather([root], out, progress=False)
    assert not out.exists() and not list(tmp_path.glob(".out.partial-*"))


def test_gather_refuses_bad_inputs_and_outputs(tmp_path, plan):
    root = tmp_path / "local"
    write_local(root, plan, 2)
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("x")
    with pytest.raises(OutputError, match="not an empty folder"):
        gather([root], full, progress=False)
    assert (full / "mine.txt").read_text() == "x"
    with pytest.raises(LocalCheckpointError, match="step 7 is in none"):
        gather([root], tmp_path / "out", step=7, progress=False)
    with pytest.raises(LocalCheckpointError, match="holds no local checkpoint"):
        gather([tmp_path / "full"], tmp_path / "out", progress=False)
    import shutil

    shutil.rmtree(root / "node-000")
    with pytest.raises(LocalCheckpointError, match="run metadata"):
        gather([root], tmp_path / "out", progress=False)


def test_node_folders_keep_the_newest_and_drop_later_steps(tmp_path):
    mine = tmp_path / "node-003" / "checkpoints"
    for step in (1, 2, 3, 5):
        (mine / L.step_name(step)).mkdir(parents=True)
    (mine / ".step-000004.partial-abc").mkdir()
    L.clear_from(mine, 4)  # an earlier run's step 5 goes before step 4 is written
    assert [s for s, _ in L.step_folders(mine)] == [1, 2, 3]
    L.prune_node(mine, 2, 3)
    assert sorted(p.name for p in mine.iterdir()) == ["step-000002", "step-000003"]


@settings(max_examples=40, deadline=None)
@given(existing=st.sets(st.integers(1, 12), max_size=6), step=st.integers(1, 12), keep=st.integers(1, 4))
def test_a_node_keeps_its_newest_steps_up_to_the_one_written(tmp_path_factory, existing, step, keep):
    """Whatever an earlier run or an unfinished checkpoint left, after writing ``step`` a node's
    folder holds exactly its newest ``keep`` steps up to ``step``, and ``step`` among them."""
    mine = tmp_path_factory.mktemp("node") / "node-001" / "checkpoints"
    for s in existing:
        (mine / L.step_name(s)).mkdir(parents=True)
    L.clear_from(mine, step)
    (mine / L.step_name(step)).mkdir(parents=True)
    L.prune_node(mine, keep, step)
    assert [s for s, _ in L.step_folders(mine)] == sorted({s for s in existing if s < step} | {step})[-keep:]


def test_launcher_resumes_from_the_newest_finished_local_step(tmp_path, plan):
    run = tmp_path / "run"
    write_local(run / "local", plan, 1)
    write_local(run / "local", plan, 2, skip_stages=(1,))  # unfinished: stage 1 never wrote step 2
    plan_file, step = L.resume_point(run, "local", None)
    assert step == 1 and plan_file == L.node_checkpoints(run / "local", 0) / "step-000001" / "plan.json"
    assert L.newest(run, "local", None) == plan_file.parent
    with pytest.raises(LocalCheckpointError, match="no finished local checkpoint"):
        L.resume_point(run, "local", str(tmp_path / "elsewhere"))


def test_storage_settings_are_checked():
    cfg = run_config_from_dict({"run": {"checkpoint_storage": "local", "local_checkpoint_dir": "/scratch/ckpt"}})
    assert cfg.run.checkpoint_storage == "local" and L.root_of("RUN", cfg.run.local_checkpoint_dir) == Path("/scratch/ckpt")
    assert L.root_of("RUN", None) == Path("RUN/local")
    bad = [
        ({"run": {"checkpoint_storage": "nfs"}}, "checkpoint_storage must be one of"),
        ({"run": {"local_checkpoint_dir": "/x"}}, 'needs checkpoint_storage = "local"'),
        ({"run": {"checkpoint_storage": "local", "local_checkpoint_dir": ""}}, "must name a folder"),
        ({"run": {"checkpoint_storage": "local"}, "runtime": {"on_failure": "continue"}}, 'on_failure = "stop"'),
    ]
    for data, message in bad:
        with pytest.raises(ConfigError, match=message):
            run_config_from_dict(data)
    assert json.loads(json.dumps(cfg.to_dict()))["run"]["checkpoint_storage"] == "local"
