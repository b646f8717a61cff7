"""The distributed runtime (7 gloo processes) matches the single-process reference executor:
same losses and same final weights, relative 1e-5."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from runtime_fixtures import seven_node_plan, write_config
from skippipe.data.dataset import token_data_for
from skippipe.runtime.config import load_run_config
from skippipe.runtime.job import format_summary, prepare, train
from skippipe.train.executor import ReferenceExecutor, plan_batch_fn

pytestmark = pytest.mark.slow


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / max(float(b.norm()), 1e-12))


MIXED = {"precision": "bf16", "activation_checkpointing": True}


@pytest.mark.parametrize(
    "emulate, deterministic, settings",
    [(False, True, {}), (True, False, {}), (False, True, MIXED)],
    ids=["direct-deterministic", "emulated-all-reduce", "direct-deterministic-bf16-checkpointed"],
)
def test_distributed_run_matches_reference_executor(tmp_path, emulate, deterministic, settings):
    plan = seven_node_plan()
    steps = 3
    runtime = {"emulate": emulate, "time_scale": 0.02, "deterministic": deterministic}
    cfg = load_run_config(write_config(tmp_path, plan, steps=steps, runtime=runtime, train=settings))
    prep = prepare(cfg, tmp_path / "run")
    summary = train(prep, progress=False)
    assert summary.iterations == steps
    tokens = len(plan.microbatches) * 2 * 16  # samples per microbatch x context of the tiny test model
    assert prep.tokens_per_iteration == tokens and prep.flops_per_iteration > 0
    assert summary.throughput is not None and summary.throughput.gpu is None  # a CPU run: no utilisation
    assert summary.throughput.tokens_per_s == pytest.approx(tokens / summary.mean_iter_s)
    assert "tokens/s" in format_summary(summary, emulate, 0.02)

    torch.set_num_threads(1)  # as in the workers: the same kernels, the same rounding
    tc = cfg.train_config()
    data = token_data_for(tc)
    model_cfg = tc.model_config(data.vocab_size)
    ref = ReferenceExecutor(plan, model_cfg, tc, plan_batch_fn(plan, data.train, tc, tc.tokens_per_sample(model_cfg)))
    ref_losses = [ref.step().loss for _ in range(steps)]
    got = [r["loss"] for r in summary.records]
    assert got == pytest.approx(ref_losses, rel=1e-5)
    if deterministic:  # gradients added in the reference's order: bit for bit
        assert got == ref_losses
    assert got[-1] != got[0]  # it trained

    folder = summary.checkpoint
    assert folder is not None and folder.name == f"step-{steps:06d}"
    for s in range(plan.num_stages):
        weights = load_file(folder / f"stage-{s}.safetensors")
        expected = ref.stage_module(s).state_dict()
        assert set(weights) == set(expected)
        for name, value in expected.items():
            assert _rel(weights[name], value) <= 1e-5, (s, name)
            if deterministic:
                assert torch.equal(weights[name], value), (s, name)
