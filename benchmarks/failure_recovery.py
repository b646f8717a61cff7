"""Elastic recovery: kill nodes of a running `skippipe train` and measure how it goes on.

A SkipPipe plan for 8 emulated GCP nodes (stages of 2, paths of 3 of 4 stages) trains a small
LLaMA with ``[runtime] on_failure = "continue"``. The script SIGKILLs a node of stage 1 (its
stage keeps a replica) after iteration K1, then a data node after iteration K2, and reads the
run's ``failures.json`` and ``metrics.jsonl``. It prints, per failure: the time from the kill to
the launcher naming the node, to the survivors' state handed over, to the new plan and
recovery checkpoint, and to the first iteration done by the new round; the makespan before and
after (simulated and measured); and draws the iteration time across the failures.

    python benchmarks/failure_recovery.py [--steps 16] [--out DIR] [--png docs/images/failure-recovery.png]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = {"preset": "tiny", "d_model": 64, "n_layers": 8, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 128, "ctx": 64}
TRAIN = {"tokenizer": "bytes", "corpus": ["shakespeare"], "samples_per_microbatch": 2, "warmup_steps": 1, "lr": 3e-3}


def _config(out: Path, steps: int, rejoin: list[dict]) -> Path:
    cfg = {
        "run": {"dir": str(out / "run"), "checkpoint_every": 0, "keep_checkpoints": 4},
        "plan": {"cluster": "gcp-2025/geo-distributed/8", "method": "skippipe", "num_stages": 4, "path_length": 3,
                 "stage_sizes": [2, 2, 2, 2], "microbatches_per_data_node": 4, "time_limit_s": 5},
        "train": {**TRAIN, "steps": steps},
        "model": MODEL,
        "runtime": {"emulate": True, "time_scale": 0.02, "timeout_s": 30.0, "on_failure": "continue", "max_failures": 2,
                    "rejoin": rejoin},
    }
    path = out / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def _records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _kill(run: Path, proc: subprocess.Popen, after: int, node: int) -> float:
    """SIGKILL the worker that runs original node ``node`` once iteration ``after`` is recorded."""
    while proc.poll() is None:
        recs = _records(run)
        if recs and recs[-1]["iteration"] >= after and (run / "logs" / "workers.json").is_file():
            plan = json.loads((run / "plan.json").read_text())
            orig = plan.get("meta", {}).get("elastic", {}).get("original_nodes") or list(range(len(plan["costs"]["forward_s"])))
            pid = json.loads((run / "logs" / "workers.json").read_text())["workers"][str(orig.index(node))]
            os.kill(pid, signal.SIGKILL)
            return time.time()
        time.sleep(0.02)
    raise SystemExit("the run ended before the kill")


def _chart(path: Path, recs: list[dict], failures: list[dict], kills: list[float], t0: float, rejoins: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from skippipe.viz import save_png

    fig, ax = plt.subplots(figsize=(9, 3.6))
    xs = [r["time"] - t0 for r in recs]
    ax.plot(xs, [r["iter_s"] for r in recs], "o-", ms=3, label="iteration time (real s)")
    for k, (f, at) in enumerate(zip(failures, kills)):
        ax.axvline(at - t0, color="tab:red", ls="--", lw=1, label="node killed" if k == 0 else None)
        ax.axvspan(at - t0, f["restarted_at"] + f["restart_s"] - t0, color="tab:red", alpha=0.12,
                   label="kill -> first iteration of the new round" if k == 0 else None)
        ax.annotate(f"node {f['node']}\n{f['nodes_left']} nodes left", (at - t0, ax.get_ylim()[1] * 0.9), fontsize=8)
    for k, r in enumerate(rejoins):
        ax.axvline(r["requested_at"] - t0, color="tab:green", ls="--", lw=1, label="node rejoins" if k == 0 else None)
        ax.axvspan(r["requested_at"] - t0, r["replanned_at"] + r.get("restart_s", 0.0) - t0, color="tab:green", alpha=0.12)
    ax.set_xlabel("wall-clock seconds since the first iteration")
    ax.set_ylabel("seconds")
    ax.set_title(f"iteration time across {len(failures)} node failures and {len(rejoins)} rejoin(s) (8 emulated nodes, "
                 "time scale 0.02)", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--kills", default="4:2,10:1", help="ITERATION:NODE,... (original node ids)")
    ap.add_argument("--rejoin", default="8:2", help="ITERATION:NODE,... a killed node starts again ('' for none)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="skippipe-failures-"))
    out.mkdir(parents=True, exist_ok=True)
    rejoin = [{"iteration": int(i), "node": int(n)} for i, n in (x.split(":") for x in args.rejoin.split(",") if x)]
    cfg = _config(out, args.steps, rejoin)
    run = out / "run"
    proc = subprocess.Popen([sys.executable, "-m", "skippipe.cli", "train", str(cfg), "--no-progress", "--fresh"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    kills = []
    try:
        for item in args.kills.split(","):
            after, node = (int(x) for x in item.split(":"))
            kills.append(_kill(run, proc, after, node))
        text, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(text.rstrip())
    if proc.returncode != 0:
        return proc.returncode
    failures = json.loads((run / "failures.json").read_text())["failures"]
    recs = _records(run)
    print()
    print(f"{'node':>4} {'iter':>4} {'from':>4} {'kill->named':>11} {'drain':>6} {'re-plan':>7} {'restart':>7} "
          f"{'kill->going':>11}  {'simulated makespan':>19}  {'measured makespan':>18}")
    for f, at in zip(failures, kills):
        going = f["restarted_at"] + f["restart_s"] - at
        print(f"{f['node']:>4} {f['iteration']:>4} {f['recovery_step']:>4} {f['decided_at'] - at:>10.2f}s {f['drain_s']:>5.2f}s "
              f"{f['replan_s']:>6.2f}s {f['restart_s']:>6.2f}s {going:>10.2f}s  "
              f"{f['makespan_sim_before_s']:>7.2f} -> {f['makespan_sim_after_s']:>6.2f} s  "
              f"{f['makespan_before_s']:>6.2f} -> {f['makespan_after_s']:>6.2f} s")
        print(f"      makespan after / before: simulated {f['makespan_sim_after_s'] / f['makespan_sim_before_s']:.3f}, "
              f"measured {f['makespan_after_s'] / f['makespan_before_s']:.3f}")
    replans = run / "replans.json"
    records = json.loads(replans.read_text())["replans"] if replans.is_file() else []
    rejoins = [r for r in records if r.get("joined") is not None and not r.get("stage_choice")]
    for r in rejoins:
        print(f"{r['reason']}: before iteration {r['iteration']}, drain {r['drain_s']:.2f}s, re-plan {r['replan_s']:.2f}s; "
              f"simulated makespan {r['makespan_sim_old_s']:.2f} -> {r['makespan_sim_new_s']:.2f} s")
    if args.png:
        _chart(args.png, recs, failures, kills, recs[0]["time"] - recs[0]["iter_s"], rejoins)
        print(f"chart: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
