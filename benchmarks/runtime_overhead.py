"""Runtime overhead: the distributed runtime on localhost with no emulated delays vs the
single-process reference executor doing the same work (same plan, model, data, steps).

Both run the ``tiny`` LLaMA preset (d_model 128, 12 layers, ctx 128) on a SkipPipe plan for an
8-node cluster (4 stages, paths of 3, 4 microbatches of 4 samples per data node). The reference
executor runs every node's share in one process with one thread; the runtime runs 8 worker
processes (one thread each) that exchange real messages through gloo. Prints seconds per
sample (wall clock; iterations after the first) and the CPU seconds per sample summed over all
processes. Target: runtime / reference <= 1.3 per sample.

    python benchmarks/runtime_overhead.py [--iterations 6] [--out DIR] [--all-reduce]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from skippipe.cluster import load_cluster
from skippipe.data.dataset import token_data_for
from skippipe.planfile import save_plan
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.runtime.config import load_run_config
from skippipe.runtime.job import prepare, train
from skippipe.runtime.timeline import load_timeline
from skippipe.train.executor import ReferenceExecutor, plan_batch_fn

MODEL = {"preset": "tiny"}
TRAIN = {"tokenizer": "bytes", "corpus": ["shakespeare"], "samples_per_microbatch": 4, "warmup_steps": 1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--out", help="keep the run here (default: a temporary folder)")
    ap.add_argument("--all-reduce", action="store_true", help="runtime.deterministic = false: plain accumulation + all-reduce")
    args = ap.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="skippipe-overhead-"))
    out.mkdir(parents=True, exist_ok=True)
    steps = args.iterations

    cfg_dict = {
        "run": {"dir": str(out / "run")},
        "plan": {"file": str(out / "plan.json")},
        "train": {**TRAIN, "steps": steps},
        "model": MODEL,
        "runtime": {"emulate": False, "timeout_s": 300.0, "deterministic": not args.all_reduce},
    }
    (out / "config.json").write_text(json.dumps({**cfg_dict, "plan": {}}))
    probe = load_run_config(out / "config.json")
    tc = probe.train_config()
    data = token_data_for(tc)
    model_cfg = tc.model_config(data.vocab_size)
    seq_len = tc.tokens_per_sample(model_cfg)
    workload = probe.plan.workload(model_cfg.n_layers, model_cfg.d_model, seq_len, tc.samples_per_microbatch, probe.runtime.wire)
    problem = build_problem(load_cluster("gcp-2025/single-cluster/8"), workload)
    plan = make_plan("skippipe", problem, seed=0, time_limit_s=10)
    save_plan(plan, out / "plan.json")
    (out / "config.json").write_text(json.dumps(cfg_dict))
    samples = len(plan.microbatches) * tc.samples_per_microbatch
    print(f"plan: {plan.n_nodes} nodes, stages {[len(s) for s in plan.stages]}, {len(plan.microbatches)} microbatches, "
          f"{samples} samples per iteration; model {model_cfg.num_params() / 1e6:.2f} M parameters")

    # the reference executor, one process, one thread
    torch.set_num_threads(1)
    ref = ReferenceExecutor(plan, model_cfg, tc, plan_batch_fn(plan, data.train, tc, seq_len))
    ref.step()  # warm-up, as the runtime's first iteration is left out too
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps - 1):
        ref.step()
    ref_wall = (time.perf_counter() - wall) / (steps - 1)
    ref_cpu = (time.process_time() - cpu) / (steps - 1)

    prep = prepare(load_run_config(out / "config.json"), out / "run", fresh=True)
    summary = train(prep, progress=False)
    run_wall = summary.mean_iter_s
    records, _ = load_timeline(out / "run")
    per_it: dict[int, float] = {}
    for r in records:
        if r["type"] == "iteration" and r["it"] > 0:
            per_it[r["it"]] = per_it.get(r["it"], 0.0) + r["cpu_s"]
    run_cpu = sum(per_it.values()) / len(per_it)

    print(f"reference executor  {1e3 * ref_wall / samples:7.2f} ms/sample wall   {1e3 * ref_cpu / samples:7.2f} ms/sample CPU")
    print(
        f"runtime, {plan.n_nodes} workers  {1e3 * run_wall / samples:7.2f} ms/sample wall   "
        f"{1e3 * run_cpu / samples:7.2f} ms/sample CPU (all workers)"
    )
    ratio = run_wall / ref_wall
    print(f"runtime / reference: wall {ratio:.2f} per sample (target <= 1.3), CPU {run_cpu / ref_cpu:.2f}")
    return 0 if ratio <= 1.3 else 1


if __name__ == "__main__":
    sys.exit(main())
