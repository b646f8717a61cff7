"""The baselines of the at-scale experiments: count-based n-gram perplexities and LayerDrop-style
random stage dropout on a full-pipeline plan."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.data.ngram import BigramCounts, ngram_baselines
from skippipe.model.config import ModelConfig
from skippipe.train.config import TrainConfig
from skippipe.train.executor import ReferenceExecutor, plan_batch_fn
from skippipe.train.layerdrop import LayerDropExecutor, drawn_paths, keep_probability
from toy_plans import full_plan

torch.set_num_threads(1)


# ---------------------------------------------------------------- n-gram baselines
def test_bigram_learns_a_deterministic_successor_and_unigram_sees_uniform_tokens():
    V = 16
    train = np.tile(np.arange(V), 200)
    val = np.tile(np.arange(V), 10)
    b = ngram_baselines(train, val, V)
    assert b.bigram_ppl < 1.1  # the next token is always known
    assert b.unigram_ppl == pytest.approx(V, rel=0.01)  # every token equally frequent
    assert b.bigram_lambda == max(b.bigram_lambda, 0.9)  # the held-out tail favours the bigram


def test_iid_tokens_give_no_bigram_gain():
    rng = np.random.default_rng(0)
    V = 8
    b = ngram_baselines(rng.integers(0, V, 50_000), rng.integers(0, V, 5_000), V)
    assert b.unigram_ppl == pytest.approx(V, rel=0.02)
    assert b.bigram_ppl >= b.unigram_ppl * 0.99  # nothing to learn from the previous token


def test_interpolation_weight_is_chosen_without_the_validation_tokens():
    rng = np.random.default_rng(1)
    train = rng.integers(0, 12, 20_000)
    a = ngram_baselines(train, rng.integers(0, 12, 500), 12)
    b = ngram_baselines(train, np.tile(np.arange(12), 40), 12)
    assert a.bigram_lambda == b.bigram_lambda


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=2, max_size=200), st.lists(st.integers(0, 5), min_size=2, max_size=50),
       st.sampled_from([0.5, 0.9, 0.98]))
def test_bigram_probabilities_are_a_distribution(train, val, lam):
    counts = BigramCounts(np.array(train), 6)
    for prev in range(6):  # every next-token distribution sums to one
        total = sum(math.exp(-counts.bigram_nll(np.array([prev, nxt]), lam)) for nxt in range(6))
        assert total == pytest.approx(1.0)
    assert counts.bigram_nll(np.array(val), lam) >= 0


def test_bad_token_ids_are_refused():
    with pytest.raises(ValueError, match="token ids"):
        BigramCounts(np.array([0, 1, 9]), 4)


# ---------------------------------------------------------------- LayerDrop
def test_keep_probability_gives_the_expected_depth_of_a_path():
    assert keep_probability(6, 4) == pytest.approx(3 / 5)
    assert keep_probability(4, 3) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        keep_probability(4, 5)


def test_drawn_paths_are_reproducible_ordered_subsets_at_the_expected_depth():
    plan = full_plan(num_stages=6, chains=2, m=5, n_layers=6)
    a, b = drawn_paths(plan, 0.6, seed=3, iteration=7), drawn_paths(plan, 0.6, seed=3, iteration=7)
    assert a == b
    assert a != drawn_paths(plan, 0.6, seed=3, iteration=8)
    for mb in plan.microbatches:
        kept = a[mb.id]
        assert kept == [n for n in mb.path if n in kept]  # pipeline order kept
    depths = [len(p) for it in range(200) for p in drawn_paths(plan, 0.6, 0, it).values()]
    assert np.mean(depths) == pytest.approx(5 * 0.6, abs=0.1)


CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=64, ctx=16, seed=1)
TOKENS = np.tile(np.random.default_rng(0).integers(0, 64, 37), 600).astype(np.int32)


def executors(keep: float):
    plan = full_plan(num_stages=4, chains=2, m=2, n_layers=4, samples=2, d_model=32, ctx=12)
    tc = TrainConfig(lr=1e-3, warmup_steps=0, steps=3, samples_per_microbatch=2)
    batches = plan_batch_fn(plan, TOKENS, tc, 12)
    return plan, ReferenceExecutor(plan, CFG, tc, batches), LayerDropExecutor(plan, CFG, tc, batches, keep)


def test_keeping_every_stage_is_the_reference_executor_exactly():
    _, ref, drop = executors(1.0)
    for _ in range(3):
        assert drop.step().microbatch_loss == ref.step().microbatch_loss
    assert all(torch.equal(v, drop.state_dict()[k]) for k, v in ref.state_dict().items())


def test_dropped_stages_average_over_the_microbatches_that_ran_them():
    plan, _, drop = executors(0.5)
    for _ in range(3):
        r = drop.step()
        assert all(math.isfinite(x) for x in r.microbatch_loss.values())
        visits = [len(plan.microbatches)] + [0] * (plan.num_stages - 1)
        for path in drop.paths.values():
            for node in path:
                visits[plan.stage_of()[node]] += 1
        assert drop.divisors == visits
    assert drop.copies_identical()


def test_stage_dropout_needs_the_visits_divisor():
    plan, _, _ = executors(1.0)
    tc = TrainConfig(samples_per_microbatch=2, grad_divisor="microbatches")
    with pytest.raises(ValueError, match="visits"):
        LayerDropExecutor(plan, CFG, tc, plan_batch_fn(plan, TOKENS, tc, 12), 0.5)
    assert replace(tc, grad_divisor="visits").grad_divisor == "visits"
