"""The runs of the at-scale experiments (``claims_at_scale.py``): the plans, one training run,
and the omission sweep of its final model.

Plans: every configuration is planned by the real planner on the 20-node reference network
(the ``gcp20-current`` transfer matrix), with the reference model shape for the time axis
(24 layers, d_model 1024, ctx 1024, 8 samples, 0.055 s per layer and sample: 1.76 s per
forward of a 4-layer stage) and 6 microbatches per data node, 30 per iteration in every
configuration:

- ``full``: method ``full``, 6 stages [5, 3, 3, 3, 3, 3] (3 chains x 10 microbatches);
- ``skip-25``: method ``skippipe``, 4 stages [5, 5, 5, 5], path length 3;
- ``skip-33``: method ``skippipe``, 6 stages [5, 3, 3, 3, 3, 3], path length 4;
- ``layerdrop-33``: the ``full`` plan, every non-data stage kept with probability 3/5 afresh
  for every microbatch and iteration (``skippipe.train.layerdrop``): the depth of skip-33 in
  expectation, without planning.

The same plan trains the small model (its stages re-cut to the small model's layers: 2 per
stage with 6 stages, 3 with 4) and gives the simulated seconds per iteration on the reference
network, the time axis of the curves.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from skippipe.cluster import load_cluster
from skippipe.fileio import atomic_write_text
from skippipe.planfile import Plan
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.sim import simulate
from skippipe.workload import Workload

REFERENCE_T_LAYER_S = 0.055  # s per layer and sample of the reference layer (DESIGN section 3)
LAYOUTS = {  # omission layouts: stage 0 (embedding, its layers, head) is never omitted
    "S=6": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]],
    "S=4": [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]],
}
N_LAYERS = 12


@dataclass(frozen=True)
class RunKind:
    method: str
    num_stages: int
    path_length: int
    stage_sizes: tuple[int, ...]
    keep_stage: float | None = None  # LayerDrop: keep each non-data stage with this probability


KINDS = {
    "full": RunKind("full", 6, 6, (5, 3, 3, 3, 3, 3)),
    "skip-25": RunKind("skippipe", 4, 3, (5, 5, 5, 5)),
    "skip-33": RunKind("skippipe", 6, 4, (5, 3, 3, 3, 3, 3)),
    "layerdrop-33": RunKind("full", 6, 6, (5, 3, 3, 3, 3, 3), keep_stage=3 / 5),
}
FULL_S4 = RunKind("full", 4, 4, (5, 5, 5, 5))  # the other full-pipeline layout, for the time axis only


def reference_network():
    """The 20-node reference network with compute from the layer count (not a fixed forward time)."""
    return replace(load_cluster("gcp20-current"), stages=None, forward_s=None, t_layer_s=REFERENCE_T_LAYER_S)


def plan_for(kind: RunKind, seed: int = 0) -> Plan:
    workload = Workload(num_stages=kind.num_stages, path_length=kind.path_length, microbatches_per_data_node=6,
                        stage_sizes=kind.stage_sizes)
    plan = make_plan(kind.method, build_problem(reference_network(), workload), seed=seed, time_limit_s=None)
    if len(plan.microbatches) != 30:
        raise SystemExit(f"{kind}: {len(plan.microbatches)} microbatches per iteration, expected 30")
    return plan


def dropped(plan: Plan, keep: float, seed: int, iteration: int) -> Plan:
    """The plan with this iteration's LayerDrop paths (for simulating its time)."""
    from skippipe.train.layerdrop import drawn_paths  # torch only where LayerDrop is simulated

    paths = drawn_paths(plan, keep, seed, iteration)
    return replace(plan, microbatches=[replace(mb, path=paths[mb.id]) for mb in plan.microbatches])


def seconds_per_iteration(kind: RunKind, plan: Plan, draws: int = 8) -> float:
    """Simulated seconds per iteration on the reference network (LayerDrop: mean over draws)."""
    if kind.keep_stage is None:
        return simulate(plan).makespan_s
    return float(np.mean([simulate(dropped(plan, kind.keep_stage, 0, i)).makespan_s for i in range(draws)]))


def small_model_plan(plan: Plan) -> Plan:
    """The plan with its stages re-cut to the small model's ``N_LAYERS`` layers."""
    per = N_LAYERS // plan.num_stages
    return replace(plan, layers=[list(range(s * per, (s + 1) * per)) for s in range(plan.num_stages)])


@dataclass(frozen=True)
class RunSpec:
    kind: str
    seed: int
    out: str  # the run's JSON file
    ckpt_dir: str
    plan_file: str  # the reference-network plan (JSON), written once by the main process
    seconds_per_iteration: float
    model: dict  # d_model, ffn_dim, ctx
    train: dict  # TrainConfig fields
    final_eval_samples: int
    device: str = "cpu"


def train_config(spec: RunSpec):
    from skippipe.train.config import TrainConfig

    return TrainConfig(model={"preset": "tiny", "n_layers": N_LAYERS, **spec.model}, seed=spec.seed, **spec.train)


def run_one(spec: RunSpec) -> str:
    """Train one (configuration, seed), sweep omissions of its final model, write its JSON."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from skippipe.data.dataset import token_data_for
    from skippipe.eval import omission_sweep, validation_loss
    from skippipe.model.checkpoint import save_checkpoint
    from skippipe.planfile import load_plan
    from skippipe.train.loop import train_plan

    torch.set_num_threads(1)
    kind = KINDS[spec.kind]
    cfg = train_config(spec)
    data = token_data_for(cfg)
    model_cfg = cfg.model_config(data.vocab_size)
    plan = small_model_plan(load_plan(spec.plan_file, validate=False))
    t0 = time.perf_counter()
    ex, hist = train_plan(plan, cfg, data, model_cfg, progress=True, keep_stage=kind.keep_stage, grouped=True,
                          desc=f"{spec.kind} s{spec.seed}", device=spec.device)
    train_s = time.perf_counter() - t0
    name = f"{spec.kind}-s{spec.seed}"
    save_checkpoint(Path(spec.ckpt_dir) / name, model_cfg, ex.state_dict(), ex.iteration, plan.layers,
                    train=cfg.to_dict(), plan=plan, tokenizer=data.tokenizer)
    model = ex.full_model()
    seq_len = cfg.tokens_per_sample(model_cfg)
    final = validation_loss(model, data.val, seq_len, spec.final_eval_samples, 16)
    omission = {}
    for layout, stage_layers in LAYOUTS.items():
        rows = omission_sweep(model, data.val, stage_layers, seq_len, samples=spec.final_eval_samples, batch_size=16,
                              max_choices=100)
        omission[layout] = [{"omitted": r.omitted, "choices": [list(c) for c in r.choices], "losses": r.losses} for r in rows]
    tokens_per_iteration = len(plan.microbatches) * cfg.samples_per_microbatch * seq_len
    result = {
        "kind": spec.kind, "seed": spec.seed, "method": kind.method, "stages": list(kind.stage_sizes),
        "path_length": kind.path_length, "keep_stage": kind.keep_stage,
        "model": {"params": model_cfg.num_params(), "n_layers": N_LAYERS, **spec.model},
        "train_config": cfg.to_dict(), "tokens_per_iteration": tokens_per_iteration,
        "seconds_per_iteration_sim": spec.seconds_per_iteration,
        "train": hist.train, "val": hist.val, "final_val": final, "final_val_ppl": math.exp(final),
        "final_eval_samples": spec.final_eval_samples, "omission": omission, "train_seconds": train_s,
        "spec": asdict(spec),
    }
    atomic_write_text(Path(spec.out), json.dumps(result, indent=1) + "\n")
    return name
