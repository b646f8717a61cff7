"""The grouped executor trains exactly like the reference executor (up to the order of
floating-point sums): same losses, same weights, for plans with skips and swaps, every gradient
divisor, and with LayerDrop-style stage dropout."""

import numpy as np
import pytest
import torch

from skippipe.model.config import ModelConfig
from skippipe.model.llama import Llama
from skippipe.train.config import TrainConfig
from skippipe.train.executor import ReferenceExecutor, plan_batch_fn
from skippipe.train.grouped import GroupedExecutor, param_stages
from skippipe.train.layerdrop import LayerDropExecutor
from toy_plans import full_plan, skip_plan

torch.set_num_threads(1)

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=6, n_heads=4, n_kv_heads=2, ffn_dim=64, ctx=16, seed=1)
TOKENS = np.tile(np.random.default_rng(0).integers(0, 64, 37), 600).astype(np.int32)
SEQ = 12


def run_both(plan, tc, keep=None, steps=3):
    batches = plan_batch_fn(plan, TOKENS, tc, SEQ)
    ref = ReferenceExecutor(plan, CFG, tc, batches) if keep is None else LayerDropExecutor(plan, CFG, tc, batches, keep)
    fast = GroupedExecutor(plan, CFG, tc, batches, keep)
    for _ in range(steps):
        a, b = ref.step(), fast.step()
        assert a.microbatch_loss.keys() == b.microbatch_loss.keys()
        for k, v in a.microbatch_loss.items():
            assert b.microbatch_loss[k] == pytest.approx(v, rel=1e-5, abs=1e-6)
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-4)
        assert b.lr == a.lr
    ref_state, fast_state = ref.state_dict(), fast.state_dict()
    assert ref_state.keys() == fast_state.keys()
    for k, v in ref_state.items():
        torch.testing.assert_close(fast_state[k], v, rtol=1e-3, atol=1e-4)  # Adam magnifies float noise in tiny grads


@pytest.mark.parametrize("divisor", ["visits", "microbatches", "reference"])
def test_skip_plan_with_swaps(divisor):
    plan = skip_plan([3, 2, 2], 2, 3, 6, seed=1, swap_fraction=0.5, samples=2, d_model=32, ctx=SEQ)
    tc = TrainConfig(lr=3e-3, warmup_steps=1, steps=3, samples_per_microbatch=2, grad_divisor=divisor, grad_clip=0.5)
    run_both(plan, tc)


def test_full_plan():
    plan = full_plan(num_stages=3, chains=2, m=3, n_layers=6, samples=2, d_model=32, ctx=SEQ)
    run_both(plan, TrainConfig(lr=3e-3, warmup_steps=0, steps=3, samples_per_microbatch=2))


def test_stage_dropout():
    plan = full_plan(num_stages=3, chains=2, m=3, n_layers=6, samples=2, d_model=32, ctx=SEQ)
    run_both(plan, TrainConfig(lr=3e-3, warmup_steps=0, steps=3, samples_per_microbatch=2, seed=4), keep=0.5)


def test_every_parameter_has_the_stage_of_its_layer():
    stages = param_stages(Llama(CFG), [[0, 1], [2, 3], [4, 5]])
    assert stages["embed_tokens.weight"] == stages["lm_head.weight"] == stages["norm.weight"] == 0
    assert {s for n, s in stages.items() if n.startswith("layers.3.")} == {1}
    assert {s for n, s in stages.items() if n.startswith("layers.5.")} == {2}


def test_train_plan_refuses_a_device_without_the_grouped_executor():
    from types import SimpleNamespace

    from skippipe.train.loop import train_plan

    plan = full_plan(num_stages=3, chains=2, m=3, n_layers=6, samples=2, d_model=32, ctx=SEQ)
    data = SimpleNamespace(train=TOKENS, val=TOKENS[:200], vocab_size=64)
    with pytest.raises(ValueError, match="grouped"):
        train_plan(plan, TrainConfig(steps=1, samples_per_microbatch=2), data, CFG, progress=False, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_grouped_executor_on_cuda_matches_cpu():
    plan = skip_plan([3, 2, 2], 2, 3, 6, seed=1, swap_fraction=0.5, samples=2, d_model=32, ctx=SEQ)
    tc = TrainConfig(lr=3e-3, warmup_steps=1, steps=3, samples_per_microbatch=2)
    batches = plan_batch_fn(plan, TOKENS, tc, SEQ)
    cpu, gpu = GroupedExecutor(plan, CFG, tc, batches), GroupedExecutor(plan, CFG, tc, batches, device="cuda")
    assert next(gpu.full_model().parameters()).is_cuda and gpu.optimizer.defaults["fused"] is True
    for _ in range(3):
        a, b = cpu.step(), gpu.step()
        assert b.loss == pytest.approx(a.loss, rel=1e-4)
    for k, v in cpu.state_dict().items():
        torch.testing.assert_close(gpu.state_dict()[k], v, rtol=1e-3, atol=1e-4)
