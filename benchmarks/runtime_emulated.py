"""Emulated reference instance: the real runtime on the 20-node GCP instance, time-scaled.

The network and compute costs are those of the reference instance ``gcp20-current`` (20 GCP
regions, stages [5, 3, 3, 3, 3, 3], M = 3, paths of 4 of 6 stages, 6 microbatches per data node,
LLaMA-500M-like costs: forward 1.76 s). Plans come from our planners (``full`` = DT-FM full
pipeline, ``skippipe``). 20 worker processes run a tiny 6-layer LLaMA (one layer per stage) with
WAN emulation: every message is delayed by the plan's transfer time and every operation
stretched to its modelled time, times ``--time-scale``.

Prints, per method, the measured iteration makespan (plan seconds, mean over iterations after
the first) beside the simulator's, and the ratio skippipe / full.
Targets: skippipe / full <= 0.50; measured within 15 % of simulated.

    python benchmarks/runtime_emulated.py [--time-scale 0.04] [--iterations 4] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from skippipe.cluster import load_cluster
from skippipe.planfile import save_plan
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.runtime.config import load_run_config
from skippipe.runtime.job import prepare, train
from skippipe.workload import Workload

MODEL = {"preset": "tiny", "d_model": 64, "n_layers": 6, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 128, "ctx": 32}


def run_method(method: str, folder: Path, time_scale: float, iterations: int, cluster: str = "gcp20-current",
               wire: str = "bf16") -> dict:
    """Plan ``method`` on ``cluster`` with ``wire``'s bytes per hop, run it emulated, measure it."""
    problem = build_problem(load_cluster(cluster), Workload(wire_format=wire))
    plan = make_plan(method, problem, seed=0, time_limit_s=20)
    simulated = plan.predicted_makespan_s
    # the same costs and paths; the model layers become one tiny layer per stage
    plan.layers = [[s] for s in range(plan.num_stages)]
    plan.model = {"n_layers": plan.num_stages, "d_model": MODEL["d_model"], "ctx": MODEL["ctx"]}
    folder.mkdir(parents=True, exist_ok=True)
    save_plan(plan, folder / "plan.json")
    cfg = {
        "run": {"dir": str(folder / "run")},
        "plan": {"file": str(folder / "plan.json")},
        "train": {"steps": iterations, "tokenizer": "bytes", "corpus": ["shakespeare"], "samples_per_microbatch": 2,
                  "warmup_steps": 1},
        "model": MODEL,
        "runtime": {"emulate": True, "time_scale": time_scale, "timeout_s": 120.0, "wire": wire},
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    prep = prepare(load_run_config(folder / "config.json"), folder / "run", fresh=True)
    summary = train(prep, progress=False)
    return {
        "method": method, "simulated_s": simulated, "measured_s": summary.mean_makespan_plan_s,
        "per_iteration_s": [r["makespan_plan_s"] for r in summary.records],
        "iter_real_s": summary.mean_iter_s, "timeline": str(summary.timeline_png),
    }


def emulation_args(description: str, prefix: str) -> tuple[argparse.Namespace, Path]:
    """The options of an emulated benchmark, and its output folder (a temporary one by default)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--time-scale", type=float, default=0.04)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--out", help="keep runs and Gantt charts here (default: a temporary folder)")
    args = ap.parse_args()
    return args, Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix=prefix))


def main() -> int:
    args, out = emulation_args(__doc__.splitlines()[0], "skippipe-emulated-")
    results = {}
    for method in ("full", "skippipe"):
        r = run_method(method, out / method, args.time_scale, args.iterations)
        results[method] = r
        print(
            f"{method:9s} simulated {r['simulated_s']:7.2f} s   measured {r['measured_s']:7.2f} s "
            f"({100 * (r['measured_s'] / r['simulated_s'] - 1):+5.1f} %)   per iteration "
            f"{[round(x, 1) for x in r['per_iteration_s']]}   real {r['iter_real_s']:.2f} s/it",
            flush=True,
        )
    ratio = results["skippipe"]["measured_s"] / results["full"]["measured_s"]
    sim_ratio = results["skippipe"]["simulated_s"] / results["full"]["simulated_s"]
    print(f"skippipe / full: measured {ratio:.3f} (target <= 0.50), simulated {sim_ratio:.3f}")
    worst = max(abs(r["measured_s"] / r["simulated_s"] - 1) for r in results.values())
    print(f"largest measured vs simulated gap: {100 * worst:.1f} % (target <= 15 %)")
    print(f"Gantt charts: {results['full']['timeline']}  {results['skippipe']['timeline']}")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    if not args.out:
        print(f"(runs kept in {out})")
    return 0 if ratio <= 0.5 and worst <= 0.15 else 1


if __name__ == "__main__":
    sys.exit(main())
