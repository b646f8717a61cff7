"""``skippipe hdee generate``: sample text from a configuration's ensemble.

Each new token is drawn from the mixture sum_k w_k p_k(. | context), where w is the posterior
over experts given every token so far (the prompt included), updated by Bayes' rule after each
token, in log space. The text starts as a new document (after the end-of-text token), like the
training data; each expert sees the last ``ctx`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from skippipe.data.tokenizer import Tokenizer
from skippipe.errors import UserError
from skippipe.hdee.evaluate import expert_target_logprobs
from skippipe.hdee.mixture import mixture_next_token, uniform_log_prior, update_log_weights
from skippipe.model.llama import Llama


@dataclass
class Sample:
    prompt: str
    text: str  # the continuation
    weights: list[float]  # posterior over the experts after the prompt and the continuation
    prompt_weights: list[float]  # posterior after the prompt alone


@torch.no_grad()
def generate(
    models: list[Llama], tokenizer: Tokenizer, prompt: str, max_tokens: int = 200, temperature: float = 0.8,
    seed: int = 0, log_prior: torch.Tensor | None = None,
) -> Sample:
    if max_tokens < 1:
        raise UserError("--tokens must be at least 1")
    if temperature < 0:
        raise UserError("--temperature must be >= 0 (0 = always the most likely token)")
    ctx = min(m.cfg.ctx for m in models)
    ids = [tokenizer.eot_id, *tokenizer.encode(prompt)]
    log_w = uniform_log_prior(len(models)) if log_prior is None else log_prior.to(torch.float64)
    if len(ids) > 1:  # the prompt's evidence: each expert's log-likelihood of it (its last ctx tokens)
        window = np.asarray([ids[-(ctx + 1):]], dtype=np.int64)
        log_w = update_log_weights(log_w, expert_target_logprobs(models, window)[:, 0].double().sum(dim=-1))
    prompt_weights = log_w.exp().tolist()
    gen = torch.Generator().manual_seed(seed)
    new: list[int] = []
    for _ in range(max_tokens):
        x = torch.tensor([ids[-ctx:]], dtype=torch.int64)
        lps = torch.stack([torch.log_softmax(m(x)[0, -1].float(), dim=-1) for m in models])  # (K, V)
        mix = mixture_next_token(lps, log_w)
        if temperature == 0:
            tok = int(torch.argmax(mix))
        else:
            tok = int(torch.multinomial(torch.softmax(mix / temperature, dim=-1), 1, generator=gen))
        log_w = update_log_weights(log_w, lps[:, tok])
        if tok == tokenizer.eot_id:
            break
        ids.append(tok)
        new.append(tok)
    return Sample(prompt, tokenizer.decode(new), log_w.exp().tolist(), prompt_weights)
