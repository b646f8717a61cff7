"""HDEE training jobs: resumable per expert, skipped when finished, branched from a seed model."""

from __future__ import annotations

import json

import pytest
import torch

from hdee_fixtures import write_config
from skippipe.hdee import checkpoint as ckpt
from skippipe.hdee.budget import ExpertPlan
from skippipe.hdee.checkpoint import JobCheckpointError
from skippipe.hdee.config import load_hdee_config
from skippipe.hdee.data import prepare_data
from skippipe.hdee.jobs import run_jobs
from skippipe.hdee.pipeline import expert_spec, seed_specs
from skippipe.hdee.train import load_expert, run_job
from skippipe.model.llama import Llama


@pytest.fixture
def setup(tmp_path):
    cfg = load_hdee_config(write_config(tmp_path)).with_run(dir=str(tmp_path / "run"))
    data = prepare_data(cfg, cfg.run.dir, lambda line: None)
    return cfg, data


def _weights(run_dir, folder):
    return {k: v.clone() for k, v in load_expert(run_dir, folder).state_dict().items()}


def test_an_interrupted_expert_resumes_to_the_same_weights(setup, tmp_path):
    cfg, data = setup
    spec = expert_spec(cfg, data, tmp_path / "run", {}, ExpertPlan("red", "M", 8, 0))
    lines: list[str] = []
    whole = run_job(spec, tmp_path / "whole", data=data, report=lines.append)
    assert not whole.skipped and whole.steps_done == 8

    first = run_job(spec, tmp_path / "cut", data=data, until=3, report=lines.append)
    assert first.steps_done == 3 and not (tmp_path / "cut" / spec.folder / "final").exists()
    assert [p.name for p in ckpt.step_folders(tmp_path / "cut" / spec.folder)] == ["step-000002", "step-000003"]
    rest = run_job(spec, tmp_path / "cut", data=data, report=lines.append)
    assert rest.steps_done == 8 and any("resuming at step 3/8" in line for line in lines)
    assert rest.losses == pytest.approx(whole.losses, rel=1e-5)
    a, b = _weights(tmp_path / "whole", spec.folder), _weights(tmp_path / "cut", spec.folder)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)
    assert not (tmp_path / "cut" / spec.folder / "checkpoints").exists()  # step checkpoints go once the job is final

    again = run_job(spec, tmp_path / "cut", data=data, report=lines.append)
    assert again.skipped and again.steps_done == 8 and again.val_loss == rest.val_loss


def test_a_checkpoint_from_other_settings_or_corrupt_is_refused(setup, tmp_path):
    cfg, data = setup
    spec = expert_spec(cfg, data, tmp_path / "run", {}, ExpertPlan("blue", "S", 4, 0))
    run_job(spec, tmp_path / "r", data=data, until=2, report=lambda line: None)
    other = expert_spec(cfg.with_run(seed=5), data, tmp_path / "run", {}, ExpertPlan("blue", "S", 4, 0))
    assert other.folder == spec.folder and other.digest() != spec.digest()
    with pytest.raises(JobCheckpointError, match="other settings"):
        run_job(other, tmp_path / "r", data=data, report=lambda line: None)
    step = ckpt.step_folders(tmp_path / "r" / spec.folder)[-1]
    (step / "model.safetensors").write_bytes(b"broken")
    with pytest.raises(JobCheckpointError, match="missing or corrupt"):
        run_job(spec, tmp_path / "r", data=data, report=lambda line: None)


def test_experts_branch_from_the_seed_model_of_their_size(setup, tmp_path):
    cfg, data = setup
    run = tmp_path / "run"
    cfg = cfg.with_run(dir=str(run))
    seeds = seed_specs(cfg, data)
    assert sorted(seeds) == ["L", "M", "S"]  # size-heterogeneous configurations branch S and L experts too
    run_job(seeds["L"], run, data=data, report=lambda line: None)
    spec = expert_spec(cfg, data, run, seeds, ExpertPlan("green", "L", 1, 0))
    assert spec.init.endswith("seeds/L/final") and spec.init_digest == seeds["L"].digest()
    seed_weights = _weights(run, seeds["L"].folder)
    result = run_job(spec, run, data=data, report=lambda line: None)
    assert result.steps_done == 1
    moved = _weights(run, spec.folder)
    assert set(moved) == set(seed_weights)
    # one step from the seed: close to it, far from a fresh initialisation of the same shape
    fresh = Llama(spec.model_config()).state_dict()
    step_gap = max(float((moved[k] - seed_weights[k]).abs().max()) for k in moved)
    fresh_gap = max(float((moved[k] - fresh[k]).abs().max()) for k in moved)
    assert 0 < step_gap < fresh_gap / 2
    manifest = json.loads((run / spec.folder / "final" / "manifest.json").read_text())
    assert manifest["flops"] == spec.flops() and "green" in manifest["val_loss"]


def test_parallel_jobs_give_the_same_experts_as_one_after_another(setup, tmp_path):
    """Experts are independent: two worker processes train them to the same weights as one process."""
    cfg, data = setup
    specs = [expert_spec(cfg, data, tmp_path / "run", {}, ExpertPlan(d, "S", 3, 0)) for d in ("red", "green")]
    lines: list[str] = []
    together = run_jobs(specs, tmp_path / "run", jobs=2, log=lines.append)
    assert [r.steps_done for r in together] == [3, 3]
    assert any(line.startswith("[expert red-S-3] done") for line in lines)
    for spec in specs:
        alone = run_job(spec, tmp_path / "alone", data=data, report=lambda line: None)
        assert alone.losses == pytest.approx(together[specs.index(spec)].losses, rel=1e-5)
        a, b = _weights(tmp_path / "run", spec.folder), _weights(tmp_path / "alone", spec.folder)
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)
