"""Throughput and peak memory of `skippipe train` on the GPUs of one machine: every worker of a
12-node plan (gcp-2025 regions, 4 stages, 3 of 4 visited) runs on this machine's GPUs, with no
WAN emulation, bf16 autocast, for each model preset and payload backend asked for.

    python3 benchmarks/gpu_train.py --out /tmp/gpu-train                       # tiny and llama-500m, gloo and nccl
    python3 benchmarks/gpu_train.py --presets tiny --backends gloo --steps 10  # one setting

Writes ``<out>/<preset>-<backend>/`` (the run folders), ``<out>/gpu-train.json`` (one record per
setting: tokens/s, model TFLOP/s, utilisation, peak memory of the busiest worker, losses) and
prints a table. Workers share the GPUs round-robin; with NCCL, groups whose workers share a GPU
fall back to gloo (``process_group.group_backend``), so on one GPU both backends move payloads
through host memory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from skippipe.fileio import atomic_write_text
from skippipe.runtime.metrics import read_metrics

SETTINGS = {  # preset -> (tokenizer vocabulary, samples per microbatch, activation checkpointing)
    "tiny": (4096, 8, False),
    "llama-500m": (32000, 4, True),  # the preset's own vocabulary: 468 M parameters
}


def config_text(run_dir: Path, preset: str, backend: str, steps: int) -> str:
    vocab, samples, recompute = SETTINGS[preset]
    return f"""[run]
dir = "{run_dir}"
checkpoint_every = -1

[plan]
cluster = "gcp-2025/geo-distributed/12"
method = "skippipe"
num_stages = 4
path_length = 3
microbatches_per_data_node = 4
memory = 2

[train]
steps = {steps}
warmup_steps = 2
samples_per_microbatch = {samples}
corpus = ["shakespeare", "bible"]
tokenizer = "bpe"
vocab_size = {vocab}
precision = "bf16"
activation_checkpointing = {str(recompute).lower()}

[model]
preset = "{preset}"
vocab_size = {vocab}

[runtime]
emulate = false
device = "cuda"
backend = "{backend}"
timeout_s = 600.0
"""


def run_setting(out: Path, preset: str, backend: str, steps: int) -> dict:
    run_dir = out / f"{preset}-{backend}"
    cfg = out / f"{preset}-{backend}.toml"
    atomic_write_text(cfg, config_text(run_dir, preset, backend, steps))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "skippipe.cli", "train", str(cfg), "--fresh", "--no-progress"],
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    print(proc.stdout + proc.stderr[-3000:], flush=True)
    record: dict = {"preset": preset, "backend": backend, "steps": steps, "exit": proc.returncode, "wall_s": wall}
    if proc.returncode != 0:
        return record
    recs = read_metrics(run_dir)
    summary = [line for line in proc.stdout.splitlines() if line.startswith(("throughput", "peak memory", "iteration time"))]
    steady = recs[1:]
    record.update(
        first_loss=recs[0]["loss"], last_loss=recs[-1]["loss"],
        mean_iter_s=sum(r["iter_s"] for r in steady) / len(steady),
        peak_memory_gib=max(r.get("peak_memory_bytes", 0) for r in recs) / 2**30,
        summary=summary,
    )
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="tiny,llama-500m")
    ap.add_argument("--backends", default="gloo,nccl")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--out", default="runs/gpu-train")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for preset in args.presets.split(","):
        for backend in args.backends.split(","):
            print(f"== {preset}, {backend} ==", flush=True)
            results.append(run_setting(out, preset, backend, args.steps))
            atomic_write_text(out / "gpu-train.json", json.dumps(results, indent=1) + "\n")
    print(f"{'setting':<22} {'exit':>4} {'s/iter':>8} {'peak GiB':>9}  loss")
    for r in results:
        if r["exit"] != 0:
            print(f"{r['preset'] + ', ' + r['backend']:<22} {r['exit']:>4}")
            continue
        print(f"{r['preset'] + ', ' + r['backend']:<22} {r['exit']:>4} {r['mean_iter_s']:>8.3f} {r['peak_memory_gib']:>9.2f}  "
              f"{r['first_loss']:.3f} -> {r['last_loss']:.3f}")
        for line in r["summary"]:
            print(f"    {line}")
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
