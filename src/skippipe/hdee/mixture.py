"""The ensemble: a mixture of the experts' next-token distributions, weighted per token by the
posterior over experts given the preceding tokens. Everything is in log space (float64).

With K experts, a prior pi and a window x_1..x_T, the weight of expert k before token t is

    w_{k,t} = pi_k * prod_{s<t} p_k(x_s | x_<s) / sum_j (same for j)          (Bayes' rule)

and the ensemble predicts p(x_t | x_<t) = sum_k w_{k,t} p_k(x_t | x_<t). In logs:
log w = log pi + exclusive cumsum of log p_k - logsumexp over k, and
log p(x_t) = logsumexp_k(log w_{k,t} + log p_k(x_t)). Nothing is exponentiated before the
logsumexp, so windows of any length stay finite (the plain products underflow after a few
hundred tokens). The product over the window of these predictions is exactly
sum_k pi_k prod_t p_k(x_t), the likelihood of "one of the experts wrote this window".

``log_average`` (the mean of the experts' log-probabilities) is *not* a mixture: it scores the
geometric mean of the experts' perplexities (the released HDEE code's ``simple_avg``). It is
kept only to show the difference.
"""

from __future__ import annotations

import math

import torch


def uniform_log_prior(k: int) -> torch.Tensor:
    return torch.full((k,), -math.log(k), dtype=torch.float64)


def _prior_view(log_prior: torch.Tensor, target_logprobs: torch.Tensor) -> torch.Tensor:
    k = target_logprobs.shape[0]
    if log_prior.shape != (k,):
        raise ValueError(f"prior of shape {tuple(log_prior.shape)} for {k} experts")
    return log_prior.to(torch.float64).view(k, *([1] * (target_logprobs.ndim - 1)))


def log_posterior(target_logprobs: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
    """log w_{k,t}: ``target_logprobs`` is (K, ..., T), expert k's log p(x_t | x_<t) of the actual
    tokens; the result has the same shape and logsumexp over k is 0 at every position."""
    lp = target_logprobs.to(torch.float64)
    before = torch.cumsum(lp, dim=-1) - lp  # sum over s < t
    joint = _prior_view(log_prior, lp) + before
    return joint - torch.logsumexp(joint, dim=0, keepdim=True)


def mixture_target_logprobs(target_logprobs: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
    """log p_ens(x_t | x_<t) of the actual tokens, shape (..., T)."""
    lp = target_logprobs.to(torch.float64)
    return torch.logsumexp(log_posterior(lp, log_prior) + lp, dim=0)


def mixture_next_token(expert_logprobs: torch.Tensor, log_weights: torch.Tensor) -> torch.Tensor:
    """The ensemble's next-token log-distribution: ``expert_logprobs`` (K, ..., V) log-softmax
    outputs, ``log_weights`` (K, ...) log posterior weights (logsumexp over k = 0)."""
    w = log_weights.to(torch.float64).unsqueeze(-1)
    return torch.logsumexp(w + expert_logprobs.to(torch.float64), dim=0)


def update_log_weights(log_weights: torch.Tensor, token_logprobs: torch.Tensor) -> torch.Tensor:
    """The posterior after one more token: ``token_logprobs`` (K, ...) is each expert's log p of it."""
    joint = log_weights.to(torch.float64) + token_logprobs.to(torch.float64)
    return joint - torch.logsumexp(joint, dim=0, keepdim=True)


def log_average(target_logprobs: torch.Tensor) -> torch.Tensor:
    """Mean over experts of log p (NOT a probability mixture; see the module docstring)."""
    return target_logprobs.to(torch.float64).mean(dim=0)


def estimate_log_prior(window_loglik: torch.Tensor, iterations: int = 200, floor: float = 1e-3) -> torch.Tensor:
    """The prior pi that maximises sum_n log sum_k pi_k L_{k,n} over validation windows, by EM.

    ``window_loglik`` is (K, N): expert k's total log-likelihood of validation window n. Since
    the ensemble's likelihood of a window is exactly sum_k pi_k L_{k,n} (module docstring),
    this is the prior under which the ensemble predicts the validation text best. Every
    expert keeps at least ``floor`` of the mass so a test window that needs it is not
    scored at minus infinity. Returns log pi, shape (K,).
    """
    ll = window_loglik.to(torch.float64)
    k = ll.shape[0]
    if not 0 <= floor * k < 1:
        raise ValueError(f"floor {floor} is too large for {k} experts")
    log_pi = uniform_log_prior(k)
    for _ in range(iterations):
        post = log_pi[:, None] + ll
        post = post - torch.logsumexp(post, dim=0, keepdim=True)  # responsibilities, (K, N)
        pi = post.exp().mean(dim=1)
        pi = floor + (1 - floor * k) * pi / pi.sum()
        log_pi = pi.log()
    return log_pi
