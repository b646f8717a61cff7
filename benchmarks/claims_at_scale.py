"""The two scientific claims at a scale where they mean something: convergence with skipping
(Experiment 1) and robustness to stages omitted at inference (Experiment 2), three seeds each,
next to the unigram and bigram perplexities of the validation text.

Configurations (``claims_runs.py``): the full pipeline, SkipPipe at 25 % and 33 % skip (real
planner plans on the 20-node reference network) and LayerDrop-style random stage dropout at
the depth of 33 % skip. Every run sees the same samples per iteration (30 microbatches) and the
same data; each (configuration, seed) is a separate process, ``--workers`` at a time; a run whose
JSON exists is not run again (the experiment can be stopped and started again).

    python3 benchmarks/claims_at_scale.py                       # the whole experiment (~2 h on 2 cores)
    python3 benchmarks/claims_at_scale.py --report-only         # tables and charts from the JSON files
    python3 benchmarks/claims_at_scale.py --steps 4 --seeds 0 --out /tmp/claims --ckpt-dir /tmp/claims  # smoke run
    python3 benchmarks/claims_at_scale.py --device cuda --precision bf16 --workers 4 ...  # on one GPU

Writes per run ``<out>/runs/<kind>-s<seed>.json`` (curves, final loss, omission sweep), then
``<out>/summary.json`` and ``<out>/convergence.png``, ``<out>/omission.png`` (``claims_report.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import claims_report
import claims_runs
from tqdm import tqdm

from skippipe.planfile import save_plan


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default=",".join(claims_runs.KINDS), help="configurations to run")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--samples", type=int, default=4, help="samples per microbatch (30 microbatches per iteration)")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--ffn-dim", type=int, default=352)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--tokenizer", default="bpe", help="bpe (trained on the corpus), bytes or gpt2")
    ap.add_argument("--vocab", type=int, default=2048, help="BPE vocabulary size")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-samples", type=int, default=128, help="validation windows during training")
    ap.add_argument("--final-eval-samples", type=int, default=512, help="validation windows for final losses and omissions")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the runs share the GPU)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast, fp32 weights")
    ap.add_argument("--n-heads", type=int, default=None, help="attention heads (default: the tiny preset's)")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default="docs/claims", help="folder for the JSON results and the charts")
    ap.add_argument("--ckpt-dir", default="runs/claims", help="folder for the final checkpoints")
    ap.add_argument("--report-only", action="store_true", help="only aggregate the existing run files")
    return ap.parse_args(argv)


def specs(args: argparse.Namespace, out: Path) -> list[claims_runs.RunSpec]:
    """One spec per (configuration, seed); plans written once to ``out/plans``."""
    train = {
        "tokenizer": args.tokenizer, "vocab_size": args.vocab if args.tokenizer == "bpe" else 0,
        "seq_len": args.seq_len, "samples_per_microbatch": args.samples, "steps": args.steps, "lr": args.lr,
        "min_lr": args.lr / 10, "warmup_steps": max(1, args.steps // 20), "eval_every": args.eval_every,
        "eval_batches": max(1, args.eval_samples // 16), "eval_batch_size": 16, "grad_divisor": "visits",
        "cache_dir": args.cache_dir, "precision": args.precision,
    }
    model = {"d_model": args.d_model, "ffn_dim": args.ffn_dim, "ctx": args.seq_len}
    if args.n_heads is not None:
        model.update(n_heads=args.n_heads, n_kv_heads=args.n_heads)
    (out / "plans").mkdir(parents=True, exist_ok=True)
    out_specs = []
    for kind_name in args.kinds.split(","):
        if kind_name not in claims_runs.KINDS:
            raise SystemExit(f"unknown configuration {kind_name!r} (known: {', '.join(claims_runs.KINDS)})")
        kind = claims_runs.KINDS[kind_name]
        plan = claims_runs.plan_for(kind)
        plan_file = out / "plans" / f"{kind_name}.json"
        save_plan(plan, plan_file)
        sec = claims_runs.seconds_per_iteration(kind, plan)
        if kind_name == "full":  # the time axis takes the faster full-pipeline layout (same math, other cut)
            s4 = claims_runs.seconds_per_iteration(claims_runs.FULL_S4, claims_runs.plan_for(claims_runs.FULL_S4))
            print(f"full pipeline, 4 stages [5, 5, 5, 5]: {s4:.2f} s per iteration simulated; 6 stages: {sec:.2f} s")
            sec = min(sec, s4)
        print(f"{kind_name}: {kind.method} plan, stages {list(kind.stage_sizes)}, path length {kind.path_length}"
              f"{'' if kind.keep_stage is None else f', stage kept with p = {kind.keep_stage:.2f}'}: "
              f"{sec:.2f} s per iteration simulated on the reference network", flush=True)
        for seed in (int(s) for s in args.seeds.split(",")):
            out_specs.append(claims_runs.RunSpec(
                kind=kind_name, seed=seed, out=str(out / "runs" / f"{kind_name}-s{seed}.json"), ckpt_dir=args.ckpt_dir,
                plan_file=str(plan_file), seconds_per_iteration=sec, model=model, train=train,
                final_eval_samples=args.final_eval_samples, device=args.device,
            ))
    return sorted(out_specs, key=lambda s: s.seed)  # seed 0 of every configuration first


def run_all(todo: list[claims_runs.RunSpec], workers: int) -> None:
    if not todo:
        return
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(claims_runs.run_one, spec): spec for spec in todo}
        bar = tqdm(total=len(todo), desc="runs", dynamic_ncols=True)
        t0 = time.perf_counter()
        for f in as_completed(futures):
            name = f.result()
            bar.update(1)
            bar.write(f"finished {name} ({(time.perf_counter() - t0) / 60:.1f} min since start)")
        bar.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        all_specs = specs(args, out)
        todo = [s for s in all_specs if not Path(s.out).is_file()]
        print(f"{len(all_specs) - len(todo)} of {len(all_specs)} runs already done; running {len(todo)}, "
              f"{args.workers} at a time", flush=True)
        run_all(todo, args.workers)
    claims_report.report(out, args.tokenizer, args.vocab, args.cache_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
