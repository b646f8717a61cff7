"""Re-plan on drift: slow one emulated link mid-run and measure how the iteration time recovers.

A SkipPipe plan for 8 emulated GCP nodes (stages of 2, paths of 3 of 4 stages) trains a small
LLaMA with ``[runtime] on_failure = "continue"`` and ``replan_on_drift = true``. The script
plans once (``skippipe train --plan-only``), picks the link the plan's paths use most (ties: the
slowest), and trains with ``emulate_events`` dividing that link's bandwidth by ``1 / FACTOR``
from iteration K. It prints the measured makespan (plan seconds) per phase — before the change,
on the slow link with the old plan, after the re-plan — beside the simulator's makespans: the
old plan on the old costs, the old plan on the new costs, and the new plan on the new costs
(the new simulated optimum; all three on the emulated network), with the ratios; ``--png``
draws the iteration time.

The run re-plans on the costs its workers MEASURED (``runtime/measured_costs.py``). The script
also makes the re-plan an oracle would have made (the emulator's own slowed link, ``fold_due``)
and simulates both plans on the emulated network: measured-cost vs oracle-cost re-plan.

    python benchmarks/replan_on_drift.py [--steps 18] [--at 5] [--factor 0.25] [--time-scale 0.1]
        [--out DIR] [--png docs/images/replan-on-drift.png]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import mean

MODEL = {"preset": "tiny", "d_model": 64, "n_layers": 8, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 128, "ctx": 64}
TRAIN = {"tokenizer": "bytes", "corpus": ["shakespeare"], "samples_per_microbatch": 2, "warmup_steps": 1, "lr": 3e-3}


def _config(out: Path, steps: int, events: list[dict], plan_file: Path | None, scale: float) -> Path:
    plan: dict = {"cluster": "gcp-2025/geo-distributed/8", "method": "skippipe", "num_stages": 4, "path_length": 3,
                  "stage_sizes": [2, 2, 2, 2], "microbatches_per_data_node": 4, "time_limit_s": 5}
    if plan_file is not None:
        plan["file"] = str(plan_file)
    cfg = {
        "run": {"dir": str(out / "run"), "checkpoint_every": 0, "keep_checkpoints": 4},
        "plan": plan,
        "train": {**TRAIN, "steps": steps},
        "model": MODEL,
        "runtime": {"emulate": True, "time_scale": scale, "timeout_s": 30.0, "on_failure": "continue",
                    "replan_on_drift": True, "drift_threshold": 0.25, "drift_window": 2, "emulate_events": events},
    }
    path = out / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def _busiest_link(plan: dict) -> list[int]:
    use: collections.Counter = collections.Counter()
    transfer = plan["costs"]["transfer_s"]
    for mb in plan["microbatches"]:
        hops = [mb["data_node"], *mb["path"], mb["data_node"]]
        for a, b in zip(hops, hops[1:]):
            if a != b:
                use[(min(a, b), max(a, b))] += 1
    a, b = max(use, key=lambda k: (use[k], transfer[k[0]][k[1]]))
    return [a, b]


def _cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "skippipe.cli", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr.strip() or f"skippipe {args[0]} failed")
    return done.stdout + done.stderr


def _chart(path: Path, recs: list[dict], at: int, replans: list[dict], sims: tuple[float, float, float], scale: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from skippipe.viz import save_png

    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.plot([r["iteration"] for r in recs], [r["makespan_plan_s"] for r in recs], "o-", ms=3, label="measured makespan")
    old, old_new, new = sims
    ax.axhline(old, color="tab:gray", ls=":", lw=1, label=f"simulated, old plan, old links ({old:.1f} s)")
    ax.axhline(old_new, color="tab:red", ls=":", lw=1, label=f"simulated, old plan, slow link ({old_new:.1f} s)")
    ax.axhline(new, color="tab:green", ls="--", lw=1, label=f"simulated, new plan, slow link ({new:.1f} s)")
    ax.axvline(at - 0.5, color="tab:red", lw=1)
    ax.annotate("link slowed", (at - 0.4, ax.get_ylim()[1] * 0.95), fontsize=8)
    for r in replans:
        ax.axvline(r["recovery_step"] + 0.5, color="tab:green", lw=1)
        ax.annotate("re-plan", (r["recovery_step"] + 0.6, ax.get_ylim()[1] * 0.95), fontsize=8)
    ax.set_xlabel("iteration")
    ax.set_ylabel(f"plan seconds (real / {scale:g})")
    ax.set_title("re-plan on drift: one link slowed mid-run (8 emulated nodes)")
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    save_png(fig, path, dpi=110)


def _on_network(run: Path, r: dict, first_file: Path) -> tuple[float, float, float]:
    """Simulated on the emulated network (the slowed link in): the old plan, the measured-cost
    re-plan the run made, and the re-plan an oracle (the emulator's own costs) would have made."""
    from dataclasses import replace

    from skippipe.planfile import load_plan
    from skippipe.planner.replan import replan
    from skippipe.runtime.emulation import network_costs
    from skippipe.sim import simulate

    new = load_plan(run / "elastic" / f"plan-round-{r['round'] + 1}.json")
    before = run / "elastic" / f"plan-round-{r['round']}.json"
    old = load_plan(before if before.is_file() else first_file)
    truth = network_costs(new)  # same nodes, same ids: a drift re-plan keeps them
    oracle = replan(replace(old, costs=truth), truth.transfer_s, method="skippipe")
    a, b, c = (simulate(replace(p, costs=truth), bound=False).makespan_s for p in (old, new, oracle))
    return a, b, c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=18)
    ap.add_argument("--at", type=int, default=5, help="the iteration from which the link is slow")
    ap.add_argument("--factor", type=float, default=0.25, help="bandwidth factor of the slowed link")
    ap.add_argument("--time-scale", type=float, default=0.1, help="real seconds per plan second (emulated delays "
                    "must dominate this machine's compute overhead, or the drift is seen before the link changes)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="skippipe-replan-"))
    out.mkdir(parents=True, exist_ok=True)
    _cli("train", str(_config(out, args.steps, [], None, args.time_scale)), "--plan-only", "--fresh")
    first = json.loads((out / "run" / "plan.json").read_text())
    plan_file = out / "first-plan.json"
    plan_file.write_text(json.dumps(first))
    link = _busiest_link(first)
    events = [{"iteration": args.at, "link": link, "bandwidth_factor": args.factor}]
    text = _cli("train", str(_config(out, args.steps, events, plan_file, args.time_scale)), "--no-progress", "--fresh")
    print(text.rstrip())
    run = out / "run"
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    replans = json.loads((run / "replans.json").read_text())["replans"] if (run / "replans.json").is_file() else []
    folding = [r for r in replans if r["folded_events"]]
    from skippipe.planfile import load_plan
    from skippipe.sim import simulate

    sim_old = simulate(load_plan(plan_file), bound=False).makespan_s
    print(f"\nlink {link} bandwidth x {args.factor} from iteration {args.at}; re-plans: {len(replans)}")
    if not folding:
        print("no re-plan took the slowed link into account (missed)")
        return 1
    r = folding[0]
    before = [x["makespan_plan_s"] for x in recs if 1 < x["iteration"] < args.at]
    slow = [x["makespan_plan_s"] for x in recs if args.at <= x["iteration"] <= r["recovery_step"]]
    after = [x["makespan_plan_s"] for x in recs if x["iteration"] > r["recovery_step"] + 1]
    old_net, new_net, oracle_net = _on_network(run, r, plan_file)
    sims = (sim_old, old_net, new_net)
    print(f"{'phase':<34} {'measured':>9} {'simulated':>10}")
    print(f"{'old plan, old links':<34} {mean(before):>8.2f}s {sims[0]:>9.2f}s")
    print(f"{'old plan, slow link':<34} {mean(slow):>8.2f}s {sims[1]:>9.2f}s")
    print(f"{'new plan, slow link (after re-plan)':<34} {mean(after):>8.2f}s {sims[2]:>9.2f}s")
    print(f"slow / before: measured {mean(slow) / mean(before):.3f}, simulated {sims[1] / sims[0]:.3f}")
    print(f"after re-plan / slow: measured {mean(after) / mean(slow):.3f}, simulated {sims[2] / sims[1]:.3f}")
    print(f"after re-plan / new simulated optimum: {mean(after) / sims[2]:.3f}")
    print(f"re-planned on: {r['measured']}")
    print(f"planner's view (measured costs): old plan {r['makespan_sim_old_s']:.2f}s -> new plan {r['makespan_sim_new_s']:.2f}s")
    print(f"on the emulated network: measured-cost re-plan {new_net:.2f}s, oracle-cost re-plan {oracle_net:.2f}s "
          f"(ratio {new_net / oracle_net:.3f})")
    print(f"stages {r['stages_before']} -> {r['stages_after']}; drain {r['drain_s']:.2f} s, re-plan {r['replan_s']:.2f} s, "
          f"restart {r['restart_s']:.2f} s")
    if args.png:
        _chart(args.png, recs, args.at, replans, sims, args.time_scale)
        print(f"chart: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
