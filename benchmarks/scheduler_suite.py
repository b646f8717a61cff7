"""Scheduler suite (issue 10): every method on clusters of every kind, against the floor over
every allocation.

The clusters come from ``skippipe.cluster_gen.suite`` (random global networks with broken
links, one site, uneven compute 0.5-2x and memory 1-4, the gcp/aws presets in their three
settings, S = 4..9 with the jump rule binding, 12 to 1,000 nodes), the reference workload
otherwise (6 microbatches of 8 samples per data node, memory 3 unless the cluster says).
Every method plans through ``make_plan`` with its default deterministic budget (no time
limit) and is simulated. Printed per cluster: kind, N, S, L, the seconds per iteration of
each method, the floor over every allocation (``free_allocation_floor``), skippipe / floor,
and skippipe's planning seconds (wall clock, on whatever machine and load this runs on, and
the CPU seconds of the process and its planning workers, which a busy machine disturbs less).
Results go to a JSON file and a chart.

    python3 benchmarks/scheduler_suite.py [--smallest 0] [--largest 1000] [--seed 0] [--json PATH] [--png PATH]
        [--methods skippipe ...] [--merge]

``--methods`` plans only those methods (the others' cells stay empty, or keep their figures with
``--merge``); ``--merge`` updates the rows of the clusters run in an existing JSON file (same
kind, N, S, L) and keeps every other row and figure, so a 1,000-node row can be added alone.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tqdm import tqdm

from skippipe.cluster_gen import SuiteCase, suite
from skippipe.errors import UserError
from skippipe.fileio import atomic_write_text
from skippipe.planner.floors import free_allocation_floor
from skippipe.planner.methods import make_plan
from skippipe.planner.problem import build_problem
from skippipe.planner.routing.pool import cpu_seconds
from skippipe.viz import save_png

METHODS = ("naive", "random", "skippipe-no-tc2", "skippipe")
COLORS = {"naive": "#8C8C8C", "random": "#DD8452", "skippipe-no-tc2": "#4C72B0", "skippipe": "#55A868"}


def run_case(case: SuiteCase, seed: int, methods: tuple[str, ...] = METHODS) -> dict:
    problem = build_problem(case.cluster, case.workload())
    floor = free_allocation_floor(problem)
    row = {"kind": case.kind, "cluster": case.cluster.name, "N": problem.n, "S": case.num_stages,
           "L": case.path_length, "floor": round(floor.value, 3), "floor_exhaustive": floor.exhaustive,
           "floor_exact_trips": floor.exact_trips}
    for method in methods:
        start = time.perf_counter()
        cpu = cpu_seconds()
        try:
            plan = make_plan(method, problem, seed=seed)
            row[method] = round(float(plan.predicted_makespan_s), 3)
        except UserError as err:
            row[method] = None
            row[f"{method}_error"] = str(err)
        row[f"{method}_plan_s"] = round(time.perf_counter() - start, 2)
        row[f"{method}_cpu_s"] = round(cpu_seconds() - cpu, 2)
        if method == "skippipe" and row[method] is not None:
            row["skippipe_candidate"] = plan.meta.get("candidate")
    row["ratio"] = round(row["skippipe"] / floor.value, 3) if row.get("skippipe") else None
    return row


def _key(row: dict) -> tuple:
    return (row["kind"], row["N"], row["S"], row["L"])


def merged(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` with every row of a cluster in ``new`` updated by the new figures (the methods
    not run keep theirs), new clusters appended; order of ``old`` kept."""
    by_key = {_key(r): r for r in new}
    out = []
    for r in old:
        fresh = by_key.pop(_key(r), None)
        out.append({**r, **fresh} if fresh is not None else r)
    return out + list(by_key.values())


def in_suite_order(rows: list[dict], cases: list[SuiteCase]) -> list[dict]:
    """``rows`` in the order of ``cases`` (a cluster added to the suite lands in its place);
    rows of clusters not in ``cases`` last, in their order."""
    place = {(c.kind, c.cluster.n, c.num_stages, c.path_length): i for i, c in enumerate(cases)}
    return sorted(rows, key=lambda r: place.get(_key(r), len(place)))


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(14, 5), dpi=110)
    width = 0.2
    for k, method in enumerate(METHODS):
        xs = [i + (k - 1.5) * width for i in range(len(rows))]
        ys = [(r.get(method) or 0) / r["floor"] for r in rows]
        ax.bar(xs, ys, width, label=method, color=COLORS[method])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(1.1, color="black", lw=0.8, ls="--", label="1.10 x floor")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r['kind']}\nN={r['N']} S={r['S']} L={r['L']}" for r in rows], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("makespan / floor over every allocation")
    ax.set_ylim(0.9, min(4.0, max(max((r.get(m) or 0) / r["floor"] for m in METHODS) for r in rows) * 1.05))
    ax.set_title("Scheduler suite: simulated seconds per iteration relative to the floor (lower is better; clipped at 4)",
                 pad=24)
    ax.legend(fontsize=8, frameon=False, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0))  # above the bars
    try:
        save_png(fig, path)
    finally:
        plt.close(fig)


def fmt(x: float | None) -> str:
    return f"{x:9.2f}" if x is not None else f"{'-':>9}"


def fmt_s(x: float | None) -> str:
    return f"{x:7.1f}" if x is not None else f"{'-':>7}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--largest", type=int, default=1000, help="leave out clusters with more nodes")
    ap.add_argument("--smallest", type=int, default=0, help="leave out clusters with fewer nodes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=Path("docs/scheduler-suite.json"))
    ap.add_argument("--png", type=Path, default=None, help="the chart (default: the --json path with .png)")
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), help="plan only these methods")
    ap.add_argument("--merge", action="store_true", help="update the rows run in an existing --json file, keep the others")
    args = ap.parse_args(argv)
    methods = tuple(m for m in METHODS if m in args.methods)
    old = json.loads(args.json.read_text())["rows"] if args.merge and args.json.exists() else []
    cases = [c for c in suite(seed=args.seed, largest=args.largest) if c.cluster.n >= args.smallest]
    head = (f"{'kind':<26} {'N':>5} {'S':>2} {'L':>2} " + " ".join(f"{m[:9]:>9}" for m in METHODS)
            + f" {'floor':>9} {'ratio':>6} {'plan s':>7} {'cpu s':>7}")
    rows = []
    tqdm.monitor_interval = 0  # no monitor thread: the planner forks its workers only without threads
    for case in tqdm(cases, desc="suite", unit="cluster", disable=None, leave=False):
        rows.append(run_case(case, args.seed, methods))
        atomic_write_text(args.json, json.dumps({"seed": args.seed, "rows": merged(old, rows)}, indent=1) + "\n")
    rows = in_suite_order(merged(old, rows), suite(seed=args.seed))
    atomic_write_text(args.json, json.dumps({"seed": args.seed, "rows": rows}, indent=1) + "\n")
    print(head)
    print("-" * len(head))
    for r in rows:
        ratio = f"{r['ratio']:6.3f}" if r["ratio"] else f"{'-':>6}"
        print(f"{r['kind']:<26} {r['N']:>5} {r['S']:>2} {r['L']:>2} " + " ".join(fmt(r.get(m)) for m in METHODS)
              + f" {r['floor']:9.2f} {ratio} {fmt_s(r.get('skippipe_plan_s'))} {fmt_s(r.get('skippipe_cpu_s'))}")
    png = args.png or args.json.with_suffix(".png")  # a run written elsewhere leaves the docs' chart alone
    chart(rows, png)
    print(f"wrote {args.json} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
