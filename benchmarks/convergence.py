"""Experiment 1 (convergence): same tiny model, data, seed and samples; full pipeline vs
SkipPipe plans at 25 % skip (S=4, L=3) and 33 % skip (S=6, L=4).

By default (``--plans planner``) the plans are made by the real planners on the
``gcp-2025/geo-distributed`` preset: method ``full`` on 12 nodes (S=4, 3 chains x 10
microbatches), method ``skippipe`` on 15 nodes (S=4, L=3, 5 data nodes x 6) and on 20 nodes
(S=6, L=4, 5 data nodes x 6); ``--plans toy`` uses the hand-made plans of
``tests/toy_plans.py`` instead. Every run uses the single-process reference executor (the
math of the distributed runtime), 30 microbatches per iteration and ``sharding = "stream"``, so
every run sees exactly the same samples in every iteration (checked and printed). The
validation loss is that of the whole model (no stage omitted).

    python3 benchmarks/convergence.py --out docs/images            # ~3 min per run on one core
    python3 benchmarks/convergence.py --steps 20 --out /tmp/conv --ckpt-dir /tmp/conv   # smoke run

Writes ``convergence.png`` (validation loss curves) and ``convergence.json`` to ``--out`` and
a checkpoint per run to ``--ckpt-dir`` (``ckpt-<run>/``, read by ``benchmarks/robustness.py``).
Prints the final losses and the ratio skip / full; target: within 3 %.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the hand-made toy plans

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from skippipe.cluster import load_cluster
from skippipe.data.dataset import token_data_for
from skippipe.fileio import atomic_write_text
from skippipe.model.checkpoint import save_checkpoint
from skippipe.planfile import Plan
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.train.config import TrainConfig
from skippipe.train.loop import train_plan
from skippipe.workload import Workload
from toy_plans import full_plan, skip_plan

N_LAYERS = 12  # 3 per stage with S=4, 2 per stage with S=6


def experiment_config(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        model={"preset": "tiny", "n_layers": N_LAYERS, "ctx": args.seq_len, "d_model": args.d_model,
               "ffn_dim": args.ffn_dim},
        vocab_size=args.vocab,
        seq_len=args.seq_len,
        samples_per_microbatch=args.samples,
        steps=args.steps,
        lr=args.lr,
        min_lr=args.lr / 10,
        warmup_steps=max(1, args.steps // 10),
        eval_every=max(1, args.steps // 10),
        eval_batches=args.eval_samples // 8,
        eval_batch_size=8,
        grad_divisor=args.divisor,
        seed=args.seed,
        cache_dir=args.cache_dir,
    )


# run name -> (method, nodes, S, L, microbatches per data node); 30 microbatches per iteration each
PLANNER_RUNS = {
    "full": ("full", 12, 4, 4, 10),
    "skip-25% (S=4, L=3)": ("skippipe", 15, 4, 3, 6),
    "skip-33% (S=6, L=4)": ("skippipe", 20, 6, 4, 6),
}


def planner_plan(method: str, nodes: int, S: int, L: int, m: int, args: argparse.Namespace) -> Plan:
    workload = Workload(num_stages=S, path_length=L, microbatches_per_data_node=m, samples_per_microbatch=args.samples,
                        n_layers=N_LAYERS, d_model=args.d_model, ctx=args.seq_len)
    problem = build_problem(load_cluster(f"gcp-2025/geo-distributed/{nodes}"), workload)
    # no time limit: the planners' default search budget, so the plan is the same in every run
    return make_plan(method, problem, seed=args.seed, time_limit_s=None)


def plans(args: argparse.Namespace) -> dict:
    if getattr(args, "plans", "planner") == "planner":
        return {name: planner_plan(*spec, args) for name, spec in PLANNER_RUNS.items()}
    b, T = args.samples, args.seq_len
    return {
        "full": full_plan(num_stages=4, chains=3, m=10, n_layers=N_LAYERS, samples=b, ctx=T),
        "skip-25% (S=4, L=3)": skip_plan(
            [5, 3, 3, 3], 3, 6, N_LAYERS, seed=args.seed, swap_fraction=args.swaps, samples=b, ctx=T
        ),
        "skip-33% (S=6, L=4)": skip_plan(
            [5, 3, 3, 3, 3, 3], 4, 6, N_LAYERS, seed=args.seed, swap_fraction=args.swaps, samples=b, ctx=T
        ),
    }


def plan_summary(plan: Plan) -> dict:
    """Which stage sequences the microbatches take and how often each stage runs per iteration."""
    stage_of = {node: s for s, nodes in enumerate(plan.stages) for node in nodes}
    seqs = Counter("-".join(str(stage_of[n]) for n in mb.path) for mb in plan.microbatches)
    visits = Counter(stage_of[n] for mb in plan.microbatches for n in mb.path)
    return {
        "method": plan.method,
        "nodes_per_stage": [len(s) for s in plan.stages],
        "microbatches": len(plan.microbatches),
        "sequences": dict(sorted(seqs.items(), key=lambda kv: (-kv[1], kv[0]))),
        "visits_per_stage": {str(s): visits.get(s, 0) for s in range(1, len(plan.stages))},
    }


def print_plans(plans_: dict, args: argparse.Namespace) -> None:
    """Print each plan's stage sequences and per-stage visits; stop unless every run trains on
    the same number of samples per iteration."""
    per_iter = {name: len(plan.microbatches) * args.samples for name, plan in plans_.items()}
    for name, plan in plans_.items():
        info = plan_summary(plan)
        seqs = ", ".join(f"0-{k} x{v}" for k, v in info["sequences"].items())
        visits = " ".join(f"{s}:{v}" for s, v in info["visits_per_stage"].items())
        print(f"{name}: method {info['method']}, nodes per stage {info['nodes_per_stage']}, "
              f"{info['microbatches']} microbatches x {args.samples} samples = {per_iter[name]} samples per iteration, "
              f"{per_iter[name] * args.steps} in total")
        print(f"  stage sequences: {seqs}")
        print(f"  visits per non-data stage per iteration: {visits}")
    if len(set(per_iter.values())) != 1:
        raise SystemExit(f"runs differ in samples per iteration: {per_iter}")


def slug(name: str) -> str:
    return name.split(" ")[0].replace("%", "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--samples", type=int, default=2, help="samples per microbatch")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--ffn-dim", type=int, default=176)
    ap.add_argument("--vocab", type=int, default=2048, help="BPE vocabulary size")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--eval-samples", type=int, default=128)
    ap.add_argument("--divisor", default="visits", choices=["visits", "microbatches", "reference"])
    ap.add_argument("--plans", default="planner", choices=["planner", "toy"],
                    help="planner: methods full and skippipe (default); toy: tests/toy_plans.py")
    ap.add_argument("--swaps", type=float, default=0.25, help="--plans toy: share of skip microbatches with one adjacent swap")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default="runs/benchmarks", help="folder for the chart and the JSON")
    ap.add_argument("--ckpt-dir", default="runs/benchmarks", help="folder for the checkpoints")
    ap.add_argument("--only", default=None, help="comma-separated run prefixes (full, skip-25, skip-33)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    cfg = experiment_config(args)
    data = token_data_for(cfg)
    model_cfg = cfg.model_config(data.vocab_size)
    print(f"model: {model_cfg.num_params() / 1e6:.2f} M parameters, {model_cfg.n_layers} layers, d_model {model_cfg.d_model}; "
          f"{30 * args.samples} samples x {args.seq_len} tokens per iteration, {args.steps} iterations")
    results = {}
    json_path = out / "convergence.json"
    if json_path.is_file() and args.only:
        results = json.loads(json_path.read_text())["runs"]
    all_plans = plans(args)
    print_plans(all_plans, args)
    for name, plan in all_plans.items():
        if args.only and not any(name.startswith(p) for p in args.only.split(",")):
            continue
        t0 = time.perf_counter()
        ex, hist = train_plan(plan, cfg, data, model_cfg, desc=slug(name))
        save_checkpoint(Path(args.ckpt_dir) / f"ckpt-{slug(name)}", model_cfg, ex.state_dict(), ex.iteration, plan.layers,
                        train=cfg.to_dict(), plan=plan, tokenizer=data.tokenizer)
        results[name] = {**hist.to_dict(), "wall_s": time.perf_counter() - t0, "final_val": hist.val[-1][1],
                         "plan": plan_summary(plan), "samples_per_iteration": len(plan.microbatches) * args.samples}
        print(f"{name}: final validation loss {hist.val[-1][1]:.4f} ({hist.seconds:.0f} s)", flush=True)

    full = results["full"]["final_val"] if "full" in results else None
    print("\nrun                    final val loss   vs full")
    for name, r in results.items():
        ratio = f"{r['final_val'] / full:.4f}" if full else "-"
        print(f"{name:22s} {r['final_val']:14.4f}   {ratio}")
    atomic_write_text(json_path, json.dumps({"args": vars(args), "runs": results}, indent=1) + "\n")

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, r in results.items():
        steps, losses = zip(*r["val"])
        ax.plot(steps, losses, marker="o", ms=3, label=f"{name}: {r['final_val']:.3f}")
    ax.set_xlabel(f"iteration ({30 * args.samples} samples x {args.seq_len} tokens, identical in every run)")
    ax.set_ylabel("validation loss (full model)")
    ax.set_title("Convergence: full pipeline vs SkipPipe skip ratios")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "convergence.png", dpi=120)
    print(f"wrote {out / 'convergence.png'} and {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
