"""HDEE compute accounting: FLOPs per expert, configurations under one budget, difficulty scores."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.errors import UserError
from skippipe.hdee.budget import BudgetError, Configuration, level_of, plan_configuration, plan_configurations, size_of
from skippipe.hdee.difficulty import manual_scores, normalise, probe_raw, seed_loss_raw
from skippipe.hdee.flops import forward_flops_per_token, matmul_params, train_flops, train_flops_per_step
from skippipe.model.config import ModelConfig
from skippipe.model.llama import Llama

M = ModelConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, ctx=16)


def _sized(ffn: int, layers: int = 2) -> ModelConfig:
    return ModelConfig(**{**M.to_dict(), "ffn_dim": ffn, "n_layers": layers})


def test_matmul_params_are_the_weights_of_every_linear_layer_of_the_model():
    for cfg in (M, _sized(48), _sized(80, layers=3)):
        model = Llama(cfg)
        linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        assert matmul_params(cfg) == linear


def test_flops_follow_the_kaplan_rule():
    per_token = 2 * matmul_params(M) + 2 * M.n_layers * M.ctx * M.d_model
    assert forward_flops_per_token(M, M.ctx) == per_token
    assert train_flops_per_step(M, 8, M.ctx) == 8 * M.ctx * 3 * per_token
    assert train_flops(M, 10, 8, M.ctx) == 10 * train_flops_per_step(M, 8, M.ctx)


@settings(max_examples=30, deadline=None)
@given(ffn=st.integers(8, 400), shift=st.integers(1, 7), layers=st.integers(1, 6))
def test_small_plus_large_costs_exactly_two_medium(ffn, shift, layers):
    """The paper's ladder: MLP widths M -/+ delta, so S + L = 2 x M in FLOPs (the cost is affine in the width)."""
    small, medium, large = _sized(ffn, layers), _sized(ffn + shift, layers), _sized(ffn + 2 * shift, layers)
    cost = {c: train_flops_per_step(c, 4, 16) for c in (small, medium, large)}
    assert cost[small] + cost[large] == 2 * cost[medium]
    assert cost[small] < cost[medium] < cost[large]


STEP_FLOPS = {s: train_flops_per_step(_sized(f), 16, 16) for s, f in (("S", 48), ("M", 64), ("L", 80))}


def test_the_paper_configurations_match_the_homogeneous_budget_exactly():
    scores = manual_scores({"easy": "easy", "moderate": "moderate", "hard": "hard"})
    configs = plan_configurations(("homogeneous", "steps", "size", "both"), list(scores), {"manual": scores}, 400, 0.25,
                                  STEP_FLOPS, 0.01)
    by = {c.name: c for c in configs}
    budget = 3 * 400 * STEP_FLOPS["M"]
    assert [(e.size, e.steps) for e in by["homogeneous"].experts] == [("M", 400)] * 3
    assert [(e.size, e.steps) for e in by["steps/manual"].experts] == [("M", 300), ("M", 400), ("M", 500)]
    assert [(e.size, e.steps) for e in by["size/manual"].experts] == [("S", 400), ("M", 400), ("L", 400)]
    for name in ("homogeneous", "steps/manual", "size/manual"):
        assert by[name].flops == budget
    both = by["both/manual"]
    assert [e.size for e in both.experts] == ["S", "M", "L"]
    assert both.experts[0].steps < both.experts[1].steps < both.experts[2].steps  # and fewer than 300/400/500: L x 500 costs more
    assert abs(both.flops - budget) / budget < 0.01
    for c in configs:
        assert c.flops == sum(e.flops for e in c.experts)
        assert all(e.flops == e.steps * STEP_FLOPS[e.size] for e in c.experts)


@settings(max_examples=60, deadline=None)
@given(
    z=st.lists(st.floats(-1, 1, allow_nan=False), min_size=2, max_size=6),
    steps=st.integers(200, 2000),
    spread=st.floats(0, 0.6),
    kind=st.sampled_from(["steps", "size", "both"]),
)
def test_any_difficulty_is_brought_onto_the_budget(z, steps, spread, kind):
    scores = {f"d{i}": v for i, v in enumerate(z)}
    config = plan_configuration(kind, "measured", scores, steps, spread, STEP_FLOPS)
    budget = len(z) * steps * STEP_FLOPS["M"]
    # steps are whole numbers: the budget is met to within half a step of the largest expert per expert
    assert abs(config.flops - budget) <= len(z) * 0.5 * STEP_FLOPS["L"]
    hardest, easiest = max(scores, key=scores.get), min(scores, key=scores.get)
    h, e = config.expert_for(hardest), config.expert_for(easiest)
    assert STEP_FLOPS[h.size] * h.steps >= STEP_FLOPS[e.size] * e.steps - STEP_FLOPS["L"]  # harder never gets less compute


def test_a_budget_that_rounding_cannot_meet_is_refused_in_one_line():
    scores = {"a": -1.0, "b": 1.0}
    with pytest.raises(BudgetError) as err:
        plan_configurations(("homogeneous", "both"), ["a", "b"], {"manual": scores}, 3, 0.25, STEP_FLOPS, 0.001)
    assert "away from the budget" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(BudgetError):
        plan_configurations(("steps",), ["a", "b"], {"manual": {"a": 0.0}}, 100, 0.25, STEP_FLOPS, 0.01)
    with pytest.raises(BudgetError):
        plan_configuration("steps", "manual", {"a": 2.0, "b": 0.0}, 100, 0.25, STEP_FLOPS)


def test_configurations_round_trip_through_json():
    scores = {"a": -1.0, "b": 0.0, "c": 1.0}
    for c in plan_configurations(("homogeneous", "both"), list(scores), {"manual": scores}, 400, 0.25, STEP_FLOPS, 0.01):
        assert Configuration.from_dict(c.to_dict()) == c
        assert len({e.name for e in c.experts}) == len(c.experts)  # one checkpoint folder per expert


def test_sizes_and_levels_from_scores():
    assert [size_of(z) for z in (-1, -0.5, -0.3, 0, 0.3, 0.5, 1)] == ["S", "S", "M", "M", "M", "L", "L"]
    assert level_of(-1) == "easy" and level_of(0) == "moderate" and level_of(1) == "hard"


def test_measured_scores_are_centred_and_scaled_to_the_most_extreme_domain():
    z = normalise({"a": 1.0, "b": 2.0, "c": 4.0})
    assert max(abs(v) for v in z.values()) == pytest.approx(1.0)
    assert sum(z.values()) == pytest.approx(0.0)
    assert z["a"] < z["b"] < z["c"] and z["c"] == pytest.approx(1.0)
    assert normalise({"a": 3.0, "b": 3.0}) == {"a": 0.0, "b": 0.0}
    with pytest.raises(UserError):
        normalise({"a": float("nan"), "b": 1.0})


def test_seed_loss_is_per_byte_so_the_tokenizer_does_not_decide():
    # the same loss per token is easier on a domain whose tokens carry more bytes
    raw = seed_loss_raw({"code": 2.0, "prose": 2.0}, {"code": 2.0, "prose": 4.0})
    assert raw == {"code": 1.0, "prose": 0.5}


def test_probe_scores_a_domain_still_learning_as_harder():
    flat = [3.0] * 40
    falling = [3.0 - 0.02 * i for i in range(40)]
    raw = probe_raw({"flat": flat, "falling": falling})
    assert raw["flat"] == pytest.approx(0.0) and raw["falling"] > 0.05
    with pytest.raises(UserError):
        probe_raw({"short": [1.0] * 5})


def test_measured_difficulty_becomes_sizes_and_steps_under_the_budget():
    """The whole chain: a seed model's per-domain loss -> scores -> a plan on the homogeneous budget."""
    raw = seed_loss_raw({"easy": 1.0, "mid": 2.2, "hard": 3.0}, {"easy": 1.0, "mid": 1.0, "hard": 1.0})
    z = normalise(raw)
    configs = plan_configurations(("homogeneous", "steps", "size"), list(z), {"seed-loss": z}, 400, 0.25, STEP_FLOPS, 0.01)
    by = {c.name: c for c in configs}
    steps = by["steps/seed-loss"]
    assert steps.expert_for("easy").steps < steps.expert_for("mid").steps < steps.expert_for("hard").steps
    assert [e.size for e in by["size/seed-loss"].experts] == ["S", "M", "L"]
    budget = by["homogeneous"].flops
    assert all(abs(c.flops - budget) / budget < 0.01 for c in configs)
