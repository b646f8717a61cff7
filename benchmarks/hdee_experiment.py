"""HDEE on CPU: every configuration of ``examples/hdee-cpu.toml`` for several seeds, then the
per-domain tables, the raw JSON and the chart.

    PYTHONPATH=src python3 benchmarks/hdee_experiment.py                      # seeds 0 and 1, one process at a time
    PYTHONPATH=src python3 benchmarks/hdee_experiment.py --seeds 0 1 2 --parallel 2

Each seed is one ``skippipe hdee train`` + ``skippipe hdee eval`` in its own process (one torch
thread each; the run folders are resumable, so an interrupted experiment continues where it
stopped). Writes ``docs/images/hdee-results.json`` (every run's raw results, plans, difficulty
scores and timings, plus the summary over seeds), ``docs/images/hdee.png`` and
``docs/images/hdee-tables.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from skippipe.fileio import atomic_write_text
from skippipe.hdee.report import chart, experts_table, markdown_table, summarise, wins

ROOT = Path(__file__).resolve().parents[1]

COMBINERS = {
    "val_prior": "ensemble, prior fitted on validation",
    "uniform": "ensemble, uniform prior",
    "best_single": "best single expert of the configuration (chosen on validation)",
    "oracle": "the domain's own expert",
}


def _run_all(commands: list[tuple[list[str], Path]], parallel: int, env: dict[str, str]) -> None:
    """Run commands, at most ``parallel`` at once, each logging to its file; stop on a failure."""
    waiting = list(commands)
    running: list[tuple[subprocess.Popen, Path]] = []
    while waiting or running:
        while waiting and len(running) < parallel:
            cmd, log = waiting.pop(0)
            log.parent.mkdir(parents=True, exist_ok=True)
            print(f"$ {' '.join(cmd)}  > {log}", flush=True)
            running.append((subprocess.Popen(cmd, stdout=log.open("a"), stderr=subprocess.STDOUT, env=env, cwd=ROOT), log))
        time.sleep(2)
        for proc, log in list(running):
            if proc.poll() is not None:
                running.remove((proc, log))
                if proc.returncode != 0:
                    for other, _ in running:
                        other.terminate()
                    raise SystemExit(f"failed (exit {proc.returncode}); see {log}")


def _heterogeneous_wins(summary: dict, combiner: str) -> dict:
    best = wins(summary, combiner)
    het = [d for d, c in best.items() if c != "homogeneous"]
    return {"best": best, "heterogeneous": len(het), "domains": len(best)}


def _measured_vs_manual(summary: dict, combiner: str = "val_prior") -> list[dict]:
    """For each heterogeneous kind: on how many domains the measured difficulty beats the manual one."""
    rows = summary["ppl"][combiner]
    out = []
    for kind in ("steps", "size", "both"):
        manual = rows.get(f"{kind}/manual")
        for c in summary["configurations"]:
            if c.startswith(f"{kind}/") and c != f"{kind}/manual" and manual is not None:
                better = [d for d in summary["domains"] if d in rows[c] and d in manual and rows[c][d][0] < manual[d][0]]
                out.append({"kind": kind, "measured": c, "better_on": better, "domains": len(summary["domains"])})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="examples/hdee-cpu.toml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--runs", default="runs/hdee-experiment", help="folder of the per-seed run folders")
    ap.add_argument("--parallel", type=int, default=1, help="processes at once (one torch thread each)")
    ap.add_argument("--json", default="docs/images/hdee-results.json")
    ap.add_argument("--chart", default="docs/images/hdee.png")
    ap.add_argument("--tables", default="docs/images/hdee-tables.md")
    ap.add_argument("--report-only", action="store_true",
                    help="only rebuild the tables, chart and JSON from finished runs (keeps the timings of --json)")
    args = ap.parse_args()

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    runs = ROOT / args.runs
    seed_dirs = {s: runs / f"seed-{s}" for s in args.seeds}
    cli = [sys.executable, "-m", "skippipe.cli", "hdee"]
    if args.report_only:
        seconds = json.loads((ROOT / args.json).read_text())["seconds"]
    else:
        start = time.perf_counter()
        train = [([*cli, "train", args.config, "--seed", str(s), "--run-dir", str(d), "--jobs", "1"],
                  runs / f"seed-{s}.train.log") for s, d in seed_dirs.items()]
        _run_all(train, args.parallel, env)
        trained = time.perf_counter()
        _run_all([([*cli, "eval", str(d)], runs / f"seed-{s}.eval.log") for s, d in seed_dirs.items()], args.parallel, env)
        evaluated = time.perf_counter()
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        seconds = {"train": trained - start, "eval": evaluated - trained, "parallel_processes": args.parallel,
                   "cpu_all_processes": children.ru_utime + children.ru_stime}

    results = [json.loads((d / "eval" / "results.json").read_text()) for d in seed_dirs.values()]
    plans = {s: json.loads((d / "plan.json").read_text()) for s, d in seed_dirs.items()}
    summary = summarise(results)
    title = f"HDEE on CPU: ensembles (validation prior) vs homogeneous, {len(results)} seeds"
    path = chart(summary, ROOT / args.chart, title=title)

    tables = [f"# HDEE CPU experiment: test perplexity, mean ± std over seeds {args.seeds}\n"]
    for comb, text in COMBINERS.items():
        tables += [f"\n## {text}\n", markdown_table(summary, comb)]
    tables += ["\n## every expert alone\n", experts_table(summary)]
    flops = {c["name"]: c["flops"] for c in plans[args.seeds[0]]["configurations"]}
    tables += ["\n## configurations (seed " + str(args.seeds[0]) + ")\n", "| configuration | experts | FLOPs |", "|---|---|---|"]
    for c in plans[args.seeds[0]]["configurations"]:
        experts = ", ".join(e["name"] for e in c["experts"])
        tables.append(f"| {c['name']} | {experts} | {c['flops']:.4g} |")
    atomic_write_text(ROOT / args.tables, "\n".join(tables) + "\n")

    def _plain(s: dict) -> dict:
        return {comb: {c: {d: {"mean": v[0], "std": v[1], "runs": v[2]} for d, v in row.items()} for c, row in rows.items()}
                for comb, rows in s["ppl"].items()}

    out = {
        "config": args.config,
        "seeds": args.seeds,
        "seconds": seconds,
        "configuration_flops": flops,
        "plans": plans,
        "summary_perplexity": _plain(summary),
        "wins_val_prior": _heterogeneous_wins(summary, "val_prior"),
        "wins_uniform": _heterogeneous_wins(summary, "uniform"),
        "wins_per_seed_val_prior": [_heterogeneous_wins(summarise([r]), "val_prior") for r in results],
        "measured_vs_manual": _measured_vs_manual(summary),
        "runs": results,
    }
    atomic_write_text(ROOT / args.json, json.dumps(out, indent=1) + "\n")
    print("\n".join(tables))
    print(f"\nheterogeneous best (validation prior, mean over seeds): {out['wins_val_prior']['heterogeneous']} of "
          f"{out['wins_val_prior']['domains']} domains: {out['wins_val_prior']['best']}")
    print(f"measured vs manual: {out['measured_vs_manual']}")
    print(f"train {seconds['train']:.0f} s, eval {seconds['eval']:.0f} s (wall); wrote {args.json}, {path}, {args.tables}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
