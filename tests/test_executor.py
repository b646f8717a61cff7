"""The reference executor against hand-built steps on the unsplit model, and its pieces."""

import math

import numpy as np
import pytest
import torch

from skippipe.errors import UserError
from skippipe.model.config import ModelConfig
from skippipe.model.llama import Llama
from skippipe.planfile import Constraints, Costs, Microbatch, Plan, check_plan
from skippipe.train.config import TrainConfig, load_train_config, train_config_from_dict
from skippipe.train.executor import ReferenceExecutor, plan_batch_fn
from skippipe.train.grads import (
    average_group,
    clip_coefficient,
    flat_grads,
    grad_divisor,
    set_flat_grads,
    stage_visits,
)
from skippipe.train.optim import lr_at, make_optimizer, set_lr
from toy_plans import full_plan, skip_plan

torch.set_num_threads(1)

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=64, ctx=16, seed=1)
TOKENS = np.tile(np.random.default_rng(0).integers(0, 64, 37), 600).astype(np.int32)  # learnable: period 37
SEQ = 12


def two_stage_plan() -> Plan:
    n = 4
    mbs = [Microbatch(0, 0, [2]), Microbatch(1, 0, [3]), Microbatch(2, 1, [3]), Microbatch(3, 1, [2])]
    plan = Plan(
        stages=[[0, 1], [2, 3]], layers=[[0, 1], [2, 3]], memory=[2] * n, constraints=Constraints(path_length=2),
        costs=Costs(transfer_s=np.ones((n, n)) - np.eye(n), forward_s=np.ones(n)), microbatches=mbs,
    )
    check_plan(plan)
    return plan


def hand_built_steps(plan, tc, steps, divisor_of_layer, grads_only=False):
    """The unsplit model: every microbatch runs the layers of its visited stages in path order,
    gradients summed, each parameter divided by its stage's divisor, clipped, AdamW."""
    model = Llama(CFG)
    opt = make_optimizer(model, tc)
    stage_of = plan.stage_of()
    batch = plan_batch_fn(plan, TOKENS, tc, SEQ)
    for it in range(steps):
        model.zero_grad()
        for mb in sorted(plan.microbatches, key=lambda m: m.id):
            order = list(plan.layers[0]) + [i for node in mb.path for i in plan.layers[stage_of[node]]]
            model.loss(*batch(it, mb.id), order=order).backward()
        for name, p in model.named_parameters():
            d = divisor_of_layer(name)
            p.grad = p.grad / d if p.grad is not None and d else torch.zeros_like(p)
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        if grads_only:
            return {name: p.grad for name, p in model.named_parameters()}
        set_lr(opt, lr_at(it, tc))
        opt.step()
    return model


def stage_divisor_fn(plan, mode):
    layer_stage = {i: s for s, ls in enumerate(plan.layers) for i in ls}

    def fn(name):
        stage = layer_stage[int(name.split(".")[1])] if name.startswith("layers.") else 0
        return grad_divisor(plan, stage, mode)

    return fn


def max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_one_step_on_a_two_stage_plan_equals_a_full_model_step():
    plan = two_stage_plan()
    tc = TrainConfig(lr=1e-3, warmup_steps=0, steps=4, samples_per_microbatch=2)
    ex = ReferenceExecutor(plan, CFG, tc, plan_batch_fn(plan, TOKENS, tc, SEQ))
    before = {k: v.clone() for k, v in ex.state_dict().items()}
    r = ex.step()
    assert r.grad_norm > tc.grad_clip  # clipping is exercised
    # every microbatch visits every stage: the plain data-parallel step, loss averaged over microbatches
    model = hand_built_steps(plan, tc, 1, lambda name: 4)
    assert max_diff(ex.state_dict(), model.state_dict()) < 1e-6
    assert max_diff(ex.state_dict(), before) > 1e-4  # the step moved the weights
    assert ex.copies_identical()


@pytest.mark.parametrize("mode", ["visits", "microbatches", "reference"])
def test_skip_plan_steps_equal_the_hand_built_math(mode):
    plan = skip_plan([2, 1, 1, 1], 3, 3, 4, seed=2, swap_fraction=1.0)
    assert any(plan.stage_of()[mb.path[0]] > plan.stage_of()[mb.path[1]] for mb in plan.microbatches)  # a swap
    tc = TrainConfig(lr=1e-3, warmup_steps=1, steps=3, samples_per_microbatch=2, grad_divisor=mode)
    ex = ReferenceExecutor(plan, CFG, tc, plan_batch_fn(plan, TOKENS, tc, SEQ))
    for _ in range(3):
        ex.step()
    model = hand_built_steps(plan, tc, 3, stage_divisor_fn(plan, mode))
    assert max_diff(ex.state_dict(), model.state_dict()) < 1e-5
    assert ex.copies_identical()


@pytest.mark.parametrize("mode", ["visits", "microbatches"])
def test_averaged_clipped_gradients_equal_the_hand_built_ones(mode):
    """AdamW hides a constant factor per stage, so check the gradients themselves."""
    plan = skip_plan([2, 1, 1, 1], 3, 3, 4, seed=2, swap_fraction=1.0)
    tc = TrainConfig(samples_per_microbatch=2, grad_divisor=mode, grad_clip=0.5)
    ex = ReferenceExecutor(plan, CFG, tc, plan_batch_fn(plan, TOKENS, tc, SEQ))
    ex.forward_backward()
    assert ex.average_and_clip() > 0.5
    grads = {}
    for s in range(plan.num_stages):
        grads.update({n: p.grad for n, p in ex.stage_module(s).named_parameters()})
    want = hand_built_steps(plan, tc, 1, stage_divisor_fn(plan, mode), grads_only=True)
    assert max_diff(grads, want) < 1e-7
    wrong = hand_built_steps(plan, tc, 1, stage_divisor_fn(plan, "reference"), grads_only=True)
    assert max_diff(grads, wrong) > 1e-5


def test_copies_stay_identical_and_loss_falls():
    plan = skip_plan([3, 2, 2, 2], 3, 2, 4, seed=0)
    tc = TrainConfig(lr=3e-3, warmup_steps=2, steps=12, samples_per_microbatch=2)
    ex = ReferenceExecutor(plan, CFG, tc, plan_batch_fn(plan, TOKENS, tc, SEQ))
    losses = [ex.step().loss for _ in range(12)]
    assert ex.copies_identical()
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.05


def test_divisors():
    plan = skip_plan([5, 3, 3, 3, 3, 3], 4, 6, 12)
    assert stage_visits(plan) == [30, 18, 18, 18, 18, 18]
    assert [grad_divisor(plan, s, "visits") for s in range(6)] == [30, 18, 18, 18, 18, 18]
    assert grad_divisor(plan, 3, "microbatches") == 30
    assert grad_divisor(plan, 0, "reference") == 6 * 5 and grad_divisor(plan, 2, "reference") == 6 * 3
    assert stage_visits(full_plan(4, 3, 10, 12)) == [30] * 4
    with pytest.raises(ValueError):
        grad_divisor(plan, 0, "median")


def test_distributed_recipe_equals_group_average():
    """flat_grads -> sum (all_reduce) -> / divisor -> set_flat_grads, as model-api.md describes."""
    torch.manual_seed(0)
    copies = [Llama(CFG) for _ in range(3)]
    for i, c in enumerate(copies):
        if i < 2:  # the third copy processed nothing: no .grad at all
            c.loss(torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))).backward()
    summed = sum(flat_grads(c) for c in copies)
    dist = [Llama(CFG) for _ in range(3)]
    for d in dist:
        set_flat_grads(d, summed / 5)
    avg = average_group(copies, 5)
    assert torch.allclose(avg, summed / 5)
    for c, d in zip(copies, dist):
        assert torch.equal(flat_grads(c), flat_grads(d))
    average_group(copies, 0)
    assert float(flat_grads(copies[0]).abs().sum()) == 0.0


def test_clip_coefficient_matches_torch():
    model = Llama(CFG)
    model.loss(torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    sq = [float(g.double().pow(2).sum()) for g in grads]
    norm, factor = clip_coefficient(sq, 0.5)
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    assert norm == pytest.approx(float(total), rel=1e-6)
    for g, p in zip(grads, model.parameters()):
        assert torch.allclose(g * factor, p.grad, atol=1e-7)
    assert clip_coefficient([0.01], 1.0)[1] == 1.0 and clip_coefficient([100.0], 0.0)[1] == 1.0


def test_lr_schedule():
    tc = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, steps=110)
    assert lr_at(0, tc) == pytest.approx(1e-4)
    assert lr_at(9, tc) == pytest.approx(1e-3)
    assert lr_at(10, tc) == pytest.approx(1e-3)
    assert lr_at(60, tc) == pytest.approx(0.5 * (1e-3 + 1e-4))
    assert lr_at(110, tc) == pytest.approx(1e-4) and lr_at(500, tc) == pytest.approx(1e-4)
    lrs = [lr_at(t, tc) for t in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    assert math.isclose(lr_at(0, TrainConfig(warmup_steps=0, steps=5, lr=2e-3)), 2e-3)


def test_optimizer_decays_matrices_only():
    opt = make_optimizer(Llama(CFG), TrainConfig(weight_decay=0.1))
    decay, no_decay = opt.param_groups
    assert all(p.ndim == 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert all(p.ndim == 1 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0


def test_train_config_files(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[train]\nsteps = 7\nlr = 1e-3\ncorpus = ["bible"]\n\n[model]\npreset = "tiny"\nn_layers = 4\n')
    cfg = load_train_config(f)
    assert cfg.steps == 7 and cfg.corpus == ("bible",) and cfg.model_config(500).n_layers == 4
    assert cfg.model_config(500).vocab_size == 500
    j = tmp_path / "run.json"
    j.write_text('{"steps": 3, "grad_divisor": "reference"}')
    assert load_train_config(j).grad_divisor == "reference"
    for data, msg in [
        ({"stepz": 3}, "unknown key"),
        ({"steps": "3"}, "integer"),
        ({"grad_divisor": "median"}, "grad_divisor"),
        ({"lr": 1e-3, "min_lr": 1e-2}, "min_lr"),
        ({"model": {"preset": "huge"}}, "unknown model preset"),
        ({"corpus": ["poems"]}, "corpus"),
        ({"train": {}, "extra": 1}, "unknown top-level"),
    ]:
        with pytest.raises(UserError, match=msg):
            train_config_from_dict(data)
    with pytest.raises(UserError, match="no such config file"):
        load_train_config(tmp_path / "missing.toml")
