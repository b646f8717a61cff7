"""The HDEE ensemble: a posterior-weighted mixture of next-token distributions, in log space."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.hdee.evaluate import combine
from skippipe.hdee.mixture import (
    estimate_log_prior,
    log_average,
    log_posterior,
    mixture_next_token,
    mixture_target_logprobs,
    uniform_log_prior,
    update_log_weights,
)


def _random_logprobs(k: int, n: int, t: int, v: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, N, T, V) log-softmax outputs and the (K, N, T) log-probabilities of random targets."""
    g = torch.Generator().manual_seed(seed)
    full = torch.log_softmax(3 * torch.randn(k, n, t, v, generator=g, dtype=torch.float64), dim=-1)
    targets = torch.randint(0, v, (n, t), generator=g)
    return full, full.gather(-1, targets.expand(k, n, t).unsqueeze(-1)).squeeze(-1)


def _random_prior(k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    return torch.log_softmax(torch.randn(k, generator=g, dtype=torch.float64), dim=0)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 5), t=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_posterior_weights_sum_to_one_at_every_position(k, t, seed):
    _, lp = _random_logprobs(k, 3, t, 7, seed)
    log_w = log_posterior(lp, _random_prior(k, seed))
    assert log_w.shape == lp.shape
    torch.testing.assert_close(log_w.exp().sum(dim=0), torch.ones(3, t, dtype=torch.float64))
    assert torch.all(log_w <= 1e-12)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 5), t=st.integers(1, 30), seed=st.integers(0, 10_000))
def test_the_ensemble_next_token_distribution_sums_to_one(k, t, seed):
    full, lp = _random_logprobs(k, 2, t, 11, seed)
    log_w = log_posterior(lp, _random_prior(k, seed))
    mix = mixture_next_token(full, log_w)  # (N, T, V)
    torch.testing.assert_close(mix.exp().sum(dim=-1), torch.ones(2, t, dtype=torch.float64))
    # and its value at the actual token is what mixture_target_logprobs scores
    direct = mixture_target_logprobs(lp, _random_prior(k, seed))
    target_ids = (full[0] == lp[0].unsqueeze(-1)).float().argmax(dim=-1, keepdim=True)
    torch.testing.assert_close(mix.gather(-1, target_ids).squeeze(-1), direct)


def test_the_first_token_is_predicted_by_the_prior_alone():
    _, lp = _random_logprobs(3, 4, 9, 5, seed=3)
    prior = _random_prior(3, seed=3)
    torch.testing.assert_close(log_posterior(lp, prior)[:, :, 0], prior[:, None].expand(3, 4))


@settings(max_examples=30, deadline=None)
@given(t=st.integers(1, 50), seed=st.integers(0, 10_000))
def test_one_expert_is_the_expert_itself(t, seed):
    _, lp = _random_logprobs(1, 3, t, 9, seed)
    torch.testing.assert_close(mixture_target_logprobs(lp, uniform_log_prior(1)), lp[0])
    full, lp = _random_logprobs(1, 1, t, 9, seed)
    torch.testing.assert_close(mixture_next_token(full, torch.zeros(1, 1, t, dtype=torch.float64)), full[0])


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 5), t=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_the_window_likelihood_is_the_prior_weighted_sum_of_expert_likelihoods(k, t, seed):
    """prod_t p_ens(x_t | x_<t) = sum_k pi_k prod_t p_k(x_t | x_<t): the chain rule of the mixture."""
    _, lp = _random_logprobs(k, 2, t, 6, seed)
    prior = _random_prior(k, seed)
    chained = mixture_target_logprobs(lp, prior).sum(dim=-1)
    direct = torch.logsumexp(prior[:, None] + lp.sum(dim=-1), dim=0)
    torch.testing.assert_close(chained, direct)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(2, 5), t=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_the_mixture_never_scores_worse_than_the_log_average_over_a_window(k, t, seed):
    """log of a mean >= mean of logs (Jensen): averaging log-probabilities is not the mixture."""
    _, lp = _random_logprobs(k, 2, t, 6, seed)
    mix = mixture_target_logprobs(lp, uniform_log_prior(k)).sum(dim=-1)
    avg = log_average(lp).sum(dim=-1)
    assert torch.all(mix >= avg - 1e-9)


def test_log_average_is_the_geometric_mean_of_perplexities_not_the_mixture():
    lp = torch.log(torch.tensor([[[0.5, 0.5]], [[0.01, 0.01]]], dtype=torch.float64))  # two experts, one window
    assert float(-log_average(lp).mean()) == pytest.approx(-(math.log(0.5) + math.log(0.01)) / 2)
    # the mixture: the posterior moves to the first expert after one token
    mix = mixture_target_logprobs(lp, uniform_log_prior(2))
    assert float(mix[0, 0]) == pytest.approx(math.log(0.255))
    assert float(mix[0, 1]) == pytest.approx(math.log((0.5 * 0.5 * 0.5 + 0.5 * 0.01 * 0.01) / (0.5 * 0.5 + 0.5 * 0.01)))


def test_the_posterior_moves_to_the_expert_that_predicts_the_context_best():
    g = torch.Generator().manual_seed(0)
    t = 200
    good = torch.log(torch.full((1, 1, t), 0.3, dtype=torch.float64))
    noise = 0.05 * torch.randn(2, 1, t, generator=g, dtype=torch.float64)
    lp = torch.cat([good, good - 0.4, good - 0.1]) + torch.cat([torch.zeros(1, 1, t), noise])  # expert 0 is best
    w = log_posterior(lp, uniform_log_prior(3)).exp()[:, 0, :]
    assert w[0, 0] == pytest.approx(1 / 3)
    assert w[0, 20] > w[0, 5] > w[0, 0]
    assert float(w[0, -1]) > 0.999
    # and it goes to whichever expert that is, whatever its index
    w = log_posterior(lp[[2, 1, 0]], uniform_log_prior(3)).exp()[:, 0, -1]
    assert int(torch.argmax(w)) == 2


def test_a_strong_prior_is_overturned_by_enough_evidence():
    lp = torch.stack([torch.full((1, 500), math.log(0.1)), torch.full((1, 500), math.log(0.2))]).double()
    prior = torch.log(torch.tensor([0.999999, 0.000001], dtype=torch.float64))
    w = log_posterior(lp, prior).exp()[:, 0, :]
    assert w[0, 0] > 0.99 and w[1, -1] > 0.99


def test_log_space_stays_finite_on_long_contexts():
    t = 100_000
    g = torch.Generator().manual_seed(1)
    lp = -torch.rand(3, 1, t, generator=g, dtype=torch.float64) * 8 - 2  # every token p < e^-2
    assert torch.exp(lp.sum(dim=-1)).max() == 0  # the plain product underflows to 0 long before the end
    w = log_posterior(lp, uniform_log_prior(3))
    mix = mixture_target_logprobs(lp, uniform_log_prior(3))
    assert torch.isfinite(w).all() and torch.isfinite(mix).all()
    torch.testing.assert_close(w.exp().sum(dim=0), torch.ones(1, t, dtype=torch.float64))
    torch.testing.assert_close(mix.sum(dim=-1), torch.logsumexp(lp.sum(dim=-1) - math.log(3), dim=0))
    # float32 inputs work too: the arithmetic happens in float64
    assert torch.isfinite(mixture_target_logprobs(lp.float(), uniform_log_prior(3))).all()


def test_token_by_token_updates_match_the_whole_window_posterior():
    full, lp = _random_logprobs(3, 1, 25, 8, seed=7)
    prior = _random_prior(3, seed=7)
    whole = log_posterior(lp, prior)[:, 0, :]
    log_w = prior
    for t in range(25):
        torch.testing.assert_close(log_w, whole[:, t])
        log_w = update_log_weights(log_w, lp[:, 0, t])


def test_the_validation_prior_goes_to_the_expert_that_explains_validation():
    g = torch.Generator().manual_seed(0)
    ll = -100 + torch.randn(3, 50, generator=g, dtype=torch.float64)
    ll[1] += 30  # expert 1 explains every validation window far better
    log_pi = estimate_log_prior(ll, floor=1e-3)
    pi = log_pi.exp()
    assert float(pi.sum()) == pytest.approx(1.0)
    assert int(torch.argmax(pi)) == 1
    assert float(pi.min()) >= 1e-3 - 1e-12  # the floor keeps every expert usable


def test_the_validation_prior_splits_mass_between_windows_each_expert_explains():
    ll = torch.full((2, 40), -50.0, dtype=torch.float64)
    ll[0, :30] += 40  # expert 0 wrote 30 windows, expert 1 the other 10
    ll[1, 30:] += 40
    pi = estimate_log_prior(ll, floor=0.0).exp()
    torch.testing.assert_close(pi, torch.tensor([0.75, 0.25], dtype=torch.float64), atol=1e-6, rtol=0)
    same = estimate_log_prior(torch.zeros(4, 10, dtype=torch.float64)).exp()
    torch.testing.assert_close(same, torch.full((4,), 0.25, dtype=torch.float64))


def test_combine_reports_every_combiner_and_the_oracle():
    _, test_lp = _random_logprobs(3, 4, 16, 6, seed=11)
    _, val_lp = _random_logprobs(3, 4, 16, 6, seed=12)
    row = combine(test_lp.float(), val_lp.float(), own=2)
    losses = -test_lp.mean(dim=(1, 2))
    assert row["oracle"] == pytest.approx(float(losses[2]))
    best = int(torch.argmin(-val_lp.mean(dim=(1, 2))))
    assert row["best_single_index"] == best and row["best_single"] == pytest.approx(float(losses[best]))
    assert sum(row["prior"]) == pytest.approx(1.0)
    assert combine(test_lp.float(), val_lp.float(), own=None)["oracle"] is None
    # with one expert every combiner is that expert
    one = combine(test_lp[:1].float(), val_lp[:1].float(), own=0)
    for key in ("uniform", "val_prior", "best_single", "oracle", "log_average"):
        assert one[key] == pytest.approx(float(losses[0]), rel=1e-6)
