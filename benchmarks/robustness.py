"""Experiment 2 (robustness): validation perplexity with 0, 1, ... non-data stages omitted at
inference, averaged over every choice of the omitted stages, for models trained with skipping
and the model trained on the full pipeline.

Two comparisons, each in the stage layout the skip model was trained with (stage 0 =
embedding, its layers, head; never omitted):

- 6 stages of 2 layers: full-trained vs skip-33 % (S=6, L=4); half of the stages = 3 omitted
- 4 stages of 3 layers: full-trained vs skip-25 % (S=4, L=3); half of the stages = 2 omitted

The models are the checkpoints of ``benchmarks/convergence.py`` (same size, data and
samples; by default trained on the plans of the real planners, ``full`` and ``skippipe``);
missing ones are trained here the same way (``--plans toy``: on the hand-made plans). The plan
each checkpoint was trained with (its ``plan.json``) is printed: stage sequences and visits
per stage.

    python3 benchmarks/convergence.py --out docs/images     # trains and saves the checkpoints
    python3 benchmarks/robustness.py --out docs/images      # ~1 min on one core

Writes ``robustness.png`` and ``robustness.json``; prints, per model, the mean perplexity for
each number of omitted stages and its ratio to the model's own full perplexity. Target:
skip-trained with half of the stages omitted <= 1.10 x its full-model perplexity, and a clear
gap to the full-trained model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import matplotlib

matplotlib.use("Agg")
import convergence
import matplotlib.pyplot as plt
import torch

from skippipe.data.dataset import token_data_for
from skippipe.eval import omission_sweep
from skippipe.fileio import atomic_write_text
from skippipe.model.checkpoint import load_checkpoint, load_model, save_checkpoint
from skippipe.planfile import load_plan
from skippipe.train.loop import train_plan

LAYOUTS = {
    "S=6": ([[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]], ["full", "skip-33"]),
    "S=4": ([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]], ["full", "skip-25"]),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt-dir", default="runs/benchmarks", help="folder with ckpt-full, ckpt-skip-33, ckpt-skip-25")
    ap.add_argument("--layouts", default="S=6,S=4", help="which comparisons to run")
    ap.add_argument("--eval-samples", type=int, default=128, help="validation windows per evaluation")
    ap.add_argument("--out", default="runs/benchmarks")
    # used only when a checkpoint is missing and is trained here (same defaults as convergence.py)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--ffn-dim", type=int, default=176)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--divisor", default="visits")
    ap.add_argument("--plans", default="planner", choices=["planner", "toy"])
    ap.add_argument("--swaps", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args(argv)
    args.eval_samples = max(8, args.eval_samples)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckdir = Path(args.ckpt_dir)

    cfg = convergence.experiment_config(args)
    data = token_data_for(cfg)
    names = {convergence.slug(name): name for name in convergence.PLANNER_RUNS}
    models = {}

    def model_for(run: str):
        if run in models:
            return models[run]
        if run not in names:
            raise SystemExit(f"unknown run {run!r} (known: {', '.join(names)})")
        name = names[run]
        path = ckdir / f"ckpt-{run}"
        if not (path / "config.json").is_file():
            plan = convergence.plans(args)[name]
            print(f"{path} missing: training {name} ({args.steps} iterations)")
            model_cfg = cfg.model_config(data.vocab_size)
            ex, _ = train_plan(plan, cfg, data, model_cfg, desc=run)
            save_checkpoint(path, model_cfg, ex.state_dict(), ex.iteration, plan.layers, train=cfg.to_dict(), plan=plan,
                            tokenizer=data.tokenizer)
        ckpt = load_checkpoint(path)
        if ckpt.plan_file is not None:
            info = convergence.plan_summary(load_plan(ckpt.plan_file, validate=False))
            seqs = ", ".join(f"0-{k} x{v}" for k, v in info["sequences"].items())
            print(f"{path}: trained on a {info['method']} plan, nodes per stage {info['nodes_per_stage']}, "
                  f"{info['microbatches']} microbatches; stage sequences {seqs}; visits per stage {info['visits_per_stage']}")
        models[run] = (name, ckpt, load_model(ckpt))
        return models[run]

    results: dict[str, dict] = {}
    for layout in args.layouts.split(","):
        if layout not in LAYOUTS:
            raise SystemExit(f"unknown layout {layout!r} (known: {', '.join(LAYOUTS)})")
        stage_layers, runs = LAYOUTS[layout]
        results[layout] = {"stages": stage_layers, "runs": {}}
        for run in runs:
            name, ckpt, model = model_for(run)
            seq_len = int((ckpt.train or {}).get("seq_len") or model.cfg.ctx)
            rows = omission_sweep(model, data.val, stage_layers, seq_len, samples=args.eval_samples, batch_size=16,
                                  max_choices=100, progress=True)
            results[layout]["runs"][name] = [
                {"omitted": r.omitted, "choices": [list(c) for c in r.choices], "losses": r.losses,
                 "mean_ppl": r.mean_ppl, "ppl": [math.exp(x) for x in r.losses]}
                for r in rows
            ]
            base = rows[0].mean_ppl
            print(f"\n{layout} {stage_layers}: {name} (trained {ckpt.step} iterations)")
            print("omitted  choices  mean ppl  min..max ppl     vs own full")
            for r in rows:
                ppls = [math.exp(x) for x in r.losses]
                print(
                    f"{r.omitted:7d}  {len(r.choices):7d}  {r.mean_ppl:8.2f}  "
                    f"{min(ppls):7.2f}..{max(ppls):<7.2f}  {r.mean_ppl / base:7.3f}"
                )
            half = len(stage_layers) // 2
            print(f"half of the stages omitted ({half} of {len(stage_layers)}): {rows[half].mean_ppl / base:.3f} x full")

    atomic_write_text(out / "robustness.json", json.dumps({"args": vars(args), "layouts": results}, indent=1) + "\n")
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.2), squeeze=False)
    for ax, res in zip(axes[0], results.values()):
        n_stages = len(res["stages"])
        for name, rows in res["runs"].items():
            ks = [r["omitted"] for r in rows]
            line, = ax.plot(ks, [r["mean_ppl"] for r in rows], marker="o", label=name)
            ax.fill_between(ks, [min(r["ppl"]) for r in rows], [max(r["ppl"]) for r in rows], color=line.get_color(), alpha=0.15)
        ax.axvline(n_stages // 2, color="grey", ls=":", lw=1)
        ax.set_xticks(range(n_stages))
        ax.set_xlabel(f"non-data stages omitted (of {n_stages - 1}); line = mean, band = min..max over choices")
        ax.set_ylabel("validation perplexity")
        ax.set_title(f"{n_stages} stages of {len(res['stages'][0])} layers (dotted: half of the stages)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Robustness to stages omitted at inference")
    fig.tight_layout()
    fig.savefig(out / "robustness.png", dpi=120)
    print(f"\nwrote {out / 'robustness.png'} and {out / 'robustness.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
