"""``skippipe compare``: every planning method on one cluster -- table + bar chart.

    skippipe compare --cluster gcp20-current-free --chart compare.png

By default the nodes are allocated to stages once and every method plans on that allocation
(``--allocation shared``), so the table compares path planning alone; ``--allocation own``
lets each method allocate for itself (``skippipe`` may then pick its own joint allocation).
Each plan is checked and simulated; ``--out-dir`` also writes the plans.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from skippipe.commands.plan import add_planning_arguments, add_problem_arguments, problem_from_args, progress
from skippipe.errors import UserError
from skippipe.fileio import check_writable, check_writable_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_problem_arguments(parser)
    from skippipe.planner.methods import method_names

    names = method_names()
    parser.add_argument("--methods", default=",".join(names), metavar="A,B,..",
                        help=f"methods to run, comma-separated (default: {','.join(names)})")
    add_planning_arguments(parser)
    parser.add_argument("--allocation", choices=("shared", "own"), default="shared",
                        help="shared: one allocation for every method (default); own: each method allocates itself")
    parser.add_argument("--chart", metavar="FILE.png", help="bar chart of the makespans")
    parser.add_argument("--out-dir", metavar="DIR", help="also write each plan as DIR/<method>.json")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")


def _methods(text: str) -> list[str]:
    from skippipe.planner.methods import method_names

    known = method_names()
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    if not chosen:
        raise UserError("--methods is empty")
    unknown = [m for m in chosen if m not in known]
    if unknown:
        raise UserError(f"unknown method(s) {', '.join(unknown)} (known: {', '.join(known)})")
    return list(dict.fromkeys(chosen))


def shared_problem(problem: Any, seed: int, time_limit_s: float | None) -> Any:
    """The problem with the allocation fixed, so that every method plans on the same stages."""
    from skippipe.planner.allocation import allocate
    from skippipe.planner.methods import with_allocation

    if problem.fixed_stages is not None:
        return problem
    return with_allocation(problem, allocate(problem, seed=seed, time_limit_s=time_limit_s))


def compare(problem: Any, methods: list[str], seed: int, time_limit_s: float | None, shared: bool,
            out_dir: Path | None = None) -> dict[str, Any]:
    """Plan and simulate every method; rows in the order given."""
    from skippipe.planfile import save_plan
    from skippipe.planner.methods import make_plan

    rows: list[dict[str, Any]] = []
    with progress("comparing", len(methods) + int(shared)) as bar:
        start = time.perf_counter()
        if shared:
            problem = shared_problem(problem, seed, time_limit_s)
            bar.update(1)
        allocation_s = time.perf_counter() - start
        for method in methods:
            bar.set_postfix_str(method)
            plan = make_plan(method, problem, seed=seed, time_limit_s=time_limit_s)
            if out_dir is not None:
                save_plan(plan, out_dir / f"{method}.json")
            rows.append({
                "method": method,
                "makespan_s": plan.predicted_makespan_s,
                "lower_bound_s": plan.lower_bound_s,
                "planning_s": plan.meta.get("planning_s"),
                "stages": plan.stages,
            })
            bar.update(1)
    full = next((r["makespan_s"] for r in rows if r["method"] == "full"), None)
    for r in rows:
        ms, lb = r["makespan_s"], r["lower_bound_s"]
        r["ratio"] = ms / lb if lb else None
        r["reduction_vs_full"] = 1.0 - ms / full if full else None
    return {
        "cluster": problem.cluster.name,
        "nodes": problem.n,
        "allocation": "shared" if shared else "own",
        "allocation_s": round(allocation_s, 3) if shared else None,
        "seed": seed,
        "workload": problem.workload.to_dict(),
        "results": rows,
    }


def format_table(doc: dict[str, Any]) -> str:
    w = doc["workload"]
    head = (
        f"{doc['cluster']}: {doc['nodes']} nodes, L={w['path_length']} of S={w['num_stages']}, "
        f"{w['microbatches_per_data_node']} microbatches per data node, memory {w['memory']}, "
        f"allocation {doc['allocation']}"
    )
    lines = [head, f"{'method':<16} {'makespan s':>10} {'bound s':>8} {'ratio':>6} {'vs full':>8} {'plan s':>7}"]
    for r in doc["results"]:
        red = "-" if r["reduction_vs_full"] is None or r["method"] == "full" else f"{-100 * r['reduction_vs_full']:+.1f}%"
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else "-"
        bound = f"{r['lower_bound_s']:.2f}" if r["lower_bound_s"] else "-"
        ps = f"{r['planning_s']:.2f}" if r["planning_s"] is not None else "-"
        lines.append(f"{r['method']:<16} {r['makespan_s']:>10.2f} {bound:>8} {ratio:>6} {red:>8} {ps:>7}")
    return "\n".join(lines)


def draw_chart(doc: dict[str, Any], path: str) -> None:
    from skippipe import viz

    rows = doc["results"]
    bounds = [r["lower_bound_s"] for r in rows if r["method"] != "full" and r["lower_bound_s"]]
    lines = {"lower bound (skipping plans)": min(bounds)} if bounds and doc["allocation"] == "shared" else None
    viz.bar_chart(
        [r["method"] for r in rows],
        [r["makespan_s"] if math.isfinite(r["makespan_s"]) else math.nan for r in rows],
        path,
        title=f"{doc['cluster']} ({doc['nodes']} nodes): simulated iteration time",
        lines=lines,
    )


def run(args: argparse.Namespace) -> int:
    methods = _methods(args.methods)
    if args.chart and Path(args.chart).suffix.lower() != ".png":
        raise UserError(f"--chart {args.chart}: charts are PNG files; give a name ending in .png")
    out_dir = Path(args.out_dir) if args.out_dir else None
    if args.chart:
        check_writable(args.chart, "chart")
    if out_dir is not None:
        check_writable_dir(out_dir, "plan folder")
    problem = problem_from_args(args)
    doc = compare(problem, methods, args.seed, args.time_limit, args.allocation == "shared", out_dir)
    if args.chart:
        draw_chart(doc, args.chart)
        doc["chart"] = args.chart
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(format_table(doc))
        if args.chart:
            print(f"chart: {args.chart}")
    return 0
