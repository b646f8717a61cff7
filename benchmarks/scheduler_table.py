"""Scheduler target 3: full pipeline, random skipping, SkipPipe without and with TC2.

Both network tables (``gcp-2025``, ``aws-2022``) x their three settings (geo-distributed,
single-cluster, 5-clusters) x two skip ratios (25 %: S = 4, L = 3; 33 %: S = 6, L = 4), 20
nodes, the reference workload otherwise (6 microbatches of 8 samples per data node, memory 3).
Every method plans through ``skippipe.planner.methods.make_plan`` (so on the allocation the
``plan`` command would use, the same samples per iteration) and is simulated. Printed: the
seconds per iteration of each method and SkipPipe's reduction against the full pipeline; a
grouped bar chart is written (default ``docs/scheduler-table.png``).

    python3 benchmarks/scheduler_table.py [--nodes 20] [--seed 0] [--time-limit 8] [--png PATH]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from skippipe.cluster import SETTING_NAMES, TABLE_NAMES, load_cluster
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.viz import save_png
from skippipe.workload import Workload

METHODS = ("full", "random", "skippipe-no-tc2", "skippipe")
SKIPS = {"25%": (4, 3), "33%": (6, 4)}
COLORS = {"full": "#8C8C8C", "random": "#DD8452", "skippipe-no-tc2": "#4C72B0", "skippipe": "#55A868"}


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(13, 4.8), dpi=110)
    width = 0.2
    for k, method in enumerate(METHODS):
        xs = [i + (k - 1.5) * width for i in range(len(rows))]
        ax.bar(xs, [r[method] for r in rows], width, label=method, color=COLORS[method])
    ax.set_xticks(range(len(rows)))
    short = {"geo-distributed": "geo", "single-cluster": "1 cluster", "5-clusters": "5 clusters"}
    ax.set_xticklabels([f"{r['table']}\n{short.get(r['setting'], r['setting'])}\n{r['skip']} skip" for r in rows],
                       fontsize=8)
    ax.set_ylabel("seconds per iteration (simulated)")
    ax.set_title("20 nodes: full pipeline, random skipping, SkipPipe without / with TC2")
    ax.legend(fontsize=8, frameon=False, ncol=4)
    try:
        save_png(fig, path)
    finally:
        plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=8.0, help="seconds per skippipe plan")
    ap.add_argument("--png", type=Path, default=Path("docs/scheduler-table.png"))
    args = ap.parse_args(argv)

    head = (f"{'table':<9} {'setting':<16} {'skip':>4} " + " ".join(f"{m:>15}" for m in METHODS)
            + f" {'vs full':>8} {'plan s':>7}")
    print(head)
    print("-" * len(head))
    rows = []
    for table in TABLE_NAMES:
        for setting in SETTING_NAMES:
            for skip, (S, L) in SKIPS.items():
                problem = build_problem(load_cluster(f"{table}/{setting}/{args.nodes}"),
                                        Workload(num_stages=S, path_length=L))
                row = {"table": table, "setting": setting, "skip": skip}
                for method in METHODS:
                    t = time.perf_counter()
                    limit = args.time_limit if method == "skippipe" else None
                    plan = make_plan(method, problem, seed=args.seed, time_limit_s=limit)
                    row[method] = float(plan.predicted_makespan_s)
                    row[f"{method} s"] = time.perf_counter() - t
                row["reduction"] = 1.0 - row["skippipe"] / row["full"]
                rows.append(row)
                print(f"{table:<9} {setting:<16} {skip:>4} " + " ".join(f"{row[m]:>15.2f}" for m in METHODS)
                      + f" {-100 * row['reduction']:>7.1f}% {row['skippipe s']:>7.1f}", flush=True)
    chart(rows, args.png)
    best = max(rows, key=lambda r: r["reduction"])
    print()
    print(f"SkipPipe vs full pipeline: {100 * min(r['reduction'] for r in rows):.1f}% to "
          f"{100 * best['reduction']:.1f}% shorter iterations (best: {best['table']} {best['setting']} "
          f"{best['skip']} skip; the paper reports up to 55 %)")
    print(f"skippipe <= skippipe-no-tc2 in {sum(r['skippipe'] <= r['skippipe-no-tc2'] + 1e-9 for r in rows)} "
          f"of {len(rows)} settings; chart: {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
