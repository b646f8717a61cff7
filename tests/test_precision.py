"""Mixed precision (bf16 autocast, fp32 master weights), activation checkpointing and the AdamW
kernel choice, on CPU (bf16 autocast runs on CPU too); the CUDA cases run only where CUDA exists."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from skippipe.model.config import ModelConfig
from skippipe.model.llama import build_stage
from skippipe.train.config import TrainConfig, train_config_from_dict
from skippipe.train.executor import ReferenceExecutor, plan_batch_fn
from skippipe.train.ops import autocast, backward_op, forward_op, loss_op
from skippipe.train.optim import adamw_kernel, make_optimizer
from toy_plans import skip_plan

torch.set_num_threads(1)

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=64, ctx=16, seed=1)
TOKENS = np.tile(np.random.default_rng(0).integers(0, 64, 37), 600).astype(np.int32)
SEQ = 12
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _executor(**train: object) -> ReferenceExecutor:
    plan = skip_plan([2, 2, 2], path_length=2, m=2, n_layers=4, samples=2, d_model=32, ctx=16)
    tc = TrainConfig(steps=8, lr=3e-3, warmup_steps=1, samples_per_microbatch=2, **train)  # type: ignore[arg-type]
    return ReferenceExecutor(plan, CFG, tc, plan_batch_fn(plan, TOKENS, tc, SEQ))


def test_config_reads_precision_and_checkpointing():
    tc = train_config_from_dict({"train": {"precision": "bf16", "activation_checkpointing": True}})
    assert tc.precision == "bf16" and tc.activation_checkpointing
    with pytest.raises(Exception, match="precision"):
        train_config_from_dict({"train": {"precision": "fp16"}})


def test_bf16_losses_finite_close_to_fp32_and_weights_stay_fp32():
    fp32, bf16 = _executor(), _executor(precision="bf16")
    a = [fp32.step().loss for _ in range(8)]
    b = [bf16.step().loss for _ in range(8)]
    assert all(np.isfinite(b))
    assert b[-1] < b[0]  # it trains
    assert np.allclose(a, b, rtol=0.03), (a, b)
    assert a != b  # autocast really ran in bf16
    for m in bf16.copies.values():
        assert all(p.dtype == torch.float32 for p in m.parameters())
    for opt in bf16.optimizers.values():
        for state in opt.state.values():
            assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
    assert bf16.copies_identical()


def test_autocast_computes_matmuls_in_bf16_on_cpu():
    stage = build_stage(CFG, [0], first=True)
    x = torch.randint(0, 64, (2, SEQ))
    with autocast(x.device, "bf16"):
        logits = stage.logits(stage(x))
    assert logits.dtype == torch.bfloat16
    saved = forward_op(stage, x, "bf16")
    assert saved.output.dtype == torch.float32  # what goes on to the next stage
    with pytest.raises(ValueError, match="precision"):
        autocast(x.device, "fp8")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_activation_checkpointing_gives_the_same_gradients(precision):
    grads = []
    for recompute in (False, True):
        first = build_stage(CFG, [0, 1], first=True, checkpointing=recompute)
        rest = build_stage(CFG, [2, 3], first=False, checkpointing=recompute)
        x, y = (torch.from_numpy(a.astype(np.int64)) for a in (TOKENS[:24].reshape(2, SEQ), TOKENS[1:25].reshape(2, SEQ)))
        s0 = forward_op(first, x, precision)
        s1 = forward_op(rest, s0.output, precision)
        _, g = loss_op(first, s1.output, y, precision)
        backward_op(s0, backward_op(s1, g))  # type: ignore[arg-type]
        grads.append({n: p.grad.clone() for m in (first, rest) for n, p in m.named_parameters() if p.grad is not None})
    plain, recomputed = grads
    assert set(plain) == set(recomputed) and len(plain) > 10
    for name in plain:
        assert torch.equal(plain[name], recomputed[name]), name


def test_checkpointing_keeps_fewer_tensors_for_the_backward():
    def saved_count(recompute: bool) -> int:
        stage = build_stage(CFG, [0, 1, 2, 3], first=True, checkpointing=recompute)
        count = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal count
            count += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            stage(torch.randint(0, 64, (2, SEQ)))
        return count

    assert saved_count(True) < saved_count(False) / 3


def test_executor_with_checkpointing_matches_without():
    plain, recomputed = _executor(), _executor(activation_checkpointing=True)
    for _ in range(3):
        assert plain.step().loss == recomputed.step().loss
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), recomputed.state_dict().values(), strict=True))


def test_adamw_kernel_is_foreach_on_cpu():
    assert adamw_kernel(torch.device("cpu")) == {"foreach": True}
    opt = make_optimizer(build_stage(CFG, [0], first=False), TrainConfig())
    assert opt.defaults["foreach"] is True and not opt.defaults.get("fused")


@CUDA
def test_adamw_is_fused_on_cuda_and_bf16_trains_there():
    stage = build_stage(CFG, [0, 1], first=True).cuda()
    opt = make_optimizer(stage, TrainConfig())
    assert opt.defaults["fused"] is True
    x = torch.from_numpy(TOKENS[:24].reshape(2, SEQ).astype(np.int64)).cuda()
    y = torch.from_numpy(TOKENS[1:25].reshape(2, SEQ).astype(np.int64)).cuda()
    saved = forward_op(stage, x, "bf16")
    loss, g = loss_op(stage, saved.output, y, "bf16")
    backward_op(saved, g)
    opt.step()
    assert np.isfinite(loss) and all(p.dtype == torch.float32 for p in stage.parameters())
