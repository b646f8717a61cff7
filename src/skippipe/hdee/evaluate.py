"""``skippipe hdee eval``: per-domain test loss of every configuration's ensemble.

For every domain (training and held-out) the test split is cut into non-overlapping windows of
``ctx + 1`` tokens. Every distinct expert of the run scores every window once; experts of the
same shape run batched together (their weights stacked, one ``vmap``-ed forward), and each
configuration then combines the rows of its own experts, all windows and positions at once:

- ``uniform``: the posterior-weighted mixture with a uniform prior;
- ``val_prior``: the same with the prior that maximises the likelihood of the domain's
  *validation* windows (EM, ``skippipe.hdee.mixture.estimate_log_prior``); test text is never
  used to fit anything;
- ``best_single``: the configuration's expert with the lowest validation loss, alone;
- ``oracle``: the domain's own expert, alone (training domains only);
- ``log_average``: the mean of the experts' log-probabilities - not a mixture, shown only to
  compare with the released HDEE code's ``simple_avg``.

Losses are nats per token (perplexity = exp) and bits per byte. Results go to
``RUN/eval/results.json``.
"""

from __future__ import annotations

import copy
import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from skippipe.errors import UserError
from skippipe.fileio import atomic_write_text
from skippipe.hdee.budget import Configuration
from skippipe.hdee.config import hdee_config_from_dict
from skippipe.hdee.data import bits_per_byte, eval_windows, load_run_data
from skippipe.hdee.mixture import estimate_log_prior, log_average, mixture_target_logprobs, uniform_log_prior
from skippipe.hdee.train import load_expert
from skippipe.model.llama import Llama

COMBINERS = ("uniform", "val_prior", "best_single", "oracle", "log_average")


def _shape_key(model: Llama) -> str:
    d = model.cfg.to_dict()
    d.pop("seed")
    return json.dumps(d, sort_keys=True)


def _target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _stacked_forward(members: list[Llama]) -> Callable[[torch.Tensor], torch.Tensor]:
    """One forward pass for several same-shaped models: x (B, T) -> logits (K, B, T, V)."""
    from torch.func import functional_call, stack_module_state

    params, buffers = stack_module_state(members)
    skeleton = copy.deepcopy(members[0]).to("meta")

    def one(p: dict, b: dict, x: torch.Tensor) -> torch.Tensor:
        return functional_call(skeleton, (p, b), (x,))

    batched = torch.vmap(one, in_dims=(0, 0, None))

    def forward(x: torch.Tensor) -> torch.Tensor:
        with warnings.catch_warnings():  # attention has no vmap rule on CPU yet: a loop inside, same result
            warnings.simplefilter("ignore", UserWarning)
            return batched(params, buffers, x)

    return forward


@torch.no_grad()
def expert_target_logprobs(models: list[Llama], windows: np.ndarray, batch_size: int = 16) -> torch.Tensor:
    """log p_k(x_t | x_<t) of every window's tokens under every model: (K, N, T), float32.
    Models of the same shape run as one batched (``torch.func.vmap``) forward pass."""
    x_all = torch.from_numpy(windows[:, :-1])
    y_all = torch.from_numpy(windows[:, 1:])
    out = torch.empty(len(models), *x_all.shape, dtype=torch.float32)
    groups: dict[str, list[int]] = {}
    for k, m in enumerate(models):
        groups.setdefault(_shape_key(m.eval()), []).append(k)
    for idx in groups.values():
        forward = _stacked_forward([models[k] for k in idx]) if len(idx) > 1 else lambda x, m=models[idx[0]]: m(x)[None]
        step = max(1, batch_size // len(idx))
        for i in range(0, len(x_all), step):
            x, y = x_all[i : i + step], y_all[i : i + step]
            out[idx, i : i + step] = _target_logprobs(forward(x), y.expand(len(idx), *y.shape))
    return out


def combine(config_lp_test: torch.Tensor, config_lp_val: torch.Tensor, own: int | None) -> dict[str, Any]:
    """Every combiner's mean test loss for one configuration on one domain. Inputs are (K, N, T)
    log-probabilities of the configuration's experts; ``own`` is the index of the domain's expert."""
    k = config_lp_test.shape[0]
    val_loss = -config_lp_val.double().mean(dim=(1, 2))
    test_loss = -config_lp_test.double().mean(dim=(1, 2))
    log_prior = estimate_log_prior(config_lp_val.double().sum(dim=-1))
    best = int(torch.argmin(val_loss))
    return {
        "uniform": float(-mixture_target_logprobs(config_lp_test, uniform_log_prior(k)).mean()),
        "val_prior": float(-mixture_target_logprobs(config_lp_test, log_prior).mean()),
        "best_single": float(test_loss[best]),
        "best_single_index": best,
        "oracle": float(test_loss[own]) if own is not None else None,
        "log_average": float(-log_average(config_lp_test).mean()),
        "prior": [float(p) for p in log_prior.exp()],
    }


def read_run(run_dir: str | Path) -> tuple[Any, dict, list[Configuration]]:
    run = Path(run_dir)
    for name in ("config.json", "plan.json"):
        if not (run / name).is_file():
            raise UserError(f"{run}: no {name}; run `skippipe hdee train` to the end first")
    cfg = hdee_config_from_dict(json.loads((run / "config.json").read_text()), where=str(run / "config.json"))
    plan = json.loads((run / "plan.json").read_text())
    return cfg, plan, [Configuration.from_dict(c) for c in plan["configurations"]]


def evaluate_run(run_dir: str | Path, windows: int | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    run = Path(run_dir)
    cfg, plan, configs = read_run(run)
    data = load_run_data(run)
    names = sorted(plan["experts"])
    models = [load_expert(run, plan["experts"][n]["folder"]) for n in names]
    ctx = models[0].cfg.ctx
    n_test = windows or cfg.ensemble.eval_windows
    results: dict[str, Any] = {
        "run": str(run), "seed": cfg.run.seed, "experts": {n: {} for n in names}, "domains": {},
        "configurations": {c.name: {"kind": c.kind, "difficulty": c.difficulty, "flops": c.flops,
                                    "experts": [e.name for e in c.experts], "domains": {}} for c in configs},
    }
    for spec in cfg.domains:
        tokens = data.domains[spec.name]
        test_w = eval_windows(tokens.splits["test"], ctx, n_test)
        val_w = eval_windows(tokens.splits["val"], ctx, cfg.ensemble.prior_windows)
        log(f"eval {spec.name} ({spec.role}): {len(names)} experts x {len(test_w)} test + {len(val_w)} validation windows")
        lp_test = expert_target_logprobs(models, test_w, cfg.ensemble.batch_size)
        lp_val = expert_target_logprobs(models, val_w, cfg.ensemble.batch_size)
        bpt = tokens.bytes_per_token["test"]
        results["domains"][spec.name] = {"role": spec.role, "source": spec.source, "difficulty": spec.difficulty,
                                         "test_tokens": int(lp_test[0].numel()), "bytes_per_token": bpt}
        for n, loss in zip(names, (-lp_test.double().mean(dim=(1, 2))).tolist()):
            results["experts"][n][spec.name] = loss
        for c in configs:
            idx = [names.index(e.name) for e in c.experts]
            own = next((i for i, e in enumerate(c.experts) if e.domain == spec.name), None)
            row = combine(lp_test[idx], lp_val[idx], own)
            row["best_single_expert"] = c.experts[row.pop("best_single_index")].name
            row["prior"] = dict(zip([e.name for e in c.experts], row["prior"]))
            row["bits_per_byte"] = {key: bits_per_byte(row[key], bpt) for key in COMBINERS if row[key] is not None}
            results["configurations"][c.name]["domains"][spec.name] = row
    out = run / "eval" / "results.json"
    atomic_write_text(out, json.dumps(results, indent=1) + "\n")
    return results


def perplexity(loss: float | None) -> float | None:
    return None if loss is None else math.exp(loss)
